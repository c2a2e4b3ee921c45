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

// The (b, h, t) of thread i's row of the B·NH·Tl rows, and where its head
// starts in row t of a (B,Tl,·) tensor of `stride` floats a row.
struct HeadRow {
  int64_t i, bh, b, h;
  int t;
  __device__ int64_t At(const BlockDims& d, int row, int64_t stride) const {
    return (b * d.Tl + row) * stride + h * d.hs;
  }
};
__device__ __forceinline__ bool RowOf(const BlockDims& d, HeadRow* r) {
  r->i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r->i >= int64_t(d.B) * d.NH * d.Tl) return false;
  r->t = r->i % d.Tl;
  r->bh = r->i / d.Tl;
  r->b = r->bh / d.NH;
  r->h = r->bh % d.NH;
  return true;
}

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
  HeadRow r;
  if (!RowOf(d, &r)) return;
  const float* q = qkv + r.At(d, r.t, 3 * d.C);
  float* y = out + r.At(d, r.t, d.C);
  const int qp = math::ZigzagPosition(r.t, d.Tl, d.cp, d.q_rank);
  // Running maximum M, sum L of e^(s - M), and y the values' average
  // weighted by those (so that the kept row is state M = lse, L = 1; a new
  // maximum rescales L, not the average).
  float M = first ? -INFINITY : lse[r.i];
  float L = M == -INFINITY ? 0.0f : 1.0f;
  if (first) {
    for (int i = 0; i < d.hs; ++i) y[i] = 0.0f;
  }
  for (int j = 0; j < d.Tl; ++j) {
    if (math::ZigzagPosition(j, d.Tl, d.cp, d.k_rank) > qp) continue;
    const float* k = kv + r.At(d, j, d.kv_stride);
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
  if (L > 0.0f) lse[r.i] = M + logf(L);
}

// dq of row (b, h, t): over this block's keys it sees.
__global__ void AttentionBlockDqKernel(float* dqkv, const float* dout,
                                       const float* qkv, const float* out,
                                       const float* lse, const float* kv,
                                       BlockDims d) {
  HeadRow r;
  if (!RowOf(d, &r)) return;
  const int64_t y = r.At(d, r.t, d.C);
  const float* q = qkv + r.At(d, r.t, 3 * d.C);
  float* dq = dqkv + r.At(d, r.t, 3 * d.C);
  const float D = Dot(dout + y, out + y, d.hs);
  const int qp = math::ZigzagPosition(r.t, d.Tl, d.cp, d.q_rank);
  for (int j = 0; j < d.Tl; ++j) {
    if (math::ZigzagPosition(j, d.Tl, d.cp, d.k_rank) > qp) continue;
    const float* k = kv + r.At(d, j, d.kv_stride);
    const float p = expf(Dot(q, k, d.hs) * d.scale - lse[r.i]);
    const float ds = p * (Dot(dout + y, k + d.C, d.hs) - D) * d.scale;
    for (int i = 0; i < d.hs; ++i) dq[i] += ds * k[i];
  }
}

// dk, dv of key row (b, h, j): over the queries that see it.
__global__ void AttentionBlockDkvKernel(float* dkv, const float* dout,
                                        const float* qkv, const float* out,
                                        const float* lse, const float* kv,
                                        BlockDims d) {
  HeadRow r;  // r.t is the key's row
  if (!RowOf(d, &r)) return;
  const float* k = kv + r.At(d, r.t, d.kv_stride);
  float* dk = dkv + r.At(d, r.t, d.kv_stride);
  float* dv = dk + d.C;
  const int kp = math::ZigzagPosition(r.t, d.Tl, d.cp, d.k_rank);
  for (int t = 0; t < d.Tl; ++t) {
    if (kp > math::ZigzagPosition(t, d.Tl, d.cp, d.q_rank)) continue;
    const int64_t y = r.At(d, t, d.C);
    const float* q = qkv + r.At(d, t, 3 * d.C);
    const float p = expf(Dot(q, k, d.hs) * d.scale - lse[r.bh * d.Tl + t]);
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
