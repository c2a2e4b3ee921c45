// The CUDA backend's norms (kernels/cpu/layernorm.cpp), LayerNorm and
// RMSNorm, forward and backward, and the column sums that also give a
// matmul's bias gradient. RMSNorm is LayerNorm without the mean and the
// bias: the same kernels, kRms, with no mean (m = 0) and no bias sums.
#include <cstdint>

#include "kernels/common/math.h"
#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

// One warp per row. kResidual: the row is inp1 + inp2, written to
// `residual` first (each lane reads back only what it wrote). O: the
// output's type, float or bf16 (rounded to nearest even). kRms: RMSNorm
// (no mean, no bias; eps the model's), else LayerNorm.
template <bool kResidual, bool kRms, typename O>
__global__ void NormForwardKernel(O* out, float* mean, float* rstd,
                                  float* residual, const float* inp1,
                                  const float* inp2, const float* weight,
                                  const float* bias, float eps, int64_t rows,
                                  int C) {
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
      sum += kRms ? v * v : v;
    }
    x = res;
  } else {
    for (int i = lane; i < C; i += 32) sum += kRms ? x[i] * x[i] : x[i];
  }
  if (kRms) {
    const float s = math::RmsNormRstd(WarpSum(sum) / C, eps);
    O* o = out + r * C;
    for (int i = lane; i < C; i += 32) Store(o + i, x[i] * s * weight[i]);
    if (lane == 0) rstd[r] = s;
    return;
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
    Store(o + i, (x[i] - m) * s * weight[i] + bias[i]);
  }
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

// One row's input gradient by a group of threads (a warp, or a block),
// this thread `first` of `stride`: dx += the gradient through the LayerNorm
// of x, whose statistics are m and s; `sum` adds a value up over the group.
// With `sums` (norm·dy's C, then dy's C), the row's weight and bias terms
// of this thread's columns are added there too. kRms: RMSNorm's (m is 0,
// dnorm's mean is not subtracted, no bias term).
template <bool kRms, typename GroupSum>
__device__ __forceinline__ void LayerNormBackwardRow(
    float* dx, const float* x, const float* dy, const float* weight, float m,
    float s, int C, int first, int stride, GroupSum sum, float* sums) {
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int i = first; i < C; i += stride) {
    const float dnorm = weight[i] * dy[i];
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * (x[i] - m) * s;
  }
  const float dnorm_mean = kRms ? 0.0f : sum(dnorm_sum) / C;
  const float dnorm_norm_mean = sum(dnorm_norm_sum) / C;
  for (int i = first; i < C; i += stride) {
    const float norm = (x[i] - m) * s;
    dx[i] += math::LayerNormInputGrad(weight[i] * dy[i], norm, dnorm_mean,
                                      dnorm_norm_mean, s);
    if (sums != nullptr) {
      sums[i] += norm * dy[i];
      if (!kRms) sums[C + i] += dy[i];
    }
  }
}

// Weight gradients are summed without atomics, in an order fixed by the
// shapes alone: each block writes its chunk of rows' column sums to
// `partial` ((chunks, 2, C): norm·dy, then dy), and ColumnPartialsKernel
// adds the chunks up in order. The ranks of a tensor-parallel group that
// hold a replicated LayerNorm or bias compute its gradient from the same
// data: the same bits on each, or the replicas drift apart.

// The whole backward in one pass over dout and inp: a block of kWarps warps
// per chunk of kLayerNormChunkRows rows. Warp w takes rows w, w + kWarps,
// ... of the chunk, one at a time (a row's sums by shuffles, no block-wide
// barrier), and adds the row's norm·dy and dy to its own 2·C sums in shared
// memory (lane l owns columns l, l + 32, ...); at the end the block adds
// its warps' sums up in warp order into `partial`. kRms: RMSNorm's (mean
// null; the dy sums stay zero).
constexpr int kLayerNormChunkRows = 16;
constexpr int kWarps = kThreads / 32;
template <bool kRms>
__global__ void __launch_bounds__(kThreads)
    LayerNormBackwardKernel(float* dinp, float* partial, const float* dout,
                            const float* inp, const float* weight,
                            const float* mean, const float* rstd, int64_t rows,
                            int C) {
  extern __shared__ float sums[];  // per warp: norm·dy's C, then dy's C
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* mine = sums + int64_t{2} * C * warp;
  for (int c = lane; c < 2 * C; c += 32) mine[c] = 0.0f;
  const int64_t r0 = blockIdx.x * int64_t{kLayerNormChunkRows};
  const int64_t r1 =
      r0 + kLayerNormChunkRows < rows ? r0 + kLayerNormChunkRows : rows;
  const auto warp_sum = [](float v) { return WarpSum(v); };
  for (int64_t r = r0 + warp; r < r1; r += kWarps) {
    LayerNormBackwardRow<kRms>(dinp + r * C, inp + r * C, dout + r * C, weight,
                               kRms ? 0.0f : mean[r], rstd[r], C, lane, 32,
                               warp_sum, mine);
  }
  __syncthreads();
  float* out = partial + blockIdx.x * int64_t{2} * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w) v += sums[int64_t{2} * C * w + c];
    out[c] = v;
  }
}

// The input gradient, one warp per row (rows too wide for the kernel
// above's shared memory; ColumnSumsKernel gives the weight gradients).
template <bool kRms>
__global__ void LayerNormBackwardInputKernel(
    float* dinp, const float* dout, const float* inp, const float* weight,
    const float* mean, const float* rstd, int64_t rows, int C) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  LayerNormBackwardRow<kRms>(
      dinp + r * C, inp + r * C, dout + r * C, weight, kRms ? 0.0f : mean[r],
      rstd[r], C, threadIdx.x % 32, 32, [](float v) { return WarpSum(v); },
      nullptr);
}

// Column sums over a chunk of kChunkRows rows a block (32 columns x 8 row
// lanes) into `partial` as above. With `inp` (a norm), the first C get
// (x - mean) rstd dy (x rstd dy where mean is null: RMSNorm) and the second
// dy; without, the second dy (a bias gradient).
constexpr int kChunkRows = 256;

// A block of 32 columns x 8 row lanes adds up each column's two partial
// sums (w, b) over its lanes, in lane order (the same bits every run):
// true in lane 0, whose w and b then hold the totals.
__device__ __forceinline__ bool AddRowLanes(float& w, float& b) {
  __shared__ float sw[8][33];
  __shared__ float sb[8][33];
  sw[threadIdx.y][threadIdx.x] = w;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0) return false;
  for (int y = 1; y < 8; ++y) {
    w += sw[y][threadIdx.x];
    b += sb[y][threadIdx.x];
  }
  return true;
}
// D: dout's type, float or bf16 (a bf16-stored MLP hidden gradient).
template <typename D>
__global__ void ColumnSumsKernel(float* partial, const D* dout,
                                 const float* inp, const float* mean,
                                 const float* rstd, int64_t rows, int C) {
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kChunkRows;
  const int64_t r1 = r0 + kChunkRows < rows ? r0 + kChunkRows : rows;
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float dy = Load(dout + r * C + c);
      ab += dy;
      if (inp != nullptr) {
        aw += (inp[r * C + c] - (mean != nullptr ? mean[r] : 0.0f)) * rstd[r] *
              dy;
      }
    }
  }
  if (AddRowLanes(aw, ab) && c < C) {
    float* out = partial + blockIdx.y * int64_t{2} * C;
    out[c] = aw;
    out[C + c] = ab;
  }
}

// dweight and dbias (each when not null) += the chunks' sums in `partial`, in
// an order fixed by the shapes: a block per 32 columns, whose 8 row lanes
// add up chunks y, y + 8, ... and then each other's in lane order.
__global__ void ColumnPartialsKernel(float* dweight, float* dbias,
                                     const float* partial, int64_t chunks,
                                     int C) {
  const int c = blockIdx.x * 32 + threadIdx.x;
  float w = 0.0f, b = 0.0f;
  if (c < C) {
    for (int64_t k = threadIdx.y; k < chunks; k += 8) {
      w += partial[k * 2 * C + c];
      b += partial[k * 2 * C + C + c];
    }
  }
  if (!AddRowLanes(w, b) || c >= C) return;
  if (dweight != nullptr) dweight[c] += w;
  if (dbias != nullptr) dbias[c] += b;
}

}  // namespace

void CudaBackend::layernorm_forward(Act out, float* mean, float* rstd,
                                    const float* inp, const float* weight,
                                    const float* bias, int B, int T, int C) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if (Bf16Storage(out)) {
    Run("layernorm_forward", NormForwardKernel<false, false, __nv_bfloat16>,
        Blocks(rows * 32), static_cast<__nv_bfloat16*>(out.p), mean, rstd,
        nullptr, inp, nullptr, weight, bias, 0.0f, rows, C);
    return;
  }
  Run("layernorm_forward", NormForwardKernel<false, false, float>,
      Blocks(rows * 32), out.f32(), mean, rstd, nullptr, inp, nullptr, weight,
      bias, 0.0f, rows, C);
}

void CudaBackend::residual_layernorm_forward(
    float* residual, Act out, float* mean, float* rstd, const float* inp1,
    const float* inp2, const float* weight, const float* bias, int B, int T,
    int C) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if (Bf16Storage(out)) {
    Run("residual_layernorm_forward",
        NormForwardKernel<true, false, __nv_bfloat16>, Blocks(rows * 32),
        static_cast<__nv_bfloat16*>(out.p), mean, rstd, residual, inp1, inp2,
        weight, bias, 0.0f, rows, C);
    return;
  }
  Run("residual_layernorm_forward", NormForwardKernel<true, false, float>,
      Blocks(rows * 32), out.f32(), mean, rstd, residual, inp1, inp2, weight,
      bias, 0.0f, rows, C);
}

void CudaBackend::rmsnorm_forward(Act out, float* rstd, const float* inp,
                                  const float* weight, float eps, int B, int T,
                                  int C) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if (Bf16Storage(out)) {
    Run("rmsnorm_forward", NormForwardKernel<false, true, __nv_bfloat16>,
        Blocks(rows * 32), static_cast<__nv_bfloat16*>(out.p), nullptr, rstd,
        nullptr, inp, nullptr, weight, nullptr, eps, rows, C);
    return;
  }
  Run("rmsnorm_forward", NormForwardKernel<false, true, float>,
      Blocks(rows * 32), out.f32(), nullptr, rstd, nullptr, inp, nullptr,
      weight, nullptr, eps, rows, C);
}

void CudaBackend::residual_rmsnorm_forward(float* residual, Act out,
                                           float* rstd, const float* inp1,
                                           const float* inp2,
                                           const float* weight, float eps,
                                           int B, int T, int C) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if (Bf16Storage(out)) {
    Run("residual_rmsnorm_forward",
        NormForwardKernel<true, true, __nv_bfloat16>, Blocks(rows * 32),
        static_cast<__nv_bfloat16*>(out.p), nullptr, rstd, residual, inp1, inp2,
        weight, nullptr, eps, rows, C);
    return;
  }
  Run("residual_rmsnorm_forward", NormForwardKernel<true, true, float>,
      Blocks(rows * 32), out.f32(), nullptr, rstd, residual, inp1, inp2, weight,
      nullptr, eps, rows, C);
}

void CudaBackend::layernorm_backward(float* dinp, float* dweight, float* dbias,
                                     const float* dout, const float* inp,
                                     const float* weight, const float* mean,
                                     const float* rstd, int B, int T, int C) {
  const OpScope scope(&times_, stream_, "layernorm_backward");
  NormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd,
               static_cast<int64_t>(B) * T, C);
}

void CudaBackend::rmsnorm_backward(float* dinp, float* dweight,
                                   const float* dout, const float* inp,
                                   const float* weight, const float* rstd,
                                   int B, int T, int C) {
  const OpScope scope(&times_, stream_, "rmsnorm_backward");
  NormBackward(dinp, dweight, nullptr, dout, inp, weight, nullptr, rstd,
               static_cast<int64_t>(B) * T, C);
}

void CudaBackend::NormBackward(float* dinp, float* dweight, float* dbias,
                               const float* dout, const float* inp,
                               const float* weight, const float* mean,
                               const float* rstd, int64_t rows, int C) {
  if (rows == 0) return;
  const bool rms = mean == nullptr;
  const size_t shared = 2 * sizeof(float) * kWarps * static_cast<size_t>(C);
  if (shared <= max_shared_) {
    if (shared > layernorm_shared_) {
      for (auto* kernel :
           {LayerNormBackwardKernel<false>, LayerNormBackwardKernel<true>}) {
        PT_CUDA_CHECK(cudaFuncSetAttribute(
            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
            static_cast<int>(shared)));
      }
      layernorm_shared_ = shared;
    }
    const int64_t chunks =
        (rows + kLayerNormChunkRows - 1) / kLayerNormChunkRows;
    float* partial = Grow(&partials_, chunks * 2 * C);
    (rms ? LayerNormBackwardKernel<true>
         : LayerNormBackwardKernel<
               false>)<<<static_cast<int>(chunks), kThreads, shared, stream_>>>(
        dinp, partial, dout, inp, weight, mean, rstd, rows, C);
    Launched();
    ColumnPartialsKernel<<<(C + 31) / 32, dim3(32, 8), 0, stream_>>>(
        dweight, dbias, partial, chunks, C);
    Launched();
    return;
  }
  (rms ? LayerNormBackwardInputKernel<true>
       : LayerNormBackwardInputKernel<
             false>)<<<Blocks(rows * 32), kThreads, 0, stream_>>>(
      dinp, dout, inp, weight, mean, rstd, rows, C);
  Launched();
  ColumnSums(dweight, dbias, dout, inp, mean, rstd, rows, C);
}

void CudaBackend::ColumnSums(float* dweight, float* dbias, ConstAct dout,
                             const float* inp, const float* mean,
                             const float* rstd, int64_t rows, int C) {
  if (rows == 0) return;
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  float* partial = Grow(&partials_, chunks * 2 * C);
  const dim3 grid((C + 31) / 32, static_cast<unsigned>(chunks));
  if (Bf16Storage(dout)) {
    ColumnSumsKernel<<<grid, dim3(32, 8), 0, stream_>>>(
        partial, static_cast<const __nv_bfloat16*>(dout.p), inp, mean, rstd,
        rows, C);
  } else {
    ColumnSumsKernel<<<grid, dim3(32, 8), 0, stream_>>>(
        partial, dout.f32(), inp, mean, rstd, rows, C);
  }
  Launched();
  ColumnPartialsKernel<<<(C + 31) / 32, dim3(32, 8), 0, stream_>>>(
      inp != nullptr ? dweight : nullptr, dbias, partial, chunks, C);
  Launched();
}

}  // namespace ptrain::kernels::cuda_impl
