// See comm_nccl.h.
#include "worker/engine/comm/comm_nccl.h"

#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/backends.h"
#include "worker/engine/comm/comm_staged.h"

namespace ptrain {
namespace {

// A handle of an NCCL operation on the communication stream: Wait makes
// the backend's stream wait for it (the host does not), Test asks whether
// it has finished.
class Issued : public CommHandle {
 public:
  Issued(kernels::DeviceCollectives* nccl, int64_t k) : nccl_(nccl), k_(k) {}
  void Wait() override { nccl_->Join(k_, /*exposed=*/true); }
  bool Test() override { return nccl_->Done(k_); }

 private:
  kernels::DeviceCollectives* nccl_;
  const int64_t k_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(Communicator* inner, kernels::Ops* ops,
                   std::unique_ptr<kernels::DeviceCollectives> nccl,
                   FlightRecorder* recorder)
      : inner_(inner),
        ops_(ops),
        recorder_(recorder),
        nccl_(std::move(nccl)),
        staged_(MakeStagedCommunicator(inner, ops)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& group() const override { return inner_->group(); }
  CommStats& stats() override {
    Collect();
    return inner_->stats();
  }

  void AllReduce(float* data, int64_t count) override {
    if (RouteOf(data) == Route::kHost) return inner_->AllReduce(data, count);
    nccl_->Join(NcclAllReduce(data, count, /*max=*/false), false);
  }
  void AllReduce(double* data, int64_t count) override {
    inner_->AllReduce(data, count);  // host sums only
  }
  void AllReduceMax(float* data, int64_t count) override {
    if (RouteOf(data) == Route::kHost) {
      return inner_->AllReduceMax(data, count);
    }
    nccl_->Join(NcclAllReduce(data, count, /*max=*/true), false);
  }
  void ReduceScatter(const float* send, float* recv, int64_t count) override {
    if (RouteOf(send, recv) != Route::kNccl) {
      return staged_->ReduceScatter(send, recv, count);  // host: through
    }
    nccl_->Join(NcclReduceScatter(send, recv, count), false);
  }
  void AllGather(const float* send, float* recv, int64_t count) override {
    if (RouteOf(send, recv) != Route::kNccl) {
      return staged_->AllGather(send, recv, count);  // host: through
    }
    nccl_->Join(NcclAllGather(send, recv, count), false);
  }
  void Broadcast(float* data, int64_t count, int root) override {
    if (RouteOf(data) == Route::kHost) {
      return inner_->Broadcast(data, count, root);
    }
    nccl_->Join(NcclBroadcast(data, count, root), false);
  }
  // GPU buffers: NCCL's grouped sends and receives; else the host's.
  void AllToAllV(const float* send, const int64_t* send_counts, float* recv,
                 const int64_t* recv_counts) override {
    if (RouteOf(send, recv) == Route::kHost) {
      return inner_->AllToAllV(send, send_counts, recv, recv_counts);
    }
    if (RouteOf(send, recv) == Route::kStaged) {
      return StagedAllToAllV(send, send_counts, recv, recv_counts);
    }
    int64_t bytes = 0;
    for (int r = 0; r < size(); ++r) bytes += send_counts[r];
    nccl_->Join(Record(nccl_->AllToAllV(send, send_counts, recv, recv_counts),
                       CommOp::kAllToAll, bytes * int64_t{sizeof(float)}),
                false);
  }
  void Send(const float* data, int64_t count, int peer, int tag) override {
    staged_->Send(data, count, peer, tag);
  }
  void Recv(float* data, int64_t count, int peer, int tag) override {
    staged_->Recv(data, count, peer, tag);
  }
  void Barrier() override { inner_->Barrier(); }

  // NCCL operations run on the communication stream beside the backend's
  // kernels until their handle is waited for (the backend's stream then
  // waits for them; the host never does).
  std::unique_ptr<CommHandle> AllReduceAsync(float* data,
                                             int64_t count) override {
    if (RouteOf(data) == Route::kHost) {
      return inner_->AllReduceAsync(data, count);
    }
    return Handle(NcclAllReduce(data, count, /*max=*/false));
  }
  std::unique_ptr<CommHandle> ReduceScatterAsync(const float* send, float* recv,
                                                 int64_t count) override {
    if (RouteOf(send, recv) != Route::kNccl) {
      return staged_->ReduceScatterAsync(send, recv, count);
    }
    return Handle(NcclReduceScatter(send, recv, count));
  }
  std::unique_ptr<CommHandle> AllGatherAsync(const float* send, float* recv,
                                             int64_t count) override {
    if (RouteOf(send, recv) != Route::kNccl) {
      return staged_->AllGatherAsync(send, recv, count);
    }
    return Handle(NcclAllGather(send, recv, count));
  }
  std::unique_ptr<CommHandle> BroadcastAsync(float* data, int64_t count,
                                             int root) override {
    if (RouteOf(data) == Route::kHost) {
      return inner_->BroadcastAsync(data, count, root);
    }
    return Handle(NcclBroadcast(data, count, root));
  }
  std::unique_ptr<CommHandle> SendAsync(const float* data, int64_t count,
                                        int peer, int tag) override {
    return staged_->SendAsync(data, count, peer, tag);
  }
  std::unique_ptr<CommHandle> RecvAsync(float* data, int64_t count, int peer,
                                        int tag) override {
    return staged_->RecvAsync(data, count, peer, tag);
  }

 private:
  // Where an operation's buffers send it: MPI for host memory, NCCL for
  // GPU memory, staged through the host when one of two is on each side.
  enum class Route { kHost, kStaged, kNccl };
  Route RouteOf(const void* a, const void* b = nullptr) const {
    const bool da = OnDevice(a), db = b == nullptr ? da : OnDevice(b);
    if (da && db) return Route::kNccl;
    return !da && !db ? Route::kHost : Route::kStaged;
  }
  bool OnDevice(const void* p) const {
    return p != nullptr && ops_->IsDeviceMemory(p);
  }
  // One buffer on the GPU, the other on the host: through host copies.
  void StagedAllToAllV(const float* send, const int64_t* send_counts,
                       float* recv, const int64_t* recv_counts) {
    int64_t sent = 0, received = 0;
    for (int r = 0; r < size(); ++r) {
      sent += send_counts[r];
      received += recv_counts[r];
    }
    std::vector<float> out(sent), in(received);
    if (OnDevice(send)) {
      ops_->ToHost(out.data(), send, sent);
    } else {
      std::memcpy(out.data(), send, sizeof(float) * sent);
    }
    inner_->AllToAllV(out.data(), send_counts, in.data(), recv_counts);
    if (OnDevice(recv)) {
      ops_->FromHost(recv, in.data(), received);
    } else {
      std::memcpy(recv, in.data(), sizeof(float) * received);
    }
  }
  // Each issues the operation on the communication stream and returns its
  // number (DeviceCollectives).
  int64_t NcclAllReduce(float* data, int64_t count, bool max) {
    return Record(nccl_->AllReduce(data, count, max), CommOp::kAllReduce,
                  count * int64_t{sizeof(float)});
  }
  int64_t NcclReduceScatter(const float* send, float* recv, int64_t count) {
    return Record(nccl_->ReduceScatter(send, recv, count),
                  CommOp::kReduceScatter,
                  count * size() * int64_t{sizeof(float)});
  }
  int64_t NcclAllGather(const float* send, float* recv, int64_t count) {
    return Record(nccl_->AllGather(send, recv, count), CommOp::kAllGather,
                  count * size() * int64_t{sizeof(float)});
  }
  int64_t NcclBroadcast(float* data, int64_t count, int root) {
    return Record(nccl_->Broadcast(data, count, root), CommOp::kBroadcast,
                  count * int64_t{sizeof(float)});
  }
  std::unique_ptr<CommHandle> Handle(int64_t k) {
    return std::make_unique<Issued>(nccl_.get(), k);
  }
  // Operation k was issued: its time is recorded once it finished.
  // In the flight recorder it is queued (the stream has not reached it)
  // until it is seen finished.
  int64_t Record(int64_t k, CommOp op, int64_t bytes) {
    const uint64_t id =
        recorder_ != nullptr
            ? recorder_->Issued(group(), op, bytes, -1, /*queued=*/true)
            : 0;
    pending_.push_back({op, bytes, id});
    Collect();
    return k;
  }
  void Collect() {
    for (double seconds : nccl_->FinishedSeconds()) {
      const Pending done = pending_.front();
      pending_.pop_front();
      inner_->stats().Record(group(), done.op, seconds, done.bytes);
      if (recorder_ != nullptr) recorder_->Completed(done.flight_id);
    }
    // The compute stream's stalls on waited handles: exposed.
    if (const double stalled = nccl_->StalledSeconds(); stalled > 0.0) {
      inner_->stats().RecordExposed(stalled);
    }
  }

  struct Pending {
    CommOp op;
    int64_t bytes;
    uint64_t flight_id;
  };
  Communicator* inner_;
  kernels::Ops* ops_;
  FlightRecorder* recorder_;
  std::unique_ptr<kernels::DeviceCollectives> nccl_;
  std::unique_ptr<Communicator> staged_;  // p2p, and mixed host/GPU buffers
  std::deque<Pending> pending_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(
    Communicator* inner, kernels::Ops* ops, FlightRecorder* recorder) {
  // Rank 0's id, behind a flag saying whether it has one, as floats (the
  // communicator's unit): MPI moves the bytes as they are.
  constexpr int kIdBytes = 128;
  constexpr int kFloats = 1 + kIdBytes / sizeof(float);
  std::vector<float> message(kFloats, 0.0f);
  std::string id, error;
  if (inner->rank() == 0 && kernels::NcclUniqueId(&id, &error) &&
      id.size() == kIdBytes) {
    message[0] = 1.0f;
    std::memcpy(message.data() + 1, id.data(), kIdBytes);
  }
  inner->Broadcast(message.data(), kFloats, 0);
  if (message[0] != 1.0f) {
    return absl::UnavailableError(absl::StrCat(
        "NCCL: no unique id for group ", inner->group(),
        inner->rank() == 0 ? absl::StrCat(": ", error) : std::string()));
  }
  id.assign(reinterpret_cast<const char*>(message.data() + 1), kIdBytes);
  std::unique_ptr<kernels::DeviceCollectives> nccl =
      kernels::MakeNcclCollectives(ops, id, inner->size(), inner->rank(),
                                   &error);
  const absl::Status mine =
      nccl != nullptr ? absl::OkStatus()
                      : absl::UnavailableError(absl::StrCat(
                            "NCCL for group ", inner->group(), ": ", error));
  if (absl::Status s =
          AgreeOnStatus(inner, mine, "NCCL failed to start on another rank");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(inner, ops, std::move(nccl), recorder));
}

}  // namespace ptrain
