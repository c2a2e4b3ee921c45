// LayerNorm over the channel dimension, forward and backward on CPU (eps 1e-5,
// PyTorch's default). Statistics are saved by forward, not recomputed.
#include <algorithm>
#include <cmath>

#include "kernels/common/math.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"

namespace ptrain::kernels {

namespace {

// One row of layernorm_forward: x is (C); writes o (C), *mean and *rstd.
template <typename F>
inline void LayerNormRow(F* o, F* mean, F* rstd, const F* x, const F* weight,
                         const F* bias, int C) {
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
  *mean = m;
  *rstd = s;
}

// LayerNormRow into a row of the calling thread's scratch, then rounded to
// bf16 into o: the values layernorm_forward writes, rounded as gemm_bf16
// rounds its operands.
struct LayerNormPool;
void LayerNormRow(uint16_t* o, float* mean, float* rstd, const float* x,
                  const float* weight, const float* bias, int C) {
  float* row = internal::ThreadScratch<LayerNormPool, float>(0, C);
  LayerNormRow(row, mean, rstd, x, weight, bias, C);
  for (int i = 0; i < C; i++) o[i] = internal::RoundToBf16(row[i]);
}

// layernorm_forward and residual_layernorm_forward into an output of type
// O: F, or bf16 (uint16_t, F float).
template <typename F, typename O>
void LayerNormRows(O* out, F* mean, F* rstd, const F* inp, const F* weight,
                   const F* bias, int B, int T, int C) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  internal::ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      LayerNormRow(out + r * C, mean + r, rstd + r, inp + r * C, weight, bias,
                   C);
    }
  });
}

// The row just summed is still in L1 when it is normalised.
template <typename F, typename O>
void ResidualLayerNormRows(F* residual, O* out, F* mean, F* rstd, const F* inp1,
                           const F* inp2, const F* weight, const F* bias, int B,
                           int T, int C) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  internal::ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      F* x = residual + r * C;
      const F* a = inp1 + r * C;
      const F* b = inp2 + r * C;
#pragma omp simd
      for (int i = 0; i < C; i++) x[i] = a[i] + b[i];
      LayerNormRow(out + r * C, mean + r, rstd + r, x, weight, bias, C);
    }
  });
}

}  // namespace

// out is (B,T,C), mean and rstd are (B,T), inp is (B,T,C), weight and bias
// are (C).
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight,
                       const F* bias, int B, int T, int C) {
  LayerNormRows(out, mean, rstd, inp, weight, bias, B, T, C);
}

// residual, out, inp1, inp2 are (B,T,C); the rest as layernorm_forward.
template <typename F>
void residual_layernorm_forward(F* residual, F* out, F* mean, F* rstd,
                                const F* inp1, const F* inp2, const F* weight,
                                const F* bias, int B, int T, int C) {
  ResidualLayerNormRows(residual, out, mean, rstd, inp1, inp2, weight, bias, B,
                        T, C);
}

void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd,
                            const float* inp, const float* weight,
                            const float* bias, int B, int T, int C) {
  LayerNormRows(out, mean, rstd, inp, weight, bias, B, T, C);
}

void residual_layernorm_forward_bf16(float* residual, uint16_t* out,
                                     float* mean, float* rstd,
                                     const float* inp1, const float* inp2,
                                     const float* weight, const float* bias,
                                     int B, int T, int C) {
  ResidualLayerNormRows(residual, out, mean, rstd, inp1, inp2, weight, bias, B,
                        T, C);
}

// dinp is (B,T,C), dweight and dbias are (C), dout is (B,T,C), inp is (B,T,C),
// weight is (C), mean and rstd are (B,T).
// One pass over the rows: dinp, and dweight and dbias through per-block
// partial sums (internal::ColumnSums: race-free, and the same whatever the
// thread count).
template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout,
                        const F* inp, const F* weight, const F* mean,
                        const F* rstd, int B, int T, int C) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  internal::ColumnSums<2>(
      rows, C, std::array<F*, 2>{dweight, dbias},
      [&](int64_t r0, int64_t r1, const std::array<F*, 2>& sums) {
        F* dw = sums[0];
        F* db = sums[1];
        for (int64_t r = r0; r < r1; r++) {
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
            dw[i] += norm * dy[i];
            db[i] += dy[i];
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
      });
}

template void layernorm_forward<float>(float*, float*, float*, const float*,
                                       const float*, const float*, int, int,
                                       int);
template void layernorm_forward<double>(double*, double*, double*,
                                        const double*, const double*,
                                        const double*, int, int, int);
template void residual_layernorm_forward<float>(float*, float*, float*, float*,
                                                const float*, const float*,
                                                const float*, const float*, int,
                                                int, int);
template void residual_layernorm_forward<double>(double*, double*, double*,
                                                 double*, const double*,
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
