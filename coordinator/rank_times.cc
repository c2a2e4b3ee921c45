// See rank_times.h.
#include "coordinator/rank_times.h"

#include <algorithm>

namespace ptrain {

void RankTimesBoard::Add(const std::string& job_id, int attempt, int world_size,
                         int rank, const v1::RankTimes& times,
                         int64_t unix_ms) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    if (jobs_.size() >= kJobs) {
      // Forget the job heard from least recently.
      auto oldest = std::min_element(
          jobs_.begin(), jobs_.end(), [](const auto& a, const auto& b) {
            return a.second.last_seq < b.second.last_seq;
          });
      jobs_.erase(oldest);
    }
    it = jobs_.emplace(job_id, Job{}).first;
  }
  Job& job = it->second;
  if (attempt < job.attempt) return;
  if (attempt > job.attempt) {
    job.ranks.clear();
    job.attempt = attempt;
  }
  job.world_size = world_size;
  std::deque<Point>& points = job.ranks[rank];
  if (points.size() >= kPointsPerRank) points.pop_front();
  job.last_seq = ++seq_;
  points.push_back(Point{job.last_seq, rank, unix_ms, times});
}

RankTimesBoard::View RankTimesBoard::Since(const std::string& job_id,
                                           int64_t after) const {
  absl::MutexLock lock(&mu_);
  View view;
  view.next = after;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return view;
  const Job& job = it->second;
  view.attempt = job.attempt;
  view.world_size = job.world_size;
  size_t total = 0;
  for (const auto& [rank, points] : job.ranks) total += points.size();
  // Each rank's points from the first after `after`; every stride-th of
  // them, counted back from its newest.
  const size_t stride = after == 0 && total > kMaxPoints
                            ? (total + kMaxPoints - 1) / kMaxPoints
                            : 1;
  for (const auto& [rank, points] : job.ranks) {
    auto first = std::upper_bound(
        points.begin(), points.end(), after,
        [](int64_t seq, const Point& p) { return seq < p.seq; });
    const size_t n = static_cast<size_t>(points.end() - first);
    for (size_t i = 0; i < n; ++i) {
      if ((n - 1 - i) % stride == 0) view.points.push_back(first[i]);
    }
  }
  std::sort(view.points.begin(), view.points.end(),
            [](const Point& a, const Point& b) { return a.seq < b.seq; });
  view.next = std::max(after, job.last_seq);
  return view;
}

}  // namespace ptrain
