// The backends behind the Ops seam (kernels/ops.h), as the engine reaches
// them: what a machine offers (its GPUs, the CPU's bf16), the factory of the
// CUDA backend and of the collectives among GPUs, and the CPU's sgemm that
// measures the matmul peak. The engine includes this and kernels/ops.h, never
// a backend's own headers (kernels/cpu/, kernels/cuda/).
//
// The CUDA backend: the same ops on one GPU's memory, in fp32 storage, on
// one stream. Matmuls (cuBLASLt, with the bias as an epilogue) and
// attention's products compute in fp32 or, with bf16 compute, on bf16 tensor
// cores with fp32 accumulation; attention under bf16 compute is one fused
// kernel each way (kernels/cuda/flash_attention.h). Every sum has an order
// fixed by the shapes, with no floating-point atomics (but for the fused
// attention's dq under PTRAIN_CUDA_FLASH_DQ=atomic): the embedding's weight
// gradient sorts the positions by token and adds each token's rows in an
// order fixed by their count, and the sums add per-block partials in block
// order. The same inputs give the same bits from run to run on one GPU model
// and toolkit.
#ifndef PTRAIN_KERNELS_BACKENDS_H_
#define PTRAIN_KERNELS_BACKENDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace ptrain::kernels {

// True when oneDNN may use AVX512_BF16 here (the CPU has it and
// ONEDNN_MAX_CPU_ISA does not forbid it).
bool CpuHasBf16();
// c = a·bᵀ for n×n row-major fp32 matrices, by the sgemm the CPU backend's
// fp32 matmuls use (for measuring its peak).
void CpuSquareSgemm(int n, const float* a, const float* b, float* c);

struct CudaOptions {
  int device = 0;
  // Matmul compute: false for fp32, true for bf16 tensor cores (inputs
  // rounded to bf16, fp32 accumulation and output).
  bool bf16_compute = false;
  // With bf16 compute: attention through the fused kernels
  // (flash_attention.h) where the head size allows, rather than cuBLAS
  // products over (T,T) scores in memory.
  bool fused_attention = true;
};

// Devices the CUDA runtime sees (0 without a driver or GPU, or when the
// backend is not built).
int CudaDeviceCount();

// GPU `device`'s compute capability as 10·major + minor (90 for 9.0); 0
// where it cannot be read (no such device, or the backend not built).
int CudaComputeCapability(int device);
// GPU `device`'s memory in bytes; 0 where it cannot be read.
int64_t CudaTotalMemory(int device);
// The capability bf16 training needs (bf16 tensor cores: 8.0), and why a
// GPU of `capability` cannot train in bf16 ("" when it can).
constexpr int kBf16Capability = 80;
std::string Bf16Unsupported(int capability);

// Why the CUDA backend would record no CUDA graphs (Ops::Capture): not
// built, or PTRAIN_CUDA_OP_TIMES=1 (its timer brackets each op with events
// of its own); "" where it would.
std::string CudaCaptureUnsupported();
// Its words for the second.
inline constexpr char kOpTimesRecordNoGraphs[] =
    "PTRAIN_CUDA_OP_TIMES=1 brackets each op with timing events, which a "
    "CUDA graph would not time: unset it to record";

// Why no GPU can be trained on here (no device, no driver, or the backend
// not built); "" when one can.
std::string CudaUnavailableReason();

// The backend on options.device; null with *error set when there is no such
// device or the backend is not built (PT_CUDA=OFF or no nvcc).
std::unique_ptr<Ops> MakeCudaOps(const CudaOptions& options,
                                 std::string* error);

// Collectives among the GPUs of a group of processes (NCCL), on memory of
// one CUDA backend, on a communication stream of their own beside the
// backend's (so that they overlap its kernels): each runs after every op
// issued on the backend so far, and the backend's later ops wait for it
// where the caller joins it. Sums unless said otherwise; counts are
// elements; the same contracts as the engine's Communicator
// (worker/engine/comm/comm.h).
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  virtual int size() const = 0;
  // Each operation runs on the collectives' own stream, after all the work
  // the backend's stream has been given so far (its inputs are ready), and
  // returns its number. Join(k): the backend's stream waits for operation k
  // (and every one before it) before its later work; the host does not
  // wait. Done(k): whether operation k has finished. Until joined, the
  // backend's later work may run beside it: it must not touch its buffers.
  virtual int64_t AllReduce(float* data, int64_t count, bool max) = 0;
  virtual int64_t ReduceScatter(const float* send, float* recv,
                                int64_t count) = 0;
  virtual int64_t AllGather(const float* send, float* recv, int64_t count) = 0;
  virtual int64_t Broadcast(float* data, int64_t count, int root) = 0;
  // Blocks of send_counts[r] elements to each rank r and of recv_counts[r]
  // from it, packed in rank order (Communicator::AllToAllV): one group of
  // sends and receives.
  virtual int64_t AllToAllV(const float* send, const int64_t* send_counts,
                            float* recv, const int64_t* recv_counts) = 0;
  // exposed: time how long the backend's stream stalls on the wait (an
  // operation meant to be hidden behind the backend's work).
  virtual void Join(int64_t k, bool exposed) = 0;
  virtual bool Done(int64_t k) = 0;
  // The seconds the backend's stream stalled on exposed joins that have
  // passed since the last call.
  virtual double StalledSeconds() = 0;
  // The GPU seconds of the operations that finished since the last call, in
  // the order they were issued (a prefix of those still unread).
  virtual std::vector<double> FinishedSeconds() = 0;
};

// A new NCCL unique id (bytes), on one process of the group, which hands it
// to the others. False with *error where NCCL is not available.
bool NcclUniqueId(std::string* id, std::string* error);
// This process's member (rank of nranks) of the group of `id`, on the memory
// and stream of `backend` (a CUDA backend). Collective over the group.
std::unique_ptr<DeviceCollectives> MakeNcclCollectives(Ops* backend,
                                                       const std::string& id,
                                                       int nranks, int rank,
                                                       std::string* error);

// Bytes of the device's memory in use by this process and in total.
struct CudaMemory {
  int64_t used = 0, total = 0;
};
CudaMemory CudaMemoryInfo();

}  // namespace ptrain::kernels

#endif  // PTRAIN_KERNELS_BACKENDS_H_
