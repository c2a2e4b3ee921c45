// Fused causal attention (see flash_attention.h), after FlashAttention-2:
// a block of 4 warps takes a tile of 64 query rows (forward) or 64 key
// columns (backward) of one head and walks the tiles of the other side
// that the causal mask leaves, with the 16x16x16 bf16 products of WMMA.
//
// Forward: warp w owns query rows w*16..w*16+15 of the tile. For each key
// tile it forms S = q k^T (16x64, fp32) in shared memory, updates the
// running row maximum m and sum l (two lanes per row, 32 columns each),
// writes P = exp2(S scale log2e - m) as bf16 and adds P v to its rows of
// the output, rescaled by exp2(m_old - m_new).
//
// Backward: warp w owns key columns w*16..w*16+15 of the tile and keeps
// their dk and dv in accumulator fragments for the whole walk. For each
// query tile: P^T from S^T and the saved lse, dv += P^T do, dP^T = v do^T,
// dS^T = P^T (dP^T - delta) scale, dk += dS^T q; then the block's dS^T
// (64x64) gives dq = dS k for the query tile, added to dinp atomically
// (several key tiles contribute to one query row).
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>

#include "common/check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention.h"

namespace ptrain::kernels {

namespace {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;  // query rows or key columns per block
constexpr int kWarps = 4;  // 16 rows (or columns) of the tile each
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;              // bf16 row padding: fewer bank conflicts
constexpr int kFPad = 4;             // fp32 row padding
constexpr int kLdS = kTile + kFPad;  // fp32 rows of 64
constexpr int kLdP = kTile + kPad;   // bf16 rows of 64

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragACol =
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol =
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Rows t0..t0+63 of one head's q, k, v or dout (row t at src + t * stride)
// into a bf16 tile of row pitch HS + kPad; rows past T are zeros. A thread
// takes pairs of neighbours (one 4-byte store each), and its loads go out
// in batches of 16 before their conversions, so that they are in flight
// together rather than one round trip each.
template <int HS>
__device__ __forceinline__ void LoadTile(bf16* __restrict__ dst,
                                         const float* __restrict__ src,
                                         int64_t stride, int t0, int T) {
  constexpr int kPairs = kTile * HS / 2 / kThreads;  // per thread
  constexpr int kBatch = kPairs < 8 ? kPairs : 8;
#pragma unroll 1
  for (int j0 = 0; j0 < kPairs; j0 += kBatch) {
    float x[2 * kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = threadIdx.x + (j0 + j) * kThreads;
      const int t = t0 + i / (HS / 2), d = 2 * (i % (HS / 2));
      const float* p = src + int64_t(t) * stride + d;
      x[2 * j] = t < T ? __ldg(p) : 0.0f;
      x[2 * j + 1] = t < T ? __ldg(p + 1) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = threadIdx.x + (j0 + j) * kThreads;
      const int r = i / (HS / 2), d = 2 * (i % (HS / 2));
      *reinterpret_cast<__nv_bfloat162*>(dst + r * (HS + kPad) + d) =
          __floats2bfloat162_rn(x[2 * j], x[2 * j + 1]);
    }
  }
}

// N floats of a shared-memory row (16-byte aligned) into registers.
template <int N>
__device__ __forceinline__ void LoadRow(float (&x)[N], const float* p) {
#pragma unroll
  for (int c = 0; c < N; c += 4) {
    const float4 v = *reinterpret_cast<const float4*>(p + c);
    x[c] = v.x;
    x[c + 1] = v.y;
    x[c + 2] = v.z;
    x[c + 3] = v.w;
  }
}

// Eight floats as bf16 into a shared-memory row (16-byte aligned).
__device__ __forceinline__ void StoreBf16x8(bf16* p, const float* x) {
  __nv_bfloat162 h[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    h[k] = __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]);
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(h);
}

// The warp's 16 x 64 fp32 tile at out (row pitch kLdS) = a b^T: a is 16
// rows and b 64 rows of HS bf16 (row pitch HS + kPad).
template <int HS>
__device__ __forceinline__ void MulABt(float* out, const bf16* a,
                                       const bf16* b) {
  constexpr int kLdB = HS + kPad;
  Acc s[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) wmma::fill_fragment(s[j], 0.0f);
  for (int kk = 0; kk < HS; kk += 16) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk, kLdB);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      FragBCol fb;  // b^T: element (d, row) at b[row][d]
      wmma::load_matrix_sync(fb, b + j * 16 * kLdB + kk, kLdB);
      wmma::mma_sync(s[j], fa, fb, s[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    wmma::store_matrix_sync(out + j * 16, s[j], kLdS, wmma::mem_row_major);
  }
}

// acc (16 x HS) += a b: a is 16 x 64 bf16 (row pitch lda), b 64 x HS bf16
// (row pitch HS + kPad).
template <int HS>
__device__ __forceinline__ void MulAddAB(Acc (&acc)[HS / 16], const bf16* a,
                                         int lda, const bf16* b) {
  constexpr int kLdB = HS + kPad;
  for (int kk = 0; kk < kTile; kk += 16) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk, lda);
#pragma unroll
    for (int j = 0; j < HS / 16; ++j) {
      FragB fb;
      wmma::load_matrix_sync(fb, b + kk * kLdB + j * 16, kLdB);
      wmma::mma_sync(acc[j], fa, fb, acc[j]);
    }
  }
}

// N accumulator fragments side by side into an fp32 tile of pitch kLdS.
template <int N>
__device__ __forceinline__ void StoreAcc(float* out, const Acc (&acc)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    wmma::store_matrix_sync(out + j * 16, acc[j], kLdS, wmma::mem_row_major);
  }
}

template <int N>
__device__ __forceinline__ void Clear(Acc (&acc)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) wmma::fill_fragment(acc[j], 0.0f);
}

// --- the forward on raw mma.sync ------------------------------------------
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

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Rows t0..t0+63 of one head's q, k or v from the bf16 (B,T,3,NH,HS) copy
// (row t at src + t * stride) into a tile of row pitch HS + kPad, 16 bytes
// a load; rows past T are zeros.
template <int HS>
__device__ __forceinline__ void LoadTileBf16(bf16* __restrict__ dst,
                                             const bf16* __restrict__ src,
                                             int64_t stride, int t0, int T) {
  constexpr int kChunks = HS / 8;  // 16-byte chunks a row
#pragma unroll
  for (int i = threadIdx.x; i < kTile * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (t0 + r < T) {
      v = __ldg(
          reinterpret_cast<const uint4*>(src + int64_t(t0 + r) * stride + c));
    }
    *reinterpret_cast<uint4*>(dst + r * (HS + kPad) + c) = v;
  }
}

template <int HS>
constexpr size_t ForwardSmem() {
  return 3 * kTile * (HS + kPad) * sizeof(bf16);
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
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kTile * kLdB;
  bf16* vs = ks + kTile * kLdB;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int C = NH * HS;
  const int64_t stride = 3 * C;
  const bf16* base = qkv + int64_t(b) * T * stride + h * HS;
  const int q0 = qt * kTile;
  LoadTileBf16<HS>(qs, base, stride, q0, T);
  __syncthreads();
  uint32_t qf[kD][4];
#pragma unroll
  for (int d = 0; d < kD; ++d) {
    LdMatrix4<false>(
        qf[d], qs + (warp * 16 + lane % 16) * kLdB + d * 16 + lane / 16 * 8);
  }

  const int row0 = q0 + warp * 16 + g;  // and row0 + 8
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[kN][4];
#pragma unroll
  for (int j = 0; j < kN; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // everyone is done with the previous k, v tiles
    LoadTileBf16<HS>(ks, base + C, stride, kt * kTile, T);
    LoadTileBf16<HS>(vs, base + 2 * C, stride, kt * kTile, T);
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
        LdMatrix4<false>(kb, ks + (j * 8 + lane % 8 + lane / 16 * 8) * kLdB +
                                 d * 16 + (lane / 8) % 2 * 8);
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
      const uint32_t pa[4] = {PackBf16(s[2 * c][0], s[2 * c][1]),
                              PackBf16(s[2 * c][2], s[2 * c][3]),
                              PackBf16(s[2 * c + 1][0], s[2 * c + 1][1]),
                              PackBf16(s[2 * c + 1][2], s[2 * c + 1][3])};
#pragma unroll
      for (int j = 0; j < kN; j += 2) {
        uint32_t vb[4];  // keys c*16.., dims j*8.. and (j+1)*8..
        LdMatrix4<true>(
            vb, vs + (c * 16 + lane % 8 + (lane / 8) % 2 * 8) * kLdB + j * 8 +
                    lane / 16 * 8);
        Mma(o[j], pa, vb[0], vb[1]);
        Mma(o[j + 1], pa, vb[2], vb[3]);
      }
    }
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

template <int HS>
constexpr size_t BackwardSmem() {
  return 4 * kTile * (HS + kPad) * sizeof(bf16) +  // k, v, q, do
         kWarps * 16 * kLdS * sizeof(float) +      // S^T, dP^T, dq, dk, dv
         kWarps * 16 * kLdP * sizeof(bf16) +       // P^T
         kTile * kLdP * sizeof(bf16) +             // dS^T, all warps
         2 * kTile * sizeof(float);                // lse, delta
}

template <int HS>
__global__ void __launch_bounds__(kThreads, 3)
    FlashBackwardKernel(float* dinp, const float* dout, const float* inp,
                        const float* lse, const float* delta, int T, int NH,
                        float scale, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 WMMA needs sm_80; the backend never launches this
#else
  constexpr int kLdB = HS + kPad;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + kTile * kLdB;
  bf16* qs = vs + kTile * kLdB;
  bf16* dos = qs + kTile * kLdB;
  float* st_all = reinterpret_cast<float*>(dos + kTile * kLdB);
  bf16* pt_all = reinterpret_cast<bf16*>(st_all + kWarps * 16 * kLdS);
  bf16* dst = pt_all + kWarps * 16 * kLdP;
  float* lse_s = reinterpret_cast<float*>(dst + kTile * kLdP);
  float* delta_s = lse_s + kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* st = st_all + warp * 16 * kLdS;
  bf16* pt = pt_all + warp * 16 * kLdP;

  const int kt = blockIdx.x;  // the longest walks first
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int C = NH * HS;
  const int64_t stride = 3 * C;
  const float* base = inp + int64_t(b) * T * stride + h * HS;
  const float* dbase = dout + int64_t(b) * T * C + h * HS;
  float* gbase = dinp + int64_t(b) * T * stride + h * HS;
  const int k0 = kt * kTile;
  LoadTile<HS>(ks, base + C, stride, k0, T);
  LoadTile<HS>(vs, base + 2 * C, stride, k0, T);

  Acc dk[HS / 16], dv[HS / 16];
  Clear(dk);
  Clear(dv);
  // This lane's share of a (16 keys x 64 queries) tile: key row r, query
  // columns half*32..
  const int r = lane / 2, half = lane % 2;
  const int key = k0 + warp * 16 + r;
  const int n_tiles = (T + kTile - 1) / kTile;

  for (int qt = kt; qt < n_tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // the previous query tile is done with
    LoadTile<HS>(qs, base, stride, q0, T);
    LoadTile<HS>(dos, dbase, C, q0, T);
    for (int i = threadIdx.x; i < kTile; i += kThreads) {
      const bool in = q0 + i < T;
      lse_s[i] = in ? lse[int64_t(bh) * T + q0 + i] : 0.0f;
      delta_s[i] = in ? delta[int64_t(bh) * T + q0 + i] : 0.0f;
    }
    __syncthreads();

    // S^T (16 keys x 64 queries) = k_w q^T.
    MulABt<HS>(st, ks + warp * 16 * kLdB, qs);
    __syncwarp();
    float p[32];
    LoadRow(p, st + r * kLdS + half * 32);
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int q = q0 + half * 32 + c;
      p[c] = q < T && key <= q ? exp2f(p[c] * scale_log2 - lse_s[half * 32 + c])
                               : 0.0f;
    }
#pragma unroll
    for (int c = 0; c < 32; c += 8) {
      StoreBf16x8(pt + r * kLdP + half * 32 + c, p + c);
    }
    __syncwarp();

    // dv_w += P^T_w do; dP^T_w = v_w do^T.
    MulAddAB<HS>(dv, pt, kLdP, dos);
    MulABt<HS>(st, vs + warp * 16 * kLdB, dos);  // the scores' rows are read
    __syncwarp();
#pragma unroll
    for (int c = 0; c < 32; c += 8) {
      float ds[8];
      LoadRow(ds, st + r * kLdS + half * 32 + c);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        ds[k] = p[c + k] * (ds[k] - delta_s[half * 32 + c + k]) * scale;
      }
      StoreBf16x8(dst + (warp * 16 + r) * kLdP + half * 32 + c, ds);
    }
    __syncwarp();

    // dk_w += dS^T_w q.
    MulAddAB<HS>(dk, dst + warp * 16 * kLdP, kLdP, qs);
    __syncthreads();  // every warp's dS^T rows are in

    // dq rows warp*16.. of the query tile = dS k: dS (query, key) is
    // dS^T[key][query], a column-major A.
    Acc dq[HS / 16];
    Clear(dq);
    for (int kk = 0; kk < kTile; kk += 16) {
      FragACol a;
      wmma::load_matrix_sync(a, dst + kk * kLdP + warp * 16, kLdP);
#pragma unroll
      for (int j = 0; j < HS / 16; ++j) {
        FragB kb;
        wmma::load_matrix_sync(kb, ks + kk * kLdB + j * 16, kLdB);
        wmma::mma_sync(dq[j], a, kb, dq[j]);
      }
    }
    StoreAcc(st, dq);
    __syncwarp();
    for (int i = lane; i < 16 * HS; i += 32) {
      const int rr = i / HS, d = i % HS;
      const int q = q0 + warp * 16 + rr;
      if (q < T) atomicAdd(gbase + int64_t(q) * stride + d, st[rr * kLdS + d]);
    }
    __syncwarp();
  }

  // dk, dv: this block's keys only, so plain adds.
  for (int part = 1; part <= 2; ++part) {
    StoreAcc(st, part == 1 ? dk : dv);
    __syncwarp();
    for (int i = lane; i < 16 * HS; i += 32) {
      const int rr = i / HS, d = i % HS;
      const int kpos = k0 + warp * 16 + rr;
      if (kpos < T) {
        gbase[int64_t(kpos) * stride + part * C + d] += st[rr * kLdS + d];
      }
    }
    __syncwarp();
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
void Backward(float* dinp, float* delta, const float* dout, const float* out,
              const float* inp, const float* lse, int B, int T, int NH,
              cudaStream_t stream) {
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
      dinp, dout, inp, lse, delta, T, NH, scale, scale * kLog2e);
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
                            const float* out, const float* inp,
                            const float* lse, int B, int T, int NH, int hs,
                            cudaStream_t stream) {
  switch (hs) {
    case 16:
      return Backward<16>(dinp, delta, dout, out, inp, lse, B, T, NH, stream);
    case 32:
      return Backward<32>(dinp, delta, dout, out, inp, lse, B, T, NH, stream);
    case 64:
      return Backward<64>(dinp, delta, dout, out, inp, lse, B, T, NH, stream);
  }
  PT_CHECK(false, "FlashAttentionBackward: unsupported head size");
}

}  // namespace ptrain::kernels
