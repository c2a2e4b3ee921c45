// Mixture-of-Experts kernels on CPU: the token-choice router (scores, top-k,
// weights), its auxiliary losses, and the dispatch of tokens to experts and
// back. Not the experts themselves: those are matmuls over the packed rows.
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "kernels/common/math.h"
#include "kernels/common/moe_args.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ptrain::kernels {

namespace {

// One token's scores s (E) from its logits x (E).
template <typename F>
void Scores(F* s, const F* x, int E, RouterScore kind) {
  if (kind == RouterScore::kSoftmax) {
    std::memcpy(s, x, sizeof(F) * E);
    const F inv_sum = F(1) / internal::ExpShifted(s, E);
#pragma omp simd
    for (int e = 0; e < E; e++) s[e] *= inv_sum;
  } else {
#pragma omp simd
    for (int e = 0; e < E; e++) {
      s[e] = math::SigmoidFromExp(internal::Exp(-x[e]));
    }
  }
}

}  // namespace

template <typename F>
void moe_router_forward(int32_t* experts, F* weights, F* scores,
                        const F* logits, const F* bias, int N, int E, int k,
                        RouterScore kind, bool normalize) {
  CheckRouterChoices(k, E);
  internal::ParallelFor(
      N,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t++) {
          F* s = scores + t * E;
          int32_t* ex = experts + t * k;
          F* w = weights + t * k;
          Scores(s, logits + t * E, E, kind);
          math::RouterTopK(ex, s, bias, E, k);
          const F inv =
              normalize ? F(1) / math::RouterChosenSum(s, ex, k) : F(1);
          for (int j = 0; j < k; j++) w[j] = s[ex[j]] * inv;
        }
      },
      /*align=*/1);
}

// Each token's math::RouterBackwardRow.
template <typename F>
void moe_router_backward(F* dlogits, const F* dweights, const int32_t* experts,
                         const F* scores, int N, int E, int k, RouterScore kind,
                         bool normalize) {
  internal::ParallelFor(
      N,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t++) {
          math::RouterBackwardRow(dlogits + t * E, dweights + t * k,
                                  experts + t * k, scores + t * E, E, k, kind,
                                  normalize);
        }
      },
      /*align=*/1);
}

// d aux / d q[t,e] = coef·E·f_e / N =: a_e for every token. Through q:
//   softmax (q = p): dx_e = p_e (a_e - Σ_f a_f p_f);
//   sigmoid (q = σ / Σσ): dσ_e = (a_e - Σ_f a_f q_f) / Σσ, dx_e = dσ_e σ(1-σ).
// The column sums (counts, then P) go through ColumnSums, in blocks fixed
// by N: the value does not depend on the thread count.
template <typename F>
F moe_aux_loss(F* dlogits, const F* scores, const int32_t* experts, F coef,
               F dloss, int N, int E, int k, RouterScore kind, const F* counts,
               int length) {
  if (N <= 0) return F(0);
  std::vector<double> count(E, 0.0), prob(E, 0.0);
  internal::ColumnSums<1, double>(
      N, E, {count.data()},
      [&](int64_t t0, int64_t t1, const std::array<double*, 1>& partial) {
        for (int64_t i = t0 * k; i < t1 * k; i++) {
          PT_CHECK(experts[i] >= 0 && experts[i] < E, "an expert index");
          partial[0][experts[i]] += 1;
        }
      });
  if (counts != nullptr) {
    PT_CHECK(length >= N, "a sequence's part is no longer than it");
    for (int e = 0; e < E; e++) count[e] = counts[e];
  } else {
    length = N;
  }
  const double L = length;
  std::vector<F> a(E);
  for (int e = 0; e < E; e++) {
    a[e] = F(dloss * coef * E * count[e] / (L * k) / L);
  }
  internal::ColumnSums<1, double>(
      N, E, {prob.data()},
      [&](int64_t t0, int64_t t1, const std::array<double*, 1>& partial) {
        for (int64_t t = t0; t < t1; t++) {
          const F* s = scores + t * E;
          F inv = 1;
          if (kind == RouterScore::kSigmoid) {
            F sum = 0;
            for (int e = 0; e < E; e++) sum += s[e];
            inv = F(1) / (sum + F(math::kRouterNormEps));
          }
          for (int e = 0; e < E; e++) partial[0][e] += s[e] * inv;
          if (!dlogits) continue;
          F dot = 0;
          for (int e = 0; e < E; e++) dot += a[e] * s[e] * inv;
          F* dx = dlogits + t * E;
          if (kind == RouterScore::kSoftmax) {
#pragma omp simd
            for (int e = 0; e < E; e++) dx[e] += s[e] * (a[e] - dot);
          } else {
#pragma omp simd
            for (int e = 0; e < E; e++) {
              dx[e] += (a[e] - dot) * inv * s[e] * (F(1) - s[e]);
            }
          }
        }
      });
  double aux = 0;
  for (int e = 0; e < E; e++) {
    aux += count[e] / (L * k) * (prob[e] / L);
  }
  return F(coef * E * aux);
}

// dz / dx_e = coef · (2/N) · lse · softmax(x)_e, one row at a time.
template <typename F>
F moe_z_loss(F* dlogits, const F* logits, F coef, F dloss, int N, int E) {
  if (N <= 0) return F(0);
  double sum = 0;
  internal::ColumnSums<1, double>(
      N, 1, {&sum},
      [&](int64_t t0, int64_t t1, const std::array<double*, 1>& partial) {
        for (int64_t t = t0; t < t1; t++) {
          const F* x = logits + t * E;
          const F m = internal::MaxOf(x, E);
          F se = 0;
#pragma omp simd reduction(+ : se)
          for (int e = 0; e < E; e++) se += internal::Exp(x[e] - m);
          const F lse = m + std::log(se);
          partial[0][0] += double(lse) * lse;
          if (!dlogits) continue;
          const F g = dloss * coef * F(2) * lse / F(N);
          F* dx = dlogits + t * E;
#pragma omp simd
          for (int e = 0; e < E; e++) dx[e] += g * internal::Exp(x[e] - lse);
        }
      });
  return F(coef * sum / N);
}

// A stable counting sort of the pairs by expert, in blocks of tokens: each
// block counts its pairs per expert, the counts become each block's first
// rank within each expert (blocks in token order), and each block then
// places its pairs. A pair's rank within its expert is its position among
// that expert's pairs in token order, so capacity keeps the first ones.
int64_t moe_dispatch_plan(int32_t* slots, int32_t* order, int32_t* counts,
                          int32_t* offsets, const int32_t* experts, int N,
                          int k, int E, int capacity, int segment,
                          const int32_t* base) {
  const int64_t pairs = int64_t{N} * k;
  segment = DispatchSegment(N, k, capacity, segment);
  for (int64_t i = 0; i < pairs; i++) {
    PT_CHECK(experts[i] >= 0 && experts[i] < E, "an expert index");
  }
  // kept[i]: pair i is within its expert's capacity in its segment (the
  // segment's first `capacity` pairs naming the expert, in pair order).
  std::vector<uint8_t> kept(pairs, 1);
  if (capacity > 0) {
    internal::ParallelFor(
        N / segment,
        [&](int64_t s0, int64_t s1) {
          std::vector<int64_t> seen(E);
          for (int64_t s = s0; s < s1; s++) {
            if (base != nullptr) {
              std::copy(base + s * E, base + (s + 1) * E, seen.begin());
            } else {
              std::fill(seen.begin(), seen.end(), 0);
            }
            const int64_t end = (s + 1) * segment * k;
            for (int64_t i = s * segment * k; i < end; i++) {
              kept[i] = seen[experts[i]]++ < capacity;
            }
          }
        },
        /*align=*/1);
  }
  // Blocks of at least 1024 tokens, at most one per thread; the plan itself
  // is unique whatever the blocks.
  constexpr int64_t kMinBlockTokens = 1024;
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>(omp_get_max_threads(), N / kMinBlockTokens));
  const int64_t block_tokens = (N + blocks - 1) / blocks;
  // rank[b·E + e]: the kept pairs of expert e in blocks before b (after the
  // scan).
  std::vector<int64_t> rank(blocks * E, 0);
  // visit(i, r) for each kept pair i of each block, r its block's row of
  // rank, the blocks over the thread team.
  auto each_pair = [&](const auto& visit) {
    internal::ParallelFor(
        blocks,
        [&](int64_t b0, int64_t b1) {
          for (int64_t b = b0; b < b1; b++) {
            int64_t* r = rank.data() + b * E;
            const int64_t end =
                std::min<int64_t>(N, (b + 1) * block_tokens) * k;
            for (int64_t i = b * block_tokens * k; i < end; i++) {
              if (kept[i]) {
                visit(i, r);
              } else {
                slots[i] = -1;
              }
            }
          }
        },
        /*align=*/1);
  };
  each_pair([&](int64_t i, int64_t* r) { r[experts[i]]++; });
  offsets[0] = 0;
  for (int e = 0; e < E; e++) {
    int64_t total = 0;
    for (int64_t b = 0; b < blocks; b++) {
      const int64_t n = rank[b * E + e];
      rank[b * E + e] = total;
      total += n;
    }
    counts[e] = static_cast<int32_t>(total);
    offsets[e + 1] = offsets[e] + counts[e];
  }
  const int32_t M = offsets[E];
  each_pair([&](int64_t i, int64_t* r) {
    const int32_t s =
        static_cast<int32_t>(offsets[experts[i]] + r[experts[i]]++);
    slots[i] = s;
    order[s] = static_cast<int32_t>(i);
  });
  std::fill(order + M, order + pairs, -1);
  return pairs - M;
}

template <typename F>
void moe_permute_forward(F* out, const F* inp, const int32_t* order, int M,
                         int k, int C) {
  internal::ParallelFor(
      M,
      [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; s++) {
          std::memcpy(out + s * C, inp + int64_t{order[s] / k} * C,
                      sizeof(F) * C);
        }
      },
      /*align=*/1);
}

template <typename F>
void moe_permute_backward(F* dinp, const F* dout, const int32_t* slots, int N,
                          int k, int C) {
  internal::ParallelFor(
      N,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t++) {
          F* dx = dinp + t * C;
          for (int j = 0; j < k; j++) {
            const int32_t s = slots[t * k + j];
            if (s < 0) continue;
            const F* dy = dout + int64_t{s} * C;
#pragma omp simd
            for (int c = 0; c < C; c++) dx[c] += dy[c];
          }
        }
      },
      /*align=*/1);
}

template <typename F>
void moe_unpermute_forward(F* out, const F* inp, const F* weights,
                           const int32_t* slots, int N, int k, int C) {
  internal::ParallelFor(
      N,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t++) {
          F* o = out + t * C;
          std::fill(o, o + C, F(0));
          for (int j = 0; j < k; j++) {
            const int32_t s = slots[t * k + j];
            if (s < 0) continue;
            const F w = weights[t * k + j];
            const F* y = inp + int64_t{s} * C;
#pragma omp simd
            for (int c = 0; c < C; c++) o[c] += w * y[c];
          }
        }
      },
      /*align=*/1);
}

template <typename F>
void moe_unpermute_backward(F* dinp, F* dweights, const F* dout, const F* inp,
                            const F* weights, const int32_t* slots, int N,
                            int k, int C) {
  internal::ParallelFor(
      N,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t++) {
          const F* d = dout + t * C;
          for (int j = 0; j < k; j++) {
            const int32_t s = slots[t * k + j];
            if (s < 0) {
              dweights[t * k + j] = 0;
              continue;
            }
            const F w = weights[t * k + j];
            const F* y = inp + int64_t{s} * C;
            F* dy = dinp + int64_t{s} * C;
            F dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int c = 0; c < C; c++) {
              dy[c] = w * d[c];
              dot += d[c] * y[c];
            }
            dweights[t * k + j] = dot;
          }
        }
      },
      /*align=*/1);
}

#define PT_MOE_INSTANTIATE(F)                                                  \
  template void moe_router_forward<F>(int32_t*, F*, F*, const F*, const F*,    \
                                      int, int, int, RouterScore, bool);       \
  template void moe_router_backward<F>(F*, const F*, const int32_t*, const F*, \
                                       int, int, int, RouterScore, bool);      \
  template F moe_aux_loss<F>(F*, const F*, const int32_t*, F, F, int, int,     \
                             int, RouterScore, const F*, int);                 \
  template F moe_z_loss<F>(F*, const F*, F, F, int, int);                      \
  template void moe_permute_forward<F>(F*, const F*, const int32_t*, int, int, \
                                       int);                                   \
  template void moe_permute_backward<F>(F*, const F*, const int32_t*, int,     \
                                        int, int);                             \
  template void moe_unpermute_forward<F>(F*, const F*, const F*,               \
                                         const int32_t*, int, int, int);       \
  template void moe_unpermute_backward<F>(                                     \
      F*, F*, const F*, const F*, const F*, const int32_t*, int, int, int);
PT_MOE_INSTANTIATE(float)
PT_MOE_INSTANTIATE(double)
#undef PT_MOE_INSTANTIATE

}  // namespace ptrain::kernels
