// The CUDA backend's encoder (kernels/cpu/encoder.cpp): the token rows a
// rank holds of wte, then the positions, forward and backward.
#include <cstdint>

#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

// Element i of a (B,T,C) embedding output: where its value sits in this
// rank's rows of wte ([vocab_begin, vocab_begin + Vl)), or -1 when the
// token's row is another rank's.
__device__ __forceinline__ int64_t WteIndex(const int32_t* inp, int64_t i,
                                            int C, int vocab_begin, int Vl) {
  const int64_t row = static_cast<int64_t>(inp[i / C]) - vocab_begin;
  return row >= 0 && row < Vl ? row * C + i % C : -1;
}

__global__ void EmbeddingForwardKernel(float* out, const int32_t* inp,
                                       const float* wte, int64_t BT, int C,
                                       int vocab_begin, int Vl) {
  const int64_t n = BT * C;
  ForEachIndex(n, [&](int64_t i) {
    const int64_t at = WteIndex(inp, i, C, vocab_begin, Vl);
    out[i] = at >= 0 ? wte[at] : 0.0f;
  });
}

__global__ void EmbeddingBackwardKernel(float* dwte, const float* dout,
                                        const int32_t* inp, int64_t BT, int C,
                                        int vocab_begin, int Vl) {
  const int64_t n = BT * C;
  ForEachIndex(n, [&](int64_t i) {
    const int64_t at = WteIndex(inp, i, C, vocab_begin, Vl);
    if (at >= 0) atomicAdd(&dwte[at], dout[i]);
  });
}

__global__ void PositionForwardKernel(float* out, const float* wpe, int B,
                                      int T, int C, int t0) {
  const int64_t n = static_cast<int64_t>(B) * T * C;
  ForEachIndex(n, [&](int64_t i) {
    const int64_t t = (i / C) % T;
    out[i] += wpe[(t0 + t) * C + i % C];
  });
}

// One thread per (t, c): the sum over the batch in a fixed order.
__global__ void PositionBackwardKernel(float* dwpe, const float* dout, int B,
                                       int T, int C, int t0) {
  const int64_t n = static_cast<int64_t>(T) * C;
  ForEachIndex(n, [&](int64_t i) {
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += dout[static_cast<int64_t>(b) * n + i];
    dwpe[static_cast<int64_t>(t0) * C + i] += acc;
  });
}

}  // namespace

void CudaBackend::embedding_forward(float* out, const int32_t* inp,
                                    const float* wte, int B, int T, int C,
                                    int vocab_begin, int Vl) {
  const int64_t BT = static_cast<int64_t>(B) * T;
  Run("embedding_forward", EmbeddingForwardKernel, Blocks(BT * C), out, inp,
      wte, BT, C, vocab_begin, Vl);
}

void CudaBackend::embedding_backward(float* dwte, const float* dout,
                                     const int32_t* inp, int B, int T, int C,
                                     int vocab_begin, int Vl) {
  const int64_t BT = static_cast<int64_t>(B) * T;
  Run("embedding_backward", EmbeddingBackwardKernel, Blocks(BT * C), dwte, dout,
      inp, BT, C, vocab_begin, Vl);
}

void CudaBackend::position_forward(float* out, const float* wpe, int B, int T,
                                   int C, int t0) {
  Run("position_forward", PositionForwardKernel, Blocks(int64_t(B) * T * C),
      out, wpe, B, T, C, t0);
}

void CudaBackend::position_backward(float* dwpe, const float* dout, int B,
                                    int T, int C, int t0) {
  Run("position_backward", PositionBackwardKernel, Blocks(int64_t(T) * C), dwpe,
      dout, B, T, C, t0);
}

}  // namespace ptrain::kernels::cuda_impl
