// The CUDA module's NCCL collectives (ops_cuda.h DeviceCollectives) on one
// backend's stream, and their entry points. No kernels of their own.
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels {

// NCCL statuses for PT_CUDA_CHECK (cuda_check.h).
inline bool Ok(ncclResult_t r) { return r == ncclSuccess; }
inline const char* Why(ncclResult_t r) { return ncclGetErrorString(r); }

namespace cuda_impl {
namespace {

// NCCL collectives on one backend's stream: each is ordered after every op
// issued on it so far and before every op issued later, so the engine needs
// no waits. Each is timed with a pair of events, read once both passed.
class NcclCollectives final : public DeviceCollectives {
 public:
  NcclCollectives(CudaBackend* backend, ncclComm_t comm, int size)
      : backend_(backend), comm_(comm), size_(size) {}
  ~NcclCollectives() override {
    cudaSetDevice(backend_->device_index());
    cudaStreamSynchronize(backend_->stream());
    for (Timing& t : timings_) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.stop);
    }
    ncclCommDestroy(comm_);
  }

  int size() const override { return size_; }

  void AllReduce(float* data, int64_t count, bool max) override {
    Timed([&](cudaStream_t s) {
      PT_CUDA_CHECK(ncclAllReduce(data, data, count, ncclFloat32,
                                  max ? ncclMax : ncclSum, comm_, s));
    });
  }
  void ReduceScatter(const float* send, float* recv, int64_t count) override {
    Timed([&](cudaStream_t s) {
      PT_CUDA_CHECK(
          ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, comm_, s));
    });
  }
  void AllGather(const float* send, float* recv, int64_t count) override {
    Timed([&](cudaStream_t s) {
      PT_CUDA_CHECK(ncclAllGather(send, recv, count, ncclFloat32, comm_, s));
    });
  }
  void Broadcast(float* data, int64_t count, int root) override {
    Timed([&](cudaStream_t s) {
      PT_CUDA_CHECK(
          ncclBroadcast(data, data, count, ncclFloat32, root, comm_, s));
    });
  }

  std::vector<double> FinishedSeconds() override {
    std::vector<double> out;
    while (!timings_.empty()) {
      Timing& t = timings_.front();
      const cudaError_t done = cudaEventQuery(t.stop);
      if (done == cudaErrorNotReady) break;
      PT_CUDA_CHECK(done);
      float ms = 0.0f;
      PT_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
      out.push_back(ms * 1e-3);
      spare_.push_back(t);
      timings_.pop_front();
    }
    return out;
  }

 private:
  struct Timing {
    cudaEvent_t start, stop;
  };
  template <typename Fn>
  void Timed(Fn enqueue) {
    Timing t;
    if (!spare_.empty()) {
      t = spare_.back();
      spare_.pop_back();
    } else {
      PT_CUDA_CHECK(cudaEventCreate(&t.start));
      PT_CUDA_CHECK(cudaEventCreate(&t.stop));
    }
    const cudaStream_t s = backend_->stream();
    PT_CUDA_CHECK(cudaEventRecord(t.start, s));
    enqueue(s);
    PT_CUDA_CHECK(cudaEventRecord(t.stop, s));
    timings_.push_back(t);
  }

  CudaBackend* backend_;
  ncclComm_t comm_;
  const int size_;
  std::deque<Timing> timings_;  // issued, not yet read
  std::vector<Timing> spare_;
};

}  // namespace
}  // namespace cuda_impl

extern "C" bool ptrain_nccl_unique_id(std::string* id, std::string* error) {
  ncclUniqueId u;
  const ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) {
    *error = std::string("ncclGetUniqueId: ") + ncclGetErrorString(r);
    return false;
  }
  id->assign(u.internal, sizeof(u.internal));
  return true;
}

extern "C" DeviceCollectives* ptrain_nccl_make(Ops* ops, const std::string* id,
                                               int nranks, int rank,
                                               std::string* error) {
  auto* backend = dynamic_cast<cuda_impl::CudaBackend*>(ops);
  ncclUniqueId u;
  if (backend == nullptr || id->size() != sizeof(u.internal)) {
    *error = backend == nullptr ? "NCCL needs the CUDA backend"
                                : "an NCCL unique id of the wrong size";
    return nullptr;
  }
  std::memcpy(u.internal, id->data(), sizeof(u.internal));
  PT_CUDA_CHECK(cudaSetDevice(backend->device_index()));
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, nranks, u, rank);
  if (r != ncclSuccess) {
    *error = std::string("ncclCommInitRank: ") + ncclGetErrorString(r) + " (" +
             ncclGetLastError(nullptr) + ")";
    return nullptr;
  }
  return new cuda_impl::NcclCollectives(backend, comm, nranks);
}

}  // namespace ptrain::kernels
