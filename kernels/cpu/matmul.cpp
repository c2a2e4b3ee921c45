// Linear layer out = inp @ weight^T + bias, forward and backward on CPU, on top
// of gemm. The bias is folded into the GEMM's C operand (beta = 1). In bf16
// (float only) the products go to gemm_bf16 / matmul_backward_bf16.
#include <type_traits>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"

namespace ptrain::kernels {

// out is (B,T,OC), inp is (B,T,C), weight is (OC,C), bias is (OC) or null.
template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int B,
                    int T, int C, int OC, bool bf16) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if constexpr (std::is_same_v<F, float>) {
    if (bf16) {  // the bias is the matmul's own epilogue
      gemm_bf16(false, true, rows, OC, C, inp, C, weight, C, 0.0f, out, OC,
                bias);
      return;
    }
  }
  F beta = 0;
  if (bias != nullptr) {
    internal::ParallelFor(rows, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++) {
        F* o = out + r * OC;
#pragma omp simd
        for (int i = 0; i < OC; i++) o[i] = bias[i];
      }
    });
    beta = 1;
  }
  gemm<F>(false, true, rows, OC, C, F(1), inp, C, weight, C, beta, out, OC);
}

// dinp is (B,T,C) or null, dweight is (OC,C) or null (then dbias is too),
// dout is (B,T,OC), inp is (B,T,C), weight is (OC,C).
template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp,
                     const F* weight, int B, int T, int C, int OC, bool bf16) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if constexpr (std::is_same_v<F, float>) {
    if (bf16) {
      matmul_backward_bf16(dinp, dweight, dbias, dout, inp, weight, rows, C,
                           OC);
      return;
    }
  }
  if (dinp != nullptr) {
    // dinp (rows,C) = dout (rows,OC) @ weight (OC,C)
    gemm<F>(false, false, rows, C, OC, F(1), dout, OC, weight, C, F(0), dinp,
            C);
  }
  if (dweight == nullptr) return;
  // dweight (OC,C) += dout^T (OC,rows) @ inp (rows,C)
  gemm<F>(true, false, OC, C, rows, F(1), dout, OC, inp, C, F(1), dweight, C);
  if (dbias != nullptr) {
    // Column sums of dout.
    internal::ColumnSums<1>(
        rows, OC, std::array<F*, 1>{dbias},
        [&](int64_t r0, int64_t r1, const std::array<F*, 1>& sum) {
          for (int64_t r = r0; r < r1; r++) {
            const F* dy = dout + r * OC;
#pragma omp simd
            for (int64_t i = 0; i < OC; i++) sum[0][i] += dy[i];
          }
        });
  }
}

template void matmul_forward<float>(float*, const float*, const float*,
                                    const float*, int, int, int, int, bool);
template void matmul_forward<double>(double*, const double*, const double*,
                                     const double*, int, int, int, int, bool);
template void matmul_backward<float>(float*, float*, float*, const float*,
                                     const float*, const float*, int, int, int,
                                     int, bool);
template void matmul_backward<double>(double*, double*, double*, const double*,
                                      const double*, const double*, int, int,
                                      int, int, bool);

}  // namespace ptrain::kernels
