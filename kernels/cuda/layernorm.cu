// The CUDA backend's LayerNorm (kernels/cpu/layernorm.cpp), forward and
// backward, and the column sums that also give a matmul's bias gradient.
#include <cstdint>

#include "kernels/common/math.h"
#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

__device__ __forceinline__ void StoreAs(float* o, float v) { *o = v; }
__device__ __forceinline__ void StoreAs(__nv_bfloat16* o, float v) {
  *o = __float2bfloat16_rn(v);
}

// One warp per row. kResidual: the row is inp1 + inp2, written to
// `residual` first (each lane reads back only what it wrote). O: the
// output's type, float or bf16 (rounded to nearest even).
template <bool kResidual, typename O>
__global__ void LayerNormForwardKernel(O* out, float* mean, float* rstd,
                                       float* residual, const float* inp1,
                                       const float* inp2, const float* weight,
                                       const float* bias, int64_t rows, int C) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* x = inp1 + r * C;
  float sum = 0.0f;
  if (kResidual) {
    float* res = residual + r * C;
    const float* y = inp2 + r * C;
    for (int i = lane; i < C; i += 32) {
      const float v = x[i] + y[i];
      res[i] = v;
      sum += v;
    }
    x = res;
  } else {
    for (int i = lane; i < C; i += 32) sum += x[i];
  }
  const float m = WarpSum(sum) / C;
  float sum_sq = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float xm = x[i] - m;
    sum_sq += xm * xm;
  }
  const float s = math::LayerNormRstd(WarpSum(sum_sq) / C);
  O* o = out + r * C;
  for (int i = lane; i < C; i += 32) {
    StoreAs(o + i, (x[i] - m) * s * weight[i] + bias[i]);
  }
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

// One row's input gradient by one warp (`lane` of 32): dx += the gradient
// through the LayerNorm of x, whose statistics are m and s. With `sums`
// (dweight's C, then dbias's C), the row's weight and bias gradient terms
// are added there too.
__device__ __forceinline__ void LayerNormBackwardRow(float* dx, const float* x,
                                                     const float* dy,
                                                     const float* weight,
                                                     float m, float s, int C,
                                                     int lane, float* sums) {
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float dnorm = weight[i] * dy[i];
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * (x[i] - m) * s;
  }
  const float dnorm_mean = WarpSum(dnorm_sum) / C;
  const float dnorm_norm_mean = WarpSum(dnorm_norm_sum) / C;
  for (int i = lane; i < C; i += 32) {
    const float norm = (x[i] - m) * s;
    dx[i] += math::LayerNormInputGrad(weight[i] * dy[i], norm, dnorm_mean,
                                      dnorm_norm_mean, s);
    if (sums != nullptr) {
      atomicAdd(&sums[i], norm * dy[i]);
      atomicAdd(&sums[C + i], dy[i]);
    }
  }
}

// The whole backward in one pass over dout and inp: a warp per row at a
// time, the block's weight and bias gradients summed in shared memory
// (2·C floats) and added to the global ones once a block. Sums in an order
// of their own: the last bits differ from LayerNormBackwardInputKernel +
// ColumnSumsKernel's, within fp32 rounding.
__global__ void LayerNormBackwardKernel(float* dinp, float* dweight,
                                        float* dbias, const float* dout,
                                        const float* inp, const float* weight,
                                        const float* mean, const float* rstd,
                                        int64_t rows, int C) {
  extern __shared__ float sums[];  // dweight's C, then dbias's C
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) sums[i] = 0.0f;
  __syncthreads();
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int64_t r = blockIdx.x * int64_t(warps) + threadIdx.x / 32; r < rows;
       r += int64_t(gridDim.x) * warps) {
    LayerNormBackwardRow(dinp + r * C, inp + r * C, dout + r * C, weight,
                         mean[r], rstd[r], C, lane, sums);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    atomicAdd(&dweight[i], sums[i]);
    atomicAdd(&dbias[i], sums[C + i]);
  }
}

// The input gradient, one warp per row (rows too wide for the kernel
// above's shared memory; ColumnSumsKernel gives the weight gradients).
__global__ void LayerNormBackwardInputKernel(
    float* dinp, const float* dout, const float* inp, const float* weight,
    const float* mean, const float* rstd, int64_t rows, int C) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  LayerNormBackwardRow(dinp + r * C, inp + r * C, dout + r * C, weight, mean[r],
                       rstd[r], C, threadIdx.x % 32, nullptr);
}

// Column sums over rows, accumulated: a block of 32 columns x 8 row lanes
// takes a chunk of kChunkRows rows, then adds its sums atomically. With
// `inp` (LayerNorm), sums[0] gets (x - mean) rstd dy and sums[1] dy;
// without, sums[1] gets dy (a bias gradient).
constexpr int kChunkRows = 256;
__global__ void ColumnSumsKernel(float* dweight, float* dbias,
                                 const float* dout, const float* inp,
                                 const float* mean, const float* rstd,
                                 int64_t rows, int C) {
  __shared__ float sw[8][33];
  __shared__ float sb[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kChunkRows;
  const int64_t r1 = r0 + kChunkRows < rows ? r0 + kChunkRows : rows;
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float dy = dout[r * C + c];
      ab += dy;
      if (inp != nullptr) aw += (inp[r * C + c] - mean[r]) * rstd[r] * dy;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int y = 1; y < 8; ++y) {
      aw += sw[y][threadIdx.x];
      ab += sb[y][threadIdx.x];
    }
    if (inp != nullptr) atomicAdd(&dweight[c], aw);
    atomicAdd(&dbias[c], ab);
  }
}

}  // namespace

void CudaBackend::layernorm_forward(Act out, float* mean, float* rstd,
                                    const float* inp, const float* weight,
                                    const float* bias, int B, int T, int C) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if (Bf16Storage(out)) {
    Run("layernorm_forward", LayerNormForwardKernel<false, __nv_bfloat16>,
        Blocks(rows * 32), static_cast<__nv_bfloat16*>(out.p), mean, rstd,
        nullptr, inp, nullptr, weight, bias, rows, C);
    return;
  }
  Run("layernorm_forward", LayerNormForwardKernel<false, float>,
      Blocks(rows * 32), out.f32(), mean, rstd, nullptr, inp, nullptr, weight,
      bias, rows, C);
}

void CudaBackend::residual_layernorm_forward(
    float* residual, Act out, float* mean, float* rstd, const float* inp1,
    const float* inp2, const float* weight, const float* bias, int B, int T,
    int C) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if (Bf16Storage(out)) {
    Run("residual_layernorm_forward",
        LayerNormForwardKernel<true, __nv_bfloat16>, Blocks(rows * 32),
        static_cast<__nv_bfloat16*>(out.p), mean, rstd, residual, inp1, inp2,
        weight, bias, rows, C);
    return;
  }
  Run("residual_layernorm_forward", LayerNormForwardKernel<true, float>,
      Blocks(rows * 32), out.f32(), mean, rstd, residual, inp1, inp2, weight,
      bias, rows, C);
}

void CudaBackend::layernorm_backward(float* dinp, float* dweight, float* dbias,
                                     const float* dout, const float* inp,
                                     const float* weight, const float* mean,
                                     const float* rstd, int B, int T, int C) {
  const OpScope scope(&times_, stream_, "layernorm_backward");
  const int64_t rows = static_cast<int64_t>(B) * T;
  const size_t shared = 2 * sizeof(float) * static_cast<size_t>(C);
  if (shared <= kLayerNormSharedBytes) {
    // Two blocks an SM, each over many rows: the fewer blocks, the fewer
    // global atomics for the weight gradients.
    const int64_t warps = kThreads / 32;
    const int64_t blocks =
        std::min<int64_t>(2 * sms_, (rows + warps - 1) / warps);
    LayerNormBackwardKernel<<<static_cast<int>(blocks), kThreads, shared,
                              stream_>>>(dinp, dweight, dbias, dout, inp,
                                         weight, mean, rstd, rows, C);
    Launched();
    return;
  }
  LayerNormBackwardInputKernel<<<Blocks(rows * 32), kThreads, 0, stream_>>>(
      dinp, dout, inp, weight, mean, rstd, rows, C);
  Launched();
  ColumnSums(dweight, dbias, dout, inp, mean, rstd, rows, C);
}

void CudaBackend::ColumnSums(float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* mean,
                             const float* rstd, int64_t rows, int C) {
  const dim3 grid((C + 31) / 32,
                  static_cast<unsigned>((rows + kChunkRows - 1) / kChunkRows));
  ColumnSumsKernel<<<grid, dim3(32, 8), 0, stream_>>>(dweight, dbias, dout, inp,
                                                      mean, rstd, rows, C);
  Launched();
}

}  // namespace ptrain::kernels::cuda_impl
