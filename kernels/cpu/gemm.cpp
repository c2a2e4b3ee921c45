// Row-major GEMM for the CPU kernels: float to oneDNN's sgemm, double to
// OpenBLAS dgemm. No blocking or threading of its own; the libraries do that.
#include <cblas.h>
#include <dnnl.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/kernels.h"

namespace ptrain::kernels {

// A is (M,K) or (K,M) if trans_a, B is (K,N) or (N,K) if trans_b, C is (M,N);
// each with its own leading dimension (row stride).
template <>
void gemm<float>(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 float alpha, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const dnnl_status_t status =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A,
                 lda, B, ldb, beta, C, ldc);
  if (status != dnnl_success) {
    // A bad leading dimension is a programming error, never a runtime state.
    std::fprintf(stderr,
                 "%s:%d: dnnl_sgemm failed (status %d): M=%lld N=%lld K=%lld "
                 "lda=%lld ldb=%lld ldc=%lld\n",
                 __FILE__, __LINE__, static_cast<int>(status),
                 static_cast<long long>(M), static_cast<long long>(N),
                 static_cast<long long>(K), static_cast<long long>(lda),
                 static_cast<long long>(ldb), static_cast<long long>(ldc));
    std::abort();
  }
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                  double alpha, const double* A, int64_t lda, const double* B,
                  int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
              static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
}

void CpuSquareSgemm(int n, const float* a, const float* b, float* c) {
  gemm<float>(false, true, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
}

}  // namespace ptrain::kernels
