// The norms over the channel dimension, forward and backward on CPU:
// LayerNorm (eps 1e-5, PyTorch's default) and RMSNorm (the model's eps).
// Statistics are saved by forward, not recomputed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

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

// One row of rmsnorm_forward: x is (C); writes o (C) and *rstd.
template <typename F>
inline void RmsNormRow(F* o, F* rstd, const F* x, const F* weight, F eps,
                       int C) {
  F sum_sq = 0;
#pragma omp simd reduction(+ : sum_sq)
  for (int i = 0; i < C; i++) sum_sq += x[i] * x[i];
  const F s = math::RmsNormRstd(sum_sq / C, eps);
#pragma omp simd
  for (int i = 0; i < C; i++) o[i] = x[i] * s * weight[i];
  *rstd = s;
}

// A norm's row (`row(o)` writes it to o) into a row of the calling thread's
// scratch, then rounded to bf16 into o: the values the float norm writes,
// rounded as gemm_bf16 rounds its operands.
struct NormPool;
template <typename Row>
void RoundedRow(uint16_t* o, int C, Row row) {
  float* scratch = internal::ThreadScratch<NormPool, float>(0, C);
  row(scratch);
  for (int i = 0; i < C; i++) o[i] = internal::RoundToBf16(scratch[i]);
}

// A norm's rows, in parallel: row(r, x) normalises row r, whose input x is
// inp's row r.
template <typename F, typename Row>
void NormRows(const F* inp, int B, int T, int C, Row row) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  internal::ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) row(r, inp + r * C);
  });
}

// residual = inp1 + inp2, then the norm of each row as NormRows: the row
// just summed is still in L1 when it is normalised.
template <typename F, typename Row>
void ResidualNormRows(F* residual, const F* inp1, const F* inp2, int B, int T,
                      int C, Row row) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  internal::ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      F* x = residual + r * C;
      const F* a = inp1 + r * C;
      const F* b = inp2 + r * C;
#pragma omp simd
      for (int i = 0; i < C; i++) x[i] = a[i] + b[i];
      row(r, x);
    }
  });
}

// LayerNorm's row into out's row r, of type O: F, or bf16 (uint16_t, F
// float).
template <typename F, typename O>
auto LayerNormInto(O* out, F* mean, F* rstd, const F* weight, const F* bias,
                   int C) {
  return [=](int64_t r, const F* x) {
    if constexpr (std::is_same_v<O, uint16_t>) {
      RoundedRow(out + r * C, C, [&](float* o) {
        LayerNormRow(o, mean + r, rstd + r, x, weight, bias, C);
      });
    } else {
      LayerNormRow(out + r * C, mean + r, rstd + r, x, weight, bias, C);
    }
  };
}

// RMSNorm's likewise.
template <typename F, typename O>
auto RmsNormInto(O* out, F* rstd, const F* weight, F eps, int C) {
  return [=](int64_t r, const F* x) {
    if constexpr (std::is_same_v<O, uint16_t>) {
      RoundedRow(out + r * C, C,
                 [&](float* o) { RmsNormRow(o, rstd + r, x, weight, eps, C); });
    } else {
      RmsNormRow(out + r * C, rstd + r, x, weight, eps, C);
    }
  };
}

}  // namespace

// out is (B,T,C), mean and rstd are (B,T), inp is (B,T,C), weight and bias
// are (C).
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight,
                       const F* bias, int B, int T, int C) {
  NormRows(inp, B, T, C, LayerNormInto(out, mean, rstd, weight, bias, C));
}

// residual, out, inp1, inp2 are (B,T,C); the rest as layernorm_forward.
template <typename F>
void residual_layernorm_forward(F* residual, F* out, F* mean, F* rstd,
                                const F* inp1, const F* inp2, const F* weight,
                                const F* bias, int B, int T, int C) {
  ResidualNormRows(residual, inp1, inp2, B, T, C,
                   LayerNormInto(out, mean, rstd, weight, bias, C));
}

void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd,
                            const float* inp, const float* weight,
                            const float* bias, int B, int T, int C) {
  NormRows(inp, B, T, C, LayerNormInto(out, mean, rstd, weight, bias, C));
}

void residual_layernorm_forward_bf16(float* residual, uint16_t* out,
                                     float* mean, float* rstd,
                                     const float* inp1, const float* inp2,
                                     const float* weight, const float* bias,
                                     int B, int T, int C) {
  ResidualNormRows(residual, inp1, inp2, B, T, C,
                   LayerNormInto(out, mean, rstd, weight, bias, C));
}

namespace {

// The backward of LayerNorm, or of RMSNorm (kRms: no mean, no bias; the
// input gradient is LayerNormInputGrad's with a zero mean of dnorm). dinp
// is (B,T,C), dweight and dbias (C), dout and inp (B,T,C), weight (C),
// mean and rstd (B,T). One pass over the rows: dinp, and the weight
// gradients through per-block partial sums (internal::ColumnSums:
// race-free, and the same whatever the thread count).
template <bool kRms, typename F>
void NormBackward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp,
                  const F* weight, const F* mean, const F* rstd, int B, int T,
                  int C) {
  constexpr int kSums = kRms ? 1 : 2;
  std::array<F*, kSums> out;
  out[0] = dweight;
  if constexpr (!kRms) out[1] = dbias;
  const int64_t rows = static_cast<int64_t>(B) * T;
  internal::ColumnSums<kSums>(
      rows, C, out,
      [&](int64_t r0, int64_t r1, const std::array<F*, kSums>& sums) {
        F* dw = sums[0];
        F* db = sums[kSums - 1];
        for (int64_t r = r0; r < r1; r++) {
          const F* x = inp + r * C;
          const F* dy = dout + r * C;
          F* dx = dinp + r * C;
          const F m = kRms ? F(0) : mean[r];
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
            if constexpr (!kRms) db[i] += dy[i];
          }
          const F dnorm_mean = kRms ? F(0) : dnorm_sum / C;
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

}  // namespace

template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout,
                        const F* inp, const F* weight, const F* mean,
                        const F* rstd, int B, int T, int C) {
  NormBackward<false>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T,
                      C);
}

// out (B,T,C), rstd (B,T), inp (B,T,C), weight (C).
template <typename F>
void rmsnorm_forward(F* out, F* rstd, const F* inp, const F* weight, F eps,
                     int B, int T, int C) {
  NormRows(inp, B, T, C, RmsNormInto(out, rstd, weight, eps, C));
}

template <typename F>
void residual_rmsnorm_forward(F* residual, F* out, F* rstd, const F* inp1,
                              const F* inp2, const F* weight, F eps, int B,
                              int T, int C) {
  ResidualNormRows(residual, inp1, inp2, B, T, C,
                   RmsNormInto(out, rstd, weight, eps, C));
}

void rmsnorm_forward_bf16(uint16_t* out, float* rstd, const float* inp,
                          const float* weight, float eps, int B, int T, int C) {
  NormRows(inp, B, T, C, RmsNormInto(out, rstd, weight, eps, C));
}

void residual_rmsnorm_forward_bf16(float* residual, uint16_t* out, float* rstd,
                                   const float* inp1, const float* inp2,
                                   const float* weight, float eps, int B, int T,
                                   int C) {
  ResidualNormRows(residual, inp1, inp2, B, T, C,
                   RmsNormInto(out, rstd, weight, eps, C));
}

template <typename F>
void rmsnorm_backward(F* dinp, F* dweight, const F* dout, const F* inp,
                      const F* weight, const F* rstd, int B, int T, int C) {
  NormBackward<true>(dinp, dweight, static_cast<F*>(nullptr), dout, inp, weight,
                     static_cast<const F*>(nullptr), rstd, B, T, C);
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

template void rmsnorm_forward<float>(float*, float*, const float*, const float*,
                                     float, int, int, int);
template void rmsnorm_forward<double>(double*, double*, const double*,
                                      const double*, double, int, int, int);
template void residual_rmsnorm_forward<float>(float*, float*, float*,
                                              const float*, const float*,
                                              const float*, float, int, int,
                                              int);
template void residual_rmsnorm_forward<double>(double*, double*, double*,
                                               const double*, const double*,
                                               const double*, double, int, int,
                                               int);
template void rmsnorm_backward<float>(float*, float*, const float*,
                                      const float*, const float*, const float*,
                                      int, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*,
                                       const double*, const double*,
                                       const double*, int, int, int);

}  // namespace ptrain::kernels
