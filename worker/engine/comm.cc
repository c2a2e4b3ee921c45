// CommOpName and CommStats: the backend-independent half of the Communicator,
// the (group, op) counters behind the ptrain_comm_* metrics.
#include "worker/engine/comm.h"

namespace ptrain {

const char* CommOpName(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce:
      return "all_reduce";
    case CommOp::kReduceScatter:
      return "reduce_scatter";
    case CommOp::kAllGather:
      return "all_gather";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kSend:
      return "send";
    case CommOp::kRecv:
      return "recv";
    case CommOp::kBarrier:
      return "barrier";
  }
  return "unknown";
}

void CommStats::Record(const std::string& group, CommOp op, double seconds,
                       int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  CommStat& s = stats_[{group, CommOpName(op)}];
  s.seconds += seconds;
  s.bytes += bytes;
  s.calls += 1;
}

std::map<std::pair<std::string, std::string>, CommStat> CommStats::Snapshot()
    const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

CommStat CommStats::Get(const std::string& group, CommOp op) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stats_.find({group, CommOpName(op)});
  return it == stats_.end() ? CommStat{} : it->second;
}

void CommStats::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.clear();
}

bool AnyRankFailed(Communicator* group, bool failed) {
  double n = failed ? 1.0 : 0.0;
  if (group != nullptr && group->size() > 1) group->AllReduce(&n, 1);
  return n > 0;
}

absl::Status AgreeOnStatus(Communicator* group, const absl::Status& mine,
                           absl::string_view others) {
  if (!AnyRankFailed(group, !mine.ok())) return absl::OkStatus();
  return mine.ok() ? absl::FailedPreconditionError(others) : mine;
}

}  // namespace ptrain
