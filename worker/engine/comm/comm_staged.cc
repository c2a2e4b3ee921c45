// See comm_staged.h.
#include "worker/engine/comm/comm_staged.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

namespace ptrain {
namespace {

using HostBuffer = std::vector<float>;

// A started operation on host copies: when the inner one completes, `done`
// copies the result back into the backend's memory (once).
class StagedHandle : public CommHandle {
 public:
  StagedHandle(std::unique_ptr<CommHandle> inner,
               std::unique_ptr<HostBuffer> host, std::function<void()> done)
      : inner_(std::move(inner)), host_(std::move(host)), done_(done) {}
  ~StagedHandle() override { Wait(); }

  void Wait() override {
    inner_->Wait();
    Finish();
  }
  bool Test() override {
    if (!inner_->Test()) return false;
    Finish();
    return true;
  }

 private:
  void Finish() {
    if (done_) std::exchange(done_, nullptr)();
  }

  std::unique_ptr<CommHandle> inner_;
  std::unique_ptr<HostBuffer> host_;  // what the inner operation works on
  std::function<void()> done_;
};

class StagedCommunicator : public Communicator {
 public:
  StagedCommunicator(Communicator* inner, kernels::Ops* ops)
      : inner_(inner), ops_(ops) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& group() const override { return inner_->group(); }
  CommStats& stats() override { return inner_->stats(); }

  void AllReduce(float* data, int64_t count) override {
    if (!OnDevice(data)) return inner_->AllReduce(data, count);
    float* h = Stage(&host_, data, count);
    inner_->AllReduce(h, count);
    ops_->FromHost(data, h, count);
  }
  void AllReduce(double* data, int64_t count) override {
    // Doubles are host-side sums (norms, losses): never staged.
    inner_->AllReduce(data, count);
  }
  void AllReduceMax(float* data, int64_t count) override {
    if (!OnDevice(data)) return inner_->AllReduceMax(data, count);
    float* h = Stage(&host_, data, count);
    inner_->AllReduceMax(h, count);
    ops_->FromHost(data, h, count);
  }
  void ReduceScatter(const float* send, float* recv, int64_t count) override {
    if (!OnDevice(send) && !OnDevice(recv)) {
      return inner_->ReduceScatter(send, recv, count);
    }
    const int64_t n = count * size();
    host_.resize(n + count);
    const float* s = Read(host_.data(), send, n);
    float* r = OnDevice(recv) ? host_.data() + n : recv;
    inner_->ReduceScatter(s, r, count);
    if (r != recv) ops_->FromHost(recv, r, count);
  }
  void AllGather(const float* send, float* recv, int64_t count) override {
    if (!OnDevice(send) && !OnDevice(recv)) {
      return inner_->AllGather(send, recv, count);
    }
    host_.resize(count * size());
    float* h = host_.data();
    // In place on the host copy: our part at its place, then the gather.
    ReadInto(h + rank() * count, send, count);
    inner_->AllGather(h + rank() * count, h, count);
    WriteBack(recv, h, count * size());
  }
  void Broadcast(float* data, int64_t count, int root) override {
    if (!OnDevice(data)) return inner_->Broadcast(data, count, root);
    float* h = Stage(&host_, data, count);
    inner_->Broadcast(h, count, root);
    ops_->FromHost(data, h, count);
  }
  void Send(const float* data, int64_t count, int peer, int tag) override {
    if (!OnDevice(data)) return inner_->Send(data, count, peer, tag);
    host_.resize(count);
    ops_->ToHost(host_.data(), data, count);
    inner_->Send(host_.data(), count, peer, tag);
  }
  void Recv(float* data, int64_t count, int peer, int tag) override {
    if (!OnDevice(data)) return inner_->Recv(data, count, peer, tag);
    host_.resize(count);
    inner_->Recv(host_.data(), count, peer, tag);
    ops_->FromHost(data, host_.data(), count);
  }
  void Barrier() override { inner_->Barrier(); }

  std::unique_ptr<CommHandle> AllReduceAsync(float* data,
                                             int64_t count) override {
    if (!OnDevice(data)) return inner_->AllReduceAsync(data, count);
    auto host = std::make_unique<HostBuffer>();
    float* h = Stage(host.get(), data, count);
    auto inner = inner_->AllReduceAsync(h, count);
    return Started(std::move(inner), std::move(host),
                   [=, this] { ops_->FromHost(data, h, count); });
  }
  std::unique_ptr<CommHandle> ReduceScatterAsync(const float* send, float* recv,
                                                 int64_t count) override {
    if (!OnDevice(send) && !OnDevice(recv)) {
      return inner_->ReduceScatterAsync(send, recv, count);
    }
    const int64_t n = count * size();
    auto host = std::make_unique<HostBuffer>(n + count);
    const float* s = Read(host->data(), send, n);
    float* r = OnDevice(recv) ? host->data() + n : recv;
    auto inner = inner_->ReduceScatterAsync(s, r, count);
    return Started(std::move(inner), std::move(host), [=, this] {
      if (r != recv) ops_->FromHost(recv, r, count);
    });
  }
  std::unique_ptr<CommHandle> AllGatherAsync(const float* send, float* recv,
                                             int64_t count) override {
    if (!OnDevice(send) && !OnDevice(recv)) {
      return inner_->AllGatherAsync(send, recv, count);
    }
    auto host = std::make_unique<HostBuffer>(count * size());
    float* h = host->data();
    ReadInto(h + rank() * count, send, count);
    auto inner = inner_->AllGatherAsync(h + rank() * count, h, count);
    return Started(std::move(inner), std::move(host),
                   [=, this] { WriteBack(recv, h, count * size()); });
  }
  std::unique_ptr<CommHandle> BroadcastAsync(float* data, int64_t count,
                                             int root) override {
    if (!OnDevice(data)) return inner_->BroadcastAsync(data, count, root);
    auto host = std::make_unique<HostBuffer>();
    float* h = Stage(host.get(), data, count);
    auto inner = inner_->BroadcastAsync(h, count, root);
    return Started(std::move(inner), std::move(host),
                   [=, this] { ops_->FromHost(data, h, count); });
  }
  std::unique_ptr<CommHandle> SendAsync(const float* data, int64_t count,
                                        int peer, int tag) override {
    if (!OnDevice(data)) return inner_->SendAsync(data, count, peer, tag);
    auto host = std::make_unique<HostBuffer>(count);
    ops_->ToHost(host->data(), data, count);
    auto inner = inner_->SendAsync(host->data(), count, peer, tag);
    return Started(std::move(inner), std::move(host), nullptr);
  }
  std::unique_ptr<CommHandle> RecvAsync(float* data, int64_t count, int peer,
                                        int tag) override {
    if (!OnDevice(data)) return inner_->RecvAsync(data, count, peer, tag);
    auto host = std::make_unique<HostBuffer>(count);
    float* h = host->data();
    auto inner = inner_->RecvAsync(h, count, peer, tag);
    return Started(std::move(inner), std::move(host),
                   [=, this] { ops_->FromHost(data, h, count); });
  }

 private:
  bool OnDevice(const void* p) const {
    return p != nullptr && ops_->IsDeviceMemory(p);
  }
  // A host copy of `data` (count) in *host.
  float* Stage(HostBuffer* host, const float* data, int64_t count) {
    host->resize(count);
    ops_->ToHost(host->data(), data, count);
    return host->data();
  }
  // `src` as host memory: itself, or copied into `host`.
  const float* Read(float* host, const float* src, int64_t n) {
    if (!OnDevice(src)) return src;
    ops_->ToHost(host, src, n);
    return host;
  }
  void ReadInto(float* host, const float* src, int64_t n) {
    if (OnDevice(src)) {
      ops_->ToHost(host, src, n);
    } else if (host != src) {
      std::copy(src, src + n, host);
    }
  }
  void WriteBack(float* dst, const float* host, int64_t n) {
    if (OnDevice(dst)) {
      ops_->FromHost(dst, host, n);
    } else {
      std::copy(host, host + n, dst);
    }
  }
  std::unique_ptr<CommHandle> Started(std::unique_ptr<CommHandle> inner,
                                      std::unique_ptr<HostBuffer> host,
                                      std::function<void()> done) {
    return std::make_unique<StagedHandle>(std::move(inner), std::move(host),
                                          std::move(done));
  }

  Communicator* inner_;
  kernels::Ops* ops_;
  HostBuffer host_;  // the blocking operations' copy
};

}  // namespace

std::unique_ptr<Communicator> MakeStagedCommunicator(Communicator* inner,
                                                     kernels::Ops* ops) {
  return std::make_unique<StagedCommunicator>(inner, ops);
}

}  // namespace ptrain
