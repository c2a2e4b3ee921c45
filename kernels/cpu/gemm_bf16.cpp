// The bf16 GEMM of the CPU backend's bf16 precision: fp32 operands rounded
// to bf16 (to nearest, ties to even) into per-thread scratch, multiplied by
// oneDNN's bf16 matmul (AVX512_BF16 dot products) with fp32 accumulation
// into an fp32 C. Primitives are made once per shape and kept.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"

namespace ptrain::kernels {

namespace {

inline uint16_t RoundToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  // A NaN stays a (quiet) NaN; rounding could carry it into infinity.
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// rows x cols of `src` (row stride ld) into dense bf16 `dst`, or its
// transpose (cols x rows) when `transpose`: oneDNN's bf16 matmul is fastest
// on plain row-major operands (up to 25% over transposed ones here).
// `col_sums` (cols, plain only), when not null, gets each column's sum of
// the unrounded values added: a bias gradient in the same pass.
void ToBf16(uint16_t* dst, const float* src, int64_t rows, int64_t cols,
            int64_t ld, bool transpose, float* col_sums = nullptr) {
  // Small conversions stay on the calling thread.
  auto split = [&](int64_t n, auto&& body, int64_t align) {
    if (rows * cols < (1 << 15)) {
      body(int64_t{0}, n);
    } else {
      internal::ParallelFor(n, body, align);
    }
  };
  if (col_sums != nullptr) {
    // One contiguous column slice per thread: each sum has one owner and a
    // fixed order.
    split(
        cols,
        [&](int64_t c0, int64_t c1) {
          for (int64_t r = 0; r < rows; ++r) {
            const float* s = src + r * ld;
            uint16_t* d = dst + r * cols;
#pragma omp simd
            for (int64_t c = c0; c < c1; ++c) {
              d[c] = RoundToBf16(s[c]);
              col_sums[c] += s[c];
            }
          }
        },
        16);
    return;
  }
  if (!transpose) {
    split(
        rows,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const float* s = src + r * ld;
            uint16_t* d = dst + r * cols;
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) d[c] = RoundToBf16(s[c]);
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
              d[r] = RoundToBf16(src[r * ld + c]);
            }
          }
        }
      },
      1);
}

struct Shape {
  bool ta;  // A is a dense (K,M) read transposed; else a dense (M,K)
  int64_t M, N, K, ldc;
  float beta;
  bool bias;
  bool operator<(const Shape& o) const {
    return std::tie(ta, M, N, K, ldc, beta, bias) <
           std::tie(o.ta, o.M, o.N, o.K, o.ldc, o.beta, o.bias);
  }
};

struct Primitive {
  dnnl::matmul matmul;
  dnnl::memory::desc a, b, c, bias;
};

dnnl::engine& Engine() {
  static dnnl::engine* const engine =
      new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

const Primitive& PrimitiveFor(const Shape& s) {
  static std::mutex mu;
  static std::map<Shape, Primitive>* const cache =
      new std::map<Shape, Primitive>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(s);
  if (it != cache->end()) return it->second;
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  // The bf16 copies are dense: op(B) (K,N) plain, op(A) (M,K) plain or
  // read transposed from a (K,M).
  Primitive p;
  p.a = dnnl::memory::desc({s.M, s.K}, dt::bf16, s.ta ? tag::ba : tag::ab);
  p.b = dnnl::memory::desc({s.K, s.N}, dt::bf16, tag::ab);
  p.c = dnnl::memory::desc({s.M, s.N}, dt::f32, dnnl::memory::dims{s.ldc, 1});
  if (s.bias) p.bias = dnnl::memory::desc({1, s.N}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  if (s.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(s.beta);
    attr.set_post_ops(ops);
  }
  try {
    const dnnl::matmul::desc desc =
        s.bias ? dnnl::matmul::desc(p.a, p.b, p.bias, p.c)
               : dnnl::matmul::desc(p.a, p.b, p.c);
    p.matmul = dnnl::matmul(dnnl::matmul::primitive_desc(desc, attr, Engine()));
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

bool CpuHasBf16() {
  const unsigned isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

float Bf16Round(float x) {
  const uint32_t u = static_cast<uint32_t>(RoundToBf16(x)) << 16;
  float out;
  std::memcpy(&out, &u, sizeof(out));
  return out;
}

namespace {

// C = op(A) B16 + beta C (+ bias) on operands already in bf16: A16 dense
// (M,K), or (K,M) when ta; B16 dense (K,N).
void MatmulBf16(bool ta, int64_t M, int64_t N, int64_t K, const uint16_t* A16,
                const uint16_t* B16, float beta, float* C, int64_t ldc,
                const float* bias) {
  const Primitive& p = PrimitiveFor({ta, M, N, K, ldc, beta, bias != nullptr});
  dnnl::memory a(p.a, Engine(), const_cast<uint16_t*>(A16));
  dnnl::memory b(p.b, Engine(), const_cast<uint16_t*>(B16));
  dnnl::memory c(p.c, Engine(), C);
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (bias != nullptr) {
    args[DNNL_ARG_BIAS] =
        dnnl::memory(p.bias, Engine(), const_cast<float*>(bias));
  }
  dnnl::stream stream(Engine());
  p.matmul.execute(stream, args);
  stream.wait();
}

// Per-thread bf16 scratch, grown as needed and kept.
uint16_t* Scratch(int which, int64_t n) {
  thread_local std::vector<uint16_t> buffers[3];
  std::vector<uint16_t>& b = buffers[which];
  if (static_cast<int64_t>(b.size()) < n) b.resize(n);
  return b.data();
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
  uint16_t* a16 = Scratch(0, M * K);
  uint16_t* b16 = Scratch(1, K * N);
  // op(A) is A (M,K), or the transpose of a stored (K,M); likewise op(B).
  if (trans_a) {
    ToBf16(a16, A, K, M, lda, /*transpose=*/true);
  } else {
    ToBf16(a16, A, M, K, lda, /*transpose=*/false);
  }
  if (trans_b) {
    ToBf16(b16, B, N, K, ldb, /*transpose=*/true);
  } else {
    ToBf16(b16, B, K, N, ldb, /*transpose=*/false);
  }
  MatmulBf16(false, M, N, K, a16, b16, beta, C, ldc, bias);
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias,
                          const float* dout, const float* inp,
                          const float* weight, int64_t rows, int C, int OC) {
  if (rows == 0) return;
  // dout once, its bias gradient in the same pass; it serves both products.
  uint16_t* dout16 = Scratch(0, rows * OC);
  ToBf16(dout16, dout, rows, OC, OC, /*transpose=*/false, dbias);
  if (dinp != nullptr) {
    // dinp (rows,C) += dout (rows,OC) @ weight (OC,C)
    uint16_t* w16 = Scratch(1, static_cast<int64_t>(OC) * C);
    ToBf16(w16, weight, OC, C, C, /*transpose=*/false);
    MatmulBf16(false, rows, C, OC, dout16, w16, 1.0f, dinp, C, nullptr);
  }
  // dweight (OC,C) += dout^T (OC,rows) @ inp (rows,C): dout read transposed
  // costs the matmul less than a second, transposing conversion would.
  uint16_t* inp16 = Scratch(2, rows * C);
  ToBf16(inp16, inp, rows, C, C, /*transpose=*/false);
  MatmulBf16(true, OC, C, rows, dout16, inp16, 1.0f, dweight, C, nullptr);
}

}  // namespace ptrain::kernels
