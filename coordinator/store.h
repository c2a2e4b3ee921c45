// Durable state of ptcoord in SQLite (WAL): jobs, attempts, events,
// checkpoints and loss history. Persistence only: the job lifecycle rules
// live in Coordinator. Thread-safe (one connection behind a mutex).
#ifndef PTRAIN_COORDINATOR_STORE_H_
#define PTRAIN_COORDINATOR_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ptrain/v1/coordinator.pb.h"

struct sqlite3;

namespace ptrain {

// A job as stored: what users see plus what only the coordinator needs.
struct JobRecord {
  v1::Job job;
  int64_t seq = 0;    // submission order (FIFO), assigned by InsertJob
  std::string token;  // per-job RankService token of the current attempt
  int64_t pid = 0;    // attempt's process-group leader; 0 when none
  int64_t last_progress_ms = 0;
  int32_t restarts_used = 0;
};

class Store {
 public:
  // Opens or creates the database (WAL mode, tables created if missing).
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Assigns seq and id ("job-NNNN") and stores the job; returns the record.
  absl::StatusOr<JobRecord> InsertJob(JobRecord record);
  absl::Status UpdateJob(const JobRecord& record);
  absl::StatusOr<JobRecord> GetJob(const std::string& id);  // NotFound
  // Every job in submission order.
  absl::StatusOr<std::vector<JobRecord>> ListJobs();

  absl::Status UpsertAttempt(const std::string& job_id, const v1::Attempt& a);
  absl::StatusOr<std::vector<v1::Attempt>> ListAttempts(
      const std::string& job_id);

  absl::Status AddEvent(const std::string& job_id, int64_t unix_ms,
                        const std::string& message);
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListEvents(
      const std::string& job_id);

  absl::Status AddLossPoint(const std::string& job_id, const v1::LossPoint& p);
  absl::StatusOr<std::vector<v1::LossPoint>> LossHistory(
      const std::string& job_id);

  absl::Status AddCheckpoint(const std::string& job_id,
                             const v1::Checkpoint& c);
  absl::StatusOr<std::vector<v1::Checkpoint>> ListCheckpoints(
      const std::string& job_id);

 private:
  explicit Store(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_STORE_H_
