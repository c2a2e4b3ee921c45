// LayerNorm over the channel dimension, forward and backward on CPU (eps 1e-5,
// PyTorch's default). Statistics are saved by forward, not recomputed.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/common/math.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"

namespace ptrain::kernels {

// out is (B,T,C), mean and rstd are (B,T), inp is (B,T,C), weight and bias
// are (C).
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight,
                       const F* bias, int B, int T, int C) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  internal::ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const F* x = inp + r * C;
      F* o = out + r * C;
      F sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < C; i++) sum += x[i];
      const F m = sum / C;
      // Two passes rather than E[x^2]-m^2: no cancellation when |m| >> std.
      F sum_sq = 0;
#pragma omp simd reduction(+ : sum_sq)
      for (int i = 0; i < C; i++) {
        const F xm = x[i] - m;
        sum_sq += xm * xm;
      }
      const F s = math::LayerNormRstd(sum_sq / C);
#pragma omp simd
      for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * weight[i] + bias[i];
      mean[r] = m;
      rstd[r] = s;
    }
  });
}

// dinp is (B,T,C), dweight and dbias are (C), dout is (B,T,C), inp is (B,T,C),
// weight is (C), mean and rstd are (B,T).
// Two phases in one parallel region: rows for dinp, then channels for dweight
// and dbias (their sums run over every row, so splitting by channel keeps them
// race-free and deterministic without per-thread copies).
template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout,
                        const F* inp, const F* weight, const F* mean,
                        const F* rstd, int B, int T, int C) {
  const int64_t rows = static_cast<int64_t>(B) * T;
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int64_t r = 0; r < rows; r++) {
      const F* x = inp + r * C;
      const F* dy = dout + r * C;
      F* dx = dinp + r * C;
      const F m = mean[r];
      const F s = rstd[r];
      F dnorm_sum = 0;
      F dnorm_norm_sum = 0;
#pragma omp simd reduction(+ : dnorm_sum, dnorm_norm_sum)
      for (int i = 0; i < C; i++) {
        const F norm = (x[i] - m) * s;
        const F dnorm = weight[i] * dy[i];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * norm;
      }
      const F dnorm_mean = dnorm_sum / C;
      const F dnorm_norm_mean = dnorm_norm_sum / C;
#pragma omp simd
      for (int i = 0; i < C; i++) {
        const F norm = (x[i] - m) * s;
        const F dnorm = weight[i] * dy[i];
        dx[i] += math::LayerNormInputGrad(dnorm, norm, dnorm_mean,
                                          dnorm_norm_mean, s);
      }
    }
    // One contiguous channel slice per thread, aligned to a 64-byte line, so
    // the rows are streamed once in long runs with no shared lines.
    const int nth = omp_get_num_threads();
    const int per = ((C + nth - 1) / nth + 15) / 16 * 16;
    const int c0 = std::min(C, omp_get_thread_num() * per);
    const int c1 = std::min(C, c0 + per);
    for (int64_t r = 0; r < rows; r++) {
      const F* x = inp + r * C;
      const F* dy = dout + r * C;
      const F m = mean[r];
      const F s = rstd[r];
#pragma omp simd
      for (int i = c0; i < c1; i++) {
        dweight[i] += (x[i] - m) * s * dy[i];
        dbias[i] += dy[i];
      }
    }
  }
}

template void layernorm_forward<float>(float*, float*, float*, const float*,
                                       const float*, const float*, int, int,
                                       int);
template void layernorm_forward<double>(double*, double*, double*,
                                        const double*, const double*,
                                        const double*, int, int, int);
template void layernorm_backward<float>(float*, float*, float*, const float*,
                                        const float*, const float*,
                                        const float*, const float*, int, int,
                                        int);
template void layernorm_backward<double>(double*, double*, double*,
                                         const double*, const double*,
                                         const double*, const double*,
                                         const double*, int, int, int);

}  // namespace ptrain::kernels
