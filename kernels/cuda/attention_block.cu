// The CUDA backend's attention between zigzag blocks (context parallelism;
// kernels/cpu/attention_block.cpp): one thread per query row in the forward
// and for the queries' gradient, one per key row for the keys' and values'
// (no atomics: the same sums in the same order every run; a key/value
// head's over its group's query heads one after the other). fp32
// throughout; a direct kernel, correct rather than fast.
#include <cmath>
#include <cstdint>

#include "kernels/common/math.h"
#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

struct BlockDims {
  int B, Tl, cp, q_rank, k_rank;
  math::AttentionHeads a;
  int64_t kv_stride;
  float scale;
};

// The (b, h, t) of thread i's row of the B·H·Tl rows of H heads (query
// heads, or key/value heads), and where its head's hs columns start in
// row t of a (B,Tl,·) tensor of `stride` floats a row, from column `col`.
struct HeadRow {
  int64_t i, bh, b, h;
  int t;
  __device__ int64_t At(const BlockDims& d, int row, int64_t stride,
                        int64_t col) const {
    return (b * d.Tl + row) * stride + col;
  }
};
__device__ __forceinline__ bool RowOf(const BlockDims& d, int H, HeadRow* r) {
  r->i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r->i >= int64_t(d.B) * H * d.Tl) return false;
  r->t = r->i % d.Tl;
  r->bh = r->i / d.Tl;
  r->b = r->bh / H;
  r->h = r->bh % H;
  return true;
}

__device__ __forceinline__ float Dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Row (b, h, t) of out and lse: the running softmax over the keys it has
// seen (out normalised, lse its log-sum-exp) continued over this block's
// (those of its key/value head).
__global__ void AttentionBlockForwardKernel(float* out, float* lse,
                                            const float* qkv, const float* kv,
                                            BlockDims d, bool first) {
  HeadRow r;
  if (!RowOf(d, d.a.NH, &r)) return;
  const int hs = d.a.hs;
  const int64_t kcol = int64_t(d.a.Kv(r.h)) * hs;  // in kv's rows
  const float* q = qkv + r.At(d, r.t, d.a.row(), d.a.q(r.h));
  float* y = out + r.At(d, r.t, d.a.C(), d.a.q(r.h));
  const int qp = math::ZigzagPosition(r.t, d.Tl, d.cp, d.q_rank);
  // Running maximum M, sum L of e^(s - M), and y the values' average
  // weighted by those (so that the kept row is state M = lse, L = 1; a new
  // maximum rescales L, not the average).
  float M = first ? -INFINITY : lse[r.i];
  float L = M == -INFINITY ? 0.0f : 1.0f;
  if (first) {
    for (int i = 0; i < hs; ++i) y[i] = 0.0f;
  }
  for (int j = 0; j < d.Tl; ++j) {
    if (math::ZigzagPosition(j, d.Tl, d.cp, d.k_rank) > qp) continue;
    const float* k = kv + r.At(d, j, d.kv_stride, kcol);
    const float* v = k + d.a.K();
    const float s = Dot(q, k, hs) * d.scale;
    if (s > M) {
      L *= expf(M - s);  // 0 from -inf
      M = s;
    }
    const float e = expf(s - M);
    L += e;
    for (int i = 0; i < hs; ++i) y[i] = (y[i] * (L - e) + e * v[i]) / L;
  }
  if (L > 0.0f) lse[r.i] = M + logf(L);
}

// dq of row (b, h, t): over this block's keys it sees.
__global__ void AttentionBlockDqKernel(float* dqkv, const float* dout,
                                       const float* qkv, const float* out,
                                       const float* lse, const float* kv,
                                       BlockDims d) {
  HeadRow r;
  if (!RowOf(d, d.a.NH, &r)) return;
  const int hs = d.a.hs;
  const int64_t kcol = int64_t(d.a.Kv(r.h)) * hs;  // in kv's rows
  const int64_t y = r.At(d, r.t, d.a.C(), d.a.q(r.h));
  const float* q = qkv + r.At(d, r.t, d.a.row(), d.a.q(r.h));
  float* dq = dqkv + r.At(d, r.t, d.a.row(), d.a.q(r.h));
  const float D = Dot(dout + y, out + y, hs);
  const int qp = math::ZigzagPosition(r.t, d.Tl, d.cp, d.q_rank);
  for (int j = 0; j < d.Tl; ++j) {
    if (math::ZigzagPosition(j, d.Tl, d.cp, d.k_rank) > qp) continue;
    const float* k = kv + r.At(d, j, d.kv_stride, kcol);
    const float p = expf(Dot(q, k, hs) * d.scale - lse[r.i]);
    const float ds = p * (Dot(dout + y, k + d.a.K(), hs) - D) * d.scale;
    for (int i = 0; i < hs; ++i) dq[i] += ds * k[i];
  }
}

// dk, dv of key row (b, g, j) of key/value head g: over the queries that
// see it, of each of its group's query heads in turn (one thread, one
// order).
__global__ void AttentionBlockDkvKernel(float* dkv, const float* dout,
                                        const float* qkv, const float* out,
                                        const float* lse, const float* kv,
                                        BlockDims d) {
  HeadRow r;  // r.h is the key/value head, r.t the key's row
  if (!RowOf(d, d.a.KVH, &r)) return;
  const int hs = d.a.hs, G = d.a.group();
  const float* k = kv + r.At(d, r.t, d.kv_stride, r.h * hs);
  const float* v = k + d.a.K();
  float* dk = dkv + r.At(d, r.t, d.kv_stride, r.h * hs);
  float* dv = dk + d.a.K();
  const int kp = math::ZigzagPosition(r.t, d.Tl, d.cp, d.k_rank);
  for (int h = int(r.h) * G; h < (r.h + 1) * G; ++h) {
    const float* lse_h = lse + (r.b * d.a.NH + h) * d.Tl;
    for (int t = 0; t < d.Tl; ++t) {
      if (kp > math::ZigzagPosition(t, d.Tl, d.cp, d.q_rank)) continue;
      const int64_t y = r.At(d, t, d.a.C(), d.a.q(h));
      const float* q = qkv + r.At(d, t, d.a.row(), d.a.q(h));
      const float p = expf(Dot(q, k, hs) * d.scale - lse_h[t]);
      const float ds =
          p * (Dot(dout + y, v, hs) - Dot(dout + y, out + y, hs)) * d.scale;
      for (int i = 0; i < hs; ++i) {
        dv[i] += p * dout[y + i];
        dk[i] += ds * q[i];
      }
    }
  }
}

BlockDims Dims(int B, int Tl, int C, int NH, int KVH, int cp, int q_rank,
               int k_rank, int64_t kv_stride) {
  const math::AttentionHeads a = math::MakeAttentionHeads(C, NH, KVH);
  return {B,      Tl, cp,        q_rank,
          k_rank, a,  kv_stride, 1.0f / sqrtf(static_cast<float>(a.hs))};
}

}  // namespace

void CudaBackend::attention_block_forward(float* out, float* lse,
                                          const float* qkv, const float* kv,
                                          int64_t kv_stride, int B, int Tl,
                                          int C, int NH, int KVH, int cp,
                                          int q_rank, int k_rank, bool first) {
  const OpScope scope(&times_, stream_, "attention_block_forward");
  const BlockDims d = Dims(B, Tl, C, NH, KVH, cp, q_rank, k_rank, kv_stride);
  AttentionBlockForwardKernel<<<Blocks(int64_t(B) * NH * Tl), kThreads, 0,
                                stream_>>>(out, lse, qkv, kv, d, first);
  Launched();
}

void CudaBackend::attention_block_backward(
    float* dqkv, float* dkv, const float* dout, const float* qkv,
    const float* out, const float* lse, const float* kv, int64_t kv_stride,
    int B, int Tl, int C, int NH, int KVH, int cp, int q_rank, int k_rank) {
  const OpScope scope(&times_, stream_, "attention_block_backward");
  const BlockDims d = Dims(B, Tl, C, NH, KVH, cp, q_rank, k_rank, kv_stride);
  AttentionBlockDqKernel<<<Blocks(int64_t(B) * NH * Tl), kThreads, 0,
                           stream_>>>(dqkv, dout, qkv, out, lse, kv, d);
  Launched();
  AttentionBlockDkvKernel<<<Blocks(int64_t(B) * KVH * Tl), kThreads, 0,
                            stream_>>>(dkv, dout, qkv, out, lse, kv, d);
  Launched();
}

}  // namespace ptrain::kernels::cuda_impl
