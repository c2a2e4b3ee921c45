// Mixture-of-Experts kernels on CPU: the token-choice router (scores, top-k,
// weights) and its auxiliary losses. Not the experts themselves: those are
// matmuls over the rows dispatched to them.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "kernels/common/math.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ptrain::kernels {

namespace {

// Keeps a normalised row finite where every chosen score has underflowed to
// 0 (sigmoids of very negative logits); far below any score that has not.
constexpr double kNormEps = 1e-20;

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

// ex (k) = the k experts of highest s[e] + bias[e], highest first, the lower
// index first among equals: an insertion into the sorted row, which moves
// an entry only past strictly lower keys.
template <typename F>
void TopK(int32_t* ex, const F* s, const F* bias, int E, int k) {
  auto key = [&](int e) { return bias ? s[e] + bias[e] : s[e]; };
  int filled = 0;
  for (int e = 0; e < E; e++) {
    const F v = key(e);
    if (filled == k && !(v > key(ex[k - 1]))) continue;
    int i = filled < k ? filled++ : k - 1;
    for (; i > 0 && v > key(ex[i - 1]); i--) ex[i] = ex[i - 1];
    ex[i] = e;
  }
}

// The sum of the chosen scores, the weights' denominator when normalised.
template <typename F>
F ChosenSum(const F* s, const int32_t* ex, int k) {
  F sum = 0;
  for (int j = 0; j < k; j++) sum += s[ex[j]];
  return sum + F(kNormEps);
}

}  // namespace

template <typename F>
void moe_router_forward(int32_t* experts, F* weights, F* scores,
                        const F* logits, const F* bias, int N, int E, int k,
                        RouterScore kind, bool normalize) {
  PT_CHECK(k >= 1 && k <= E, "the router chooses 1 to E experts per token");
  internal::ParallelFor(
      N,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t++) {
          F* s = scores + t * E;
          int32_t* ex = experts + t * k;
          F* w = weights + t * k;
          Scores(s, logits + t * E, E, kind);
          TopK(ex, s, bias, E, k);
          const F inv = normalize ? F(1) / ChosenSum(s, ex, k) : F(1);
          for (int j = 0; j < k; j++) w[j] = s[ex[j]] * inv;
        }
      },
      /*align=*/1);
}

// With S the chosen scores' sum and w_j = s_j / S (normalised):
//   dL/ds_j = (dw_j - Σ_i dw_i w_i) / S, else dL/ds_j = dw_j,
// nonzero only at the k chosen experts. Then through the scores:
//   softmax: dx_e = p_e (ds_e - Σ_f ds_f p_f);  sigmoid: dx_e = ds_e σ(1-σ).
template <typename F>
void moe_router_backward(F* dlogits, const F* dweights, const int32_t* experts,
                         const F* scores, int N, int E, int k, RouterScore kind,
                         bool normalize) {
  internal::ParallelFor(
      N,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t++) {
          const F* s = scores + t * E;
          const int32_t* ex = experts + t * k;
          const F* dw = dweights + t * k;
          F* dx = dlogits + t * E;
          F inv = 1, shift = 0;
          if (normalize) {
            inv = F(1) / ChosenSum(s, ex, k);
            for (int j = 0; j < k; j++) shift += dw[j] * s[ex[j]] * inv;
          }
          // ds_j = (dw_j - shift) * inv at expert ex[j].
          if (kind == RouterScore::kSoftmax) {
            F dot = 0;
            for (int j = 0; j < k; j++) {
              dot += (dw[j] - shift) * inv * s[ex[j]];
            }
#pragma omp simd
            for (int e = 0; e < E; e++) dx[e] -= s[e] * dot;
            for (int j = 0; j < k; j++) {
              dx[ex[j]] += s[ex[j]] * (dw[j] - shift) * inv;
            }
          } else {
            for (int j = 0; j < k; j++) {
              const F sj = s[ex[j]];
              dx[ex[j]] += (dw[j] - shift) * inv * sj * (F(1) - sj);
            }
          }
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
               F dloss, int N, int E, int k, RouterScore kind) {
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
  std::vector<F> a(E);
  for (int e = 0; e < E; e++) {
    a[e] = F(dloss * coef * E * count[e] / (double(N) * k) / N);
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
            inv = F(1) / (sum + F(kNormEps));
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
    aux += count[e] / (double(N) * k) * (prob[e] / N);
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

#define PT_MOE_INSTANTIATE(F)                                                  \
  template void moe_router_forward<F>(int32_t*, F*, F*, const F*, const F*,    \
                                      int, int, int, RouterScore, bool);       \
  template void moe_router_backward<F>(F*, const F*, const int32_t*, const F*, \
                                       int, int, int, RouterScore, bool);      \
  template F moe_aux_loss<F>(F*, const F*, const int32_t*, F, F, int, int,     \
                             int, RouterScore);                                \
  template F moe_z_loss<F>(F*, const F*, F, F, int, int);
PT_MOE_INSTANTIATE(float)
PT_MOE_INSTANTIATE(double)
#undef PT_MOE_INSTANTIATE

}  // namespace ptrain::kernels
