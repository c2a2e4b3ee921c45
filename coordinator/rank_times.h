// What ranks said about their step times (ReportAliveRequest.times), kept
// in memory for the web UI's per-rank panel: the latest attempt's of each
// job, at most kPointsPerRank a rank, for the kJobs jobs heard from most
// recently. Not job history: a restarted ptcoord starts empty.
// Thread-safe.
#ifndef PTRAIN_COORDINATOR_RANK_TIMES_H_
#define PTRAIN_COORDINATOR_RANK_TIMES_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ptrain/v1/coordinator.pb.h"

namespace ptrain {

class RankTimesBoard {
 public:
  static constexpr size_t kPointsPerRank = 600;
  static constexpr size_t kJobs = 64;
  // An answer without a cursor holds at most this many points (each rank's
  // thinned evenly, its newest kept).
  static constexpr size_t kMaxPoints = 20000;

  struct Point {
    int64_t seq = 0;  // the order points arrived in, from 1
    int rank = 0;
    int64_t unix_ms = 0;
    v1::RankTimes times;
  };

  // Rank `rank` of `job_id`'s attempt `attempt` (of `world_size` ranks)
  // said `times` at `unix_ms`. A newer attempt replaces the job's points;
  // an older one's are dropped.
  void Add(const std::string& job_id, int attempt, int world_size, int rank,
           const v1::RankTimes& times, int64_t unix_ms);

  struct View {
    int attempt = 0;  // 0: none heard
    int world_size = 0;
    std::vector<Point> points;  // by seq
    int64_t next = 0;           // the `after` that asks for what comes next
  };
  // The job's points after `after` (0: all, thinned to kMaxPoints).
  View Since(const std::string& job_id, int64_t after) const;

 private:
  struct Job {
    int attempt = 0;
    int world_size = 0;
    int64_t last_seq = 0;
    std::map<int, std::deque<Point>> ranks;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_RANK_TIMES_H_
