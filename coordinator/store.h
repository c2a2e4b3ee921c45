// Durable state of ptcoord in SQLite (WAL): jobs, attempts, events,
// checkpoints, loss history and the nodes that registered. Persistence only:
// the job lifecycle rules live in Coordinator. No secret is stored: a rank
// token and a node secret only as their SHA-256. Thread-safe (one connection
// behind a mutex).
#ifndef PTRAIN_COORDINATOR_STORE_H_
#define PTRAIN_COORDINATOR_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
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
  int64_t seq = 0;  // submission order (FIFO), assigned by InsertJob
  // Sha256Hex of the current attempt's RankService token; "" when no
  // attempt runs, so no token is valid then.
  std::string token_sha256;
  // PTRAIN_ATTEMPT_UID of the current attempt: not a secret, it finds the
  // attempt's processes in /proc. "" when none runs.
  std::string attempt_uid;
  int32_t restarts_used = 0;
};

// One change of one job, written in a single transaction: the new record
// and what goes with it. Either all of it is on disk or none.
struct JobUpdate {
  JobRecord record;     // replaces the stored job (matched by record.job.id())
  std::string event;    // "" = none
  int64_t unix_ms = 0;  // the event's time
  std::optional<v1::Attempt> attempt;  // upserted by number
  std::vector<v1::LossPoint> loss_points;
  std::vector<v1::Checkpoint> checkpoints;  // upserted by step
};

// A node's stored registration: what users see, and the SHA-256 of the
// secret that binds its name ("" for a node an older ptcoord registered).
struct StoredNode {
  v1::Node node;
  std::string secret_sha256;
};

class Store {
 public:
  // Opens or creates the database (WAL mode, tables created if missing) and
  // migrates an older one: a plain `token` column is replaced by its
  // SHA-256 and the freed pages are wiped (secure_delete, VACUUM, WAL
  // truncated). A new file is created 0600.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Assigns seq and id ("job-NNNN") and stores the job, with `event` when
  // not empty, in one transaction; returns the record.
  absl::StatusOr<JobRecord> InsertJob(JobRecord record,
                                      const std::string& event = "",
                                      int64_t unix_ms = 0);
  absl::Status UpdateJob(const JobRecord& record);
  // Applies `update` atomically; NotFound for an unknown job.
  absl::Status Apply(const JobUpdate& update);
  absl::StatusOr<JobRecord> GetJob(const std::string& id);  // NotFound
  // Every job in submission order.
  absl::StatusOr<std::vector<JobRecord>> ListJobs();

  // Removes job `id` and everything stored of it (attempts, events,
  // checkpoints listed, loss history), at once. Its seq stays used: ids are
  // never given again.
  absl::Status DeleteJob(const std::string& id);
  absl::Status UpsertAttempt(const std::string& job_id, const v1::Attempt& a);
  absl::StatusOr<std::vector<v1::Attempt>> ListAttempts(
      const std::string& job_id);

  absl::Status AddEvent(const std::string& job_id, int64_t unix_ms,
                        const std::string& message);
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListEvents(
      const std::string& job_id);

  absl::Status AddLossPoint(const std::string& job_id, const v1::LossPoint& p);
  // The job's loss points in the order they were added, those added after
  // the point numbered `after` (0: all). With `max_per_series` > 0, each
  // series (training points; evaluation points, those with a val_loss)
  // that has more is thinned to at most that many, evenly by position, its
  // first and last point kept. `stored`, when not null, gets how many
  // points there are after `after`; `last`, the number of the newest (or
  // `after` when there is none): the `after` of the next call that wants
  // only what came since.
  absl::StatusOr<std::vector<v1::LossPoint>> LossHistory(
      const std::string& job_id, int64_t max_per_series = 0,
      int64_t* stored = nullptr, int64_t after = 0, int64_t* last = nullptr);
  // The newest step of attempt `attempt`'s training points and of its
  // evaluation points; -1 for a series without any.
  struct LastSteps {
    int64_t step = -1;
    int64_t eval = -1;
  };
  absl::StatusOr<LastSteps> LastLossSteps(const std::string& job_id,
                                          int attempt);

  absl::Status AddCheckpoint(const std::string& job_id,
                             const v1::Checkpoint& c);
  // A node's latest registration (replaces one of the same name) with the
  // SHA-256 of its secret; the nodes by name, with spec and registered time
  // (state and heartbeats live in memory). With `pending_approval` the node
  // is also marked as waiting for approval, in the same transaction;
  // without it, a mark it has stays.
  absl::Status UpsertNode(const v1::NodeSpec& spec, int64_t registered_unix_ms,
                          const std::string& secret_sha256,
                          bool pending_approval = false);
  // Clears a node's mark of waiting for approval (none: nothing changes).
  absl::Status ApproveNode(const std::string& name);
  // Forgets a node's registration, secret, draining flag and approval mark
  // (one transaction).
  absl::Status DeleteNode(const std::string& name);
  // Drained nodes take no new attempts; kept across restarts.
  absl::Status SetNodeDraining(const std::string& name, bool draining);
  // Registrations by name, with their draining flag, approval mark
  // (Node.pending_approval) and secret hash.
  absl::StatusOr<std::vector<StoredNode>> ListNodes();

  absl::StatusOr<std::vector<v1::Checkpoint>> ListCheckpoints(
      const std::string& job_id);

 private:
  explicit Store(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The column names of `table`.
  absl::StatusOr<std::set<std::string>> Columns(const char* table)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The statements behind the public calls, inside a transaction of the
  // caller's.
  absl::Status UpdateJobLocked(const JobRecord& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UpsertAttemptLocked(const std::string& job_id,
                                   const v1::Attempt& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AddEventLocked(const std::string& job_id, int64_t unix_ms,
                              const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AddLossPointLocked(const std::string& job_id,
                                  const v1::LossPoint& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AddCheckpointLocked(const std::string& job_id,
                                   const v1::Checkpoint& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `body` between BEGIN IMMEDIATE and COMMIT; rolls back on error.
  template <typename F>
  absl::Status InTransaction(F body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_STORE_H_
