// Fused softmax + cross-entropy loss over the vocabulary, forward and backward
// on CPU. The loss itself (mean over positions) is the caller's reduction.
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"

namespace ptrain::kernels {

// losses is (B,T), probs is (B,T,V) and may alias logits, logits is (B,T,V),
// targets is (B,T).
template <typename F>
void crossentropy_softmax_forward(F* losses, F* probs, const F* logits,
                                  const int32_t* targets, int B, int T, int V) {
  const int64_t rows = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const F* x = logits + r * V;
    F* p = probs + r * V;
    const F maxval = internal::MaxOf(x, V);
    // Read before the row is overwritten (probs may alias logits).
    const F target_shifted = x[targets[r]] - maxval;
    F sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; i++) {
      const F e = internal::Exp(x[i] - maxval);
      p[i] = e;
      sum += e;
    }
    const F inv_sum = F(1) / sum;
#pragma omp simd
    for (int i = 0; i < V; i++) p[i] *= inv_sum;
    // -log(exp(target_shifted) / sum), without rounding prob[target] first.
    losses[r] = std::log(sum) - target_shifted;
  }
}

// dlogits is (B,T,V), probs is (B,T,V), targets is (B,T).
template <typename F>
void crossentropy_softmax_backward(F* dlogits, const F* probs,
                                   const int32_t* targets, F dloss, int B,
                                   int T, int V) {
  const int64_t rows = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    F* dx = dlogits + r * V;
    const F* p = probs + r * V;
#pragma omp simd
    for (int i = 0; i < V; i++) dx[i] += p[i] * dloss;
    dx[targets[r]] -= dloss;
  }
}

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
