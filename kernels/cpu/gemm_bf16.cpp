// The bf16 GEMM of the CPU backend's bf16 precision: fp32 operands rounded
// to bf16 (to nearest, ties to even) into per-thread scratch, multiplied by
// oneDNN's bf16 matmul (AVX512_BF16 dot products) with fp32 accumulation
// into an fp32 C. The left operand is rounded into a dense row-major copy;
// the right one straight into the blocked layout oneDNN's matmul kernel
// reads when given the choice (pairs of K rows interleaved, in blocks of
// 32 K rows by 16 to 64 columns), which it then needs not pack again: up to
// 15% faster here. Known layouts are packed in this file, in one pass as
// fast as the plain rounding; any other the matmul asks for goes through
// oneDNN's reorder (same rounding, slower). Primitives are made once per
// shape and kept.

#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ptrain::kernels {

namespace {

using internal::RoundToBf16;

// x, or GELU(x) when kGelu (an operand that is GELU of the stored one, never
// kept in fp32), rounded; a value already in bf16 as it is.
template <bool kGelu>
inline uint16_t Round(float x) {
  return RoundToBf16(kGelu ? internal::Gelu(x) : x);
}
template <bool kGelu>
inline uint16_t Round(uint16_t x) {
  return kGelu ? RoundToBf16(internal::Gelu(internal::FromBf16(x))) : x;
}

// ToBf16's plain conversion of fp32 src with each column's sum of the
// unrounded values added to col_sums (a bias gradient in the same pass).
template <bool kGelu>
void ToBf16WithSums(uint16_t* dst, const float* src, int64_t rows, int64_t cols,
                    int64_t ld, float* col_sums) {
  internal::ColumnSums<1>(
      rows, cols, std::array<float*, 1>{col_sums},
      [&](int64_t r0, int64_t r1, const std::array<float*, 1>& sum) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* s = src + r * ld;
          uint16_t* d = dst + r * cols;
#pragma omp simd
          for (int64_t c = 0; c < cols; ++c) {
            const float v = kGelu ? internal::Gelu(s[c]) : s[c];
            d[c] = RoundToBf16(v);
            sum[0][c] += v;
          }
        }
      });
}

// rows x cols of `src` (row stride ld) into dense bf16 `dst`, or its
// transpose (cols x rows) when `transpose`: oneDNN's bf16 matmul is fastest
// on plain row-major operands (up to 25% over transposed ones here).
// `col_sums` (cols, plain only), when not null, gets each column's sum of
// the unrounded values added: a bias gradient in the same pass. kGelu:
// GELU of src.
template <bool kGelu = false, typename S = float>
void ToBf16(uint16_t* dst, const S* src, int64_t rows, int64_t cols, int64_t ld,
            bool transpose, float* col_sums = nullptr) {
  // Small conversions stay on the calling thread.
  auto split = [&](int64_t n, auto&& body, int64_t align) {
    if (rows * cols < (1 << 15)) {
      body(int64_t{0}, n);
    } else {
      internal::ParallelFor(n, body, align);
    }
  };
  if constexpr (std::is_same_v<S, float>) {
    if (col_sums != nullptr) {
      ToBf16WithSums<kGelu>(dst, src, rows, cols, ld, col_sums);
      return;
    }
  }
  if (!transpose) {
    split(
        rows,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const S* s = src + r * ld;
            uint16_t* d = dst + r * cols;
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) d[c] = Round<kGelu>(s[c]);
          }
        },
        1);
    return;
  }
  // Tiles small enough that a tile's source rows and destination rows stay
  // in L1 while it is transposed; tile j is (column tile j / row_tiles, row
  // tile j % row_tiles).
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const int64_t col_tiles = (cols + kTile - 1) / kTile;
  split(
      col_tiles * row_tiles,
      [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t ct = j / row_tiles, rt = j % row_tiles;
          const int64_t r0 = rt * kTile, r1 = std::min(rows, r0 + kTile);
          const int64_t c0 = ct * kTile, c1 = std::min(cols, c0 + kTile);
          for (int64_t c = c0; c < c1; ++c) {
            uint16_t* d = dst + c * rows;
            for (int64_t r = r0; r < r1; ++r) {
              d[r] = Round<kGelu>(src[r * ld + c]);
            }
          }
        }
      },
      1);
}

#if defined(__AVX512F__)
// GCC 12 warns of the `undefined` vectors inside its own AVX-512 intrinsics
// once they are inlined here.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
constexpr bool kHaveTransposeKernel = true;

// RoundToBf16 of 16 floats, each result in the low half of its lane.
inline __m512i RoundToBf16x16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(
          u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                              _mm512_and_si512(hi, _mm512_set1_epi32(1)))),
      16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
      _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_or_epi32(rounded, nan, hi, _mm512_set1_epi32(0x40));
}

// Rows 0..15 of `src` (row stride ld), 32 floats each, as the 16 pair
// words of each row (word p: k = 2p low, 2p + 1 high), transposed: `dst`
// row p (row stride nb words) gets word p of the 16 rows, in their order.
inline void PackTransposed16(uint32_t* dst, int64_t nb, const float* src,
                             int64_t ld) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) {
    const float* s = src + i * ld;
    const __m256i lo =
        _mm512_cvtepi32_epi16(RoundToBf16x16(_mm512_loadu_ps(s)));
    const __m256i hi =
        _mm512_cvtepi32_epi16(RoundToBf16x16(_mm512_loadu_ps(s + 16)));
    r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  // Within each 128-bit lane L: t[4g + c] holds word 4L + c of rows
  // 4g..4g+3.
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {
    r[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g + 0], t[4 * g + 2]);
    r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g + 0], t[4 * g + 2]);
    r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // Then across lanes: word 4L + c of all 16 rows, lane g from r[4g + c].
  for (int c = 0; c < 4; ++c) {
    const __m512i a01 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);
    const __m512i a23 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee);
    const __m512i b01 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
    const __m512i b23 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
    _mm512_storeu_si512(dst + (0 + c) * nb,
                        _mm512_shuffle_i32x4(a01, b01, 0x88));
    _mm512_storeu_si512(dst + (4 + c) * nb,
                        _mm512_shuffle_i32x4(a01, b01, 0xdd));
    _mm512_storeu_si512(dst + (8 + c) * nb,
                        _mm512_shuffle_i32x4(a23, b23, 0x88));
    _mm512_storeu_si512(dst + (12 + c) * nb,
                        _mm512_shuffle_i32x4(a23, b23, 0xdd));
  }
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
constexpr bool kHaveTransposeKernel = false;
inline void PackTransposed16(uint32_t*, int64_t, const float*, int64_t) {}
#endif

// The blocked bf16 layouts oneDNN's matmul picks for its right operand
// (K,N) here, BA16a<nb>b2a: blocks of 32 K rows by `nb` columns, the
// blocks column-block-major; inside one, 16 pairs of rows, each pair as
// nb (row k, row k+1) bf16 pairs. Padding rows and columns hold zeros.
constexpr int64_t kPackedColumns[] = {64, 48, 32, 16};

dnnl::memory::format_tag PackedTag(int64_t nb) {
  using tag = dnnl::memory::format_tag;
  switch (nb) {
    case 64:
      return tag::BA16a64b2a;
    case 48:
      return tag::BA16a48b2a;
    case 32:
      return tag::BA16a32b2a;
    default:
      return tag::BA16a16b2a;
  }
}

// B (K,N) as op(stored): stored (K,N) with row stride ld, or (N,K) read
// transposed when `transpose`, rounded into `dst` in layout BA16a<nb>b2a.
// kGelu: GELU of src. A bf16 src (uint16_t) is laid out, not rounded.
template <bool kGelu = false, typename S = float>
void PackBf16(uint16_t* dst, const S* src, int64_t K, int64_t N, int64_t ld,
              bool transpose, int64_t nb) {
  const int64_t k_blocks = (K + 31) / 32, n_blocks = (N + nb - 1) / nb;
  // One (row k, row k+1) pair is one 32-bit word, row k in its low half.
  uint32_t* words = reinterpret_cast<uint32_t*>(dst);
  auto at = [&](int64_t k, int64_t n) {
    return k < K && n < N
               ? Round<kGelu>(transpose ? src[n * ld + k] : src[k * ld + n])
               : uint16_t{0};
  };
  auto pack = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b / k_blocks * nb, k0 = b % k_blocks * 32;
      uint32_t* block = words + b * 16 * nb;
      const bool whole = k0 + 32 <= K && n0 + nb <= N;
      if (whole && transpose && std::is_same_v<S, float> && !kGelu &&
          kHaveTransposeKernel) {
        // 16 columns at a time: their pair words made from 16 stored rows,
        // then transposed in registers (one store per pair of k rows).
        for (int64_t n = 0; n < nb; n += 16) {
          PackTransposed16(
              block + n, nb,
              reinterpret_cast<const float*>(src) + (n0 + n) * ld + k0, ld);
        }
      } else if (whole && transpose) {
        // A stored row n holds column n of op(B): 32 consecutive k.
        for (int64_t n = 0; n < nb; ++n) {
          const S* s = src + (n0 + n) * ld + k0;
#pragma omp simd
          for (int64_t p = 0; p < 16; ++p) {
            block[p * nb + n] = Round<kGelu>(s[2 * p]) |
                                uint32_t{Round<kGelu>(s[2 * p + 1])} << 16;
          }
        }
      } else if (whole) {
        for (int64_t p = 0; p < 16; ++p) {
          const S* lo = src + (k0 + 2 * p) * ld + n0;
          const S* hi = lo + ld;
          uint32_t* d = block + p * nb;
#pragma omp simd
          for (int64_t n = 0; n < nb; ++n) {
            d[n] = Round<kGelu>(lo[n]) | uint32_t{Round<kGelu>(hi[n])} << 16;
          }
        }
      } else {
        for (int64_t p = 0; p < 16; ++p) {
          for (int64_t n = 0; n < nb; ++n) {
            block[p * nb + n] = at(k0 + 2 * p, n0 + n) |
                                uint32_t{at(k0 + 2 * p + 1, n0 + n)} << 16;
          }
        }
      }
    }
  };
  const int64_t blocks = n_blocks * k_blocks;
  if (K * N < (1 << 15)) {
    pack(0, blocks);
  } else {
    internal::ParallelFor(blocks, pack, 1);
  }
}

struct Shape {
  bool ta;  // A is a dense bf16 (K,M) read transposed; else a dense (M,K)
  bool tb;  // B is an fp32 (N,K) read transposed; else (K,N); row stride ldb
  int64_t M, N, K, ldb, ldc;
  float beta;
  bool bias;
  bool c_bf16 = false;  // C is bf16 (rounded to nearest even), else fp32
  bool operator<(const Shape& o) const {
    return std::tie(ta, tb, M, N, K, ldb, ldc, beta, bias, c_bf16) <
           std::tie(o.ta, o.tb, o.M, o.N, o.K, o.ldb, o.ldc, o.beta, o.bias,
                    o.c_bf16);
  }
};

struct Primitive {
  dnnl::matmul matmul;
  // The matmul's layout of B (b) is BA16a<packed>b2a, packed here; or
  // (packed 0) another, reached by oneDNN's reorder from fp32 B (b_f32).
  int64_t packed = 0;
  // (packed 0) from a plain bf16 B, dense (K,N): a stored bf16 operand.
  dnnl::reorder pack_b, pack_b16;
  dnnl::memory::desc a, b_f32, b_bf16, b, c, bias;
};

const Primitive& PrimitiveFor(const Shape& s) {
  static std::mutex mu;
  static std::map<Shape, Primitive>* const cache =
      new std::map<Shape, Primitive>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(s);
  if (it != cache->end()) return it->second;
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  // The bf16 copy of op(A) is dense, (M,K) plain or read transposed from a
  // (K,M); that of op(B) is in whatever layout the matmul prefers (`any`),
  // reordered from the fp32 B as it is stored.
  Primitive p;
  p.a = dnnl::memory::desc({s.M, s.K}, dt::bf16, s.ta ? tag::ba : tag::ab);
  p.b_f32 = dnnl::memory::desc(
      {s.K, s.N}, dt::f32,
      s.tb ? dnnl::memory::dims{1, s.ldb} : dnnl::memory::dims{s.ldb, 1});
  const dnnl::memory::desc b_any({s.K, s.N}, dt::bf16, tag::any);
  p.c = dnnl::memory::desc({s.M, s.N}, s.c_bf16 ? dt::bf16 : dt::f32,
                           dnnl::memory::dims{s.ldc, 1});
  if (s.bias) p.bias = dnnl::memory::desc({1, s.N}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  if (s.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(s.beta);
    attr.set_post_ops(ops);
  }
  try {
    const dnnl::matmul::desc desc =
        s.bias ? dnnl::matmul::desc(p.a, b_any, p.bias, p.c)
               : dnnl::matmul::desc(p.a, b_any, p.c);
    const dnnl::matmul::primitive_desc pd(desc, attr, internal::DnnlEngine());
    p.matmul = dnnl::matmul(pd);
    p.b = pd.weights_desc();
    for (int64_t nb : kPackedColumns) {
      if (p.b == dnnl::memory::desc({s.K, s.N}, dt::bf16, PackedTag(nb))) {
        p.packed = nb;
      }
    }
    if (p.packed == 0) {
      p.pack_b = dnnl::reorder(dnnl::reorder::primitive_desc(
          internal::DnnlEngine(), p.b_f32, internal::DnnlEngine(), p.b));
      if (!s.tb) {
        p.b_bf16 = dnnl::memory::desc({s.K, s.N}, dt::bf16, tag::ab);
        p.pack_b16 = dnnl::reorder(dnnl::reorder::primitive_desc(
            internal::DnnlEngine(), p.b_bf16, internal::DnnlEngine(), p.b));
      }
    }
  } catch (const dnnl::error& e) {
    // Shapes are the engine's; a failure here is a programming error.
    std::fprintf(stderr, "%s:%d: bf16 matmul M=%lld N=%lld K=%lld: %s\n",
                 __FILE__, __LINE__, static_cast<long long>(s.M),
                 static_cast<long long>(s.N), static_cast<long long>(s.K),
                 e.what());
    std::abort();
  }
  return cache->emplace(s, std::move(p)).first->second;
}

}  // namespace

namespace internal {

dnnl::engine& DnnlEngine() {
  static dnnl::engine* const engine =
      new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

void RoundRowsToBf16(uint16_t* dst, const float* src, int64_t rows,
                     int64_t cols, int64_t ld) {
  ToBf16(dst, src, rows, cols, ld, /*transpose=*/false);
}

}  // namespace internal

bool CpuHasBf16() {
  const unsigned isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

float Bf16Round(float x) { return internal::FromBf16(RoundToBf16(x)); }

float* Bf16Scratch(int which, int64_t n) {
  struct StoragePool;
  return internal::ThreadScratch<StoragePool, float>(which, n);
}

void FromBf16Values(float* dst, const uint16_t* src, int64_t n) {
  internal::ParallelFor(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dst[i] = internal::FromBf16(src[i]);
  });
}

void RoundToBf16Rows(uint16_t* dst, const float* src, int64_t rows,
                     int64_t cols) {
  internal::RoundRowsToBf16(dst, src, rows, cols, cols);
}

namespace {

// Per-thread bf16 scratch, grown as needed and kept.
struct GemmPool;
uint16_t* Scratch(int which, int64_t n) {
  return internal::ThreadScratch<GemmPool, uint16_t>(which, n);
}

// C = op(A) op(B) + beta C (+ bias): A16 dense bf16 (M,K), or (K,M) when
// ta; B fp32 (K,N) with row stride ldb, or (N,K) when tb, rounded into
// scratch `b_scratch` in the matmul's layout. gelu_b: the operand is GELU
// of B (plain, dense: ldb = N), computed as it is packed, or into `hidden`
// (K,N) for a layout this file does not pack. B16, when not null, is that
// operand already rounded, dense (K,N) (plain only): laid out instead of
// rounded where this file packs the layout; reordered by oneDNN where not
// when B is null (a stored bf16 operand, with no fp32 one beside it).
void MatmulBf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                const uint16_t* A16, const float* B, int64_t ldb, float beta,
                void* C, int64_t ldc, const float* bias, int b_scratch,
                bool gelu_b = false, float* hidden = nullptr,
                const uint16_t* B16 = nullptr, bool c_bf16 = false) {
  const Primitive& p =
      PrimitiveFor({ta, tb, M, N, K, ldb, ldc, beta, bias != nullptr, c_bf16});
  uint16_t* b16 = Scratch(
      b_scratch, static_cast<int64_t>(p.b.get_size() / sizeof(uint16_t)));
  dnnl::memory b(p.b, internal::DnnlEngine(), b16);
  dnnl::memory a(p.a, internal::DnnlEngine(), const_cast<uint16_t*>(A16));
  dnnl::memory c(p.c, internal::DnnlEngine(), C);
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (bias != nullptr) {
    args[DNNL_ARG_BIAS] =
        dnnl::memory(p.bias, internal::DnnlEngine(), const_cast<float*>(bias));
  }
  dnnl::stream stream(internal::DnnlEngine());
  if (p.packed != 0 && B16 != nullptr && !tb) {
    PackBf16(b16, B16, K, N, N, /*transpose=*/false, p.packed);
  } else if (p.packed != 0 && gelu_b) {
    PackBf16<true>(b16, B, K, N, ldb, tb, p.packed);
  } else if (p.packed != 0) {
    PackBf16(b16, B, K, N, ldb, tb, p.packed);
  } else if (B == nullptr) {
    dnnl::memory b_bf16(p.b_bf16, internal::DnnlEngine(),
                        const_cast<uint16_t*>(B16));
    p.pack_b16.execute(stream, b_bf16, b);
  } else {
    const float* b_src = B;
    if (gelu_b) {
      gelu_forward(hidden, B, K * N);  // the same internal::Gelu
      b_src = hidden;
    }
    dnnl::memory b_f32(p.b_f32, internal::DnnlEngine(),
                       const_cast<float*>(b_src));
    p.pack_b.execute(stream, b_f32, b);
  }
  p.matmul.execute(stream, args);
  stream.wait();
}

// gelu_matmul_forward_bf16 of an input of type S (float, or a bf16-stored
// one): GELU as inp is rounded, its fp32 output never written.
template <typename S>
void GeluMatmulForwardBf16(float* out, const S* inp, const float* weight,
                           const float* bias, int64_t rows, int C, int OC,
                           uint16_t* saved) {
  if (rows == 0) return;
  uint16_t* a16 = saved != nullptr ? saved : Scratch(0, rows * C);
  ToBf16<true>(a16, inp, rows, C, C, /*transpose=*/false);
  MatmulBf16(false, true, rows, OC, C, a16, weight, C, 0.0f, out, OC, bias, 1);
}

// matmul_backward_bf16, its input GELU(inp) when gelu (see MatmulBf16),
// inp16 that input rounded when not null.
// dout16, when not null, is dout stored in bf16 (dout is then unused):
// taken as it is, dbias summing its values.
void MatmulBackwardBf16(float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp,
                        const float* weight, int64_t rows, int C, int OC,
                        bool gelu, float* hidden,
                        const uint16_t* inp16 = nullptr,
                        const uint16_t* dout16_in = nullptr) {
  if (rows == 0) return;
  const uint16_t* dout16 = dout16_in;
  if (dout16 == nullptr) {
    // dout once, its bias gradient in the same pass; it serves both products.
    uint16_t* rounded = Scratch(0, rows * OC);
    ToBf16(rounded, dout, rows, OC, OC, /*transpose=*/false, dbias);
    dout16 = rounded;
  } else if (dbias != nullptr) {
    internal::ColumnSums<1>(
        rows, OC, std::array<float*, 1>{dbias},
        [&](int64_t r0, int64_t r1, const std::array<float*, 1>& sum) {
          for (int64_t r = r0; r < r1; ++r) {
            const uint16_t* row = dout16 + r * OC;
#pragma omp simd
            for (int64_t c = 0; c < OC; ++c) {
              sum[0][c] += internal::FromBf16(row[c]);
            }
          }
        });
  }
  if (dinp != nullptr) {
    // dinp (rows,C) = dout (rows,OC) @ weight (OC,C)
    MatmulBf16(false, false, rows, C, OC, dout16, weight, C, 0.0f, dinp, C,
               nullptr, 1);
  }
  if (dweight == nullptr) return;
  // dweight (OC,C) += dout^T (OC,rows) @ inp (rows,C): dout read transposed
  // costs the matmul less than a second, transposing conversion would.
  MatmulBf16(true, false, OC, C, rows, dout16, inp, C, 1.0f, dweight, C,
             nullptr, 2, gelu, hidden, inp16);
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const float* A, int64_t lda, const float* B, int64_t ldb,
               float beta, float* C, int64_t ldc, const float* bias) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        C[i * ldc + j] =
            beta * C[i * ldc + j] + (bias != nullptr ? bias[j] : 0.0f);
      }
    }
    return;
  }
  // op(A) is A (M,K), or the transpose of a stored (K,M).
  uint16_t* a16 = Scratch(0, M * K);
  if (trans_a) {
    ToBf16(a16, A, K, M, lda, /*transpose=*/true);
  } else {
    ToBf16(a16, A, M, K, lda, /*transpose=*/false);
  }
  MatmulBf16(false, trans_b, M, N, K, a16, B, ldb, beta, C, ldc, bias, 1);
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias,
                          const float* dout, const float* inp,
                          const float* weight, int64_t rows, int C, int OC) {
  MatmulBackwardBf16(dinp, dweight, dbias, dout, inp, weight, rows, C, OC,
                     /*gelu=*/false, nullptr);
}

void matmul_forward_bf16_input(float* out, const uint16_t* inp16,
                               const float* weight, const float* bias,
                               int64_t rows, int C, int OC) {
  if (rows == 0) return;
  MatmulBf16(false, true, rows, OC, C, inp16, weight, C, 0.0f, out, OC, bias,
             1);
}

void matmul_forward_bf16_output(uint16_t* out16, const uint16_t* inp16,
                                const float* weight, const float* bias,
                                int64_t rows, int C, int OC) {
  if (rows == 0) return;
  MatmulBf16(false, true, rows, OC, C, inp16, weight, C, 0.0f, out16, OC, bias,
             1, /*gelu_b=*/false, nullptr, nullptr, /*c_bf16=*/true);
}

void matmul_backward_bf16_input(float* dinp, float* dweight, float* dbias,
                                const float* dout, const uint16_t* inp16,
                                const float* weight, int64_t rows, int C,
                                int OC) {
  MatmulBackwardBf16(dinp, dweight, dbias, dout, /*inp=*/nullptr, weight, rows,
                     C, OC, /*gelu=*/false, nullptr, inp16);
}

void matmul_backward_bf16_dout(float* dinp, float* dweight, float* dbias,
                               const uint16_t* dout16, const float* inp,
                               const uint16_t* inp16, const float* weight,
                               int64_t rows, int C, int OC) {
  MatmulBackwardBf16(dinp, dweight, dbias, /*dout=*/nullptr, inp, weight, rows,
                     C, OC, /*gelu=*/false, nullptr, inp16, dout16);
}

void gelu_matmul_forward_bf16_input(float* out, const uint16_t* inp16,
                                    const float* weight, const float* bias,
                                    int64_t rows, int C, int OC,
                                    uint16_t* saved) {
  GeluMatmulForwardBf16(out, inp16, weight, bias, rows, C, OC, saved);
}

void gelu_matmul_backward_bf16_input(float* dinp, float* dweight, float* dbias,
                                     const float* dout, const uint16_t* inp16,
                                     const float* weight, int64_t rows, int C,
                                     int OC, const uint16_t* saved) {
  if (rows == 0) return;
  // The rounded GELU of the stored input: what the forward kept, or made
  // again (full recomputation) into scratch 3, which the products leave.
  const uint16_t* g16 = saved;
  if (g16 == nullptr && dweight != nullptr) {
    uint16_t* made = Scratch(3, rows * C);
    ToBf16<true>(made, inp16, rows, C, C, /*transpose=*/false);
    g16 = made;
  }
  MatmulBackwardBf16(dinp, dweight, dbias, dout, /*inp=*/nullptr, weight, rows,
                     C, OC, /*gelu=*/false, nullptr, g16);
}

void gelu_matmul_forward_bf16(float* out, const float* inp, const float* weight,
                              const float* bias, int64_t rows, int C, int OC,
                              uint16_t* saved) {
  GeluMatmulForwardBf16(out, inp, weight, bias, rows, C, OC, saved);
}

void gelu_matmul_backward_bf16(float* dinp, float* dweight, float* dbias,
                               const float* dout, const float* inp,
                               float* hidden, const float* weight, int64_t rows,
                               int C, int OC, const uint16_t* saved) {
  MatmulBackwardBf16(dinp, dweight, dbias, dout, inp, weight, rows, C, OC,
                     /*gelu=*/true, hidden, saved);
}

}  // namespace ptrain::kernels
