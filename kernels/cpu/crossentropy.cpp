// Softmax + cross-entropy loss over the vocabulary, forward and backward on
// CPU, whole or split over tensor-parallel ranks by vocabulary columns. The
// loss itself (mean over positions) is the caller's reduction.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"

namespace ptrain::kernels {

// The vocabulary-parallel softmax + cross-entropy in three local steps; a
// tensor-parallel caller reduces over its group between them (max after the
// first, sum after the second). Columns j of a rank's (B,T,Vl) logits are
// vocabulary entries vocab_begin + j; those at or past V pad the vocabulary
// and take no part.

// The number of this rank's columns that are real vocabulary entries.
inline int RealColumns(int Vl, int vocab_begin, int V) {
  return std::max(0, std::min(Vl, V - vocab_begin));
}

// maxes is (B,T), logits is (B,T,Vl).
template <typename F>
void crossentropy_parallel_max(F* maxes, const F* logits, int B, int T, int Vl,
                               int vocab_begin, int V) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  const int n = RealColumns(Vl, vocab_begin, V);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    maxes[r] = internal::MaxOf(logits + r * Vl, n);
  }
}

// sums, target_shifted, maxes are (B,T); probs (B,T,Vl) may alias logits.
template <typename F>
void crossentropy_parallel_exp(F* sums, F* target_shifted, F* probs,
                               const F* logits, const F* maxes,
                               const int32_t* targets, int B, int T, int Vl,
                               int vocab_begin, int V) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  const int n = RealColumns(Vl, vocab_begin, V);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const F* x = logits + r * Vl;
    F* p = probs + r * Vl;
    const F maxval = maxes[r];
    // Read before the row is overwritten (probs may alias logits).
    const int target = targets[r] - vocab_begin;
    target_shifted[r] = target >= 0 && target < n ? x[target] - maxval : F(0);
    F sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) {
      const F e = internal::Exp(x[i] - maxval);
      p[i] = e;
      sum += e;
    }
    for (int i = n; i < Vl; i++) p[i] = 0;
    sums[r] = sum;
  }
}

// losses, sums, target_shifted are (B,T); probs is (B,T,Vl).
template <typename F>
void crossentropy_parallel_finish(F* losses, F* probs, const F* sums,
                                  const F* target_shifted, int B, int T,
                                  int Vl) {
  const int64_t rows = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    F* p = probs + r * Vl;
    const F inv_sum = F(1) / sums[r];
#pragma omp simd
    for (int i = 0; i < Vl; i++) p[i] *= inv_sum;
    losses[r] = math::CrossEntropyLoss(sums[r], target_shifted[r]);
  }
}

// dlogits, probs are (B,T,Vl) and may be one buffer; targets is (B,T).
template <typename F>
void crossentropy_parallel_backward(F* dlogits, const F* probs,
                                    const int32_t* targets, F dloss, int B,
                                    int T, int Vl, int vocab_begin) {
  const int64_t rows = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    F* dx = dlogits + r * Vl;
    const F* p = probs + r * Vl;
#pragma omp simd
    for (int i = 0; i < Vl; i++) dx[i] = p[i] * dloss;
    const int target = targets[r] - vocab_begin;
    if (target >= 0 && target < Vl) dx[target] -= dloss;
  }
}

// The single-rank softmax + cross-entropy: the three steps over the whole
// vocabulary, nothing to reduce in between. losses is (B,T), probs is
// (B,T,V) and may alias logits, logits is (B,T,V), targets is (B,T).
template <typename F>
void crossentropy_softmax_forward(F* losses, F* probs, const F* logits,
                                  const int32_t* targets, int B, int T, int V) {
  const size_t rows = static_cast<size_t>(B) * T;
  std::vector<F> maxes(rows), sums(rows), shifted(rows);
  crossentropy_parallel_max(maxes.data(), logits, B, T, V, 0, V);
  crossentropy_parallel_exp(sums.data(), shifted.data(), probs, logits,
                            maxes.data(), targets, B, T, V, 0, V);
  crossentropy_parallel_finish(losses, probs, sums.data(), shifted.data(), B, T,
                               V);
}

// dlogits is (B,T,V), probs is (B,T,V), targets is (B,T).
template <typename F>
void crossentropy_softmax_backward(F* dlogits, const F* probs,
                                   const int32_t* targets, F dloss, int B,
                                   int T, int V) {
  crossentropy_parallel_backward(dlogits, probs, targets, dloss, B, T, V, 0);
}

#define PT_INSTANTIATE(F)                                                      \
  template void crossentropy_parallel_max<F>(F*, const F*, int, int, int, int, \
                                             int);                             \
  template void crossentropy_parallel_exp<F>(F*, F*, F*, const F*, const F*,   \
                                             const int32_t*, int, int, int,    \
                                             int, int);                        \
  template void crossentropy_parallel_finish<F>(F*, F*, const F*, const F*,    \
                                                int, int, int);                \
  template void crossentropy_parallel_backward<F>(                             \
      F*, const F*, const int32_t*, F, int, int, int, int);
PT_INSTANTIATE(float)
PT_INSTANTIATE(double)
#undef PT_INSTANTIATE

template void crossentropy_softmax_forward<float>(float*, float*, const float*,
                                                  const int32_t*, int, int,
                                                  int);
template void crossentropy_softmax_forward<double>(double*, double*,
                                                   const double*,
                                                   const int32_t*, int, int,
                                                   int);
template void crossentropy_softmax_backward<float>(float*, const float*,
                                                   const int32_t*, float, int,
                                                   int, int);
template void crossentropy_softmax_backward<double>(double*, const double*,
                                                    const int32_t*, double, int,
                                                    int, int);

}  // namespace ptrain::kernels
