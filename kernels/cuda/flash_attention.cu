// Fused causal attention (see flash_attention.h), after FlashAttention-2,
// on the m16n8k16 bf16 products of mma.sync with fp32 accumulation. A
// block of 4 warps takes a tile of 64 query rows of one query head
// (forward) or 64 key rows of one key/value head (backward) and walks the
// tiles of the other side that the causal mask leaves (in the backward,
// those of each query head of the key/value head's group in turn); q, k,
// v and dout come from bf16 copies, 16 bytes a load, through ldmatrix.
//
// Forward: warp w owns query rows w*16..w*16+15. For each key tile it
// forms S = q k^T in registers, updates the running row maximum m and sum
// l, and adds P v (P = exp2(S scale log2e - m) as bf16, straight from the
// score registers) to its output rows, rescaled by exp2(m_old - m_new).
//
// Backward: warp w owns key rows w*16..w*16+15 and keeps their dk and dv
// in registers for the whole walk, over the query tiles of each of the
// group's query heads. For each query tile: P^T from S^T and the saved
// lse, dv += P^T do, dP^T = v do^T, dS^T = P^T (dP^T - delta) scale,
// dk += dS^T q; then the block's dS^T (64x64, shared memory) gives
// dq = dS k for the query tile, added to dinp atomically (several key
// tiles contribute to one query row). A key/value head's gradient is thus
// summed over its group in registers, in one order, by one block.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/check.h"
#include "kernels/common/math.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention.h"

namespace ptrain::kernels {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kTile = 64;  // query rows or key columns per block
constexpr int kWarps = 4;  // 16 rows (or columns) of the tile each
constexpr int kThreads = kWarps * 32;
// bf16 row padding: the eight rows an ldmatrix reads fall in different banks.
constexpr int kPad = 8;
constexpr int kLdP = kTile + kPad;  // bf16 rows of 64

// --- mma.sync and ldmatrix -------------------------------------------------
//
// m16n8k16 bf16 products with fp32 accumulation. Fragments (g = lane / 4,
// t = lane % 4): an accumulator holds rows g and g + 8, columns 2t, 2t + 1
// of a 16 x 8 tile; an A operand (16 x 16) rows g and g + 8, columns 2t,
// 2t + 1, 2t + 8, 2t + 9; a B operand (16 x 8) columns g, rows 2t, 2t + 1,
// 2t + 8, 2t + 9. Two accumulator tiles side by side are thus an A operand
// already: the probabilities go from the scores to the next product
// without leaving registers.

__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4],
                                    uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
      "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 bf16 matrices from shared memory: lanes 8i..8i+7 give the row
// addresses of matrix i; r[i] receives this lane's pair of matrix i
// (transposed with kTrans).
template <bool kTrans>
__device__ __forceinline__ void LdMatrix4(uint32_t (&r)[4], const bf16* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  if (kTrans) {
    asm volatile(
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
        : "r"(a));
  } else {
    asm volatile(
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
        : "r"(a));
  }
}

// Where `lane` points LdMatrix4 in a row-major bf16 tile of pitch ld to read
// the 16 x 16 block at (r0, c0) as its four 8 x 8 matrices in the order
// (r0, c0), (r0 + 8, c0), (r0, c0 + 8), (r0 + 8, c0 + 8): an A operand, or
// (transposed) the B operands of two 8-column tiles of a tile whose rows
// are the k dimension.
__device__ __forceinline__ int ColumnsFirst(int lane, int r0, int c0, int ld) {
  return (r0 + lane % 16) * ld + c0 + lane / 16 * 8;
}
// The same block in the order (r0, c0), (r0, c0 + 8), (r0 + 8, c0),
// (r0 + 8, c0 + 8): the B operands of two 8-row tiles of a tile whose rows
// are the n dimension, or (transposed) an A operand of the tile's
// transpose.
__device__ __forceinline__ int RowsFirst(int lane, int r0, int c0, int ld) {
  return (r0 + lane % 8 + lane / 16 * 8) * ld + c0 + lane / 8 % 2 * 8;
}

// Two operands' products side by side: x0, x1 += ax times the two 8-column
// B tiles LdMatrix4 reads at bx (transposed with kTrans), and y0, y1 += ay
// times those at by.
template <bool kTrans>
__device__ __forceinline__ void TwoPairs(
    float (&x0)[4], float (&x1)[4], const uint32_t (&ax)[4], const bf16* bx,
    float (&y0)[4], float (&y1)[4], const uint32_t (&ay)[4], const bf16* by) {
  uint32_t fx[4], fy[4];
  LdMatrix4<kTrans>(fx, bx);
  LdMatrix4<kTrans>(fy, by);
  Mma(x0, ax, fx[0], fx[1]);
  Mma(x1, ax, fx[2], fx[3]);
  Mma(y0, ay, fy[0], fy[1]);
  Mma(y1, ay, fy[2], fy[3]);
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Two accumulator tiles side by side (16 x 16, fp32) as the bf16 A operand
// of the next product.
__device__ __forceinline__ void AccToA(uint32_t (&a)[4], const float (&lo)[4],
                                       const float (&hi)[4]) {
  a[0] = PackBf16(lo[0], lo[1]);
  a[1] = PackBf16(lo[2], lo[3]);
  a[2] = PackBf16(hi[0], hi[1]);
  a[3] = PackBf16(hi[2], hi[3]);
}

// 16 bytes from global to shared memory without passing through registers
// (zeros where !valid); completes at CpAsyncWait.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src,
                                          bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Rows t0..t0+63 of one head's q, k, v or dout from a bf16 copy (row t at
// src + t * stride) into a tile of row pitch HS + kPad, 16 bytes a copy,
// asynchronously; rows past T are zeros.
template <int HS>
__device__ __forceinline__ void LoadTileAsync(bf16* __restrict__ dst,
                                              const bf16* __restrict__ src,
                                              int64_t stride, int t0, int T) {
  constexpr int kChunks = HS / 8;
#pragma unroll
  for (int i = threadIdx.x; i < kTile * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool valid = t0 + r < T;
    CpAsync16(dst + r * (HS + kPad) + c,
              src + int64_t(valid ? t0 + r : 0) * stride + c, valid);
  }
}

// Step `step` of a walk over the tiles of two tensors a and b (rows at
// src + t * stride), double-buffered (a0, b0: two tiles each): starts the
// copies of the tiles at row `next` (none when negative) into the other
// buffer, waits for this step's and the block; returns this step's buffer.
template <int HS>
__device__ __forceinline__ int TilePairStep(bf16* a0, const bf16* a,
                                            int64_t a_stride, bf16* b0,
                                            const bf16* b, int64_t b_stride,
                                            int step, int next, int T) {
  constexpr int kTileElems = kTile * (HS + kPad);
  const int buf = step & 1;
  if (next >= 0) {  // the next tiles, while these work
    LoadTileAsync<HS>(a0 + (buf ^ 1) * kTileElems, a, a_stride, next, T);
    LoadTileAsync<HS>(b0 + (buf ^ 1) * kTileElems, b, b_stride, next, T);
  }
  CpAsyncCommit();
  CpAsyncWait<1>();
  __syncthreads();
  return buf;
}

// TilePairStep over the key and value tiles 0..last of one key/value head
// (keys at kbase, values K further).
template <int HS>
__device__ __forceinline__ int KeyValueStep(bf16* ks0, bf16* vs0,
                                            const bf16* kbase, int64_t K,
                                            int64_t stride, int kt, int last,
                                            int T) {
  return TilePairStep<HS>(ks0, kbase, stride, vs0, kbase + K, stride, kt,
                          kt + 1 <= last ? (kt + 1) * kTile : -1, T);
}

// q, and two buffers each of k and v.
template <int HS>
constexpr size_t ForwardSmem() {
  return 5 * kTile * (HS + kPad) * sizeof(bf16);
}

// Two adjacent output values: fp32, or rounded to bf16 (nearest even) for
// a bf16-stored output, which may sit at any element offset.
__device__ __forceinline__ void StorePair(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void StorePair(bf16* p, float a, float b) {
  if (reinterpret_cast<uintptr_t>(p) % 4 == 0) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  } else {
    p[0] = __float2bfloat16_rn(a);
    p[1] = __float2bfloat16_rn(b);
  }
}

// Warp w owns query rows w*16.. of the block's 64 (of query head h) and
// keeps their q fragments, scores, probabilities and output rows in
// registers; the block shares each key and value tile (of h's key/value
// head) through shared memory. The output is written as it is stored (O:
// fp32 or bf16).
// long: one tile walk whose q fragments, running max and sum and output
// rows live in registers across the loop; device functions would pass them
// through memory or leave register allocation to chance.
template <int HS, typename O>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(O* out, float* lse, const bf16* qkv, int T, int NH,
                       int KVH, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 mma needs sm_80; the backend never launches this
#else
  constexpr int kLdB = HS + kPad;
  constexpr int kD = HS / 16;  // k steps of q k^T
  constexpr int kN = HS / 8;   // output tiles of 8 columns
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kTileElems = kTile * kLdB;
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks0 = qs + kTileElems;       // two buffers
  bf16* vs0 = ks0 + 2 * kTileElems;  // two buffers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int C = NH * HS;
  const math::AttentionHeads heads{NH, KVH, HS};
  const int64_t stride = heads.row(), K = heads.K();
  const bf16* seq = qkv + int64_t(b) * T * stride;
  const bf16* base = seq + heads.q(h);
  const bf16* kbase = seq + heads.k(heads.Kv(h));  // values K further
  const int q0 = qt * kTile;
  LoadTileAsync<HS>(qs, base, stride, q0, T);
  LoadTileAsync<HS>(ks0, kbase, stride, 0, T);
  LoadTileAsync<HS>(vs0, kbase + K, stride, 0, T);
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncthreads();
  uint32_t qf[kD][4];
#pragma unroll
  for (int d = 0; d < kD; ++d) {
    LdMatrix4<false>(qf[d], qs + ColumnsFirst(lane, warp * 16, d * 16, kLdB));
  }

  const int row0 = q0 + warp * 16 + g;  // and row0 + 8
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[kN][4];
#pragma unroll
  for (int j = 0; j < kN; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    const int buf = KeyValueStep<HS>(ks0, vs0, kbase, K, stride, kt, qt, T);
    const bf16* ks = ks0 + buf * kTileElems;
    const bf16* vs = vs0 + buf * kTileElems;

    // S (16 x 64) = q k^T: eight tiles of 8 keys.
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
#pragma unroll
      for (int d = 0; d < kD; ++d) {
        uint32_t kb[4];  // keys j*8.. and (j+1)*8.., dims d*16..
        LdMatrix4<false>(kb, ks + RowsFirst(lane, j * 8, d * 16, kLdB));
        Mma(s[j], qf[d], kb[0], kb[1]);
        Mma(s[j + 1], qf[d], kb[2], kb[3]);
      }
    }

    // Online softmax over this tile, in base 2; rows g and g + 8.
    const bool diagonal = kt == qt;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kt * kTile + j * 8 + 2 * t + (e & 1);
        const int row = row0 + (e >> 1) * 8;
        float x = s[j][e] * scale_log2;
        if (diagonal && key > row) x = -INFINITY;
        s[j][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);  // finite: key 0 is in every row
      alpha[i] = exp2f(m[i] - m_new);
      m[i] = m_new;
      l[i] *= alpha[i];
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2f(s[j][e] - m[e >> 1]);
        l[e >> 1] += s[j][e];  // this lane's share; the quad sums at the end
      }
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }

    // o += P v: P's accumulator tiles 2c, 2c+1 are the A operand of keys
    // c*16..; v through transposed loads (keys are v's rows).
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t pa[4];
      AccToA(pa, s[2 * c], s[2 * c + 1]);
#pragma unroll
      for (int j = 0; j < kN; j += 2) {
        uint32_t vb[4];  // keys c*16.., dims j*8.. and (j+1)*8..
        LdMatrix4<true>(vb, vs + ColumnsFirst(lane, c * 16, j * 8, kLdB));
        Mma(o[j], pa, vb[0], vb[1]);
        Mma(o[j + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // these k, v buffers take the tile after next
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    const int row = row0 + i * 8;
    if (row >= T) continue;
    const float inv = 1.0f / l[i];
    O* orow = out + (int64_t(b) * T + row) * C + h * HS + 2 * t;
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      StorePair(orow + j * 8, o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
    }
    if (t == 0) lse[int64_t(bh) * T + row] = m[i] + log2f(l[i]);
  }
#endif
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(bf16 x) { return __bfloat162float(x); }

// delta (B,NH,T) = rowsum(dout * out), and dout rounded to bf16 (dout16,
// dout's layout) for the products: one warp per (b, t, h) row, one read of
// dout for both. out is fp32 or bf16 as stored.
template <typename O>
__global__ void FlashPrepareKernel(float* delta, bf16* dout16,
                                   const float* dout, const O* out,
                                   int64_t rows, int T, int NH, int hs) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (i >= rows) return;
  const float* a = dout + i * hs;
  const O* o = out + i * hs;
  bf16* r = dout16 + i * hs;
  float s = 0.0f;
  for (int d = lane; d < hs; d += 32) {
    const float x = a[d];
    r[d] = __float2bfloat16_rn(x);
    s += x * ToFloat(o[d]);
  }
  for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
  if (lane == 0) {
    const int64_t bt = i / NH;
    const int h = static_cast<int>(i % NH);
    const int64_t b = bt / T, t = bt % T;
    delta[(b * NH + h) * T + t] = s;
  }
}

// How a warp's accumulator rows reach dinp: written (the block owns them),
// or added atomically (other blocks add to the same rows).
enum class Rows { kWrite, kAtomic };

// A warp's 16 x HS accumulator rows (rows r0 + g and r0 + g + 8 of the
// fragment layout, columns 2t, 2t + 1 of each 8-column tile) into the fp32
// rows at dst (row pitch `stride`), rows past T left out. On sm_90, atomic
// adds go four consecutive floats at a time, lanes t and t^1 trading halves
// first (dst and stride 16-byte aligned, which the caller checks: kVec4).
template <int kN, Rows kHow, bool kVec4>
__device__ __forceinline__ void StoreRows(float* dst, int64_t stride, int r0,
                                          int T, const float (&acc)[kN][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kQuad = kHow == Rows::kAtomic && kVec4;
#else
  constexpr bool kQuad = false;
#endif
  if constexpr (kQuad) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Even t: row g, columns 2t..2t+3; odd t: row g + 8, columns 2t-2..2t+1.
    const bool odd = t & 1;
    const int row = r0 + g + (odd ? 8 : 0);
    float* p = dst + int64_t(row) * stride + 2 * (t & ~1);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      // Even lanes send their row g + 8 pair, odd lanes their row g pair.
      const float s0 = odd ? acc[j][0] : acc[j][2];
      const float s1 = odd ? acc[j][1] : acc[j][3];
      const float x0 = __shfl_xor_sync(0xffffffffu, s0, 1);
      const float x1 = __shfl_xor_sync(0xffffffffu, s1, 1);
      const float4 v = odd ? make_float4(x0, x1, acc[j][2], acc[j][3])
                           : make_float4(acc[j][0], acc[j][1], x0, x1);
      if (row < T) atomicAdd(reinterpret_cast<float4*>(p + j * 8), v);
    }
#endif
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = r0 + g + 8 * i;
      if (row >= T) continue;
      float* p = dst + int64_t(row) * stride + 2 * t;
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        if (kHow == Rows::kAtomic) {
          atomicAdd(p + j * 8, acc[j][2 * i]);
          atomicAdd(p + j * 8 + 1, acc[j][2 * i + 1]);
        } else {
          *reinterpret_cast<float2*>(p + j * 8) =
              make_float2(acc[j][2 * i], acc[j][2 * i + 1]);
        }
      }
    }
  }
}

// k, v, two buffers each of q and do, and (with dq) dS^T.
template <int HS, bool kDq>
constexpr size_t BackwardSmem() {
  return (6 * kTile * (HS + kPad) + (kDq ? kTile * kLdP : 0)) * sizeof(bf16);
}

// A block takes 64 key rows of one key/value head; warp w owns key rows
// w*16.. of them: their dk and dv stay in registers for the whole walk
// over the query tiles (double-buffered in shared memory) of the group's
// query heads, one head after the other, k and v in shared memory. For
// each query tile the warp forms S^T = k q^T, P^T (from the saved lse),
// dv += P^T do, dP^T = v do^T, dS^T = P^T (dP^T - delta) scale and
// dk += dS^T q in registers; the block's dS^T goes through shared memory
// for dq = dS k, 16 query rows a warp, added to dinp atomically (every
// key tile adds to a query row). Without kDq the walk leaves dq to
// FlashDqKernel.
// long: one walk over query tiles that keeps dk and dv accumulators in
// registers for the whole loop (the launch bounds fix their budget).
template <int HS, bool kDq, bool kVec4>
__global__ void __launch_bounds__(kThreads, kDq ? 2 : 3)
    FlashBackwardKernel(float* dinp, const bf16* dout, const bf16* qkv,
                        const float* lse, const float* delta, int T, int NH,
                        int KVH, float scale, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 mma needs sm_80; the backend never launches this
#else
  constexpr int kLdB = HS + kPad;
  constexpr int kD = HS / 16;  // k steps over the head dimension
  constexpr int kN = HS / 8;   // tiles of 8 head dimensions
  constexpr int kTileElems = kTile * kLdB;
  constexpr int kParts = kDq ? 1 : 2;  // of a query tile, one after the other
  constexpr int kJ = 8 / kParts;       // tiles of 8 queries a part
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + kTileElems;
  bf16* qs0 = vs + kTileElems;        // two buffers
  bf16* dos0 = qs0 + 2 * kTileElems;  // two buffers
  bf16* dst = dos0 + 2 * kTileElems;  // dS^T (64 keys x 64 queries)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  const int kt = blockIdx.x;  // the longest walks first
  const int b = blockIdx.y / KVH, kvh = blockIdx.y % KVH;
  const int C = NH * HS;
  const math::AttentionHeads heads{NH, KVH, HS};
  const int64_t stride = heads.row(), K = heads.K();
  const int h0 = kvh * heads.group();  // the group's first query head
  const int64_t seq = int64_t(b) * T * stride;
  // The group's query heads are adjacent: HS columns apart in qkv, dinp
  // and dout, T rows apart in lse and delta. The walk moves these on a
  // head at a time.
  const bf16* base = qkv + seq + heads.q(h0);
  const bf16* dbase = dout + int64_t(b) * T * C + heads.q(h0);
  float* gbase = dinp + seq + heads.q(h0);
  const float* lse_h = lse + (int64_t(b) * NH + h0) * T;
  const float* delta_h = delta + (int64_t(b) * NH + h0) * T;
  const int k0 = kt * kTile;
  const int n_tiles = (T + kTile - 1) / kTile;

  LoadTileAsync<HS>(ks, qkv + seq + heads.k(kvh), stride, k0, T);
  LoadTileAsync<HS>(vs, qkv + seq + heads.k(kvh) + K, stride, k0, T);
  LoadTileAsync<HS>(qs0, base, stride, k0, T);
  LoadTileAsync<HS>(dos0, dbase, C, k0, T);
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncthreads();
  float dk[kN][4], dv[kN][4];
#pragma unroll
  for (int j = 0; j < kN; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;
  }
  const int key0 = k0 + warp * 16 + g;  // and key0 + 8

  // The walk's steps run on over the heads: the tiles after a head's last
  // are the next head's first (tile kt), fetched while the last works.
  int step = 0;
#pragma unroll 1
  for (int left = heads.group(); left > 0; --left) {
    for (int qt = kt; qt < n_tiles; ++qt, ++step) {
      const bool last = qt + 1 == n_tiles;
      const int next = !last ? (qt + 1) * kTile : left > 1 ? k0 : -1;
      const int hop = last ? HS : 0;  // to the next head's columns
      const int buf = TilePairStep<HS>(qs0, base + hop, stride, dos0,
                                       dbase + hop, C, step, next, T);
      const bf16* qs = qs0 + buf * kTileElems;
      const bf16* dos = dos0 + buf * kTileElems;
      const int q0 = qt * kTile;

      // Without dq the tile's 64 queries go in two parts of 32, which halves
      // the score registers (three blocks an SM instead of two).
#pragma unroll 1
      for (int part = 0; part < kParts; ++part) {
        const int qp = part * kJ * 8;  // the part's first query in the tile
        // S^T (16 keys x kJ*8 queries) = k q^T, and dP^T = v do^T.
        float p[kJ][4], dp[kJ][4];
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) p[j][e] = dp[j][e] = 0.0f;
        }
#pragma unroll
        for (int d = 0; d < kD; ++d) {
          // The warp's k and v rows (dims d*16..) come from shared memory each
          // time: registers are what limits the blocks an SM holds.
          uint32_t kf[4], vf[4];
          const int a = ColumnsFirst(lane, warp * 16, d * 16, kLdB);
          LdMatrix4<false>(kf, ks + a);
          LdMatrix4<false>(vf, vs + a);
#pragma unroll
          for (int j = 0; j < kJ; j += 2) {
            const int off = RowsFirst(lane, qp + j * 8, d * 16, kLdB);
            TwoPairs<false>(p[j], p[j + 1], kf, qs + off, dp[j], dp[j + 1], vf,
                            dos + off);
          }
        }
        // P^T = exp2(S^T scale log2e - lse), zero where masked; dS^T in place
        // of dP^T.
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int q = q0 + qp + j * 8 + 2 * t + c;
            const bool in = q < T;
            const float l = in ? __ldg(lse_h + q) : 0.0f;
            const float dl = in ? __ldg(delta_h + q) : 0.0f;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int e = 2 * i + c;
              const float x = in && key0 + 8 * i <= q
                                  ? exp2f(p[j][e] * scale_log2 - l)
                                  : 0.0f;
              p[j][e] = x;
              dp[j][e] = x * (dp[j][e] - dl) * scale;
            }
          }
        }
        // dv += P^T do and dk += dS^T q: the accumulator tiles 2c, 2c+1 are
        // the A operand over queries c*16..; do and q through transposed loads.
#pragma unroll
        for (int c = 0; c < kJ / 2; ++c) {
          uint32_t pa[4];
          AccToA(pa, p[2 * c], p[2 * c + 1]);
          uint32_t sa[4];
          AccToA(sa, dp[2 * c], dp[2 * c + 1]);
          if (kDq) {  // dS^T rows of this warp's keys into shared memory for dq
            bf16* srow = dst + (warp * 16 + g) * kLdP + qp + c * 16 + 2 * t;
            *reinterpret_cast<uint32_t*>(srow) = sa[0];
            *reinterpret_cast<uint32_t*>(srow + 8 * kLdP) = sa[1];
            *reinterpret_cast<uint32_t*>(srow + 8) = sa[2];
            *reinterpret_cast<uint32_t*>(srow + 8 * kLdP + 8) = sa[3];
          }
#pragma unroll
          for (int j = 0; j < kN; j += 2) {
            const int off = ColumnsFirst(lane, qp + c * 16, j * 8, kLdB);
            TwoPairs<true>(dv[j], dv[j + 1], pa, dos + off, dk[j], dk[j + 1],
                           sa, qs + off);
          }
        }
      }
      if (!kDq) {
        __syncthreads();  // this tile's buffers are free again
        continue;
      }
      __syncthreads();  // every warp's dS^T rows are in

      // dq (the warp's 16 query rows) = dS k over the block's 64 keys: dS is
      // dS^T read transposed, k through transposed loads.
      float dq[kN][4];
#pragma unroll
      for (int j = 0; j < kN; ++j)
        dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        uint32_t sa[4];
        LdMatrix4<true>(sa, dst + RowsFirst(lane, c * 16, warp * 16, kLdP));
#pragma unroll
        for (int j = 0; j < kN; j += 2) {
          uint32_t kb[4];
          LdMatrix4<true>(kb, ks + ColumnsFirst(lane, c * 16, j * 8, kLdB));
          Mma(dq[j], sa, kb[0], kb[1]);
          Mma(dq[j + 1], sa, kb[2], kb[3]);
        }
      }
      StoreRows<kN, Rows::kAtomic, kVec4>(gbase, stride, q0 + warp * 16, T, dq);
      __syncthreads();  // dS^T and this tile's buffers are free again
    }
    base += HS;
    dbase += HS;
    gbase += HS;
    lse_h += T;
    delta_h += T;
  }

  // dk, dv: this block's keys only, summed over the group, so written.
  float* gk = dinp + seq + heads.k(kvh);
  StoreRows<kN, Rows::kWrite, false>(gk, stride, k0 + warp * 16, T, dk);
  StoreRows<kN, Rows::kWrite, false>(gk + K, stride, k0 + warp * 16, T, dv);
#endif
}

// q, do, and two buffers each of k and v.
template <int HS>
constexpr size_t DqSmem() {
  return 6 * kTile * (HS + kPad) * sizeof(bf16);
}

// dq on its own pass (FlashDq::kSecondPass): a block takes 64 query rows of
// a query head, as the forward, and walks the key tiles (of the head's
// key/value head) the causal mask leaves. Warp w keeps its 16 rows' q and
// do fragments, lse and delta, and dq in registers; per key tile it
// recomputes S = q k^T and dP = do v^T, P from the saved lse,
// dS = P (dP - delta) scale, and dq += dS k (dS's accumulator tiles are
// the A operand as they are). One block owns each row: no atomics.
// long: one walk over key tiles that keeps the row's dq accumulator and
// q fragments in registers for the whole loop.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashDqKernel(float* dinp, const bf16* dout, const bf16* qkv,
                  const float* lse, const float* delta, int T, int NH, int KVH,
                  float scale, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 mma needs sm_80; the backend never launches this
#else
  constexpr int kLdB = HS + kPad;
  constexpr int kD = HS / 16;  // k steps over the head dimension
  constexpr int kN = HS / 8;   // tiles of 8 head dimensions
  constexpr int kTileElems = kTile * kLdB;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = qs + kTileElems;
  bf16* ks0 = dos + kTileElems;      // two buffers
  bf16* vs0 = ks0 + 2 * kTileElems;  // two buffers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int C = NH * HS;
  const math::AttentionHeads heads{NH, KVH, HS};
  const int64_t stride = heads.row(), K = heads.K();
  const bf16* seq = qkv + int64_t(b) * T * stride;
  const bf16* base = seq + heads.q(h);
  const bf16* kbase = seq + heads.k(heads.Kv(h));  // values K further
  const bf16* dbase = dout + int64_t(b) * T * C + h * HS;
  const int q0 = qt * kTile;
  LoadTileAsync<HS>(qs, base, stride, q0, T);
  LoadTileAsync<HS>(dos, dbase, C, q0, T);
  LoadTileAsync<HS>(ks0, kbase, stride, 0, T);
  LoadTileAsync<HS>(vs0, kbase + K, stride, 0, T);
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncthreads();
  uint32_t qf[kD][4], of[kD][4];
#pragma unroll
  for (int d = 0; d < kD; ++d) {
    const int off = ColumnsFirst(lane, warp * 16, d * 16, kLdB);
    LdMatrix4<false>(qf[d], qs + off);
    LdMatrix4<false>(of[d], dos + off);
  }
  const int row0 = q0 + warp * 16 + g;  // and row0 + 8
  float l[2], dl[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + 8 * i;
    l[i] = row < T ? lse[int64_t(bh) * T + row] : 0.0f;
    dl[i] = row < T ? delta[int64_t(bh) * T + row] : 0.0f;
  }
  float dq[kN][4];
#pragma unroll
  for (int j = 0; j < kN; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    const int buf = KeyValueStep<HS>(ks0, vs0, kbase, K, stride, kt, qt, T);
    const bf16* ks = ks0 + buf * kTileElems;
    const bf16* vs = vs0 + buf * kTileElems;

    // S (16 x 64) = q k^T and dP = do v^T: eight tiles of 8 keys.
    float s[8][4], dp[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
#pragma unroll
      for (int d = 0; d < kD; ++d) {
        const int off = RowsFirst(lane, j * 8, d * 16, kLdB);
        TwoPairs<false>(s[j], s[j + 1], qf[d], ks + off, dp[j], dp[j + 1],
                        of[d], vs + off);
      }
    }
    // P = exp2(S scale log2e - lse), zero where masked; dS in place of dP.
    const bool diagonal = kt == qt;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kt * kTile + j * 8 + 2 * t + (e & 1);
        const int i = e >> 1;
        const float x = !diagonal || key <= row0 + 8 * i
                            ? exp2f(s[j][e] * scale_log2 - l[i])
                            : 0.0f;
        dp[j][e] = x * (dp[j][e] - dl[i]) * scale;
      }
    }
    // dq += dS k: dS's accumulator tiles 2c, 2c+1 are the A operand over
    // keys c*16..; k through transposed loads (keys are k's rows).
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t sa[4];
      AccToA(sa, dp[2 * c], dp[2 * c + 1]);
#pragma unroll
      for (int j = 0; j < kN; j += 2) {
        uint32_t kb[4];
        LdMatrix4<true>(kb, ks + ColumnsFirst(lane, c * 16, j * 8, kLdB));
        Mma(dq[j], sa, kb[0], kb[1]);
        Mma(dq[j + 1], sa, kb[2], kb[3]);
      }
    }
    __syncthreads();  // these k, v buffers take the tile after next
  }
  StoreRows<kN, Rows::kWrite, false>(
      dinp + int64_t(b) * T * stride + heads.q(h), stride, q0 + warp * 16, T,
      dq);
#endif
}

constexpr float kLog2e = 1.4426950408889634f;

// Launches kKernel (kThreads a block) with `bytes` of dynamic shared
// memory, which it is let take past the default 48 KiB once, at its first
// launch.
template <auto kKernel, typename... Args>
void Launch(dim3 grid, size_t bytes, cudaStream_t stream, Args... args) {
  static const bool allowed = [bytes] {
    PT_CUDA_CHECK(cudaFuncSetAttribute(
        kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(bytes)));
    return true;
  }();
  (void)allowed;
  kKernel<<<grid, kThreads, bytes, stream>>>(args...);
  PT_CUDA_CHECK(cudaGetLastError());
}

template <int HS, typename O>
void Forward(O* out, float* lse, const bf16* qkv, int B, int T, int NH, int KVH,
             cudaStream_t stream) {
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  const float scale_log2 = kLog2e / sqrtf(float(HS));
  Launch<FlashForwardKernel<HS, O>>(grid, ForwardSmem<HS>(), stream, out, lse,
                                    qkv, T, NH, KVH, scale_log2);
}

template <int HS>
void Forward(float* out, bf16* out_bf16, float* lse, const bf16* qkv, int B,
             int T, int NH, int KVH, cudaStream_t stream) {
  if (out_bf16 != nullptr) {
    Forward<HS>(out_bf16, lse, qkv, B, T, NH, KVH, stream);
  } else {
    Forward<HS>(out, lse, qkv, B, T, NH, KVH, stream);
  }
}

template <int HS>
void Backward(float* dinp, float* delta, bf16* dout16, const float* dout,
              const float* out32, const bf16* out16, const bf16* qkv,
              const float* lse, int B, int T, int NH, int KVH, FlashDq mode,
              cudaStream_t stream) {
  const int64_t rows = int64_t(B) * T * NH;
  const unsigned prep_blocks = static_cast<unsigned>((rows * 32 + 255) / 256);
  if (out16 != nullptr) {
    FlashPrepareKernel<<<prep_blocks, 256, 0, stream>>>(delta, dout16, dout,
                                                        out16, rows, T, NH, HS);
  } else {
    FlashPrepareKernel<<<prep_blocks, 256, 0, stream>>>(delta, dout16, dout,
                                                        out32, rows, T, NH, HS);
  }
  PT_CUDA_CHECK(cudaGetLastError());
  // The walk that makes dk and dv: a block per key tile and key/value head;
  // dq's second pass: a block per query tile and query head.
  const int tiles = (T + kTile - 1) / kTile;
  const dim3 kv_grid(tiles, B * KVH), q_grid(tiles, B * NH);
  const float scale = 1.0f / sqrtf(float(HS)), scale_log2 = scale * kLog2e;
  if (mode == FlashDq::kSecondPass) {
    Launch<FlashBackwardKernel<HS, false, false>>(
        kv_grid, BackwardSmem<HS, false>(), stream, dinp, dout16, qkv, lse,
        delta, T, NH, KVH, scale, scale_log2);
    Launch<FlashDqKernel<HS>>(q_grid, DqSmem<HS>(), stream, dinp, dout16, qkv,
                              lse, delta, T, NH, KVH, scale, scale_log2);
    return;
  }
  // dq is added up from zero; dk and dv are written.
  const int64_t row = math::MakeAttentionHeads(NH * HS, NH, KVH).row();
  PT_CUDA_CHECK(
      cudaMemsetAsync(dinp, 0, sizeof(float) * size_t(B) * T * row, stream));
  // Four floats an atomic where the rows allow it (sm_90 and 16-byte rows).
  if (reinterpret_cast<uintptr_t>(dinp) % 16 == 0 && row % 4 == 0) {
    Launch<FlashBackwardKernel<HS, true, true>>(
        kv_grid, BackwardSmem<HS, true>(), stream, dinp, dout16, qkv, lse,
        delta, T, NH, KVH, scale, scale_log2);
  } else {
    Launch<FlashBackwardKernel<HS, true, false>>(
        kv_grid, BackwardSmem<HS, true>(), stream, dinp, dout16, qkv, lse,
        delta, T, NH, KVH, scale, scale_log2);
  }
}

}  // namespace

FlashDq FlashDqFromEnv() {
  const char* env = std::getenv("PTRAIN_CUDA_FLASH_DQ");
  if (env == nullptr || *env == '\0') return kFlashDqDefault;
  const std::string v = env;
  const std::string why =
      "PTRAIN_CUDA_FLASH_DQ must be atomic or pass, not '" + v + "'";
  PT_CHECK(v == "atomic" || v == "pass", why.c_str());
  return v == "atomic" ? FlashDq::kAtomic : FlashDq::kSecondPass;
}

bool FlashAttentionSupports(int hs, int major) {
  return major >= 8 && (hs == 16 || hs == 32 || hs == 64);
}

void FlashAttentionForward(float* out, __nv_bfloat16* out_bf16, float* lse,
                           const __nv_bfloat16* qkv, int B, int T, int NH,
                           int KVH, int hs, cudaStream_t stream) {
  switch (hs) {
    case 16:
      return Forward<16>(out, out_bf16, lse, qkv, B, T, NH, KVH, stream);
    case 32:
      return Forward<32>(out, out_bf16, lse, qkv, B, T, NH, KVH, stream);
    case 64:
      return Forward<64>(out, out_bf16, lse, qkv, B, T, NH, KVH, stream);
  }
  PT_CHECK(false, "FlashAttentionForward: unsupported head size");
}

void FlashAttentionBackward(float* dinp, float* delta, __nv_bfloat16* dout_bf16,
                            const float* dout, const float* out,
                            const __nv_bfloat16* out_bf16,
                            const __nv_bfloat16* qkv, const float* lse, int B,
                            int T, int NH, int KVH, int hs, FlashDq mode,
                            cudaStream_t stream) {
  switch (hs) {
    case 16:
      return Backward<16>(dinp, delta, dout_bf16, dout, out, out_bf16, qkv, lse,
                          B, T, NH, KVH, mode, stream);
    case 32:
      return Backward<32>(dinp, delta, dout_bf16, dout, out, out_bf16, qkv, lse,
                          B, T, NH, KVH, mode, stream);
    case 64:
      return Backward<64>(dinp, delta, dout_bf16, dout, out, out_bf16, qkv, lse,
                          B, T, NH, KVH, mode, stream);
  }
  PT_CHECK(false, "FlashAttentionBackward: unsupported head size");
}

}  // namespace ptrain::kernels
