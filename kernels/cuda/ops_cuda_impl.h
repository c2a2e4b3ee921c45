// The CUDA backend's private parts, shared by its sources (one per op
// family, as in kernels/cpu/): launch and reduction helpers, the op timer
// and the CudaBackend class. Not the module's interface (kernels/backends.h).
#ifndef PTRAIN_KERNELS_CUDA_OPS_CUDA_IMPL_H_
#define PTRAIN_KERNELS_CUDA_OPS_CUDA_IMPL_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/check.h"
#include "kernels/backends.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention.h"

namespace ptrain::kernels {

// cuBLAS(Lt) statuses for PT_CUDA_CHECK (cuda_check.h), beside the CUDA
// runtime's (NCCL's: nccl.cu).
inline bool Ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline const char* Why(cublasStatus_t s) { return cublasGetStatusString(s); }

// Hidden, as they were in one source's anonymous namespace: the module
// exports its entry points (ops_cuda_loader.cpp), not the backend's parts.
#pragma GCC visibility push(hidden)
namespace cuda_impl {

constexpr int kThreads = 256;

inline int Blocks(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 65535 * 16 ? b : 65535 * 16);
}

// --- reductions ------------------------------------------------------------

__device__ __forceinline__ float WarpSum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float WarpMax(float x) {
  for (int o = 16; o > 0; o >>= 1) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  }
  return x;
}
// Block-wide reduction (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result.
template <typename T, typename Op>
__device__ T BlockReduce(T x, Op op, T init) {
  __shared__ T shared[32];
  __shared__ T result;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o >>= 1)
    x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  if (warp == 0) {
    T y = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : init;
    for (int o = 16; o > 0; o >>= 1) {
      y = op(y, __shfl_xor_sync(0xffffffffu, y, o));
    }
    if (lane == 0) result = y;
  }
  __syncthreads();
  return result;
}
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The grid-stride loop: fn(i) for each i < n this thread takes.
template <typename Fn>
__device__ __forceinline__ void ForEachIndex(int64_t n, Fn fn) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    fn(i);
  }
}

// An element of an fp32 or bf16 tensor as a float, and a float stored as
// one (bf16: rounded to nearest even).
__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// PTRAIN_CUDA_OP_TIMES=1: every op is bracketed by CUDA events and the
// backend prints each op's total GPU time when it is destroyed — where a
// step's time goes, without a profiler.
class OpTimes {
 public:
  OpTimes() {
    const char* env = std::getenv("PTRAIN_CUDA_OP_TIMES");
    enabled_ = env != nullptr && std::string(env) == "1";
  }
  bool enabled() const { return enabled_; }
  void Add(const char* name, cudaEvent_t start, cudaEvent_t stop) {
    pending_.push_back({name, start, stop});
    if (pending_.size() >= 4096) Resolve();
  }
  // Waits for the recorded events and adds up their times.
  void Resolve() {
    for (const Pending& p : pending_) {
      float ms = 0.0f;
      cudaEventSynchronize(p.stop);
      cudaEventElapsedTime(&ms, p.start, p.stop);
      auto& t = totals_[p.name];
      t.first += ms;
      t.second += 1;
      cudaEventDestroy(p.start);
      cudaEventDestroy(p.stop);
    }
    pending_.clear();
  }
  void Print() {
    Resolve();
    double all = 0.0;
    for (const auto& [name, t] : totals_) all += t.first;
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [name, t] : totals_) rows.push_back({t.first, name});
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "cuda op times (GPU ms, all calls):\n");
    for (const auto& [ms, name] : rows) {
      std::fprintf(stderr, "  %-32s %10.2f ms %5.1f%%  %lld calls\n",
                   name.c_str(), ms, 100.0 * ms / all,
                   static_cast<long long>(totals_[name].second));
    }
  }

 private:
  struct Pending {
    const char* name;
    cudaEvent_t start, stop;
  };
  bool enabled_ = false;
  std::vector<Pending> pending_;
  std::map<std::string, std::pair<double, int64_t>> totals_;
};

// Brackets one op on `stream` when timing is on.
class OpScope {
 public:
  OpScope(OpTimes* times, cudaStream_t stream, const char* name)
      : times_(times), stream_(stream), name_(name) {
    if (!times_->enabled()) return;
    cudaEventCreate(&start_);
    cudaEventCreate(&stop_);
    cudaEventRecord(start_, stream_);
  }
  ~OpScope() {
    if (!times_->enabled()) return;
    cudaEventRecord(stop_, stream_);
    times_->Add(name_, start_, stop_);
  }

 private:
  OpTimes* times_;
  cudaStream_t stream_;
  const char* name_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// A run (Ops::Run) on the device: where it starts in the buffer, its
// first element's index when the runs' elements are counted one run after
// another, and its tag.
struct RunEntry {
  int64_t begin, first;
  int tag;
  bool operator==(const RunEntry& o) const {
    return begin == o.begin && first == o.first && tag == o.tag;
  }
};

// The run (index into `t`, n entries) holding flat index k: the last whose
// `first` is at most k.
__device__ __forceinline__ int FindRun(const RunEntry* t, int n, int64_t k) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t[mid].first <= k) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The Ops seam on one GPU. Each op sits with its family's kernels, as in
// kernels/cpu/: encoder.cu, layernorm.cu, matmul.cu, attention.cu,
// elementwise.cu, crossentropy.cu and adamw.cu (with the sums of the
// gradient norm); its memory and lifetime in ops_cuda.cu.
class CudaBackend final : public Ops {
 public:
  explicit CudaBackend(const CudaOptions& o);
  ~CudaBackend() override;

  Device device() const override { return Device::kCuda; }
  // Under bf16 compute LayerNorm outputs, qkv, attention's output and fch
  // are stored in bf16: matmuls and the fused attention take them as they
  // are.
  DType activation_type() const override {
    return options_.bf16_compute ? DType::kBf16 : DType::kF32;
  }
  cudaStream_t stream() const { return stream_; }
  // The stream NCCL collectives run on beside stream() (nccl.cu), made at
  // the first call, at the device's highest priority (a collective holds
  // back the ranks it waits for).
  cudaStream_t CommStream();
  int device_index() const { return options_.device; }
  std::string name() const override;

  float* Alloc(int64_t n) override;
  void Free(float* p) override;
  int32_t* AllocTokens(int64_t n) override;
  void FreeTokens(int32_t* p) override;
  const int32_t* StageTokens(int32_t* staging, const int32_t* host,
                             int64_t n) override;
  void ToHost(float* host, const float* src, int64_t n) override;
  void FromHost(float* dst, const float* host, int64_t n) override;
  float* AllocHost(int64_t n) override;
  void FreeHost(float* p) override;
  int64_t ToHostAsync(float* host, const float* src, int64_t n) override;
  void FromHostAsync(float* dst, const float* host, int64_t n) override;
  void WaitCopy(int64_t k) override;
  void ComputeAfterCopies() override;
  void Synchronize() override {
    if (Refused("Synchronize")) return;
    PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  bool IsDeviceMemory(const void* p) const override;
  // CUDA graphs (graph.cu): the stream captured from fn's first op to its
  // last. An op that cannot be recorded (Refused) fails the capture
  // without calling CUDA.
  std::string CaptureUnsupported() const override;
  std::unique_ptr<OpsGraph> Capture(const std::function<void()>& fn,
                                    std::string* error) override;
  // Counts the moves of the backend's own buffers (a grow-only buffer
  // reallocated): a graph recorded before a move reads freed memory.
  int64_t buffer_moves() const { return buffer_moves_; }

  void Zero(float* p, int64_t n) override;
  void Copy(float* dst, const float* src, int64_t n) override;
  void Add(float* dst, const float* src, int64_t n) override;
  void CopyRows(float* dst, int64_t dst_stride, const float* src,
                int64_t src_stride, int64_t rows, int64_t cols,
                bool add) override;
  void Convert(Act dst, ConstAct src, int64_t rows, int64_t cols) override;
  double Sum(const float* x, int64_t n) override;
  double SumSquares(const float* x, int64_t n) override;

  void embedding_forward(float* out, const int32_t* inp, const float* wte,
                         int B, int T, int C, int vocab_begin, int Vl) override;
  void embedding_backward(float* dwte, const float* dout, const int32_t* inp,
                          int B, int T, int C, int vocab_begin,
                          int Vl) override;
  void position_forward(float* out, const float* wpe, int B, int T, int C,
                        int t0) override;
  void position_backward(float* dwpe, const float* dout, int B, int T, int C,
                         int t0) override;
  void layernorm_forward(Act out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int B, int T,
                         int C) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias,
                          const float* dout, const float* inp,
                          const float* weight, const float* mean,
                          const float* rstd, int B, int T, int C) override;
  void residual_layernorm_forward(float* residual, Act out, float* mean,
                                  float* rstd, const float* inp1,
                                  const float* inp2, const float* weight,
                                  const float* bias, int B, int T,
                                  int C) override;
  void rmsnorm_forward(Act out, float* rstd, const float* inp,
                       const float* weight, float eps, int B, int T,
                       int C) override;
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout,
                        const float* inp, const float* weight,
                        const float* rstd, int B, int T, int C) override;
  void residual_rmsnorm_forward(float* residual, Act out, float* rstd,
                                const float* inp1, const float* inp2,
                                const float* weight, float eps, int B, int T,
                                int C) override;
  void matmul_forward(Act out, ConstAct inp, ConstAct weight, const float* bias,
                      int B, int T, int C, int OC) override;
  void matmul_backward(float* dinp, float* dweight, float* dbias, ConstAct dout,
                       ConstAct inp, ConstAct weight, int B, int T, int C,
                       int OC) override;
  void gelu_matmul_forward(float* out, float* hidden, float* saved,
                           ConstAct inp, ConstAct weight, const float* bias,
                           int B, int T, int C, int OC) override;
  void gelu_matmul_backward(Act dinp, float* dweight, float* dbias,
                            const float* dout, float* hidden,
                            const float* saved, ConstAct inp, ConstAct weight,
                            int B, int T, int C, int OC) override;
  void attention_forward(Act out, float* att, ConstAct inp, int B, int T, int C,
                         int NH, int KVH) override;
  void attention_block_forward(float* out, float* lse, const float* qkv,
                               const float* kv, int64_t kv_stride, int B,
                               int Tl, int C, int NH, int KVH, int cp,
                               int q_rank, int k_rank, bool first) override;
  void attention_block_backward(float* dqkv, float* dkv, const float* dout,
                                const float* qkv, const float* out,
                                const float* lse, const float* kv,
                                int64_t kv_stride, int B, int Tl, int C, int NH,
                                int KVH, int cp, int q_rank,
                                int k_rank) override;
  void attention_backward(float* dinp, float* datt, const float* dout,
                          ConstAct inp, ConstAct out, const float* att, int B,
                          int T, int C, int NH, int KVH) override;
  void attention_decode(Act out, float* kcache, float* vcache, ConstAct qkv,
                        int n, int pos, int C, int NH, int KVH,
                        int capacity) override;
  // Under bf16 compute the MLP projection's operand, GELU(fch) rounded to
  // bf16, as the forward made it: the backward's weight gradient reads it
  // instead of a second GELU pass (two bytes a value).
  int64_t gelu_saved_floats(int64_t rows, int C) const override {
    return options_.bf16_compute ? (rows * C + 1) / 2 : 0;
  }
  int64_t attention_saved_floats(int64_t B, int64_t T, int C,
                                 int NH) const override;
  void gelu_forward(float* out, const float* inp, int64_t N) override;
  void gelu_backward(float* dinp, ConstAct inp, const float* dout,
                     int64_t N) override;
  void rope_forward(float* x, int64_t stride, int B, int n, int heads, int hs,
                    int pos0, const math::Rope& rope, bool inverse) override;
  void swiglu_forward(float* out, ConstAct gate_up, int64_t rows,
                      int H) override;
  void swiglu_backward(float* dgate_up, const float* dout, ConstAct gate_up,
                       int64_t rows, int H) override;
  // Mixture-of-Experts (moe.cu).
  void moe_router_forward(int32_t* experts, float* weights, float* scores,
                          const float* logits, const float* bias, int N, int E,
                          int k, math::RouterScore kind,
                          bool normalize) override;
  void moe_router_backward(float* dlogits, const float* dweights,
                           const int32_t* experts, const float* scores, int N,
                           int E, int k, math::RouterScore kind,
                           bool normalize) override;
  double moe_aux_loss(float* dlogits, const float* scores,
                      const int32_t* experts, float coef, float dloss, int N,
                      int segment, int E, int k, math::RouterScore kind,
                      const float* counts, int length) override;
  double moe_z_loss(float* dlogits, const float* logits, float coef,
                    float dloss, int N, int E) override;
  int64_t moe_dispatch_plan(int32_t* slots, int32_t* order, int32_t* counts,
                            int32_t* offsets, int32_t* host_offsets,
                            const int32_t* experts, int N, int k, int E,
                            int capacity, int segment,
                            const int32_t* base) override;
  void moe_permute_forward(float* out, const float* inp, const int32_t* order,
                           int M, int k, int C) override;
  void moe_permute_backward(float* dinp, const float* dout,
                            const int32_t* slots, int N, int k, int C) override;
  void moe_unpermute_forward(float* out, const float* inp, const float* weights,
                             const int32_t* slots, int N, int k,
                             int C) override;
  void moe_unpermute_backward(float* dinp, float* dweights, const float* dout,
                              const float* inp, const float* weights,
                              const int32_t* slots, int N, int k,
                              int C) override;
  void bias_forward(float* out, const float* bias, int64_t rows,
                    int OC) override;
  void residual_forward(float* out, const float* inp1, const float* inp2,
                        int64_t N) override;
  void crossentropy_parallel_max(float* maxes, const float* logits, int B,
                                 int T, int Vl, int vocab_begin,
                                 int V) override;
  void crossentropy_parallel_exp(float* sums, float* target_shifted,
                                 float* probs, const float* logits,
                                 const float* maxes, const int32_t* targets,
                                 int B, int T, int Vl, int vocab_begin,
                                 int V) override;
  void crossentropy_parallel_finish(float* losses, float* probs,
                                    const float* sums,
                                    const float* target_shifted, int B, int T,
                                    int Vl) override;
  void crossentropy_forward(float* losses, float* probs, const float* logits,
                            const int32_t* targets, float* stats, int B, int T,
                            int Vl, int V) override;
  void crossentropy_parallel_backward(float* dlogits, const float* probs,
                                      const int32_t* targets, float dloss,
                                      int B, int T, int Vl,
                                      int vocab_begin) override;
  void crossentropy_forward_backward(float* losses, Act logits,
                                     const int32_t* targets, float dloss,
                                     float* stats, int B, int T, int Vl,
                                     int V) override;
  void crossentropy_parallel_finish_backward(float* losses, float* exps,
                                             const float* sums,
                                             const float* target_shifted,
                                             const int32_t* targets,
                                             float dloss, int B, int T, int Vl,
                                             int vocab_begin) override;
  void adamw_update(float* params, float* m, float* v, const float* grads,
                    int64_t N, float lr, float beta1, float beta2, float eps,
                    float weight_decay, int64_t t, float grad_scale) override;
  void adamw_update_runs(float* params, void* params_bf16, float* m, float* v,
                         const float* grads, const Ops::Run* runs, int n,
                         float lr, float beta1, float beta2, float eps,
                         float weight_decay, int64_t t,
                         float grad_scale) override;
  void SumSquaresRuns(const float* x, const Ops::Run* runs, int n,
                      double sums[2]) override;

 private:
  static constexpr size_t kWorkspaceBytes = 32u << 20;
  // The largest table of runs a kernel copies into shared memory (more is
  // read from global memory).
  static constexpr size_t kRunTableSharedBytes = 32u << 10;

  void Launched() { PT_CUDA_CHECK(cudaGetLastError()); }

  // During a capture: true, and the capture fails naming `op`, which
  // cannot be recorded (it allocates, waits for the device or copies to or
  // from the host); the op then does nothing. Else false.
  bool Refused(const char* op) {
    if (!capturing_) return false;
    if (capture_error_.empty()) {
      capture_error_ = std::string(op) +
                       " allocates, waits for the GPU or copies from or to "
                       "the host, which a CUDA graph cannot record";
    }
    return true;
  }
  bool capturing_ = false;
  std::string capture_error_;  // the first op Refused in this capture
  int64_t buffer_moves_ = 0;

  // Whether `a` is stored in bf16, which only bf16 compute takes.
  bool Bf16Storage(ConstAct a) const {
    if (a.type == DType::kF32) return false;
    PT_CHECK(options_.bf16_compute,
             "a bf16 activation passed to the fp32 CUDA backend");
    return true;
  }

  // Whether attention over heads of C / NH takes the fused kernels.
  bool Fused(int C, int NH) const {
    return options_.bf16_compute && options_.fused_attention &&
           FlashAttentionSupports(C / NH, major_);
  }

  // One kernel that is the whole of op `name`: launched on the stream with
  // `blocks` blocks of kThreads, timed under PTRAIN_CUDA_OP_TIMES, checked.
  template <typename... Params, typename... Args>
  void Run(const char* name, void (*kernel)(Params...), int blocks,
           Args&&... args) {
    const OpScope scope(&times_, stream_, name);
    kernel<<<blocks, kThreads, 0, stream_>>>(std::forward<Args>(args)...);
    Launched();
  }

  // The sum of x's elements, or of their squares, in double (adamw.cu).
  template <bool kSquares>
  double Reduce(const float* x, int64_t n);

  // The backward of LayerNorm, or of RMSNorm where mean is null (no dbias
  // then), over `rows` rows (layernorm.cu).
  void NormBackward(float* dinp, float* dweight, float* dbias,
                    const float* dout, const float* inp, const float* weight,
                    const float* mean, const float* rstd, int64_t rows, int C);
  // ColumnSumsKernel over `rows` rows of dout (layernorm.cu): dbias += the
  // column sums of dout (when dbias is not null) and, with inp, dweight +=
  // those of (x - mean) rstd dout (x rstd dout where mean is null); summed in
  // an order fixed by the shapes (no atomics), so that the replicas of a
  // tensor-parallel group get the same bits.
  void ColumnSums(float* dweight, float* dbias, ConstAct dout, const float* inp,
                  const float* mean, const float* rstd, int64_t rows, int C);

  // The whole-vocabulary softmax/cross-entropy of `rows` rows
  // (crossentropy.cu): one read of each row where it is 16-byte aligned and
  // short enough to be held in registers, else the two-read kernel. kGradient:
  // the fused classifier's gradient in place of the probabilities.
  template <bool kGradient, typename L>
  void ClassifierRows(const char* name, float* losses, L* probs,
                      const L* logits, const int32_t* targets, int rows, int Vl,
                      int V, float dloss);

  // A grow-only device buffer of T: reallocated, once the stream is done
  // with the old one, only when a request is larger than it.
  template <typename T>
  struct GrowOnly {
    T* p = nullptr;
    int64_t size = 0;
  };
  template <typename T>
  T* Grow(GrowOnly<T>* b, int64_t n) {
    if (n > b->size) {
      // Recorded, the old buffer's kernels are never run: the capture
      // fails, and the first run of the shape op by op grows it.
      if (Refused("a scratch buffer growing")) return b->p;
      ++buffer_moves_;
      if (b->p != nullptr) {
        PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
        PT_CUDA_CHECK(cudaFree(b->p));
      }
      b->p = nullptr;
      PT_CUDA_CHECK(cudaMalloc(&b->p, n * sizeof(T)));
      b->size = n;
    }
    return b->p;
  }
  // Attention's permuted copies.
  float* Scratch(int64_t n) { return Grow(&scratch_, n); }

  // A table of runs on the device, uploaded when it differs from the one
  // it holds (a caller's runs stay the same from step to step).
  struct RunTable {
    GrowOnly<RunEntry> dev;
    std::vector<RunEntry> host;
    int64_t total = 0;  // the runs' elements
  };

  // A matmul's or the fused attention's input: fp32 as given, or its bf16
  // copy.
  struct Op {
    const void* p;
    cudaDataType_t type;
  };
  // Under bf16 compute, x (n floats) rounded to bf16 into scratch `slot`
  // (valid until the next op that uses the slot), for a matmul or the fused
  // attention: cuBLASLt's native bf16 kernels on such operands ran the
  // matmuls of a step about 1.5 times as fast as fp32 operands under
  // CUBLAS_COMPUTE_32F_FAST_16BF, rounding included (docs/cuda.md). Else
  // x itself.
  Op Operand(ConstAct x, int64_t n, int slot);
  // Operand for the fused attention, which reads it 16 bytes at a time: a
  // stored bf16 tensor off that alignment is copied into `slot` first.
  Op FusedOperand(ConstAct x, int64_t n, int slot);
  // Under bf16 compute, GELU(x) rounded to bf16 into scratch `slot`, or
  // into `into` (n bf16 values) where given, one pass: the MLP projection's
  // input, whose fp32 GELU is never written.
  Op GeluOperand(ConstAct x, int64_t n, int slot, void* into = nullptr);
  template <bool kGelu, typename S>
  Op Rounded(const S* x, int64_t n, int slot, void* into = nullptr);
  // Around a kernel that reads and writes fp32 (matmul.cu): x (n) as fp32,
  // itself or its bf16 values unpacked into unpacked_[slot]; where an op
  // writes `out` (n) in fp32, itself or unpacked_[slot], which Finish
  // rounds into it.
  const float* AsF32(ConstAct x, int64_t n, int slot);
  float* F32Target(Act out, int64_t n, int slot);
  void Finish(Act out, const float* y, int64_t n);
  // matmul_backward's products over rows BT, with its input as the operand
  // `in` (Operand's or GeluOperand's, in slot 2).
  void MatmulBackward(float* dinp, float* dweight, float* dbias, ConstAct dout,
                      Op in, ConstAct weight, int64_t BT, int C, int OC);
  // Both backwards' weight gradients: dweight += in^T d (d: dout as the
  // products' operand), dbias (may be null) += dout's column sums.
  void WeightGradients(float* dweight, float* dbias, ConstAct dout, Op d, Op in,
                       int64_t BT, int C, int OC);
  // dinp (n) = GELU'(inp) dout, in dinp's type (elementwise.cu; dinp
  // may be dout).
  void GeluBackwardInto(Act dinp, ConstAct inp, const float* dout, int64_t n);

  // A matmul's output: fp32, or bf16 rounded to nearest even.
  struct Dst {
    void* p;
    cudaDataType_t type;
  };
  // Column-major D (m,n) = alpha op(A) op(B) + beta D through cuBLASLt,
  // accumulation fp32, plus the epilogue: bias (m, fp32; rounded to bf16
  // first for a bf16 D, as cuBLASLt takes a bias of D's type) on every
  // column when given; with `dgelu` (GELU's input, of D's type and layout)
  // D multiplied by GELU' of it. False, with nothing launched, where no
  // algorithm takes the DGELU epilogue (the caller does without it); any
  // other failure is fatal.
  bool Matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, Op A,
              int64_t lda, Op B, int64_t ldb, float beta, Dst D, int64_t ldd,
              const float* bias, const void* dgelu = nullptr);

  template <typename Q>
  static cudaDataType_t TypeOf() {
    return sizeof(Q) == 2 ? CUDA_R_16BF : CUDA_R_32F;
  }

  // Q: the type of the products' inputs (float, or bf16).
  template <typename Q>
  void Attention(float* out, float* att, const float* inp, int B, int T, int C,
                 int NH, int KVH);
  template <typename Q>
  void AttentionBackward(float* dinp, float* datt, const float* dout,
                         const float* inp, const float* att, int B, int T,
                         int C, int NH, int KVH);

  // Strided batched column-major D (fp32) = op(A) op(B), through cuBLAS;
  // A and B fp32 or bf16.
  void Batched(bool trans_a, bool trans_b, int m, int n, int k, const void* A,
               cudaDataType_t a_type, int lda, int64_t sa, const void* B,
               cudaDataType_t b_type, int ldb, int64_t sb, float* D, int ldd,
               int64_t sd, int batch);

  const CudaOptions options_;
  int major_ = 0;  // compute capability
  // How the fused attention's backward makes dq: kFlashDqDefault, or
  // PTRAIN_CUDA_FLASH_DQ=atomic|pass (to compare the two, as the GPU tests
  // and docs/cuda.md's figures do).
  const FlashDq flash_dq_ = FlashDqFromEnv();
  // Dynamic shared memory AttentionDecodeKernel may use (48 KiB needs no
  // opt-in; more is asked for once, as a longer cache needs it).
  size_t decode_shared_ = 48u << 10;
  // Likewise for the one-kernel LayerNorm backward (2·C floats a warp):
  // rows too wide for the device's opt-in limit (max_shared_) take two
  // kernels.
  size_t layernorm_shared_ = 48u << 10;
  size_t max_shared_ = 48u << 10;
  OpTimes times_;
  cudaStream_t stream_ = nullptr;
  // The copy queue of ToHostAsync/FromHostAsync (made at the first), the
  // number of the last copy issued, and an event recorded after each
  // ToHostAsync not yet waited for.
  cudaStream_t copy_stream_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;  // CommStream()
  int64_t copies_ = 0;
  std::map<int64_t, cudaEvent_t> copy_done_;
  // The copy stream, after the compute stream's work so far.
  cudaStream_t CopyStreamAfterCompute();
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasComputeType_t compute_;
  void* workspace_ = nullptr;
  double* sum_ = nullptr;  // Reduce's sum; SumSquaresRuns' two
  GrowOnly<float> scratch_;
  // The Mixture-of-Experts ops' scratch (moe.cu).
  GrowOnly<float> moe_floats_;
  GrowOnly<int32_t> moe_ints_;
  // Column sums' per-chunk partials (layernorm.cu).
  GrowOnly<float> partials_;
  // A matmul's shape, alignments, types and epilogue: the algorithm
  // cuBLASLt's heuristic chose for it (none: no algorithm takes the
  // epilogue).
  using AlgoKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int, int, int, int, int, bool,
                             cudaDataType_t, cudaDataType_t, int>;
  std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> algos_;
  GrowOnly<__nv_bfloat16> bias16_;   // a bias rounded for a bf16 D
  GrowOnly<__nv_bfloat16> bf16_[3];  // Operand's slots
  GrowOnly<float> unpacked_[2];      // AsF32's and F32Target's slots
  // `runs` (n) into `table` on the device, unless it holds them already;
  // returns whether it fits in the shared memory of a block (48 KiB).
  bool Upload(const Ops::Run* runs, int n, RunTable* table);
  // The tables of adamw_update_runs and SumSquaresRuns.
  RunTable adam_runs_, norm_runs_;
  // The sums' partials (adamw.cu): a sum takes at most kSumBlocks blocks,
  // each writing its partials (two for SumSquaresRuns) at its index after
  // sum_'s two results (the constructor allocates 2 + 2·kSumBlocks), and
  // one block adds them in index order: no atomics, the same bits each run.
  static constexpr int kSumBlocks = 1024;
  double* SumPartials() const { return sum_ + 2; }
  // embedding_backward's sort (encoder.cu): the (row, position) pairs and
  // their sorted copy (2·BT each), and CUB's temporary storage.
  GrowOnly<uint32_t> embed_rows_;
  GrowOnly<int32_t> embed_positions_;
  GrowOnly<unsigned char> embed_sort_temp_;
};

}  // namespace cuda_impl
#pragma GCC visibility pop
}  // namespace ptrain::kernels

#endif  // PTRAIN_KERNELS_CUDA_OPS_CUDA_IMPL_H_
