// Causal attention with its products in bf16 (the bf16 CPU backend, below
// kFlashAttentionT): q, k, v, the probabilities and the gradients that
// meet in a product are rounded to bf16, products accumulate in fp32
// (oneDNN's bf16 matmul), softmax and its backward run in fp32. The same
// tiles as attention.cpp's fp32 kernels, 64 query rows each, computing
// scores only for keys [0, end of tile). The work is split by sequence and
// group of heads, one unit per thread at a time, and one product covers a
// tile of every head of its group (a batched matmul over strided views of
// the interleaved QKV buffer): per-head products this small run bf16 no
// faster than fp32, and a tile of every head of the batch at once leaves
// its scores in memory, not in cache, for the softmax. The probabilities
// are kept for the backward rounded, as the product reads them: att holds
// (B,NH,T,T) bf16, half the floats of the fp32 kernel's, and only their
// causal part is written.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"

namespace ptrain::kernels {

namespace {

constexpr int kTile = 64;  // query rows (and key columns) per tile

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

// The products, for tile i: query rows [t0, t1) or key rows [k0, k1).
enum class Product {
  kScores,  // S[t0:t1, 0:t1] = Q[t0:t1] K[0:t1]^T, into a dense scratch
  kValues,  // Y[t0:t1] = P[t0:t1, 0:t1] V[0:t1]
  kDProbs,  // dP[t0:t1, 0:t1] = dY[t0:t1] V[0:t1]^T
  kDQuery,  // dQ[t0:t1] += dS[t0:t1, 0:t1] K[0:t1]
  kDValue,  // dV[k0:k1] += P[k0:T, k0:k1]^T dY[k0:T]
  kDKey,    // dK[k0:k1] += dS[k0:T, k0:k1]^T Q[k0:T]
};

// A product over the g heads of a group of one sequence.
struct Key {
  Product product;
  int g, NH, T, C, tile;
  bool operator<(const Key& o) const {
    return std::tie(product, g, NH, T, C, tile) <
           std::tie(o.product, o.g, o.NH, o.T, o.C, o.tile);
  }
};

struct Matmul {
  dnnl::matmul matmul;
  dnnl::memory::desc src, weights, dst, scratchpad;
};

const Matmul& MatmulFor(const Key& k) {
  static std::mutex mu;
  static std::map<Key, Matmul>* const cache = new std::map<Key, Matmul>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(k);
  if (it != cache->end()) return it->second;
  const int64_t T = k.T, C = k.C, hs = C / k.NH, C3 = 3 * C;
  const int64_t lo = int64_t{k.tile} * kTile, hi = std::min(T, lo + kTile);
  const int64_t n = hi - lo, rest = T - lo;
  // (g, rows, cols) views: a head's rows in the (B,T,3C) buffers, in the
  // (B,T,C) ones and in the (B,NH,T,T) ones; and their transposes.
  auto view = [&](dt type, int64_t rows, int64_t cols, const dims& strides) {
    return dnnl::memory::desc({k.g, rows, cols}, type, strides);
  };
  const dims qkv = {hs, C3, 1}, qkv_t = {hs, 1, C3}, y = {hs, C, 1};
  const dims tt = {T * T, T, 1}, tt_t = {T * T, 1, T};
  const dims tile = {kTile * hi, hi, 1};  // a dense (g, kTile, hi) scratch
  // Every product: src (n, K) bf16, weights (K, N) bf16, dst (n, N) fp32.
  Matmul m;
  auto set = [&](int64_t K, const dims& src, const dims& weights, int64_t N,
                 const dims& dst) {
    m.src = view(dt::bf16, n, K, src);
    m.weights = view(dt::bf16, K, N, weights);
    m.dst = view(dt::f32, n, N, dst);
  };
  switch (k.product) {
    case Product::kScores:
      set(hs, qkv, qkv_t, hi, tile);
      break;
    case Product::kValues:
      set(hi, tt, qkv, hs, y);
      break;
    case Product::kDProbs:
      set(hs, y, qkv_t, hi, tile);
      break;
    case Product::kDQuery:
      set(hi, tt, qkv, hs, qkv);
      break;
    case Product::kDValue:
      set(rest, tt_t, y, hs, qkv);
      break;
    case Product::kDKey:
      set(rest, tt_t, qkv, hs, qkv);
      break;
  }
  // Units run concurrently, each product on its own thread: scratchpads are
  // the caller's, per thread. The input gradients accumulate, as the fp32
  // kernel's do.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.product == Product::kDQuery || k.product == Product::kDValue ||
      k.product == Product::kDKey) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  try {
    const dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(m.src, m.weights, m.dst), attr,
        internal::DnnlEngine());
    m.matmul = dnnl::matmul(pd);
    m.scratchpad = pd.scratchpad_desc();
  } catch (const dnnl::error& e) {
    // Shapes are the engine's; a failure here is a programming error.
    std::fprintf(stderr, "%s:%d: bf16 attention product %d T=%d C=%d: %s\n",
                 __FILE__, __LINE__, static_cast<int>(k.product), k.T, k.C,
                 e.what());
    std::abort();
  }
  return cache->emplace(k, std::move(m)).first->second;
}

// This file's per-thread scratch.
struct AttentionPool;
template <typename V>
V* Scratch(int which, int64_t n) {
  return internal::ThreadScratch<AttentionPool, V>(which, n);
}

// Runs product `p` of tile `tile` for a group of g heads on the calling
// thread, on the given buffers (each at the view's first element).
void Run(Product p, int tile, int g, int T, int C, int NH, const void* src,
         const void* weights, float* dst) {
  const Matmul& m = MatmulFor({p, g, NH, T, C, tile});
  dnnl::engine& engine = internal::DnnlEngine();
  dnnl::stream stream(engine);
  uint8_t* pad =
      Scratch<uint8_t>(0, static_cast<int64_t>(m.scratchpad.get_size()));
  m.matmul.execute(
      stream,
      {{DNNL_ARG_SRC, dnnl::memory(m.src, engine, const_cast<void*>(src))},
       {DNNL_ARG_WEIGHTS,
        dnnl::memory(m.weights, engine, const_cast<void*>(weights))},
       {DNNL_ARG_DST, dnnl::memory(m.dst, engine, dst)},
       {DNNL_ARG_SCRATCHPAD, dnnl::memory(m.scratchpad, engine, pad)}});
  stream.wait();
}

// Heads per unit: all of a sequence's, unless that leaves fewer than two
// units per thread; then the largest divisor of NH that does not.
int GroupHeads(int B, int NH) {
  const int want = 2 * omp_get_max_threads();
  for (int g = NH; g > 1; --g) {
    if (NH % g == 0 && int64_t{B} * (NH / g) >= want) return g;
  }
  return 1;
}

// inp's rows (B·T of them) rounded into dense multi-head attention rows
// (3C): grouped rows' key and value heads once for each query head of
// their group.
uint16_t* RoundedHeads(const float* inp, int64_t rows,
                       const math::AttentionHeads& a) {
  const int64_t C = a.C(), C3 = 3 * C;
  uint16_t* qkv = Scratch<uint16_t>(0, rows * C3);
  if (a.KVH == a.NH) {
    internal::RoundRowsToBf16(qkv, inp, rows, C3, C3);
    return qkv;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * a.row();
    uint16_t* y = qkv + r * C3;
    for (int64_t c = 0; c < C; ++c) y[c] = internal::RoundToBf16(x[c]);
    for (int h = 0; h < a.NH; ++h) {
      const float* k = x + a.k(a.Kv(h));
      for (int d = 0; d < a.hs; ++d) {
        y[C + a.q(h) + d] = internal::RoundToBf16(k[d]);
        y[2 * C + a.q(h) + d] = internal::RoundToBf16(k[a.K() + d]);
      }
    }
  }
  return qkv;
}

}  // namespace

void attention_forward_bf16(float* out, float* att, const float* inp, int B,
                            int T, int C, int NH, int KVH) {
  const int64_t C3 = 3 * int64_t{C}, hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int g = GroupHeads(B, NH), groups = NH / g;
  const uint16_t* qkv =
      RoundedHeads(inp, int64_t{B} * T, math::MakeAttentionHeads(C, NH, KVH));
  uint16_t* probs = reinterpret_cast<uint16_t*>(att);
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < int64_t{B} * groups; ++u) {
    const int64_t b = u / groups, h0 = u % groups * g;
    const uint16_t* q = qkv + b * T * C3 + h0 * hs;
    uint16_t* p = probs + (b * NH + h0) * T * T;
    float* scores = Scratch<float>(1, int64_t{g} * kTile * T);
    for (int i = 0; i * kTile < T; ++i) {
      const int t0 = i * kTile, t1 = std::min(T, t0 + kTile);
      Run(Product::kScores, i, g, T, C, NH, q + t0 * C3, q + C, scores);
      // Softmax of scale * scores over keys [0, t], rounded; 0 past key t
      // up to the tile's end (the products read no further).
      for (int h = 0; h < g; ++h) {
        for (int t = t0; t < t1; ++t) {
          float* row = scores + (int64_t{h} * kTile + t - t0) * t1;
          uint16_t* row16 = p + (int64_t{h} * T + t) * T;
          const float inv_sum = 1.0f / internal::ExpShifted(row, t + 1, scale);
#pragma omp simd
          for (int j = 0; j <= t; j++) {
            row16[j] = internal::RoundToBf16(row[j] * inv_sum);
          }
          for (int j = t + 1; j < t1; j++) row16[j] = 0;
        }
      }
      Run(Product::kValues, i, g, T, C, NH, p + int64_t{t0} * T, q + 2 * C,
          out + (b * T + t0) * C + h0 * hs);
    }
  }
}

void attention_backward_bf16(float* dinp, float* datt, const float* dout,
                             const float* inp, const float* att, int B, int T,
                             int C, int NH, int KVH) {
  const int64_t C3 = 3 * int64_t{C}, hs = C / NH, BT = int64_t{B} * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int g = GroupHeads(B, NH), groups = NH / g;
  const math::AttentionHeads heads = math::MakeAttentionHeads(C, NH, KVH);
  const uint16_t* qkv = RoundedHeads(inp, BT, heads);
  uint16_t* dy = Scratch<uint16_t>(1, BT * C);
  const uint16_t* probs = reinterpret_cast<const uint16_t*>(att);
  (void)datt;  // a unit's dP and dS are in its thread's scratch
  internal::RoundRowsToBf16(dy, dout, BT, C, C);
  // Grouped rows: the gradient of the multi-head rows, summed into dinp's
  // below.
  float* dfull = dinp;
  if (KVH != NH) {
    dfull = Scratch<float>(3, BT * C3);
    std::fill(dfull, dfull + BT * C3, 0.0f);
  }
  const int tiles = (T + kTile - 1) / kTile;
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < int64_t{B} * groups; ++u) {
    const int64_t b = u / groups, h0 = u % groups * g;
    const uint16_t* q = qkv + b * T * C3 + h0 * hs;
    const uint16_t* d_y = dy + b * T * C + h0 * hs;
    const uint16_t* p = probs + (b * NH + h0) * T * T;
    // One tile's dP of the group's heads, (g,kTile,t1) dense; their dS,
    // rounded, (g,T,T).
    float* dprobs = Scratch<float>(1, int64_t{g} * kTile * T);
    uint16_t* ds = Scratch<uint16_t>(2, int64_t{g} * T * T);
    float* dq = dfull + b * T * C3 + h0 * hs;
    for (int i = 0; i < tiles; ++i) {
      const int t0 = i * kTile, t1 = std::min(T, t0 + kTile);
      Run(Product::kDProbs, i, g, T, C, NH, d_y + int64_t{t0} * C, q + 2 * C,
          dprobs);
      // Softmax backward: dS = P (dP - sum(P dP)), times the scores'
      // scale, rounded; 0 past key t up to the tile's end.
      for (int h = 0; h < g; ++h) {
        for (int t = t0; t < t1; ++t) {
          const uint16_t* p16 = p + (int64_t{h} * T + t) * T;
          const float* d = dprobs + (int64_t{h} * kTile + t - t0) * t1;
          uint16_t* ds16 = ds + (int64_t{h} * T + t) * T;
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int j = 0; j <= t; j++) dot += internal::FromBf16(p16[j]) * d[j];
#pragma omp simd
          for (int j = 0; j <= t; j++) {
            ds16[j] = internal::RoundToBf16(scale * internal::FromBf16(p16[j]) *
                                            (d[j] - dot));
          }
          for (int j = t + 1; j < t1; j++) ds16[j] = 0;
        }
      }
      Run(Product::kDQuery, i, g, T, C, NH, ds + int64_t{t0} * T, q + C,
          dq + t0 * C3);
    }
    for (int i = 0; i < tiles; ++i) {
      const int64_t k0 = int64_t{i} * kTile;
      Run(Product::kDValue, i, g, T, C, NH, p + k0 * T + k0, d_y + k0 * C,
          dq + 2 * C + k0 * C3);
      Run(Product::kDKey, i, g, T, C, NH, ds + k0 * T + k0, q + k0 * C3,
          dq + C + k0 * C3);
    }
  }
  if (dfull == dinp) return;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < BT; ++r) {
    const float* x = dfull + r * C3;
    float* y = dinp + r * heads.row();
    for (int64_t c = 0; c < C; ++c) y[c] += x[c];
    for (int h = 0; h < NH; ++h) {
      float* k = y + heads.k(heads.Kv(h));
      for (int d = 0; d < hs; ++d) {
        k[d] += x[C + heads.q(h) + d];
        k[heads.K() + d] += x[2 * C + heads.q(h) + d];
      }
    }
  }
}

}  // namespace ptrain::kernels
