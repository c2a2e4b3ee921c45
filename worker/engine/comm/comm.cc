// CommOpName and CommStats: the backend-independent half of the Communicator,
// the (group, op) counters behind the ptrain_comm_* metrics.
#include "worker/engine/comm/comm.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"

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
    case CommOp::kAllToAll:
      return "all_to_all";
  }
  return "unknown";
}

void Communicator::AllToAllV(const float* send, const int64_t* send_counts,
                             float* recv, const int64_t* recv_counts) {
  const int n = size(), me = rank();
  std::vector<std::unique_ptr<CommHandle>> pending;
  int64_t sent = 0, received = 0;
  for (int r = 0; r < n; ++r) {
    if (r == me) {
      std::memcpy(recv + received, send + sent, sizeof(float) * send_counts[r]);
    } else {
      if (recv_counts[r] > 0) {
        pending.push_back(RecvAsync(recv + received, recv_counts[r], r, 0));
      }
      if (send_counts[r] > 0) {
        pending.push_back(SendAsync(send + sent, send_counts[r], r, 0));
      }
    }
    sent += send_counts[r];
    received += recv_counts[r];
  }
  for (auto& h : pending) h->Wait();
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

void CommStats::RecordExposed(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  exposed_ += seconds;
}

double CommStats::ExposedSeconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exposed_;
}

void CommStats::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.clear();
  exposed_ = 0.0;
}

namespace {

class DoneHandle : public CommHandle {
 public:
  void Wait() override {}
  bool Test() override { return true; }
};

class SelfCommunicator : public Communicator {
 public:
  SelfCommunicator(std::string group, std::shared_ptr<CommStats> stats)
      : group_(std::move(group)), stats_(std::move(stats)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& group() const override { return group_; }
  void AllReduce(float*, int64_t) override {}
  void AllReduce(double*, int64_t) override {}
  void AllReduceMax(float*, int64_t) override {}
  void ReduceScatter(const float* send, float* recv, int64_t count) override {
    Copy(send, recv, count);
  }
  void AllGather(const float* send, float* recv, int64_t count) override {
    Copy(send, recv, count);
  }
  void Broadcast(float*, int64_t, int) override {}
  void Send(const float*, int64_t, int, int) override { NoPeer(); }
  void Recv(float*, int64_t, int, int) override { NoPeer(); }
  void Barrier() override {}
  std::unique_ptr<CommHandle> AllReduceAsync(float*, int64_t) override {
    return std::make_unique<DoneHandle>();
  }
  std::unique_ptr<CommHandle> ReduceScatterAsync(const float* send, float* recv,
                                                 int64_t count) override {
    Copy(send, recv, count);
    return std::make_unique<DoneHandle>();
  }
  std::unique_ptr<CommHandle> AllGatherAsync(const float* send, float* recv,
                                             int64_t count) override {
    Copy(send, recv, count);
    return std::make_unique<DoneHandle>();
  }
  std::unique_ptr<CommHandle> BroadcastAsync(float*, int64_t, int) override {
    return std::make_unique<DoneHandle>();
  }
  std::unique_ptr<CommHandle> SendAsync(const float*, int64_t, int,
                                        int) override {
    NoPeer();
  }
  std::unique_ptr<CommHandle> RecvAsync(float*, int64_t, int, int) override {
    NoPeer();
  }
  CommStats& stats() override { return *stats_; }

 private:
  static void Copy(const float* send, float* recv, int64_t count) {
    if (send != recv) std::memmove(recv, send, sizeof(float) * count);
  }
  [[noreturn]] void NoPeer() const {
    PT_CHECK(false, ("group " + group_ + " of one rank has no peer").c_str());
    std::abort();
  }

  const std::string group_;
  std::shared_ptr<CommStats> stats_;
};

}  // namespace

std::unique_ptr<Communicator> MakeSelfCommunicator(
    const std::string& group, std::shared_ptr<CommStats> stats) {
  return std::make_unique<SelfCommunicator>(group, std::move(stats));
}

bool AnyRankFailed(Communicator* group, bool failed) {
  double n = failed ? 1.0 : 0.0;
  if (group != nullptr && group->size() > 1) group->AllReduce(&n, 1);
  return n > 0;
}

absl::Status AgreeOnStatus(Communicator* group, const absl::Status& mine,
                           absl::string_view others) {
  if (!AnyRankFailed(group, !mine.ok())) return absl::OkStatus();
  return mine.ok() ? MarkAgreed(group, absl::FailedPreconditionError(others),
                                /*echo=*/true)
                   : MarkAgreed(group, mine);
}

namespace {
constexpr char kAgreedBy[] = "ptrain/agreed-by";
}  // namespace

// The payload: the group's size, then ":echo" for an echo.
absl::Status MarkAgreed(Communicator* group, absl::Status s, bool echo) {
  if (s.ok()) return s;
  s.SetPayload(kAgreedBy,
               absl::Cord(absl::StrCat(group == nullptr ? 1 : group->size(),
                                       echo ? ":echo" : "")));
  return s;
}

int AgreedBy(const absl::Status& s) {
  const auto by = s.GetPayload(kAgreedBy);
  if (!by.has_value()) return 0;
  const std::string text(*by);
  int n = 0;
  return absl::SimpleAtoi(text.substr(0, text.find(':')), &n) ? n : 0;
}

bool IsAgreedEcho(const absl::Status& s) {
  const auto by = s.GetPayload(kAgreedBy);
  return by.has_value() && absl::EndsWith(std::string(*by), ":echo");
}

}  // namespace ptrain
