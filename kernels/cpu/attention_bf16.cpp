// Causal attention with its products in bf16 (the bf16 CPU backend, below
// kFlashAttentionT): q, k, v, the probabilities and the gradients that
// meet in a product are rounded to bf16, products accumulate in fp32
// (oneDNN's bf16 matmul), softmax and its backward run in fp32. The same
// tiles as attention.cpp's fp32 kernels, 64 query rows each, computing
// scores only for keys [0, end of tile). The work is split by sequence and
// group of query heads, one unit per thread at a time, and one product
// covers a tile of every head of its group (a batched matmul over strided
// views of the interleaved rows): per-head products this small run bf16 no
// faster than fp32, and a tile of every head of the batch at once leaves
// its scores in memory, not in cache, for the softmax. Grouped-query rows
// (KVH < NH) are read as they are: a unit's heads share one key/value
// head, which its products broadcast over their batch, and a backward unit
// owns a key/value head's whole group, summing the group's key and value
// gradients head after head. The probabilities are kept for the backward
// rounded, as the product reads them: att holds (B,NH,T,T) bf16, half the
// floats of the fp32 kernel's, and only their causal part is written.
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

// A product over g query heads of one sequence. kv: the batch of the
// key/value operand, g (a head each) or 1 (one head, broadcast).
struct Key {
  Product product;
  int g, kv, T, NH, KVH, hs, tile;
  bool operator<(const Key& o) const {
    return std::tie(product, g, kv, T, NH, KVH, hs, tile) <
           std::tie(o.product, o.g, o.kv, o.T, o.NH, o.KVH, o.hs, o.tile);
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
  const math::AttentionHeads a = {k.NH, k.KVH, k.hs};
  const int64_t T = k.T, C = a.C(), R = a.row(), hs = a.hs;
  const int64_t lo = int64_t{k.tile} * kTile, hi = std::min(T, lo + kTile);
  const int64_t n = hi - lo, rest = T - lo;
  // (batch, rows, cols) views: a head's rows in the (B,T,R) buffers, in
  // the (B,T,C) ones and in the (B,NH,T,T) ones; and their transposes.
  const dims qkv = {hs, R, 1}, qkv_t = {hs, 1, R}, y = {hs, C, 1};
  const dims tt = {T * T, T, 1}, tt_t = {T * T, 1, T};
  const dims tile = {kTile * hi, hi, 1};  // a dense (g, kTile, hi) scratch
  // Every product: src (n, K) bf16, weights (K, N) bf16, dst (n, N) fp32.
  Matmul m;
  auto set = [&](int64_t K, const dims& src, const dims& weights, int64_t N,
                 const dims& dst, bool kv_weights) {
    const int64_t g = k.g, wb = kv_weights ? k.kv : g;
    m.src = dnnl::memory::desc({g, n, K}, dt::bf16, src);
    m.weights = dnnl::memory::desc({wb, K, N}, dt::bf16, weights);
    m.dst = dnnl::memory::desc({g, n, N}, dt::f32, dst);
  };
  switch (k.product) {
    case Product::kScores:
      set(hs, qkv, qkv_t, hi, tile, true);
      break;
    case Product::kValues:
      set(hi, tt, qkv, hs, y, true);
      break;
    case Product::kDProbs:
      set(hs, y, qkv_t, hi, tile, true);
      break;
    case Product::kDQuery:
      set(hi, tt, qkv, hs, qkv, true);
      break;
    case Product::kDValue:
      set(rest, tt_t, y, hs, qkv, false);
      break;
    case Product::kDKey:
      set(rest, tt_t, qkv, hs, qkv, false);
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
    std::fprintf(stderr,
                 "%s:%d: bf16 attention product %d T=%d NH=%d KVH=%d hs=%d: "
                 "%s\n",
                 __FILE__, __LINE__, static_cast<int>(k.product), k.T, k.NH,
                 k.KVH, k.hs, e.what());
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

// Runs product `p` of tile `tile` for g query heads (kv: as Key's) on the
// calling thread, on the given buffers (each at the view's first element).
void Run(Product p, int tile, int g, int kv, int T,
         const math::AttentionHeads& a, const void* src, const void* weights,
         float* dst) {
  const Matmul& m = MatmulFor({p, g, kv, T, a.NH, a.KVH, a.hs, tile});
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

// Query heads per unit, a divisor of `span` (NH, or with grouped rows a
// key/value head's group, so that a unit's heads share it): all of it,
// unless that leaves fewer than two units per thread; then the largest
// divisor that does not.
int GroupHeads(int B, int NH, int span) {
  const int want = 2 * omp_get_max_threads();
  for (int g = span; g > 1; --g) {
    if (span % g == 0 && int64_t{B} * (NH / g) >= want) return g;
  }
  return 1;
}

// Unit u of g query heads a sequence: its sequence b, first head h0, and
// the offsets of its query rows and of its key/value head's key rows (its
// values a.K() further) in the (B,T,R) rows.
struct Unit {
  int64_t b;
  int h0;
  int64_t q, k;
};
Unit UnitAt(int64_t u, int g, int T, const math::AttentionHeads& a) {
  const int units = a.NH / g;
  const int64_t b = u / units;
  const int h0 = static_cast<int>(u % units) * g;
  const int64_t seq = b * T * a.row();
  return {b, h0, seq + a.q(h0), seq + a.k(a.Kv(h0))};
}

}  // namespace

void attention_forward_bf16(float* out, float* att, const float* inp, int B,
                            int T, int C, int NH, int KVH) {
  const math::AttentionHeads a = math::MakeAttentionHeads(C, NH, KVH);
  const int64_t R = a.row(), hs = a.hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const bool grouped = KVH != NH;
  const int g = GroupHeads(B, NH, grouped ? a.group() : NH), units = NH / g;
  const int kv = grouped ? 1 : g;
  uint16_t* rows = Scratch<uint16_t>(0, int64_t{B} * T * R);
  uint16_t* probs = reinterpret_cast<uint16_t*>(att);
  internal::RoundRowsToBf16(rows, inp, int64_t{B} * T, R, R);
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < int64_t{B} * units; ++u) {
    const auto [b, h0, q_at, k_at] = UnitAt(u, g, T, a);
    const uint16_t* q = rows + q_at;
    const uint16_t* k = rows + k_at;
    const uint16_t* v = k + a.K();
    uint16_t* p = probs + (b * NH + h0) * T * T;
    float* scores = Scratch<float>(1, int64_t{g} * kTile * T);
    for (int i = 0; i * kTile < T; ++i) {
      const int t0 = i * kTile, t1 = std::min(T, t0 + kTile);
      Run(Product::kScores, i, g, kv, T, a, q + t0 * R, k, scores);
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
      Run(Product::kValues, i, g, kv, T, a, p + int64_t{t0} * T, v,
          out + (b * T + t0) * C + a.q(h0));
    }
  }
}

void attention_backward_bf16(float* dinp, float* datt, const float* dout,
                             const float* inp, const float* att, int B, int T,
                             int C, int NH, int KVH) {
  const math::AttentionHeads a = math::MakeAttentionHeads(C, NH, KVH);
  const int64_t R = a.row(), hs = a.hs, BT = int64_t{B} * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // A grouped unit is a key/value head's whole group: the only writer of
  // that head's gradient rows, it sums them over the group in one order.
  const bool grouped = KVH != NH;
  const int g = grouped ? a.group() : GroupHeads(B, NH, NH), units = NH / g;
  const int kv = grouped ? 1 : g;
  uint16_t* rows = Scratch<uint16_t>(0, BT * R);
  uint16_t* dy = Scratch<uint16_t>(1, BT * C);
  const uint16_t* probs = reinterpret_cast<const uint16_t*>(att);
  (void)datt;  // a unit's dP and dS are in its thread's scratch
  internal::RoundRowsToBf16(rows, inp, BT, R, R);
  internal::RoundRowsToBf16(dy, dout, BT, C, C);
  const int tiles = (T + kTile - 1) / kTile;
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < int64_t{B} * units; ++u) {
    const auto [b, h0, q_at, k_at] = UnitAt(u, g, T, a);
    const uint16_t* q = rows + q_at;
    const uint16_t* k = rows + k_at;
    const uint16_t* v = k + a.K();
    const uint16_t* d_y = dy + b * T * C + a.q(h0);
    const uint16_t* p = probs + (b * NH + h0) * T * T;
    // One tile's dP of the group's heads, (g,kTile,t1) dense; their dS,
    // rounded, (g,T,T).
    float* dprobs = Scratch<float>(1, int64_t{g} * kTile * T);
    uint16_t* ds = Scratch<uint16_t>(2, int64_t{g} * T * T);
    float* dq = dinp + q_at;
    float* dk = dinp + k_at;
    float* dv = dk + a.K();
    for (int i = 0; i < tiles; ++i) {
      const int t0 = i * kTile, t1 = std::min(T, t0 + kTile);
      Run(Product::kDProbs, i, g, kv, T, a, d_y + int64_t{t0} * C, v, dprobs);
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
      Run(Product::kDQuery, i, g, kv, T, a, ds + int64_t{t0} * T, k,
          dq + t0 * R);
    }
    // Multi-head: every head its own key/value head, one product for all.
    // Grouped: one product a head, the group's in order into its head's
    // rows.
    const int heads = grouped ? 1 : g;
    for (int i = 0; i < tiles; ++i) {
      const int64_t k0 = int64_t{i} * kTile;
      for (int h = 0; h < g; h += heads) {
        const int64_t at = int64_t{h} * T * T + k0 * T + k0;
        Run(Product::kDValue, i, heads, heads, T, a, p + at,
            d_y + a.q(h) + k0 * C, dv + k0 * R);
        Run(Product::kDKey, i, heads, heads, T, a, ds + at, q + a.q(h) + k0 * R,
            dk + k0 * R);
      }
    }
  }
}

}  // namespace ptrain::kernels
