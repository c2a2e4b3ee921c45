// The CUDA backend's causal attention (kernels/cpu/attention.cpp): the
// fused kernels' dispatch (flash_attention.cu), the products through
// cuBLAS with the scores in memory, and generation's cached attention.
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels/common/math.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

// Element i of a head-major (B,H,T,hs) tensor: its offset in a
// position-major tensor of rows `row` elements wide that holds the H heads
// from column 0 (B,T,·): the query heads of the attention input's rows
// (key and value heads C and C + K further), or a (B,T,C) tensor.
__device__ __forceinline__ int64_t PositionMajor(int64_t i, int T, int H,
                                                 int hs, int64_t row) {
  const int d = i % hs;
  const int t = (i / hs) % T;
  const int h = (i / (int64_t(hs) * T)) % H;
  const int64_t b = i / (int64_t(hs) * T * H);
  return (b * T + t) * row + int64_t(h) * hs + d;
}

// inp (B,T,NH+2·KVH,hs) -> q (B,NH,T,hs), k, v (B,KVH,T,hs).
template <typename Q>
__global__ void PermuteQkvKernel(Q* q, Q* k, Q* v, const float* inp, int B,
                                 int T, int NH, int KVH, int hs) {
  const math::AttentionHeads a{NH, KVH, hs};
  const int64_t n = static_cast<int64_t>(B) * NH * T * hs;
  const int64_t nkv = static_cast<int64_t>(B) * KVH * T * hs;
  ForEachIndex(n, [&](int64_t i) {
    Store(q + i, inp[PositionMajor(i, T, NH, hs, a.row())]);
    if (i < nkv) {
      const int64_t src = PositionMajor(i, T, KVH, hs, a.row()) + a.C();
      Store(k + i, inp[src]);
      Store(v + i, inp[src + a.K()]);
    }
  });
}

// y (B,NH,T,hs) -> out (B,T,NH,hs).
__global__ void UnpermuteKernel(float* out, const float* y, int B, int T,
                                int NH, int hs) {
  const int64_t n = static_cast<int64_t>(B) * NH * T * hs;
  ForEachIndex(n, [&](int64_t i) {
    out[PositionMajor(i, T, NH, hs, int64_t(NH) * hs)] = y[i];
  });
}

// Generation's cached attention (kernels/cpu/kernels.h attention_decode).
// The new positions' keys and values, of qkv (n,NH+2·KVH,hs), into the
// caches (KVH,capacity,hs) at rows [pos, pos + n): once per key/value head.
__global__ void KvCacheWriteKernel(float* kcache, float* vcache,
                                   const float* qkv, int n, int pos,
                                   math::AttentionHeads a, int capacity) {
  const int K = static_cast<int>(a.K()), hs = a.hs;
  ForEachIndex(int64_t(n) * K, [&](int64_t i) {
    const int t = i / K, c = i % K, g = c / hs, d = c % hs;
    const int64_t src = t * a.row() + a.k(g) + d;
    const int64_t dst = (int64_t(g) * capacity + pos + t) * hs + d;
    kcache[dst] = qkv[src];
    vcache[dst] = qkv[src + K];
  });
}

// One block per (query head, new position i): scores against its
// key/value head's cache rows [0, pos + i] in dynamic shared memory, their
// softmax, then each output channel as the probability-weighted sum of the
// cached values.
__global__ void AttentionDecodeKernel(float* out, const float* kcache,
                                      const float* vcache, const float* qkv,
                                      int pos, math::AttentionHeads a,
                                      int capacity) {
  extern __shared__ float scores[];
  const int h = blockIdx.x, i = blockIdx.y, hs = a.hs;
  const int64_t C = a.C();
  const int len = pos + i + 1;
  const float* q = qkv + i * a.row() + a.q(h);
  const float* k = kcache + int64_t(a.Kv(h)) * capacity * hs;
  const float* v = vcache + int64_t(a.Kv(h)) * capacity * hs;
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
    Store(dy + i, dout[PositionMajor(i, T, NH, hs, int64_t(NH) * hs)]);
  });
}

// dinp (B,T,NH+2·KVH,hs) += dq (B,NH,T,hs), dk, dv (B,KVH,T,hs).
__global__ void UnpermuteQkvAddKernel(float* dinp, const float* dq,
                                      const float* dk, const float* dv, int B,
                                      int T, int NH, int KVH, int hs) {
  const math::AttentionHeads a{NH, KVH, hs};
  const int64_t n = static_cast<int64_t>(B) * NH * T * hs;
  const int64_t nkv = static_cast<int64_t>(B) * KVH * T * hs;
  ForEachIndex(n, [&](int64_t i) {
    dinp[PositionMajor(i, T, NH, hs, a.row())] += dq[i];
    if (i < nkv) {
      const int64_t dst = PositionMajor(i, T, KVH, hs, a.row()) + a.C();
      dinp[dst] += dk[i];
      dinp[dst + a.K()] += dv[i];
    }
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

}  // namespace

// Under bf16 compute, heads of 16, 32 or 64 take the fused kernels
// (flash_attention.h): `att` keeps one float per query row and `datt` is
// (B,NH,T). Otherwise the products go through cuBLAS with the (T,T)
// scores of each query head in memory; under bf16 compute q, k, v, the
// probabilities and the score gradients are then bf16 (fp32 accumulation
// and fp32 scores), the probabilities packed in the first half of `att`,
// which only this backend's backward reads.
void CudaBackend::attention_forward(Act out, float* att, ConstAct inp, int B,
                                    int T, int C, int NH, int KVH) {
  const OpScope scope(&times_, stream_, "attention_forward");
  const int64_t n = int64_t(B) * T * C;
  const int64_t n_inp =
      int64_t(B) * T * math::MakeAttentionHeads(C, NH, KVH).row();
  if (Fused(C, NH)) {
    // The fused kernels take a bf16 qkv as it is and write the output as
    // it is stored.
    const Op qkv = FusedOperand(inp, n_inp, 0);
    const bool out16 = Bf16Storage(out);
    FlashAttentionForward(out16 ? nullptr : out.f32(),
                          out16 ? static_cast<__nv_bfloat16*>(out.p) : nullptr,
                          att, static_cast<const __nv_bfloat16*>(qkv.p), B, T,
                          NH, KVH, C / NH, stream_);
    return;
  }
  // A bf16 output is written in fp32, then rounded; the cuBLAS attention
  // takes qkv's fp32 values.
  float* y = F32Target(out, n, 0);
  if (options_.bf16_compute) {
    Attention<__nv_bfloat16>(y, att, AsF32(inp, n_inp, 1), B, T, C, NH, KVH);
  } else {
    Attention<float>(y, att, AsF32(inp, n_inp, 1), B, T, C, NH, KVH);
  }
  Finish(out, y, n);
}

void CudaBackend::attention_backward(float* dinp, float* datt,
                                     const float* dout, ConstAct inp,
                                     ConstAct out, const float* att, int B,
                                     int T, int C, int NH, int KVH) {
  const OpScope scope(&times_, stream_, "attention_backward");
  const int64_t n = int64_t(B) * T * C;
  const int64_t n_inp =
      int64_t(B) * T * math::MakeAttentionHeads(C, NH, KVH).row();
  if (Fused(C, NH)) {
    // dout is rounded as delta is summed, and a bf16 output read as it is.
    const Op qkv = FusedOperand(inp, n_inp, 0);
    const bool out16 = Bf16Storage(out);
    FlashAttentionBackward(
        dinp, datt, Grow(&bf16_[1], n), dout, out16 ? nullptr : out.f32(),
        out16 ? static_cast<const __nv_bfloat16*>(out.p) : nullptr,
        static_cast<const __nv_bfloat16*>(qkv.p), att, B, T, NH, KVH, C / NH,
        flash_dq_, stream_);
    return;
  }
  // The cuBLAS attention adds to dinp.
  PT_CUDA_CHECK(cudaMemsetAsync(dinp, 0, n_inp * sizeof(float), stream_));
  if (options_.bf16_compute) {
    AttentionBackward<__nv_bfloat16>(dinp, datt, dout, AsF32(inp, n_inp, 1),
                                     att, B, T, C, NH, KVH);
  } else {
    AttentionBackward<float>(dinp, datt, dout, AsF32(inp, n_inp, 1), att, B, T,
                             C, NH, KVH);
  }
}

// fp32 throughout (generation is one sequence; the caches are small); a
// bf16 qkv is unpacked and a bf16 output rounded around it.
void CudaBackend::attention_decode(Act out, float* kcache, float* vcache,
                                   ConstAct qkv_in, int n, int pos, int C,
                                   int NH, int KVH, int capacity) {
  const OpScope scope(&times_, stream_, "attention_decode");
  const math::AttentionHeads heads = math::MakeAttentionHeads(C, NH, KVH);
  const float* qkv = AsF32(qkv_in, n * heads.row(), 1);
  float* y = F32Target(out, int64_t(n) * C, 0);
  KvCacheWriteKernel<<<Blocks(n * heads.K()), kThreads, 0, stream_>>>(
      kcache, vcache, qkv, n, pos, heads, capacity);
  Launched();
  const size_t shared = sizeof(float) * (pos + n);
  if (shared > decode_shared_) {
    PT_CUDA_CHECK(cudaFuncSetAttribute(
        AttentionDecodeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(shared)));
    decode_shared_ = shared;
  }
  AttentionDecodeKernel<<<dim3(NH, n), kThreads, shared, stream_>>>(
      y, kcache, vcache, qkv, pos, heads, capacity);
  Launched();
  Finish(out, y, int64_t(n) * C);
}

CudaBackend::Op CudaBackend::FusedOperand(ConstAct x, int64_t n, int slot) {
  const Op op = Operand(x, n, slot);
  if (reinterpret_cast<uintptr_t>(op.p) % 16 == 0) return op;
  // A stored bf16 tensor off that alignment (an odd slab offset): copied.
  __nv_bfloat16* copy = Grow(&bf16_[slot], n);
  PT_CUDA_CHECK(cudaMemcpyAsync(copy, op.p, n * sizeof(__nv_bfloat16),
                                cudaMemcpyDeviceToDevice, stream_));
  return {copy, CUDA_R_16BF};
}

int64_t CudaBackend::attention_saved_floats(int64_t B, int64_t T, int C,
                                            int NH) const {
  return Fused(C, NH) ? B * NH * T : B * NH * T * T;
}

namespace {

// The sizes of the batched (cuBLAS) attention's products. Its batch is
// the key/value heads (B·KVH): the G = NH/KVH query heads that read one are
// adjacent in q (B,NH,T,hs) and in the scores (B,NH,T,T), so a product
// takes the G·T rows of a group as one matrix, and the group's sum for dk
// and dv is a product's inner dimension (one order, no second pass). Head
// size, group size, elements of q (n) and of k, v (nkv), each head's
// stride in q (and k, v) and in the (T,T) scores, and the scores' rows.
struct BatchedDims {
  int hs, G, batch;
  int64_t n, nkv, sq, sa, rows;
  static BatchedDims Of(int B, int T, int C, int NH, int KVH) {
    BatchedDims d;
    d.hs = C / NH;
    d.G = NH / KVH;
    d.n = static_cast<int64_t>(B) * T * C;
    d.nkv = d.n / d.G;
    d.batch = B * KVH;
    d.sq = static_cast<int64_t>(T) * d.hs;
    d.sa = int64_t(T) * T;
    d.rows = static_cast<int64_t>(B) * NH * T;
    return d;
  }
};

}  // namespace

// The products below are per key/value head (BatchedDims): T1 runs over
// the G·T query rows of its group (G heads of T), T2 over its T keys; the
// group's q, scores and their gradients are strided G heads apart, its k
// and v one.
template <typename Q>
void CudaBackend::Attention(float* out, float* att, const float* inp, int B,
                            int T, int C, int NH, int KVH) {
  const BatchedDims d = BatchedDims::Of(B, T, C, NH, KVH);
  const int hs = d.hs, G = d.G, batch = d.batch;
  const int64_t n = d.n, nkv = d.nkv, sq = d.sq, sa = d.sa, rows = d.rows;
  const bool packed = sizeof(Q) == 2;
  // [q k v (Q)] [y (fp32)] [scores (fp32), when att holds Q]
  char* base = reinterpret_cast<char*>(Scratch(
      ((n + 2 * nkv) * sizeof(Q) + n * 4 + (packed ? rows * T * 4 : 0) + 3) /
      4));
  Q* q = reinterpret_cast<Q*>(base);
  Q* k = q + n;
  Q* v = k + nkv;
  float* y = reinterpret_cast<float*>(base + (n + 2 * nkv) * sizeof(Q));
  float* scores = packed ? y + n : att;
  Q* probs = reinterpret_cast<Q*>(att);
  PermuteQkvKernel<<<Blocks(n), kThreads, 0, stream_>>>(q, k, v, inp, B, T, NH,
                                                        KVH, hs);
  Launched();
  // Scores, column-major (T2,T1) = op_T(k: hs x T2) op_N(q: hs x T1).
  Batched(true, false, T, G * T, hs, k, TypeOf<Q>(), hs, sq, q, TypeOf<Q>(), hs,
          G * sq, scores, T, G * sa, batch);
  CausalSoftmaxKernel<<<Blocks(rows * 32), kThreads, 0, stream_>>>(
      probs, scores, rows, T, 1.0f / sqrtf(static_cast<float>(hs)));
  Launched();
  // y^T (hs,T1) = v^T (hs,T2) att^T (T2,T1).
  Batched(false, false, hs, G * T, T, v, TypeOf<Q>(), hs, sq, probs,
          TypeOf<Q>(), T, G * sa, y, hs, G * sq, batch);
  UnpermuteKernel<<<Blocks(n), kThreads, 0, stream_>>>(out, y, B, T, NH, hs);
  Launched();
}

template <typename Q>
void CudaBackend::AttentionBackward(float* dinp, float* datt, const float* dout,
                                    const float* inp, const float* att, int B,
                                    int T, int C, int NH, int KVH) {
  const BatchedDims d = BatchedDims::Of(B, T, C, NH, KVH);
  const int hs = d.hs, G = d.G, batch = d.batch;
  const int64_t n = d.n, nkv = d.nkv, sq = d.sq, sa = d.sa, rows = d.rows;
  const bool packed = sizeof(Q) == 2;
  // [q k v dy (Q)] [dq dk dv (fp32)] [dscores (Q), when packed]
  const int64_t operands = 2 * n + 2 * nkv;
  char* base = reinterpret_cast<char*>(
      Scratch((operands * sizeof(Q) + (n + 2 * nkv) * 4 +
               (packed ? rows * T * sizeof(Q) : 0) + 3) /
              4));
  Q* q = reinterpret_cast<Q*>(base);
  Q* k = q + n;
  Q* v = k + nkv;
  Q* dy = v + nkv;
  float* dq = reinterpret_cast<float*>(base + operands * sizeof(Q));
  float* dk = dq + n;
  float* dv = dk + nkv;
  Q* dscores =
      packed ? reinterpret_cast<Q*>(dv + nkv) : reinterpret_cast<Q*>(datt);
  const Q* probs = reinterpret_cast<const Q*>(att);
  PermuteQkvKernel<<<Blocks(n), kThreads, 0, stream_>>>(q, k, v, inp, B, T, NH,
                                                        KVH, hs);
  Launched();
  PermuteOutKernel<<<Blocks(n), kThreads, 0, stream_>>>(dy, dout, B, T, NH, hs);
  Launched();
  // datt (T1,T2) = dy v^T: the scores' shape, from v and dy.
  Batched(true, false, T, G * T, hs, v, TypeOf<Q>(), hs, sq, dy, TypeOf<Q>(),
          hs, G * sq, datt, T, G * sa, batch);
  // dv^T (hs,T2) = dy^T (hs,T1) att (T1,T2): summed over the group's rows.
  Batched(false, true, hs, T, G * T, dy, TypeOf<Q>(), hs, G * sq, probs,
          TypeOf<Q>(), T, G * sa, dv, hs, sq, batch);
  CausalSoftmaxBackwardKernel<<<Blocks(rows * 32), kThreads, 0, stream_>>>(
      dscores, datt, probs, rows, T, 1.0f / sqrtf(static_cast<float>(hs)));
  Launched();
  // dq^T (hs,T1) = k^T (hs,T2) dscores^T (T2,T1).
  Batched(false, false, hs, G * T, T, k, TypeOf<Q>(), hs, sq, dscores,
          TypeOf<Q>(), T, G * sa, dq, hs, G * sq, batch);
  // dk^T (hs,T2) = q^T (hs,T1) dscores (T1,T2): summed over the group's rows.
  Batched(false, true, hs, T, G * T, q, TypeOf<Q>(), hs, G * sq, dscores,
          TypeOf<Q>(), T, G * sa, dk, hs, sq, batch);
  UnpermuteQkvAddKernel<<<Blocks(n), kThreads, 0, stream_>>>(dinp, dq, dk, dv,
                                                             B, T, NH, KVH, hs);
  Launched();
}

void CudaBackend::Batched(bool trans_a, bool trans_b, int m, int n, int k,
                          const void* A, cudaDataType_t a_type, int lda,
                          int64_t sa, const void* B, cudaDataType_t b_type,
                          int ldb, int64_t sb, float* D, int ldd, int64_t sd,
                          int batch) {
  const float alpha = 1.0f, beta = 0.0f;
  // bf16 inputs compute in fp32 (accumulation); fp32 inputs as configured.
  const cublasComputeType_t compute =
      a_type == CUDA_R_16BF ? CUBLAS_COMPUTE_32F : compute_;
  PT_CUDA_CHECK(cublasGemmStridedBatchedEx(
      blas_, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, a_type, lda, sa,
      B, b_type, ldb, sb, &beta, D, CUDA_R_32F, ldd, sd, batch, compute,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace ptrain::kernels::cuda_impl
