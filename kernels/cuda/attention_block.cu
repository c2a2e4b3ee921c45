// The CUDA backend's attention between zigzag blocks (context parallelism;
// kernels/cpu/attention_block.cpp): one thread per query row in the forward
// and for the queries' gradient, one per key row for the keys' and values'
// (no atomics: the same sums in the same order every run). fp32 throughout;
// a direct kernel, correct rather than fast.
#include <cmath>
#include <cstdint>

#include "kernels/common/math.h"
#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

struct BlockDims {
  int B, Tl, C, NH, hs, cp, q_rank, k_rank;
  int64_t kv_stride;
  float scale;
};

__device__ __forceinline__ float Dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Row (b, h, t) of out and lse: the running softmax over the keys it has
// seen (out normalised, lse its log-sum-exp) continued over this block's.
__global__ void AttentionBlockForwardKernel(float* out, float* lse,
                                            const float* qkv, const float* kv,
                                            BlockDims d, bool first) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= int64_t(d.B) * d.NH * d.Tl) return;
  const int t = row % d.Tl;
  const int64_t bh = row / d.Tl;
  const int64_t b = bh / d.NH, h = bh % d.NH;
  const float* q = qkv + (b * d.Tl + t) * 3 * d.C + h * d.hs;
  float* y = out + (b * d.Tl + t) * d.C + h * d.hs;
  const int qp = math::ZigzagPosition(t, d.Tl, d.cp, d.q_rank);
  // Running maximum M, sum L of e^(s - M), and y the values' average
  // weighted by those (so that the kept row is state M = lse, L = 1; a new
  // maximum rescales L, not the average).
  float M = first ? -INFINITY : lse[row];
  float L = M == -INFINITY ? 0.0f : 1.0f;
  if (first) {
    for (int i = 0; i < d.hs; ++i) y[i] = 0.0f;
  }
  for (int j = 0; j < d.Tl; ++j) {
    if (math::ZigzagPosition(j, d.Tl, d.cp, d.k_rank) > qp) continue;
    const float* k = kv + (b * d.Tl + j) * d.kv_stride + h * d.hs;
    const float* v = k + d.C;
    const float s = Dot(q, k, d.hs) * d.scale;
    if (s > M) {
      L *= expf(M - s);  // 0 from -inf
      M = s;
    }
    const float e = expf(s - M);
    L += e;
    for (int i = 0; i < d.hs; ++i) y[i] = (y[i] * (L - e) + e * v[i]) / L;
  }
  if (L > 0.0f) lse[row] = M + logf(L);
}

// dq of row (b, h, t): over this block's keys it sees.
__global__ void AttentionBlockDqKernel(float* dqkv, const float* dout,
                                       const float* qkv, const float* out,
                                       const float* lse, const float* kv,
                                       BlockDims d) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= int64_t(d.B) * d.NH * d.Tl) return;
  const int t = row % d.Tl;
  const int64_t bh = row / d.Tl;
  const int64_t b = bh / d.NH, h = bh % d.NH;
  const int64_t y = (b * d.Tl + t) * d.C + h * d.hs;
  const float* q = qkv + (b * d.Tl + t) * 3 * d.C + h * d.hs;
  float* dq = dqkv + (b * d.Tl + t) * 3 * d.C + h * d.hs;
  const float D = Dot(dout + y, out + y, d.hs);
  const int qp = math::ZigzagPosition(t, d.Tl, d.cp, d.q_rank);
  for (int j = 0; j < d.Tl; ++j) {
    if (math::ZigzagPosition(j, d.Tl, d.cp, d.k_rank) > qp) continue;
    const float* k = kv + (b * d.Tl + j) * d.kv_stride + h * d.hs;
    const float p = expf(Dot(q, k, d.hs) * d.scale - lse[row]);
    const float ds = p * (Dot(dout + y, k + d.C, d.hs) - D) * d.scale;
    for (int i = 0; i < d.hs; ++i) dq[i] += ds * k[i];
  }
}

// dk, dv of key row (b, h, j): over the queries that see it.
__global__ void AttentionBlockDkvKernel(float* dkv, const float* dout,
                                        const float* qkv, const float* out,
                                        const float* lse, const float* kv,
                                        BlockDims d) {
  const int64_t key = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (key >= int64_t(d.B) * d.NH * d.Tl) return;
  const int j = key % d.Tl;
  const int64_t bh = key / d.Tl;
  const int64_t b = bh / d.NH, h = bh % d.NH;
  const float* k = kv + (b * d.Tl + j) * d.kv_stride + h * d.hs;
  float* dk = dkv + (b * d.Tl + j) * d.kv_stride + h * d.hs;
  float* dv = dk + d.C;
  const int kp = math::ZigzagPosition(j, d.Tl, d.cp, d.k_rank);
  for (int t = 0; t < d.Tl; ++t) {
    if (kp > math::ZigzagPosition(t, d.Tl, d.cp, d.q_rank)) continue;
    const int64_t y = (b * d.Tl + t) * d.C + h * d.hs;
    const float* q = qkv + (b * d.Tl + t) * 3 * d.C + h * d.hs;
    const float p = expf(Dot(q, k, d.hs) * d.scale - lse[bh * d.Tl + t]);
    const float ds =
        p * (Dot(dout + y, k + d.C, d.hs) - Dot(dout + y, out + y, d.hs)) *
        d.scale;
    for (int i = 0; i < d.hs; ++i) {
      dv[i] += p * dout[y + i];
      dk[i] += ds * q[i];
    }
  }
}

BlockDims Dims(int B, int Tl, int C, int NH, int cp, int q_rank, int k_rank,
               int64_t kv_stride) {
  const int hs = C / NH;
  return {B,  Tl,     C,      NH,        hs,
          cp, q_rank, k_rank, kv_stride, 1.0f / sqrtf(static_cast<float>(hs))};
}

}  // namespace

void CudaBackend::attention_block_forward(float* out, float* lse,
                                          const float* qkv, const float* kv,
                                          int64_t kv_stride, int B, int Tl,
                                          int C, int NH, int cp, int q_rank,
                                          int k_rank, bool first) {
  const OpScope scope(&times_, stream_, "attention_block_forward");
  const BlockDims d = Dims(B, Tl, C, NH, cp, q_rank, k_rank, kv_stride);
  AttentionBlockForwardKernel<<<Blocks(int64_t(B) * NH * Tl), kThreads, 0,
                                stream_>>>(out, lse, qkv, kv, d, first);
  Launched();
}

void CudaBackend::attention_block_backward(float* dqkv, float* dkv,
                                           const float* dout, const float* qkv,
                                           const float* out, const float* lse,
                                           const float* kv, int64_t kv_stride,
                                           int B, int Tl, int C, int NH, int cp,
                                           int q_rank, int k_rank) {
  const OpScope scope(&times_, stream_, "attention_block_backward");
  const BlockDims d = Dims(B, Tl, C, NH, cp, q_rank, k_rank, kv_stride);
  const int blocks = Blocks(int64_t(B) * NH * Tl);
  AttentionBlockDqKernel<<<blocks, kThreads, 0, stream_>>>(dqkv, dout, qkv, out,
                                                           lse, kv, d);
  Launched();
  AttentionBlockDkvKernel<<<blocks, kThreads, 0, stream_>>>(dkv, dout, qkv, out,
                                                            lse, kv, d);
  Launched();
}

}  // namespace ptrain::kernels::cuda_impl
