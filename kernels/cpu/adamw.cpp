// AdamW parameter update (PyTorch's formulation, decoupled weight decay) and
// the sum of squares used for gradient-norm clipping, on CPU.
#include <algorithm>
#include <cmath>
#include <vector>

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

// x is (N). One order of additions on every machine and thread count:
// blocks of kBlock elements, each summed in kLanes interleaved partial sums
// (element i of a block goes to lane i % kLanes, whatever width the
// compiler vectorizes with), the lanes added in a fixed tree, then the
// blocks in order. The threads only share out the blocks. (A reduction
// clause leaves the order to the compiler's vector width and unrolling,
// which -march=native picks per machine: the gradient norm, and with it the
// clipped update, then differed in its last bits between two CPUs of the
// same instruction set.)
template <typename F>
double sum_squares(const F* x, int64_t N) {
  constexpr int64_t kBlock = int64_t{1} << 14;
  constexpr int kLanes = 8;
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const F* p = x + b * kBlock;
    const int64_t n = std::min(kBlock, N - b * kBlock);
    double lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const double v = p[i + l];
        lane[l] = std::fma(v, v, lane[l]);
      }
    }
    for (int l = 0; i + l < n; ++l) {
      const double v = p[i + l];
      lane[l] = std::fma(v, v, lane[l]);
    }
    partial[b] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                 ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
  double sum = 0;
  for (const double s : partial) sum += s;
  return sum;
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
