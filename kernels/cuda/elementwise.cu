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

__global__ void AddRowsKernel(float* dst, int64_t dst_stride, const float* src,
                              int64_t src_stride, int64_t rows, int64_t cols) {
  ForEachIndex(rows * cols, [&](int64_t i) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * dst_stride + c] += src[r * src_stride + c];
  });
}

template <typename S, typename O>
__global__ void ConvertKernel(O* dst, const S* src, int64_t n) {
  ForEachIndex(n, [&](int64_t i) { Store(dst + i, Load(src + i)); });
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

// S: the stored input's type, float or bf16 (fch under bf16 compute); O:
// the gradient's, float or bf16 (rounded to nearest even).
template <typename S, typename O>
__global__ void GeluBackwardKernel(O* dinp, const S* inp, const float* dout,
                                   int64_t n) {
  ForEachIndex(n, [&](int64_t i) {
    const float x = Load(inp + i);
    Store(dinp + i,
          math::GeluGradFromExp(x, expf(math::GeluExponent(x))) * dout[i]);
  });
}

// SwiGLU over rows of [gate | up] (2H each), stored as S (float or bf16):
// element i of out is row i / H, column i % H.
template <typename S>
__global__ void SwigluForwardKernel(float* out, const S* gate_up, int64_t n,
                                    int H) {
  ForEachIndex(n, [&](int64_t i) {
    const S* g = gate_up + (i / H) * 2 * H + i % H;
    const float x = Load(g);
    out[i] = x * math::Sigmoid(x) * Load(g + H);
  });
}

template <typename S>
__global__ void SwigluBackwardKernel(float* dgate_up, const float* dout,
                                     const S* gate_up, int64_t n, int H) {
  ForEachIndex(n, [&](int64_t i) {
    const int64_t at = (i / H) * 2 * H + i % H;
    const float g = Load(gate_up + at), u = Load(gate_up + at + H);
    const float s = math::Sigmoid(g);
    dgate_up[at] = dout[i] * u * math::SiluGrad(g, s);
    dgate_up[at + H] = dout[i] * g * s;
  });
}

// RoPE: element i is channel pair i % half of head (i / half) % heads of
// row i / (half·heads); the row's position is pos0 + row % n.
__global__ void RopeKernel(float* x, int64_t stride, int64_t pairs, int n,
                           int heads, int hs, int pos0, math::Rope rope,
                           bool inverse) {
  const int half = hs / 2;
  ForEachIndex(pairs, [&](int64_t i) {
    const int pair = static_cast<int>(i % half);
    const int64_t head = i / half;
    const int64_t row = head / heads;
    float* at = x + row * stride + (head % heads) * hs + pair;
    float c, s;
    math::RopeCosSin(pos0 + static_cast<int>(row % n),
                     math::RopeInvFreq(pair, hs, rope), &c, &s);
    math::RopeRotate(at, at + half, c, s, inverse);
  });
}

}  // namespace

void CudaBackend::rope_forward(float* x, int64_t stride, int B, int n,
                               int heads, int hs, int pos0,
                               const math::Rope& rope, bool inverse) {
  const int64_t pairs = int64_t{B} * n * heads * (hs / 2);
  Run("rope_forward", RopeKernel, Blocks(pairs), x, stride, pairs, n, heads, hs,
      pos0, rope, inverse);
}

void CudaBackend::swiglu_forward(float* out, ConstAct gate_up, int64_t rows,
                                 int H) {
  const int64_t n = rows * H;
  if (Bf16Storage(gate_up)) {
    Run("swiglu_forward", SwigluForwardKernel<__nv_bfloat16>, Blocks(n), out,
        static_cast<const __nv_bfloat16*>(gate_up.p), n, H);
  } else {
    Run("swiglu_forward", SwigluForwardKernel<float>, Blocks(n), out,
        gate_up.f32(), n, H);
  }
}

void CudaBackend::swiglu_backward(float* dgate_up, const float* dout,
                                  ConstAct gate_up, int64_t rows, int H) {
  const int64_t n = rows * H;
  if (Bf16Storage(gate_up)) {
    Run("swiglu_backward", SwigluBackwardKernel<__nv_bfloat16>, Blocks(n),
        dgate_up, dout, static_cast<const __nv_bfloat16*>(gate_up.p), n, H);
  } else {
    Run("swiglu_backward", SwigluBackwardKernel<float>, Blocks(n), dgate_up,
        dout, gate_up.f32(), n, H);
  }
}

void CudaBackend::Add(float* dst, const float* src, int64_t n) {
  Run("Add", AddKernel, Blocks(n), dst, src, n);
}

void CudaBackend::CopyRows(float* dst, int64_t dst_stride, const float* src,
                           int64_t src_stride, int64_t rows, int64_t cols,
                           bool add) {
  if (add) {
    Run("AddRows", AddRowsKernel, Blocks(rows * cols), dst, dst_stride, src,
        src_stride, rows, cols);
    return;
  }
  const OpScope scope(&times_, stream_, "CopyRows");
  PT_CUDA_CHECK(cudaMemcpy2DAsync(
      dst, dst_stride * sizeof(float), src, src_stride * sizeof(float),
      cols * sizeof(float), rows, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::Convert(Act dst, ConstAct src, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  if (dst.type == src.type) {
    if (dst.p == src.p) return;
    const OpScope scope(&times_, stream_, "Convert");
    PT_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p,
                                  n * (src.type == DType::kF32 ? 4 : 2),
                                  cudaMemcpyDeviceToDevice, stream_));
  } else if (src.type == DType::kBf16) {
    Run("Convert", ConvertKernel<__nv_bfloat16, float>, Blocks(n), dst.f32(),
        static_cast<const __nv_bfloat16*>(src.p), n);
  } else {
    Run("Convert", ConvertKernel<float, __nv_bfloat16>, Blocks(n),
        static_cast<__nv_bfloat16*>(dst.p), src.f32(), n);
  }
}

void CudaBackend::gelu_forward(float* out, const float* inp, int64_t N) {
  Run("gelu_forward", GeluForwardKernel, Blocks(N), out, inp, N);
}

void CudaBackend::gelu_backward(float* dinp, ConstAct inp, const float* dout,
                                int64_t N) {
  const OpScope scope(&times_, stream_, "gelu_backward");
  GeluBackwardInto(dinp, inp, dout, N);
}

void CudaBackend::GeluBackwardInto(Act dinp, ConstAct inp, const float* dout,
                                   int64_t n) {
  using Bf16 = __nv_bfloat16;
  const auto* in16 = static_cast<const Bf16*>(inp.p);
  if (Bf16Storage(dinp)) {
    PT_CHECK(Bf16Storage(inp), "a bf16 GELU gradient of an fp32 input");
    GeluBackwardKernel<Bf16, Bf16><<<Blocks(n), kThreads, 0, stream_>>>(
        static_cast<Bf16*>(dinp.p), in16, dout, n);
  } else if (Bf16Storage(inp)) {
    GeluBackwardKernel<Bf16, float>
        <<<Blocks(n), kThreads, 0, stream_>>>(dinp.f32(), in16, dout, n);
  } else {
    GeluBackwardKernel<float, float>
        <<<Blocks(n), kThreads, 0, stream_>>>(dinp.f32(), inp.f32(), dout, n);
  }
  Launched();
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
