// The CUDA module's NCCL collectives (kernels/backends.h DeviceCollectives) on
// a communication stream beside one backend's, and their entry points. No
// kernels of their own.
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels {

// NCCL statuses for PT_CUDA_CHECK (cuda_check.h).
inline bool Ok(ncclResult_t r) { return r == ncclSuccess; }
inline const char* Why(ncclResult_t r) { return ncclGetErrorString(r); }

namespace cuda_impl {
namespace {

// NCCL collectives on the backend's communication stream (one for all its
// groups, so that every rank issues their operations in one order, as NCCL
// needs of communicators sharing a GPU): each waits for the work issued on
// the backend's stream so far (an event), runs beside the backend's later
// kernels, and records an event at its end, which Join makes the backend's
// stream wait for and Done queries. Each is timed with a pair of events,
// read once both passed.
class NcclCollectives final : public DeviceCollectives {
 public:
  NcclCollectives(CudaBackend* backend, ncclComm_t comm, int size)
      : backend_(backend),
        comm_(comm),
        size_(size),
        stream_(backend->CommStream()) {}
  ~NcclCollectives() override {
    cudaSetDevice(backend_->device_index());
    cudaStreamSynchronize(backend_->stream());
    cudaStreamSynchronize(stream_);
    for (Timing& t : timings_) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.stop);
    }
    for (Timing& t : stalls_) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.stop);
    }
    for (Timing& t : spare_) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.stop);
    }
    for (auto& [k, end] : ends_) cudaEventDestroy(end);
    ncclCommDestroy(comm_);
  }

  int size() const override { return size_; }

  int64_t AllReduce(float* data, int64_t count, bool max) override {
    return Issue([&](cudaStream_t s) {
      PT_CUDA_CHECK(ncclAllReduce(data, data, count, ncclFloat32,
                                  max ? ncclMax : ncclSum, comm_, s));
    });
  }
  int64_t ReduceScatter(const float* send, float* recv,
                        int64_t count) override {
    return Issue([&](cudaStream_t s) {
      PT_CUDA_CHECK(
          ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, comm_, s));
    });
  }
  int64_t AllGather(const float* send, float* recv, int64_t count) override {
    return Issue([&](cudaStream_t s) {
      PT_CUDA_CHECK(ncclAllGather(send, recv, count, ncclFloat32, comm_, s));
    });
  }
  int64_t AllToAllV(const float* send, const int64_t* send_counts, float* recv,
                    const int64_t* recv_counts) override {
    return Issue([&](cudaStream_t s) {
      PT_CUDA_CHECK(ncclGroupStart());
      int64_t sent = 0, received = 0;
      for (int r = 0; r < size_; ++r) {
        if (send_counts[r] > 0) {
          PT_CUDA_CHECK(
              ncclSend(send + sent, send_counts[r], ncclFloat32, r, comm_, s));
        }
        if (recv_counts[r] > 0) {
          PT_CUDA_CHECK(ncclRecv(recv + received, recv_counts[r], ncclFloat32,
                                 r, comm_, s));
        }
        sent += send_counts[r];
        received += recv_counts[r];
      }
      PT_CUDA_CHECK(ncclGroupEnd());
    });
  }
  int64_t Broadcast(float* data, int64_t count, int root) override {
    return Issue([&](cudaStream_t s) {
      PT_CUDA_CHECK(
          ncclBroadcast(data, data, count, ncclFloat32, root, comm_, s));
    });
  }

  void Join(int64_t k, bool exposed) override {
    Sweep();
    // Operations end in the order issued: the newest end at or before k
    // stands for all of them; none left means all have ended.
    for (auto it = ends_.rbegin(); it != ends_.rend(); ++it) {
      if (it->first > k) continue;
      const cudaStream_t compute = backend_->stream();
      Timing stall{};
      if (exposed) {
        stall = Spare();
        PT_CUDA_CHECK(cudaEventRecord(stall.start, compute));
      }
      PT_CUDA_CHECK(cudaStreamWaitEvent(compute, it->second, 0));
      if (exposed) {
        PT_CUDA_CHECK(cudaEventRecord(stall.stop, compute));
        stalls_.push_back(stall);
      }
      return;
    }
  }
  double StalledSeconds() override {
    double seconds = 0.0;
    for (double s : Passed(&stalls_)) seconds += s;
    return seconds;
  }
  bool Done(int64_t k) override {
    Sweep();
    return ends_.empty() || ends_.front().first > k;
  }

  std::vector<double> FinishedSeconds() override { return Passed(&timings_); }

 private:
  struct Timing {
    cudaEvent_t start, stop;
  };
  // A pair of timing events, reused once read.
  Timing Spare() {
    Timing t;
    if (!spare_.empty()) {
      t = spare_.back();
      spare_.pop_back();
    } else {
      PT_CUDA_CHECK(cudaEventCreate(&t.start));
      PT_CUDA_CHECK(cudaEventCreate(&t.stop));
    }
    return t;
  }
  // The seconds between each pair of `pairs` (oldest first) whose stop has
  // passed, in order, up to the first that has not; those pairs are reused.
  std::vector<double> Passed(std::deque<Timing>* pairs) {
    std::vector<double> out;
    while (!pairs->empty()) {
      Timing& t = pairs->front();
      const cudaError_t done = cudaEventQuery(t.stop);
      if (done == cudaErrorNotReady) break;
      PT_CUDA_CHECK(done);
      float ms = 0.0f;
      PT_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
      out.push_back(ms * 1e-3);
      spare_.push_back(t);
      pairs->pop_front();
    }
    return out;
  }
  template <typename Fn>
  int64_t Issue(Fn enqueue) {
    Timing t = Spare();
    // After everything the backend's stream has been given.
    cudaEvent_t ready;
    PT_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    PT_CUDA_CHECK(cudaEventRecord(ready, backend_->stream()));
    PT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    PT_CUDA_CHECK(cudaEventDestroy(ready));  // released once it has fired
    PT_CUDA_CHECK(cudaEventRecord(t.start, stream_));
    enqueue(stream_);
    PT_CUDA_CHECK(cudaEventRecord(t.stop, stream_));
    timings_.push_back(t);
    cudaEvent_t end;
    PT_CUDA_CHECK(cudaEventCreateWithFlags(&end, cudaEventDisableTiming));
    PT_CUDA_CHECK(cudaEventRecord(end, stream_));
    ends_.emplace_back(++issued_, end);
    Sweep();
    return issued_;
  }
  // Forgets the ends that have passed, oldest first.
  void Sweep() {
    while (!ends_.empty()) {
      const cudaError_t done = cudaEventQuery(ends_.front().second);
      if (done == cudaErrorNotReady) return;
      PT_CUDA_CHECK(done);
      PT_CUDA_CHECK(cudaEventDestroy(ends_.front().second));
      ends_.pop_front();
    }
  }

  CudaBackend* backend_;
  ncclComm_t comm_;
  const int size_;
  const cudaStream_t stream_;   // the backend's communication stream
  std::deque<Timing> timings_;  // issued, not yet read
  std::deque<Timing> stalls_;   // exposed joins on the backend's stream
  std::vector<Timing> spare_;
  // The end of each operation issued and not yet seen to have passed, by
  // number, oldest first.
  std::deque<std::pair<int64_t, cudaEvent_t>> ends_;
  int64_t issued_ = 0;
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
