// The CUDA backend's AdamW update and the sums (of squares, for the
// gradient norm) in double, as kernels/cpu/adamw.cpp.
#include <cstdint>

#include "kernels/common/math.h"
#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

__global__ void AdamWKernel(float* params, float* m, float* v,
                            const float* grads, int64_t n,
                            math::AdamWStep step) {
  ForEachIndex(n, [&](int64_t i) {
    float p = params[i], mi = m[i], vi = v[i];
    math::AdamWUpdate(p, mi, vi, grads[i], step);
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
  });
}

template <bool kSquares>
__global__ void SumKernel(double* out, const float* x, int64_t n) {
  double acc = 0.0;
  ForEachIndex(n, [&](int64_t i) {
    const double xi = x[i];
    acc += kSquares ? xi * xi : xi;
  });
  acc = BlockReduce(acc, SumOp(), 0.0);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

}  // namespace

template <bool kSquares>
double CudaBackend::Reduce(const float* x, int64_t n) {
  PT_CUDA_CHECK(cudaMemsetAsync(sum_, 0, sizeof(double), stream_));
  SumKernel<kSquares>
      <<<Blocks(n) < 1024 ? Blocks(n) : 1024, kThreads, 0, stream_>>>(sum_, x,
                                                                      n);
  Launched();
  double host = 0.0;
  PT_CUDA_CHECK(cudaMemcpyAsync(&host, sum_, sizeof(double),
                                cudaMemcpyDeviceToHost, stream_));
  PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host;
}

double CudaBackend::Sum(const float* x, int64_t n) {
  return Reduce<false>(x, n);
}

double CudaBackend::SumSquares(const float* x, int64_t n) {
  return Reduce<true>(x, n);
}

void CudaBackend::adamw_update(float* params, float* m, float* v,
                               const float* grads, int64_t N, float lr,
                               float beta1, float beta2, float eps,
                               float weight_decay, int64_t t,
                               float grad_scale) {
  const math::AdamWStep step =
      math::MakeAdamWStep(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
  Run("adamw_update", AdamWKernel, Blocks(N), params, m, v, grads, N, step);
}

}  // namespace ptrain::kernels::cuda_impl
