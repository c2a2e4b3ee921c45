// Fused causal attention (see flash_attention.h), after FlashAttention-2,
// on the m16n8k16 bf16 products of mma.sync with fp32 accumulation. A
// block of 4 warps takes a tile of 64 query rows (forward) or 64 key rows
// (backward) of one head and walks the tiles of the other side that the
// causal mask leaves; q, k, v and dout come from bf16 copies, 16 bytes a
// load, through ldmatrix.
//
// Forward: warp w owns query rows w*16..w*16+15. For each key tile it
// forms S = q k^T in registers, updates the running row maximum m and sum
// l, and adds P v (P = exp2(S scale log2e - m) as bf16, straight from the
// score registers) to its output rows, rescaled by exp2(m_old - m_new).
//
// Backward: warp w owns key rows w*16..w*16+15 and keeps their dk and dv
// in registers for the whole walk. For each query tile: P^T from S^T and
// the saved lse, dv += P^T do, dP^T = v do^T, dS^T = P^T (dP^T - delta)
// scale, dk += dS^T q; then the block's dS^T (64x64, shared memory) gives
// dq = dS k for the query tile, added to dinp atomically (several key
// tiles contribute to one query row).
#include <cuda_bf16.h>

#include <cmath>

#include "common/check.h"
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

// q, and two buffers each of k and v.
template <int HS>
constexpr size_t ForwardSmem() {
  return 5 * kTile * (HS + kPad) * sizeof(bf16);
}

// Warp w owns query rows w*16.. of the block's 64 and keeps their q
// fragments, scores, probabilities and output rows in registers; the
// block shares each key and value tile through shared memory.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(float* out, float* lse, const bf16* qkv, int T, int NH,
                       float scale_log2) {
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
  const int64_t stride = 3 * C;
  const bf16* base = qkv + int64_t(b) * T * stride + h * HS;
  const int q0 = qt * kTile;
  LoadTileAsync<HS>(qs, base, stride, q0, T);
  LoadTileAsync<HS>(ks0, base + C, stride, 0, T);
  LoadTileAsync<HS>(vs0, base + 2 * C, stride, 0, T);
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
    const int buf = kt & 1;
    const bf16* ks = ks0 + buf * kTileElems;
    const bf16* vs = vs0 + buf * kTileElems;
    if (kt + 1 <= qt) {  // the next k, v tiles, while these work
      LoadTileAsync<HS>(ks0 + (buf ^ 1) * kTileElems, base + C, stride,
                        (kt + 1) * kTile, T);
      LoadTileAsync<HS>(vs0 + (buf ^ 1) * kTileElems, base + 2 * C, stride,
                        (kt + 1) * kTile, T);
    }
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();

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
    float* orow = out + (int64_t(b) * T + row) * C + h * HS + 2 * t;
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      *reinterpret_cast<float2*>(orow + j * 8) =
          make_float2(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
    }
    if (t == 0) lse[int64_t(bh) * T + row] = m[i] + log2f(l[i]);
  }
#endif
}

// delta (B,NH,T) = rowsum(dout * out): one warp per (b, t, h) row.
__global__ void FlashDeltaKernel(float* delta, const float* dout,
                                 const float* out, int64_t rows, int T, int NH,
                                 int hs) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (i >= rows) return;
  const float* a = dout + i * hs;
  const float* o = out + i * hs;
  float s = 0.0f;
  for (int d = lane; d < hs; d += 32) s += a[d] * o[d];
  for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
  if (lane == 0) {
    const int64_t bt = i / NH;
    const int h = static_cast<int>(i % NH);
    const int64_t b = bt / T, t = bt % T;
    delta[(b * NH + h) * T + t] = s;
  }
}

// k, v, two buffers each of q and do, and dS^T.
template <int HS>
constexpr size_t BackwardSmem() {
  return (6 * kTile * (HS + kPad) + kTile * kLdP) * sizeof(bf16);
}

// Warp w owns key rows w*16.. of the block's 64: their k and v fragments,
// and their dk and dv, stay in registers for the whole walk over the query
// tiles (double-buffered in shared memory). For each query tile the warp
// forms S^T = k q^T, P^T (from the saved lse), dv += P^T do, dP^T = v do^T,
// dS^T = P^T (dP^T - delta) scale and dk += dS^T q in registers; the
// block's dS^T goes through shared memory for dq = dS k, 16 query rows a
// warp, added to dinp atomically (every key tile adds to a query row).
template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKernel(float* dinp, const bf16* dout, const bf16* qkv,
                        const float* lse, const float* delta, int T, int NH,
                        float scale, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 mma needs sm_80; the backend never launches this
#else
  constexpr int kLdB = HS + kPad;
  constexpr int kD = HS / 16;  // k steps over the head dimension
  constexpr int kN = HS / 8;   // tiles of 8 head dimensions
  constexpr int kTileElems = kTile * kLdB;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + kTileElems;
  bf16* qs0 = vs + kTileElems;        // two buffers
  bf16* dos0 = qs0 + 2 * kTileElems;  // two buffers
  bf16* dst = dos0 + 2 * kTileElems;  // dS^T (64 keys x 64 queries)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  const int kt = blockIdx.x;  // the longest walks first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int C = NH * HS;
  const int64_t stride = 3 * C;
  const bf16* base = qkv + int64_t(b) * T * stride + h * HS;
  const bf16* dbase = dout + int64_t(b) * T * C + h * HS;
  float* gbase = dinp + int64_t(b) * T * stride + h * HS;
  const float* lse_h = lse + int64_t(bh) * T;
  const float* delta_h = delta + int64_t(bh) * T;
  const int k0 = kt * kTile;
  const int n_tiles = (T + kTile - 1) / kTile;

  LoadTileAsync<HS>(ks, base + C, stride, k0, T);
  LoadTileAsync<HS>(vs, base + 2 * C, stride, k0, T);
  LoadTileAsync<HS>(qs0, base, stride, k0, T);
  LoadTileAsync<HS>(dos0, dbase, C, k0, T);
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncthreads();
  uint32_t kf[kD][4], vf[kD][4];
#pragma unroll
  for (int d = 0; d < kD; ++d) {
    const int off = ColumnsFirst(lane, warp * 16, d * 16, kLdB);
    LdMatrix4<false>(kf[d], ks + off);
    LdMatrix4<false>(vf[d], vs + off);
  }
  float dk[kN][4], dv[kN][4];
#pragma unroll
  for (int j = 0; j < kN; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;
  }
  const int key0 = k0 + warp * 16 + g;  // and key0 + 8

  for (int qt = kt; qt < n_tiles; ++qt) {
    const int buf = (qt - kt) & 1;
    const bf16* qs = qs0 + buf * kTileElems;
    const bf16* dos = dos0 + buf * kTileElems;
    if (qt + 1 < n_tiles) {  // the next query tile, while this one works
      LoadTileAsync<HS>(qs0 + (buf ^ 1) * kTileElems, base, stride,
                        (qt + 1) * kTile, T);
      LoadTileAsync<HS>(dos0 + (buf ^ 1) * kTileElems, dbase, C,
                        (qt + 1) * kTile, T);
    }
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    const int q0 = qt * kTile;

    // S^T (16 keys x 64 queries) = k q^T, and dP^T = v do^T.
    float p[8][4], dp[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[j][e] = dp[j][e] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
#pragma unroll
      for (int d = 0; d < kD; ++d) {
        const int off = RowsFirst(lane, j * 8, d * 16, kLdB);
        uint32_t qb[4], ob[4];
        LdMatrix4<false>(qb, qs + off);
        LdMatrix4<false>(ob, dos + off);
        Mma(p[j], kf[d], qb[0], qb[1]);
        Mma(p[j + 1], kf[d], qb[2], qb[3]);
        Mma(dp[j], vf[d], ob[0], ob[1]);
        Mma(dp[j + 1], vf[d], ob[2], ob[3]);
      }
    }
    // P^T = exp2(S^T scale log2e - lse), zero where masked; dS^T in place
    // of dP^T.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int q = q0 + j * 8 + 2 * t + c;
        const bool in = q < T;
        const float l = in ? __ldg(lse_h + q) : 0.0f;
        const float dl = in ? __ldg(delta_h + q) : 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int e = 2 * i + c;
          const float x =
              in && key0 + 8 * i <= q ? exp2f(p[j][e] * scale_log2 - l) : 0.0f;
          p[j][e] = x;
          dp[j][e] = x * (dp[j][e] - dl) * scale;
        }
      }
    }
    // dv += P^T do and dk += dS^T q: the accumulator tiles 2c, 2c+1 are
    // the A operand over queries c*16..; do and q through transposed loads.
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t pa[4];
      AccToA(pa, p[2 * c], p[2 * c + 1]);
      uint32_t sa[4];
      AccToA(sa, dp[2 * c], dp[2 * c + 1]);
      // dS^T rows of this warp's keys into shared memory for dq.
      bf16* srow = dst + (warp * 16 + g) * kLdP + c * 16 + 2 * t;
      *reinterpret_cast<uint32_t*>(srow) = sa[0];
      *reinterpret_cast<uint32_t*>(srow + 8 * kLdP) = sa[1];
      *reinterpret_cast<uint32_t*>(srow + 8) = sa[2];
      *reinterpret_cast<uint32_t*>(srow + 8 * kLdP + 8) = sa[3];
#pragma unroll
      for (int j = 0; j < kN; j += 2) {
        const int off = ColumnsFirst(lane, c * 16, j * 8, kLdB);
        uint32_t ob[4], qb[4];
        LdMatrix4<true>(ob, dos + off);
        LdMatrix4<true>(qb, qs + off);
        Mma(dv[j], pa, ob[0], ob[1]);
        Mma(dv[j + 1], pa, ob[2], ob[3]);
        Mma(dk[j], sa, qb[0], qb[1]);
        Mma(dk[j + 1], sa, qb[2], qb[3]);
      }
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
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int q = q0 + warp * 16 + g + 8 * i;
      if (q >= T) continue;
      float* row = gbase + int64_t(q) * stride + 2 * t;
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        atomicAdd(row + j * 8, dq[j][2 * i]);
        atomicAdd(row + j * 8 + 1, dq[j][2 * i + 1]);
      }
    }
    __syncthreads();  // dS^T and this tile's buffers are free again
  }

  // dk, dv: this block's keys only, so plain adds.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = key0 + 8 * i;
    if (key >= T) continue;
    float* row = gbase + int64_t(key) * stride + 2 * t;
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      float2* pk = reinterpret_cast<float2*>(row + C + j * 8);
      float2* pv = reinterpret_cast<float2*>(row + 2 * C + j * 8);
      const float2 a = *pk, v = *pv;
      *pk = make_float2(a.x + dk[j][2 * i], a.y + dk[j][2 * i + 1]);
      *pv = make_float2(v.x + dv[j][2 * i], v.y + dv[j][2 * i + 1]);
    }
  }
#endif
}

constexpr float kLog2e = 1.4426950408889634f;

// Lets `kernel` take `bytes` of dynamic shared memory, past the default
// 48 KiB; true, for a function-local static that does it once.
template <typename Kernel>
bool AllowSharedMemory(Kernel kernel, size_t bytes) {
  PT_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)));
  return true;
}

template <int HS>
void Forward(float* out, float* lse, const bf16* qkv, int B, int T, int NH,
             cudaStream_t stream) {
  constexpr size_t smem = ForwardSmem<HS>();
  static const bool allowed = AllowSharedMemory(FlashForwardKernel<HS>, smem);
  (void)allowed;
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  const float scale_log2 = kLog2e / sqrtf(float(HS));
  FlashForwardKernel<HS>
      <<<grid, kThreads, smem, stream>>>(out, lse, qkv, T, NH, scale_log2);
  PT_CUDA_CHECK(cudaGetLastError());
}

template <int HS>
void Backward(float* dinp, float* delta, const float* dout,
              const bf16* dout_bf16, const float* out, const bf16* qkv,
              const float* lse, int B, int T, int NH, cudaStream_t stream) {
  const int64_t rows = int64_t(B) * T * NH;
  FlashDeltaKernel<<<static_cast<unsigned>((rows * 32 + 255) / 256), 256, 0,
                     stream>>>(delta, dout, out, rows, T, NH, HS);
  PT_CUDA_CHECK(cudaGetLastError());
  constexpr size_t smem = BackwardSmem<HS>();
  static const bool allowed = AllowSharedMemory(FlashBackwardKernel<HS>, smem);
  (void)allowed;
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  const float scale = 1.0f / sqrtf(float(HS));
  FlashBackwardKernel<HS><<<grid, kThreads, smem, stream>>>(
      dinp, dout_bf16, qkv, lse, delta, T, NH, scale, scale * kLog2e);
  PT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool FlashAttentionSupports(int hs, int major) {
  return major >= 8 && (hs == 16 || hs == 32 || hs == 64);
}

void FlashAttentionForward(float* out, float* lse, const __nv_bfloat16* qkv,
                           int B, int T, int NH, int hs, cudaStream_t stream) {
  switch (hs) {
    case 16:
      return Forward<16>(out, lse, qkv, B, T, NH, stream);
    case 32:
      return Forward<32>(out, lse, qkv, B, T, NH, stream);
    case 64:
      return Forward<64>(out, lse, qkv, B, T, NH, stream);
  }
  PT_CHECK(false, "FlashAttentionForward: unsupported head size");
}

void FlashAttentionBackward(float* dinp, float* delta, const float* dout,
                            const __nv_bfloat16* dout_bf16, const float* out,
                            const __nv_bfloat16* qkv, const float* lse, int B,
                            int T, int NH, int hs, cudaStream_t stream) {
  switch (hs) {
    case 16:
      return Backward<16>(dinp, delta, dout, dout_bf16, out, qkv, lse, B, T, NH,
                          stream);
    case 32:
      return Backward<32>(dinp, delta, dout, dout_bf16, out, qkv, lse, B, T, NH,
                          stream);
    case 64:
      return Backward<64>(dinp, delta, dout, dout_bf16, out, qkv, lse, B, T, NH,
                          stream);
  }
  PT_CHECK(false, "FlashAttentionBackward: unsupported head size");
}

}  // namespace ptrain::kernels
