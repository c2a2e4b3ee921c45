// The CUDA backend: see ops_cuda.h. Kernels here, in the CPU kernels'
// order; per-element formulas from kernels/common/math.h.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/check.h"
#include "kernels/common/math.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/ops_cuda.h"

namespace ptrain::kernels {

// cuBLAS(Lt) and NCCL statuses for PT_CUDA_CHECK (cuda_check.h), beside
// the CUDA runtime's.
inline bool Ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline bool Ok(ncclResult_t r) { return r == ncclSuccess; }
inline const char* Why(cublasStatus_t s) { return cublasGetStatusString(s); }
inline const char* Why(ncclResult_t r) { return ncclGetErrorString(r); }

namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n, int threads = kThreads) {
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

// --- elementwise -----------------------------------------------------------

// The grid-stride loop: fn(i) for each i < n this thread takes.
template <typename Fn>
__device__ __forceinline__ void ForEachIndex(int64_t n, Fn fn) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    fn(i);
  }
}

__global__ void AddKernel(float* dst, const float* src, int64_t n) {
  ForEachIndex(n, [&](int64_t i) { dst[i] += src[i]; });
}

__global__ void ResidualKernel(float* out, const float* a, const float* b,
                               int64_t n) {
  ForEachIndex(n, [&](int64_t i) { out[i] = a[i] + b[i]; });
}

__global__ void BiasKernel(float* out, const float* bias, int64_t n, int OC) {
  ForEachIndex(n, [&](int64_t i) { out[i] += bias[i % OC]; });
}

// fp32 -> bf16, rounded to nearest even: a matmul's or the fused
// attention's input under bf16 compute. The first 4 * n4 elements four at a
// thread step (16-byte loads, 8-byte stores; `in` 16-byte aligned when n4 > 0),
// the rest one by one.
__global__ void ToBf16Kernel(__nv_bfloat16* out, const float* in, int64_t n,
                             int64_t n4) {
  ForEachIndex(n4, [&](int64_t i) {
    const float4 v = reinterpret_cast<const float4*>(in)[i];
    auto* o = reinterpret_cast<__nv_bfloat162*>(out) + 2 * i;
    o[0] = __floats2bfloat162_rn(v.x, v.y);
    o[1] = __floats2bfloat162_rn(v.z, v.w);
  });
  ForEachIndex(n - 4 * n4, [&](int64_t i) {
    out[4 * n4 + i] = __float2bfloat16_rn(in[4 * n4 + i]);
  });
}

__global__ void GeluForwardKernel(float* out, const float* inp, int64_t n) {
  ForEachIndex(n, [&](int64_t i) {
    const float x = inp[i];
    out[i] = math::GeluFromExp(x, expf(math::GeluExponent(x)));
  });
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp,
                                   const float* dout, int64_t n) {
  ForEachIndex(n, [&](int64_t i) {
    const float x = inp[i];
    dinp[i] = math::GeluGradFromExp(x, expf(math::GeluExponent(x))) * dout[i];
  });
}

__global__ void AdamWKernel(float* params, float* m, float* v,
                            const float* grads, int64_t n,
                            math::AdamWStep step) {
  ForEachIndex(n, [&](int64_t i) {
    float p = params[i], mi = m[i], vi = v[i];
    math::AdamWUpdate(p, mi, vi, grads[i], step);
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
  });
}

template <bool kSquares>
__global__ void SumKernel(double* out, const float* x, int64_t n) {
  double acc = 0.0;
  ForEachIndex(n, [&](int64_t i) {
    const double xi = x[i];
    acc += kSquares ? xi * xi : xi;
  });
  acc = BlockReduce(acc, SumOp(), 0.0);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

// --- encoder ---------------------------------------------------------------

// Element i of a (B,T,C) embedding output: where its value sits in this
// rank's rows of wte ([vocab_begin, vocab_begin + Vl)), or -1 when the
// token's row is another rank's.
__device__ __forceinline__ int64_t WteIndex(const int32_t* inp, int64_t i,
                                            int C, int vocab_begin, int Vl) {
  const int64_t row = static_cast<int64_t>(inp[i / C]) - vocab_begin;
  return row >= 0 && row < Vl ? row * C + i % C : -1;
}

__global__ void EmbeddingForwardKernel(float* out, const int32_t* inp,
                                       const float* wte, int64_t BT, int C,
                                       int vocab_begin, int Vl) {
  const int64_t n = BT * C;
  ForEachIndex(n, [&](int64_t i) {
    const int64_t at = WteIndex(inp, i, C, vocab_begin, Vl);
    out[i] = at >= 0 ? wte[at] : 0.0f;
  });
}

__global__ void EmbeddingBackwardKernel(float* dwte, const float* dout,
                                        const int32_t* inp, int64_t BT, int C,
                                        int vocab_begin, int Vl) {
  const int64_t n = BT * C;
  ForEachIndex(n, [&](int64_t i) {
    const int64_t at = WteIndex(inp, i, C, vocab_begin, Vl);
    if (at >= 0) atomicAdd(&dwte[at], dout[i]);
  });
}

__global__ void PositionForwardKernel(float* out, const float* wpe, int B,
                                      int T, int C, int t0) {
  const int64_t n = static_cast<int64_t>(B) * T * C;
  ForEachIndex(n, [&](int64_t i) {
    const int64_t t = (i / C) % T;
    out[i] += wpe[(t0 + t) * C + i % C];
  });
}

// One thread per (t, c): the sum over the batch in a fixed order.
__global__ void PositionBackwardKernel(float* dwpe, const float* dout, int B,
                                       int T, int C, int t0) {
  const int64_t n = static_cast<int64_t>(T) * C;
  ForEachIndex(n, [&](int64_t i) {
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += dout[static_cast<int64_t>(b) * n + i];
    dwpe[static_cast<int64_t>(t0) * C + i] += acc;
  });
}

// --- LayerNorm -------------------------------------------------------------

// One warp per row.
__global__ void LayerNormForwardKernel(float* out, float* mean, float* rstd,
                                       const float* inp, const float* weight,
                                       const float* bias, int64_t rows, int C) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* x = inp + r * C;
  float sum = 0.0f;
  for (int i = lane; i < C; i += 32) sum += x[i];
  const float m = WarpSum(sum) / C;
  float sum_sq = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float xm = x[i] - m;
    sum_sq += xm * xm;
  }
  const float s = math::LayerNormRstd(WarpSum(sum_sq) / C);
  float* o = out + r * C;
  for (int i = lane; i < C; i += 32)
    o[i] = (x[i] - m) * s * weight[i] + bias[i];
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

// The input gradient, one warp per row.
__global__ void LayerNormBackwardInputKernel(
    float* dinp, const float* dout, const float* inp, const float* weight,
    const float* mean, const float* rstd, int64_t rows, int C) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* x = inp + r * C;
  const float* dy = dout + r * C;
  const float m = mean[r], s = rstd[r];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float dnorm = weight[i] * dy[i];
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * (x[i] - m) * s;
  }
  const float dnorm_mean = WarpSum(dnorm_sum) / C;
  const float dnorm_norm_mean = WarpSum(dnorm_norm_sum) / C;
  float* dx = dinp + r * C;
  for (int i = lane; i < C; i += 32) {
    dx[i] += math::LayerNormInputGrad(weight[i] * dy[i], (x[i] - m) * s,
                                      dnorm_mean, dnorm_norm_mean, s);
  }
}

// Column sums over rows, accumulated: a block of 32 columns x 8 row lanes
// takes a chunk of kChunkRows rows, then adds its sums atomically. With
// `inp` (LayerNorm), sums[0] gets (x - mean) rstd dy and sums[1] dy;
// without, sums[1] gets dy (a bias gradient).
constexpr int kChunkRows = 256;
__global__ void ColumnSumsKernel(float* dweight, float* dbias,
                                 const float* dout, const float* inp,
                                 const float* mean, const float* rstd,
                                 int64_t rows, int C) {
  __shared__ float sw[8][33];
  __shared__ float sb[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kChunkRows;
  const int64_t r1 = r0 + kChunkRows < rows ? r0 + kChunkRows : rows;
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float dy = dout[r * C + c];
      ab += dy;
      if (inp != nullptr) aw += (inp[r * C + c] - mean[r]) * rstd[r] * dy;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int y = 1; y < 8; ++y) {
      aw += sw[y][threadIdx.x];
      ab += sb[y][threadIdx.x];
    }
    if (inp != nullptr) atomicAdd(&dweight[c], aw);
    atomicAdd(&dbias[c], ab);
  }
}

// --- attention -------------------------------------------------------------

// fp32 -> the attention products' input type (fp32, or bf16 under bf16
// compute).
__device__ __forceinline__ void Store(float* p, float x) { *p = x; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float x) {
  *p = __float2bfloat16(x);
}
__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}

// Element i of a head-major (B,NH,T,hs) tensor: its offset in the
// position-major layout (B,T,width,NH,hs), where width is 3 for the q, k,
// v rows of the attention input and 1 for a (B,T,C) tensor.
__device__ __forceinline__ int64_t PositionMajor(int64_t i, int T, int NH,
                                                 int hs, int width) {
  const int d = i % hs;
  const int t = (i / hs) % T;
  const int h = (i / (int64_t(hs) * T)) % NH;
  const int64_t b = i / (int64_t(hs) * T * NH);
  return (b * T + t) * width * NH * hs + int64_t(h) * hs + d;
}

// inp (B,T,3,NH,hs) -> q, k, v (B,NH,T,hs).
template <typename Q>
__global__ void PermuteQkvKernel(Q* q, Q* k, Q* v, const float* inp, int B,
                                 int T, int NH, int hs) {
  const int64_t n = static_cast<int64_t>(B) * NH * T * hs;
  const int C = NH * hs;
  ForEachIndex(n, [&](int64_t i) {
    const int64_t src = PositionMajor(i, T, NH, hs, 3);
    Store(q + i, inp[src]);
    Store(k + i, inp[src + C]);
    Store(v + i, inp[src + 2 * C]);
  });
}

// y (B,NH,T,hs) -> out (B,T,NH,hs).
__global__ void UnpermuteKernel(float* out, const float* y, int B, int T,
                                int NH, int hs) {
  const int64_t n = static_cast<int64_t>(B) * NH * T * hs;
  ForEachIndex(n,
               [&](int64_t i) { out[PositionMajor(i, T, NH, hs, 1)] = y[i]; });
}

// Generation's cached attention (kernels/cpu/kernels.h attention_decode).
// The new positions' keys and values, qkv (n,3,NH,hs), into the caches
// (NH,capacity,hs) at rows [pos, pos + n).
__global__ void KvCacheWriteKernel(float* kcache, float* vcache,
                                   const float* qkv, int n, int pos, int NH,
                                   int hs, int capacity) {
  const int C = NH * hs;
  ForEachIndex(int64_t(n) * C, [&](int64_t i) {
    const int t = i / C, c = i % C, h = c / hs, d = c % hs;
    const int64_t src = int64_t(t) * 3 * C + c;
    const int64_t dst = (int64_t(h) * capacity + pos + t) * hs + d;
    kcache[dst] = qkv[src + C];
    vcache[dst] = qkv[src + 2 * C];
  });
}

// One block per (head, new position i): scores against cache rows
// [0, pos + i] in dynamic shared memory, their softmax, then each output
// channel as the probability-weighted sum of the cached values.
__global__ void AttentionDecodeKernel(float* out, const float* kcache,
                                      const float* vcache, const float* qkv,
                                      int pos, int NH, int hs, int capacity) {
  extern __shared__ float scores[];
  const int h = blockIdx.x, i = blockIdx.y, C = NH * hs;
  const int len = pos + i + 1;
  const float* q = qkv + int64_t(i) * 3 * C + int64_t(h) * hs;
  const float* k = kcache + int64_t(h) * capacity * hs;
  const float* v = vcache + int64_t(h) * capacity * hs;
  const float scale = rsqrtf(static_cast<float>(hs));
  float mx = -INFINITY;
  for (int t = threadIdx.x; t < len; t += blockDim.x) {
    float dot = 0.0f;
    for (int d = 0; d < hs; ++d) dot += q[d] * k[int64_t(t) * hs + d];
    scores[t] = dot * scale;
    mx = fmaxf(mx, dot * scale);
  }
  mx = BlockReduce(mx, MaxOp(), -INFINITY);
  float sum = 0.0f;
  for (int t = threadIdx.x; t < len; t += blockDim.x) {
    const float e = expf(scores[t] - mx);
    scores[t] = e;
    sum += e;
  }
  sum = BlockReduce(sum, SumOp(), 0.0f);  // its barrier publishes scores
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    float acc = 0.0f;
    for (int t = 0; t < len; ++t) acc += scores[t] * v[int64_t(t) * hs + d];
    out[int64_t(i) * C + int64_t(h) * hs + d] = acc / sum;
  }
}

// dout (B,T,NH,hs) -> dy (B,NH,T,hs).
template <typename Q>
__global__ void PermuteOutKernel(Q* dy, const float* dout, int B, int T, int NH,
                                 int hs) {
  const int64_t n = static_cast<int64_t>(B) * NH * T * hs;
  ForEachIndex(n, [&](int64_t i) {
    Store(dy + i, dout[PositionMajor(i, T, NH, hs, 1)]);
  });
}

// dinp (B,T,3,NH,hs) += dq, dk, dv (B,NH,T,hs).
__global__ void UnpermuteQkvAddKernel(float* dinp, const float* dq,
                                      const float* dk, const float* dv, int B,
                                      int T, int NH, int hs) {
  const int64_t n = static_cast<int64_t>(B) * NH * T * hs;
  const int C = NH * hs;
  ForEachIndex(n, [&](int64_t i) {
    const int64_t dst = PositionMajor(i, T, NH, hs, 3);
    dinp[dst] += dq[i];
    dinp[dst + C] += dk[i];
    dinp[dst + 2 * C] += dv[i];
  });
}

// The scaled causal softmax of the scores (B*NH*T rows of T) into att;
// entries above the diagonal become 0. att may be scores itself (fp32):
// each element is read before the same thread writes it. One warp per row.
template <typename A>
__global__ void CausalSoftmaxKernel(A* att, const float* scores, int64_t rows,
                                    int T, float scale) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int t1 = static_cast<int>(r % T);
  const float* row = scores + r * T;
  float mx = -FLT_MAX;
  for (int t2 = lane; t2 <= t1; t2 += 32) mx = fmaxf(mx, row[t2] * scale);
  mx = WarpMax(mx);
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t1; t2 += 32) sum += expf(row[t2] * scale - mx);
  const float inv = 1.0f / WarpSum(sum);
  A* out = att + r * T;
  for (int t2 = lane; t2 < T; t2 += 32) {
    Store(out + t2, t2 <= t1 ? expf(row[t2] * scale - mx) * inv : 0.0f);
  }
}

// The gradient of the scaled scores, att (datt - sum(att datt)) scale, 0
// above the diagonal, into dscores (which may be datt itself, fp32).
template <typename A, typename D>
__global__ void CausalSoftmaxBackwardKernel(D* dscores, const float* datt,
                                            const A* att, int64_t rows, int T,
                                            float scale) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int t1 = static_cast<int>(r % T);
  const float* d = datt + r * T;
  const A* a = att + r * T;
  float dot = 0.0f;
  for (int t2 = lane; t2 <= t1; t2 += 32) dot += Load(a + t2) * d[t2];
  dot = WarpSum(dot);
  D* out = dscores + r * T;
  for (int t2 = lane; t2 < T; t2 += 32) {
    Store(out + t2, t2 <= t1 ? Load(a + t2) * (d[t2] - dot) * scale : 0.0f);
  }
}

// --- cross-entropy ---------------------------------------------------------

// One block per row.
__global__ void CrossEntropyMaxKernel(float* maxes, const float* logits, int Vl,
                                      int vocab_begin, int V) {
  const int64_t r = blockIdx.x;
  const float* l = logits + r * Vl;
  const int real = V - vocab_begin < Vl ? V - vocab_begin : Vl;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < real; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = BlockReduce(mx, MaxOp(), -INFINITY);
  if (threadIdx.x == 0) maxes[r] = mx;
}

__global__ void CrossEntropyExpKernel(float* sums, float* target_shifted,
                                      float* probs, const float* logits,
                                      const float* maxes,
                                      const int32_t* targets, int Vl,
                                      int vocab_begin, int V) {
  const int64_t r = blockIdx.x;
  const float* l = logits + r * Vl;
  float* p = probs + r * Vl;
  const float mx = maxes[r];
  const int real = V - vocab_begin < Vl ? V - vocab_begin : Vl;
  // The target's logit is read before probs (which may alias logits) is
  // written.
  if (threadIdx.x == 0) {
    const int t = targets[r] - vocab_begin;
    target_shifted[r] = t >= 0 && t < Vl ? l[t] - mx : 0.0f;
  }
  __syncthreads();
  float sum = 0.0f;
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
    const float e = j < real ? expf(l[j] - mx) : 0.0f;
    p[j] = e;
    sum += e;
  }
  sum = BlockReduce(sum, SumOp(), 0.0f);
  if (threadIdx.x == 0) sums[r] = sum;
}

__global__ void CrossEntropyFinishKernel(float* losses, float* probs,
                                         const float* sums,
                                         const float* target_shifted, int Vl) {
  const int64_t r = blockIdx.x;
  float* p = probs + r * Vl;
  const float inv = 1.0f / sums[r];
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) p[j] *= inv;
  if (threadIdx.x == 0) {
    losses[r] = math::CrossEntropyLoss(sums[r], target_shifted[r]);
  }
}

// The three steps in one block per row and three passes over it (two
// reads, one write): each thread keeps a running maximum and the sum of
// exponentials relative to it, and the block combines them.
__global__ void CrossEntropyForwardKernel(float* losses, float* probs,
                                          const float* logits,
                                          const int32_t* targets, int Vl,
                                          int V) {
  const int64_t r = blockIdx.x;
  const float* l = logits + r * Vl;
  float* p = probs + r * Vl;
  const int real = V < Vl ? V : Vl;
  // The target's logit is read before probs (which may alias logits) is
  // written; the block's reductions order the two.
  const float target = threadIdx.x == 0 ? l[targets[r]] : 0.0f;
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < real; j += blockDim.x) {
    const float x = l[j];
    if (x > m) {
      s = s * expf(m - x) + 1.0f;
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  const float mx = BlockReduce(m, MaxOp(), -INFINITY);
  const float sum =
      BlockReduce(m == -INFINITY ? 0.0f : s * expf(m - mx), SumOp(), 0.0f);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
    p[j] = j < real ? expf(l[j] - mx) * inv : 0.0f;
  }
  if (threadIdx.x == 0) {
    losses[r] = math::CrossEntropyLoss(sum, target - mx);
  }
}

__global__ void CrossEntropyBackwardKernel(float* dlogits, const float* probs,
                                           const int32_t* targets, float dloss,
                                           int64_t rows, int Vl,
                                           int vocab_begin) {
  const int64_t n = rows * Vl;
  ForEachIndex(n, [&](int64_t i) {
    const int64_t r = i / Vl;
    const int j = static_cast<int>(i % Vl);
    const float onehot = targets[r] - vocab_begin == j ? 1.0f : 0.0f;
    dlogits[i] = (probs[i] - onehot) * dloss;  // may be probs itself
  });
}

// --- the backend -----------------------------------------------------------

int Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (int align : {256, 128, 64, 32, 16, 8}) {
    if (a % align == 0) return align;
  }
  return 4;
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

class CudaBackend final : public Ops {
 public:
  explicit CudaBackend(const CudaOptions& o) : options_(o) {
    PT_CUDA_CHECK(cudaSetDevice(o.device));
    PT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    PT_CUDA_CHECK(cublasLtCreate(&lt_));
    PT_CUDA_CHECK(cublasCreate(&blas_));
    PT_CUDA_CHECK(cublasSetStream(blas_, stream_));
    PT_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    PT_CUDA_CHECK(cublasSetWorkspace(blas_, workspace_, kWorkspaceBytes));
    PT_CUDA_CHECK(cudaMalloc(&sum_, sizeof(double)));
    PT_CUDA_CHECK(cudaDeviceGetAttribute(
        &major_, cudaDevAttrComputeCapabilityMajor, o.device));
    compute_ =
        o.bf16_compute ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  }
  ~CudaBackend() override {
    cudaSetDevice(options_.device);
    cudaStreamSynchronize(stream_);
    if (times_.enabled()) times_.Print();
    cudaFree(scratch_.p);
    for (GrowOnly<__nv_bfloat16>& b : bf16_) cudaFree(b.p);
    cudaFree(sum_);
    cudaFree(workspace_);
    cublasDestroy(blas_);
    cublasLtDestroy(lt_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::kCuda; }
  cudaStream_t stream() const { return stream_; }
  int device_index() const { return options_.device; }
  std::string name() const override {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, options_.device);
    return std::string("cuda:") + std::to_string(options_.device) + " (" +
           prop.name + (options_.bf16_compute ? ", bf16 compute)" : ", fp32)");
  }

  float* Alloc(int64_t n) override {
    float* p = nullptr;
    PT_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
    PT_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_));
    return p;
  }
  void Free(float* p) override {
    PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    PT_CUDA_CHECK(cudaFree(p));
  }
  int32_t* AllocTokens(int64_t n) override {
    int32_t* p = nullptr;
    PT_CUDA_CHECK(cudaMalloc(&p, n * sizeof(int32_t)));
    return p;
  }
  void FreeTokens(int32_t* p) override {
    PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    PT_CUDA_CHECK(cudaFree(p));
  }
  const int32_t* StageTokens(int32_t* staging, const int32_t* host,
                             int64_t n) override {
    // Synchronous: the caller may reuse its host buffer at once.
    PT_CUDA_CHECK(cudaMemcpyAsync(staging, host, n * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_));
    PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return staging;
  }
  void ToHost(float* host, const float* src, int64_t n) override {
    PT_CUDA_CHECK(cudaMemcpyAsync(host, src, n * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_));
    PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void FromHost(float* dst, const float* host, int64_t n) override {
    PT_CUDA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(float),
                                  cudaMemcpyHostToDevice, stream_));
    PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void Synchronize() override { PT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  bool IsDeviceMemory(const void* p) const override {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // an unknown pointer: host memory
      return false;
    }
    return a.type == cudaMemoryTypeDevice;
  }

  void Zero(float* p, int64_t n) override {
    const OpScope scope(&times_, stream_, "Zero");
    PT_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_));
  }
  void Copy(float* dst, const float* src, int64_t n) override {
    const OpScope scope(&times_, stream_, "Copy");
    if (dst == src) return;
    PT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream_));
  }
  void Add(float* dst, const float* src, int64_t n) override {
    Run("Add", AddKernel, Blocks(n), dst, src, n);
  }
  double Sum(const float* x, int64_t n) override { return Reduce<false>(x, n); }
  double SumSquares(const float* x, int64_t n) override {
    return Reduce<true>(x, n);
  }

  void embedding_forward(float* out, const int32_t* inp, const float* wte,
                         int B, int T, int C, int vocab_begin,
                         int Vl) override {
    const int64_t BT = static_cast<int64_t>(B) * T;
    Run("embedding_forward", EmbeddingForwardKernel, Blocks(BT * C), out, inp,
        wte, BT, C, vocab_begin, Vl);
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* inp,
                          int B, int T, int C, int vocab_begin,
                          int Vl) override {
    const int64_t BT = static_cast<int64_t>(B) * T;
    Run("embedding_backward", EmbeddingBackwardKernel, Blocks(BT * C), dwte,
        dout, inp, BT, C, vocab_begin, Vl);
  }
  void position_forward(float* out, const float* wpe, int B, int T, int C,
                        int t0) override {
    Run("position_forward", PositionForwardKernel, Blocks(int64_t(B) * T * C),
        out, wpe, B, T, C, t0);
  }
  void position_backward(float* dwpe, const float* dout, int B, int T, int C,
                         int t0) override {
    Run("position_backward", PositionBackwardKernel, Blocks(int64_t(T) * C),
        dwpe, dout, B, T, C, t0);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int B, int T,
                         int C) override {
    const int64_t rows = static_cast<int64_t>(B) * T;
    Run("layernorm_forward", LayerNormForwardKernel, Blocks(rows * 32), out,
        mean, rstd, inp, weight, bias, rows, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias,
                          const float* dout, const float* inp,
                          const float* weight, const float* mean,
                          const float* rstd, int B, int T, int C) override {
    const OpScope scope(&times_, stream_, "layernorm_backward");
    const int64_t rows = static_cast<int64_t>(B) * T;
    LayerNormBackwardInputKernel<<<Blocks(rows * 32), kThreads, 0, stream_>>>(
        dinp, dout, inp, weight, mean, rstd, rows, C);
    Launched();
    ColumnSums(dweight, dbias, dout, inp, mean, rstd, rows, C);
  }
  void matmul_forward(float* out, const float* inp, const float* weight,
                      const float* bias, int B, int T, int C, int OC) override {
    const OpScope scope(&times_, stream_, "matmul_forward");
    const int64_t BT = static_cast<int64_t>(B) * T;
    // Column-major: out^T (OC,BT) = weight (C,OC)^T inp^T (C,BT).
    Matmul(true, false, OC, BT, C, Operand(weight, int64_t(C) * OC, 0), C,
           Operand(inp, BT * C, 1), C, 0.0f, out, OC, bias);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias,
                       const float* dout, const float* inp, const float* weight,
                       int B, int T, int C, int OC) override {
    const OpScope scope(&times_, stream_, "matmul_backward");
    const int64_t BT = static_cast<int64_t>(B) * T;
    // dout is rounded once for both products.
    const Op d = Operand(dout, BT * OC, 0);
    // dinp^T (C,BT) = weight^T... in column-major: (C,OC) (OC,BT).
    if (dinp != nullptr) {
      Matmul(false, false, C, BT, OC, Operand(weight, int64_t(C) * OC, 1), C, d,
             OC, 0.0f, dinp, C, nullptr);
    }
    // dweight^T (C,OC) += inp^T (C,BT) dout (BT,OC).
    Matmul(false, true, C, OC, BT, Operand(inp, BT * C, 2), C, d, OC, 1.0f,
           dweight, C, nullptr);
    if (dbias != nullptr) {
      ColumnSums(nullptr, dbias, dout, nullptr, nullptr, nullptr, BT, OC);
    }
  }
  // Under bf16 compute, heads of 16, 32 or 64 take the fused kernels
  // (flash_attention.h): `att` keeps one float per query row and `datt` is
  // (B,NH,T). Otherwise the products go through cuBLAS with the (T,T)
  // scores in memory; under bf16 compute q, k, v, the probabilities and the
  // score gradients are then bf16 (fp32 accumulation and fp32 scores), the
  // probabilities packed in the first half of `att`, which only this
  // backend's backward reads.
  void attention_forward(float* out, float* att, const float* inp, int B, int T,
                         int C, int NH) override {
    const OpScope scope(&times_, stream_, "attention_forward");
    if (Fused(C, NH)) {
      const Op qkv = Operand(inp, int64_t(B) * T * 3 * C, 0);
      FlashAttentionForward(out, att, static_cast<const __nv_bfloat16*>(qkv.p),
                            B, T, NH, C / NH, stream_);
    } else if (options_.bf16_compute) {
      Attention<__nv_bfloat16>(out, att, inp, B, T, C, NH);
    } else {
      Attention<float>(out, att, inp, B, T, C, NH);
    }
  }
  void attention_backward(float* dinp, float* datt, const float* dout,
                          const float* inp, const float* out, const float* att,
                          int B, int T, int C, int NH) override {
    const OpScope scope(&times_, stream_, "attention_backward");
    if (Fused(C, NH)) {
      const int64_t n = int64_t(B) * T * C;
      const Op qkv = Operand(inp, 3 * n, 0), dy = Operand(dout, n, 1);
      FlashAttentionBackward(dinp, datt, dout,
                             static_cast<const __nv_bfloat16*>(dy.p), out,
                             static_cast<const __nv_bfloat16*>(qkv.p), att, B,
                             T, NH, C / NH, stream_);
    } else if (options_.bf16_compute) {
      AttentionBackward<__nv_bfloat16>(dinp, datt, dout, inp, att, B, T, C, NH);
    } else {
      AttentionBackward<float>(dinp, datt, dout, inp, att, B, T, C, NH);
    }
  }
  // fp32 throughout (generation is one sequence; the caches are small).
  void attention_decode(float* out, float* kcache, float* vcache,
                        const float* qkv, int n, int pos, int C, int NH,
                        int capacity) override {
    const OpScope scope(&times_, stream_, "attention_decode");
    const int hs = C / NH;
    KvCacheWriteKernel<<<Blocks(int64_t(n) * C), kThreads, 0, stream_>>>(
        kcache, vcache, qkv, n, pos, NH, hs, capacity);
    Launched();
    const size_t shared = sizeof(float) * (pos + n);
    if (shared > decode_shared_) {
      PT_CUDA_CHECK(cudaFuncSetAttribute(
          AttentionDecodeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
          static_cast<int>(shared)));
      decode_shared_ = shared;
    }
    AttentionDecodeKernel<<<dim3(NH, n), kThreads, shared, stream_>>>(
        out, kcache, vcache, qkv, pos, NH, hs, capacity);
    Launched();
  }
  int64_t attention_saved_floats(int64_t B, int64_t T, int C,
                                 int NH) const override {
    return Fused(C, NH) ? B * NH * T : B * NH * T * T;
  }
  void gelu_forward(float* out, const float* inp, int64_t N) override {
    Run("gelu_forward", GeluForwardKernel, Blocks(N), out, inp, N);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout,
                     int64_t N) override {
    Run("gelu_backward", GeluBackwardKernel, Blocks(N), dinp, inp, dout, N);
  }
  void bias_forward(float* out, const float* bias, int64_t rows,
                    int OC) override {
    Run("bias_forward", BiasKernel, Blocks(rows * OC), out, bias, rows * OC,
        OC);
  }
  void residual_forward(float* out, const float* inp1, const float* inp2,
                        int64_t N) override {
    Run("residual_forward", ResidualKernel, Blocks(N), out, inp1, inp2, N);
  }
  void crossentropy_parallel_max(float* maxes, const float* logits, int B,
                                 int T, int Vl, int vocab_begin,
                                 int V) override {
    Run("crossentropy_parallel_max", CrossEntropyMaxKernel, B * T, maxes,
        logits, Vl, vocab_begin, V);
  }
  void crossentropy_parallel_exp(float* sums, float* target_shifted,
                                 float* probs, const float* logits,
                                 const float* maxes, const int32_t* targets,
                                 int B, int T, int Vl, int vocab_begin,
                                 int V) override {
    Run("crossentropy_parallel_exp", CrossEntropyExpKernel, B * T, sums,
        target_shifted, probs, logits, maxes, targets, Vl, vocab_begin, V);
  }
  void crossentropy_parallel_finish(float* losses, float* probs,
                                    const float* sums,
                                    const float* target_shifted, int B, int T,
                                    int Vl) override {
    Run("crossentropy_parallel_finish", CrossEntropyFinishKernel, B * T, losses,
        probs, sums, target_shifted, Vl);
  }
  void crossentropy_forward(float* losses, float* probs, const float* logits,
                            const int32_t* targets, float* stats, int B, int T,
                            int Vl, int V) override {
    (void)stats;
    Run("crossentropy_forward", CrossEntropyForwardKernel, B * T, losses, probs,
        logits, targets, Vl, V);
  }
  void crossentropy_parallel_backward(float* dlogits, const float* probs,
                                      const int32_t* targets, float dloss,
                                      int B, int T, int Vl,
                                      int vocab_begin) override {
    const int64_t rows = static_cast<int64_t>(B) * T;
    Run("crossentropy_parallel_backward", CrossEntropyBackwardKernel,
        Blocks(rows * Vl), dlogits, probs, targets, dloss, rows, Vl,
        vocab_begin);
  }
  void adamw_update(float* params, float* m, float* v, const float* grads,
                    int64_t N, float lr, float beta1, float beta2, float eps,
                    float weight_decay, int64_t t, float grad_scale) override {
    const math::AdamWStep step =
        math::MakeAdamWStep(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
    Run("adamw_update", AdamWKernel, Blocks(N), params, m, v, grads, N, step);
  }

 private:
  static constexpr size_t kWorkspaceBytes = 32u << 20;

  void Launched() { PT_CUDA_CHECK(cudaGetLastError()); }

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

  template <bool kSquares>
  double Reduce(const float* x, int64_t n) {
    PT_CUDA_CHECK(cudaMemsetAsync(sum_, 0, sizeof(double), stream_));
    SumKernel<kSquares>
        <<<Blocks(n) < 1024 ? Blocks(n) : 1024, kThreads, 0, stream_>>>(sum_, x,
                                                                        n);
    Launched();
    double host = 0.0;
    PT_CUDA_CHECK(cudaMemcpyAsync(&host, sum_, sizeof(double),
                                  cudaMemcpyDeviceToHost, stream_));
    PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return host;
  }

  void ColumnSums(float* dweight, float* dbias, const float* dout,
                  const float* inp, const float* mean, const float* rstd,
                  int64_t rows, int C) {
    const dim3 grid((C + 31) / 32, static_cast<unsigned>(
                                       (rows + kChunkRows - 1) / kChunkRows));
    ColumnSumsKernel<<<grid, dim3(32, 8), 0, stream_>>>(
        dweight, dbias, dout, inp, mean, rstd, rows, C);
    Launched();
  }

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
  Op Operand(const float* x, int64_t n, int slot) {
    if (!options_.bf16_compute) return {x, CUDA_R_32F};
    __nv_bfloat16* copy = Grow(&bf16_[slot], n);
    const int64_t n4 = reinterpret_cast<uintptr_t>(x) % 16 == 0 ? n / 4 : 0;
    ToBf16Kernel<<<Blocks(n4 > 0 ? n4 : n), kThreads, 0, stream_>>>(copy, x, n,
                                                                    n4);
    Launched();
    return {copy, CUDA_R_16BF};
  }

  // Column-major D (m,n) = alpha op(A) op(B) + beta D, plus bias (m) on
  // every column when given, through cuBLASLt; D fp32, accumulation fp32.
  void Matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, Op A,
              int64_t lda, Op B, int64_t ldb, float beta, float* D, int64_t ldd,
              const float* bias) {
    // bf16 operands compute in fp32; fp32 ones as configured.
    const cublasComputeType_t compute =
        A.type == CUDA_R_16BF ? CUBLAS_COMPUTE_32F : compute_;
    cublasLtMatmulDesc_t desc;
    PT_CUDA_CHECK(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    PT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    PT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      PT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
          desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
      PT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
          desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    PT_CUDA_CHECK(cublasLtMatrixLayoutCreate(&la, A.type, trans_a ? k : m,
                                             trans_a ? m : k, lda));
    PT_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lb, B.type, trans_b ? n : k,
                                             trans_b ? k : n, ldb));
    PT_CUDA_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, ldd));

    const auto key = std::make_tuple(
        trans_a, trans_b, m, n, k, lda, ldb, ldd, bias != nullptr,
        Alignment(A.p), Alignment(B.p), Alignment(D),
        bias != nullptr ? Alignment(bias) : 0, beta != 0.0f, A.type);
    auto it = algos_.find(key);
    if (it == algos_.end()) {
      cublasLtMatmulPreference_t pref;
      PT_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const size_t ws = kWorkspaceBytes;
      PT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
      const uint32_t aa = Alignment(A.p), ab = Alignment(B.p),
                     ad = Alignment(D);
      PT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa)));
      PT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab)));
      PT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof(ad)));
      PT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad)));
      cublasLtMatmulHeuristicResult_t result;
      int found = 0;
      PT_CUDA_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, desc, la, lb, ld, ld,
                                                   pref, 1, &result, &found));
      cublasLtMatmulPreferenceDestroy(pref);
      PT_CHECK(found > 0, "cuBLASLt has no algorithm for a matmul");
      it = algos_.emplace(key, result.algo).first;
    }
    const float alpha = 1.0f;
    PT_CUDA_CHECK(cublasLtMatmul(lt_, desc, &alpha, A.p, la, B.p, lb, &beta, D,
                                 ld, D, ld, &it->second, workspace_,
                                 kWorkspaceBytes, stream_));
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
  }

  template <typename Q>
  static cudaDataType_t TypeOf() {
    return sizeof(Q) == 2 ? CUDA_R_16BF : CUDA_R_32F;
  }

  // Q: the type of the products' inputs (float, or bf16).
  template <typename Q>
  void Attention(float* out, float* att, const float* inp, int B, int T, int C,
                 int NH) {
    const int hs = C / NH;
    const int64_t n = static_cast<int64_t>(B) * T * C;
    const int batch = B * NH;
    const int64_t sq = static_cast<int64_t>(T) * hs, sa = int64_t(T) * T;
    const int64_t rows = static_cast<int64_t>(batch) * T;
    const bool packed = sizeof(Q) == 2;
    // [q k v (Q)] [y (fp32)] [scores (fp32), when att holds Q]
    char* base = reinterpret_cast<char*>(Scratch(
        (3 * n * sizeof(Q) + n * 4 + (packed ? rows * T * 4 : 0) + 3) / 4));
    Q* q = reinterpret_cast<Q*>(base);
    Q* k = q + n;
    Q* v = k + n;
    float* y = reinterpret_cast<float*>(base + 3 * n * sizeof(Q));
    float* scores = packed ? y + n : att;
    Q* probs = reinterpret_cast<Q*>(att);
    PermuteQkvKernel<<<Blocks(n), kThreads, 0, stream_>>>(q, k, v, inp, B, T,
                                                          NH, hs);
    Launched();
    // Scores per head, column-major (T,T) = op_T(k: hs x T) op_N(q: hs x T).
    Batched(true, false, T, T, hs, k, TypeOf<Q>(), hs, sq, q, TypeOf<Q>(), hs,
            sq, scores, T, sa, batch);
    CausalSoftmaxKernel<<<Blocks(rows * 32), kThreads, 0, stream_>>>(
        probs, scores, rows, T, 1.0f / sqrtf(static_cast<float>(hs)));
    Launched();
    // y^T (hs,T1) = v^T (hs,T2) att^T (T2,T1).
    Batched(false, false, hs, T, T, v, TypeOf<Q>(), hs, sq, probs, TypeOf<Q>(),
            T, sa, y, hs, sq, batch);
    UnpermuteKernel<<<Blocks(n), kThreads, 0, stream_>>>(out, y, B, T, NH, hs);
    Launched();
  }

  template <typename Q>
  void AttentionBackward(float* dinp, float* datt, const float* dout,
                         const float* inp, const float* att, int B, int T,
                         int C, int NH) {
    const int hs = C / NH;
    const int64_t n = static_cast<int64_t>(B) * T * C;
    const int batch = B * NH;
    const int64_t sq = static_cast<int64_t>(T) * hs, sa = int64_t(T) * T;
    const int64_t rows = static_cast<int64_t>(batch) * T;
    const bool packed = sizeof(Q) == 2;
    // [q k v dy (Q)] [dq dk dv (fp32)] [dscores (Q), when packed]
    char* base = reinterpret_cast<char*>(
        Scratch((4 * n * sizeof(Q) + 3 * n * 4 +
                 (packed ? rows * T * sizeof(Q) : 0) + 3) /
                4));
    Q* q = reinterpret_cast<Q*>(base);
    Q* k = q + n;
    Q* v = k + n;
    Q* dy = v + n;
    float* dq = reinterpret_cast<float*>(base + 4 * n * sizeof(Q));
    float* dk = dq + n;
    float* dv = dk + n;
    Q* dscores =
        packed ? reinterpret_cast<Q*>(dv + n) : reinterpret_cast<Q*>(datt);
    const Q* probs = reinterpret_cast<const Q*>(att);
    PermuteQkvKernel<<<Blocks(n), kThreads, 0, stream_>>>(q, k, v, inp, B, T,
                                                          NH, hs);
    Launched();
    PermuteOutKernel<<<Blocks(n), kThreads, 0, stream_>>>(dy, dout, B, T, NH,
                                                          hs);
    Launched();
    // datt (T1,T2) = dy v^T: the scores' shape, from v and dy.
    Batched(true, false, T, T, hs, v, TypeOf<Q>(), hs, sq, dy, TypeOf<Q>(), hs,
            sq, datt, T, sa, batch);
    // dv^T (hs,T2) = dy^T (hs,T1) att (T1,T2).
    Batched(false, true, hs, T, T, dy, TypeOf<Q>(), hs, sq, probs, TypeOf<Q>(),
            T, sa, dv, hs, sq, batch);
    CausalSoftmaxBackwardKernel<<<Blocks(rows * 32), kThreads, 0, stream_>>>(
        dscores, datt, probs, rows, T, 1.0f / sqrtf(static_cast<float>(hs)));
    Launched();
    // dq^T (hs,T1) = k^T (hs,T2) dscores^T (T2,T1).
    Batched(false, false, hs, T, T, k, TypeOf<Q>(), hs, sq, dscores,
            TypeOf<Q>(), T, sa, dq, hs, sq, batch);
    // dk^T (hs,T2) = q^T (hs,T1) dscores (T1,T2).
    Batched(false, true, hs, T, T, q, TypeOf<Q>(), hs, sq, dscores, TypeOf<Q>(),
            T, sa, dk, hs, sq, batch);
    UnpermuteQkvAddKernel<<<Blocks(n), kThreads, 0, stream_>>>(dinp, dq, dk, dv,
                                                               B, T, NH, hs);
    Launched();
  }

  // Strided batched column-major D (fp32) = op(A) op(B), through cuBLAS;
  // A and B fp32 or bf16.
  void Batched(bool trans_a, bool trans_b, int m, int n, int k, const void* A,
               cudaDataType_t a_type, int lda, int64_t sa, const void* B,
               cudaDataType_t b_type, int ldb, int64_t sb, float* D, int ldd,
               int64_t sd, int batch) {
    const float alpha = 1.0f, beta = 0.0f;
    // bf16 inputs compute in fp32 (accumulation); fp32 inputs as configured.
    const cublasComputeType_t compute =
        a_type == CUDA_R_16BF ? CUBLAS_COMPUTE_32F : compute_;
    PT_CUDA_CHECK(cublasGemmStridedBatchedEx(
        blas_, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, a_type, lda,
        sa, B, b_type, ldb, sb, &beta, D, CUDA_R_32F, ldd, sd, batch, compute,
        CUBLAS_GEMM_DEFAULT));
  }

  const CudaOptions options_;
  int major_ = 0;  // compute capability
  // Dynamic shared memory AttentionDecodeKernel may use (48 KiB needs no
  // opt-in; more is asked for once, as a longer cache needs it).
  size_t decode_shared_ = 48u << 10;
  OpTimes times_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasComputeType_t compute_;
  void* workspace_ = nullptr;
  double* sum_ = nullptr;
  GrowOnly<float> scratch_;
  std::map<std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t,
                      int64_t, bool, int, int, int, int, bool, cudaDataType_t>,
           cublasLtMatmulAlgo_t>
      algos_;
  GrowOnly<__nv_bfloat16> bf16_[3];  // Operand's slots
};

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

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

}  // namespace

// The module's entry points (ops_cuda_loader.cpp finds them with dlsym).
extern "C" int ptrain_cuda_device_count() { return DeviceCount(); }

extern "C" Ops* ptrain_cuda_make_ops(const CudaOptions* options,
                                     std::string* error) {
  const int n = DeviceCount();
  if (options->device < 0 || options->device >= n) {
    *error = n == 0 ? "no CUDA device is present (no GPU, or no driver)"
                    : "CUDA device " + std::to_string(options->device) +
                          " does not exist (" + std::to_string(n) + " present)";
    return nullptr;
  }
  return new CudaBackend(*options);
}

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
  auto* backend = dynamic_cast<CudaBackend*>(ops);
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
  return new NcclCollectives(backend, comm, nranks);
}

extern "C" void ptrain_cuda_memory(int64_t* used, int64_t* total) {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    *used = *total = 0;
    return;
  }
  *used = static_cast<int64_t>(total_bytes - free_bytes);
  *total = static_cast<int64_t>(total_bytes);
}

}  // namespace ptrain::kernels
