// The CUDA backend's elementwise ops (kernels/cpu/elementwise.cpp): GELU,
// the residual and bias adds, and Ops::Add. One grid-stride pass each.
#include <cmath>
#include <cstdint>

#include "kernels/common/math.h"
#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

__global__ void AddKernel(float* dst, const float* src, int64_t n) {
  ForEachIndex(n, [&](int64_t i) { dst[i] += src[i]; });
}

__global__ void ResidualKernel(float* out, const float* a, const float* b,
                               int64_t n) {
  ForEachIndex(n, [&](int64_t i) { out[i] = a[i] + b[i]; });
}

__global__ void BiasKernel(float* out, const float* bias, int64_t n, int OC) {
  ForEachIndex(n, [&](int64_t i) { out[i] += bias[i % OC]; });
}

__global__ void GeluForwardKernel(float* out, const float* inp, int64_t n) {
  ForEachIndex(n, [&](int64_t i) {
    const float x = inp[i];
    out[i] = math::GeluFromExp(x, expf(math::GeluExponent(x)));
  });
}

__device__ __forceinline__ float Value(float x) { return x; }
__device__ __forceinline__ float Value(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// S: the stored input's type, float or bf16 (fch under bf16 compute).
template <typename S>
__global__ void GeluBackwardKernel(float* dinp, const S* inp, const float* dout,
                                   int64_t n) {
  ForEachIndex(n, [&](int64_t i) {
    const float x = Value(inp[i]);
    dinp[i] = math::GeluGradFromExp(x, expf(math::GeluExponent(x))) * dout[i];
  });
}

}  // namespace

void CudaBackend::Add(float* dst, const float* src, int64_t n) {
  Run("Add", AddKernel, Blocks(n), dst, src, n);
}

void CudaBackend::gelu_forward(float* out, const float* inp, int64_t N) {
  Run("gelu_forward", GeluForwardKernel, Blocks(N), out, inp, N);
}

void CudaBackend::gelu_backward(float* dinp, ConstAct inp, const float* dout,
                                int64_t N) {
  if (Bf16Storage(inp)) {
    Run("gelu_backward", GeluBackwardKernel<__nv_bfloat16>, Blocks(N), dinp,
        static_cast<const __nv_bfloat16*>(inp.p), dout, N);
    return;
  }
  Run("gelu_backward", GeluBackwardKernel<float>, Blocks(N), dinp, inp.f32(),
      dout, N);
}

void CudaBackend::bias_forward(float* out, const float* bias, int64_t rows,
                               int OC) {
  Run("bias_forward", BiasKernel, Blocks(rows * OC), out, bias, rows * OC, OC);
}

void CudaBackend::residual_forward(float* out, const float* inp1,
                                   const float* inp2, int64_t N) {
  Run("residual_forward", ResidualKernel, Blocks(N), out, inp1, inp2, N);
}

}  // namespace ptrain::kernels::cuda_impl
