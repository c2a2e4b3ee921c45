// AdamW parameter update (PyTorch's formulation, decoupled weight decay) and
// the sum of squares used for gradient-norm clipping, on CPU.
#include <cmath>

#include "kernels/common/math.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/kernels.h"

namespace ptrain::kernels {

// params, m, v, grads are (N).
template <typename F>
void adamw_update(F* params, F* m, F* v, const F* grads, int64_t N, float lr,
                  float beta1, float beta2, float eps, float weight_decay,
                  int64_t t, float grad_scale) {
  const math::AdamWStep step =
      math::MakeAdamWStep(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; i++) {
    math::AdamWUpdate(params[i], m[i], v[i], grads[i], step);
  }
}

void adamw_update_with_copy(float* params, uint16_t* params_bf16, float* m,
                            float* v, const float* grads, int64_t N, float lr,
                            float beta1, float beta2, float eps,
                            float weight_decay, int64_t t, float grad_scale) {
  const math::AdamWStep step =
      math::MakeAdamWStep(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; i++) {
    math::AdamWUpdate(params[i], m[i], v[i], grads[i], step);
    params_bf16[i] = internal::RoundToBf16(params[i]);
  }
}

// x is (N).
template <typename F>
double sum_squares(const F* x, int64_t N) {
  double acc = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : acc)
  for (int64_t i = 0; i < N; i++) {
    const double xi = x[i];
    acc += xi * xi;
  }
  return acc;
}

template void adamw_update<float>(float*, float*, float*, const float*, int64_t,
                                  float, float, float, float, float, int64_t,
                                  float);
template void adamw_update<double>(double*, double*, double*, const double*,
                                   int64_t, float, float, float, float, float,
                                   int64_t, float);
template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);

}  // namespace ptrain::kernels
