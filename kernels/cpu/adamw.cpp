// AdamW parameter update (PyTorch's formulation, decoupled weight decay) and
// the sum of squares used for gradient-norm clipping, on CPU.
#include <cmath>

#include "kernels/cpu/kernels.h"

namespace ptrain::kernels {

// params, m, v, grads are (N).
template <typename F>
void adamw_update(F* params, F* m, F* v, const F* grads, int64_t N, float lr,
                  float beta1, float beta2, float eps, float weight_decay,
                  int64_t t, float grad_scale) {
  // Bias corrections in double: 1 - beta2^t is tiny early on and loses digits
  // in float.
  const F inv_bc1 = F(1.0 / (1.0 - std::pow(double(beta1), double(t))));
  const F inv_bc2 = F(1.0 / (1.0 - std::pow(double(beta2), double(t))));
  const F b1 = beta1;
  const F b2 = beta2;
  const F one_minus_b1 = F(1.0 - double(beta1));
  const F one_minus_b2 = F(1.0 - double(beta2));
  const F lr_f = lr;
  const F eps_f = eps;
  const F wd = weight_decay;
  const F scale = grad_scale;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const F g = grads[i] * scale;
    const F mi = b1 * m[i] + one_minus_b1 * g;
    const F vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const F mhat = mi * inv_bc1;
    const F vhat = vi * inv_bc2;
    params[i] -= lr_f * (wd * params[i] + mhat / (std::sqrt(vhat) + eps_f));
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
