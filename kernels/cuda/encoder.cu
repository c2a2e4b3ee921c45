// The CUDA backend's encoder (kernels/cpu/encoder.cpp): the token rows a
// rank holds of wte, then the positions, forward and backward.
#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

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

// embedding_backward's sort: position i's key is its token's row in this
// rank's wte ([0, Vl)), or Vl for a token another rank holds (sorted past
// every row, and skipped); its value is i.
__global__ void EmbeddingKeysKernel(uint32_t* rows, int32_t* positions,
                                    const int32_t* inp, int BT, int vocab_begin,
                                    int Vl) {
  ForEachIndex(BT, [&](int64_t i) {
    const int64_t row = static_cast<int64_t>(inp[i]) - vocab_begin;
    rows[i] = static_cast<uint32_t>(row >= 0 && row < Vl ? row : Vl);
    positions[i] = static_cast<int32_t>(i);
  });
}

// The end of the run of `row` starting at j in the sorted rows (BT): the
// first index past j whose row is larger.
__device__ __forceinline__ int RunEnd(const uint32_t* rows, int j, int BT,
                                      uint32_t row) {
  int lo = j + 1, hi = BT;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (rows[mid] > row) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// dwte (Vl,C) += the rows of dout (BT,C) by token, over the positions
// sorted by row (rows, positions: BT each, positions ascending within a
// row). The block at each index that starts a run of one row adds the
// run's rows of dout to that row of dwte, kRunChannels channels at a time:
// warp w sums the run's positions w, w + kWarps, ... in order (a lane a
// channel), and the block adds dwte's value and the warps' sums in warp
// order. The order is fixed by the run's length alone (the same bits each
// run), and a run of at most kWarps positions is added one position after
// another onto dwte, in position order: the CPU's sums (kernels/cpu/
// encoder.cpp). A long run (a frequent token) is shared by the block's
// warps, not walked by one thread. A row of dwte is one run, so one block
// writes it: no atomics.
constexpr int kRunWarps = kThreads / 32;
constexpr int kRunChannels = 256;  // per pass: 8 a lane
__global__ void EmbeddingRunsKernel(float* dwte, const float* dout,
                                    const uint32_t* rows,
                                    const int32_t* positions, int BT, int C,
                                    int Vl) {
  constexpr int kPerLane = kRunChannels / 32;
  __shared__ float sums[kRunWarps][kRunChannels];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = blockIdx.x; j < BT; j += gridDim.x) {
    const uint32_t row = rows[j];
    if (row >= static_cast<uint32_t>(Vl)) break;  // the other ranks' tokens
    if (j > 0 && rows[j - 1] == row) continue;
    const int end = RunEnd(rows, j, BT, row);
    float* dst = dwte + static_cast<int64_t>(row) * C;
    for (int c0 = 0; c0 < C; c0 += kRunChannels) {
      float acc[kPerLane];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
      bool any = false;
      for (int k = j + warp; k < end; k += kRunWarps) {
        const float* src = dout + static_cast<int64_t>(positions[k]) * C;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int c = c0 + lane + 32 * i;
          if (c < C) acc[i] = any ? acc[i] + src[c] : src[c];
        }
        any = true;
      }
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) sums[warp][lane + 32 * i] = acc[i];
      __syncthreads();
      // A warp without positions (a run shorter than kWarps) adds nothing.
      const int warps = min(kRunWarps, end - j);
      for (int c = c0 + threadIdx.x; c < min(C, c0 + kRunChannels);
           c += blockDim.x) {
        float v = dst[c];
        for (int w = 0; w < warps; ++w) v += sums[w][c - c0];
        dst[c] = v;
      }
      __syncthreads();
    }
  }
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

// The sort's keys and values, then its output, sit in embed_rows_ and
// embed_positions_ (2·BT each) and CUB's temporary storage in
// embed_sort_temp_: grow-only, so once they have grown no call allocates or
// waits (CUB's size query is computed on the host).
void CudaBackend::embedding_backward(float* dwte, const float* dout,
                                     const int32_t* inp, int B, int T, int C,
                                     int vocab_begin, int Vl) {
  const int64_t BT = static_cast<int64_t>(B) * T;
  if (BT == 0 || C <= 0 || Vl <= 0) return;
  PT_CHECK(BT <= INT32_MAX, "embedding_backward: B·T past 2^31 positions");
  const int n = static_cast<int>(BT);
  int end_bit = 0;  // the bits of the keys 0..Vl
  while (end_bit < 32 && (static_cast<uint32_t>(Vl) >> end_bit) != 0) {
    ++end_bit;
  }
  uint32_t* rows = Grow(&embed_rows_, 2 * BT);
  int32_t* positions = Grow(&embed_positions_, 2 * BT);
  size_t temp_bytes = 0;
  PT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, rows, rows + BT, positions, positions + BT, n, 0,
      end_bit, stream_));
  // At least a byte: a null temporary storage would make the sort a query.
  unsigned char* temp =
      Grow(&embed_sort_temp_,
           std::max<int64_t>(static_cast<int64_t>(temp_bytes), 1));
  const OpScope scope(&times_, stream_, "embedding_backward");
  EmbeddingKeysKernel<<<Blocks(BT), kThreads, 0, stream_>>>(
      rows, positions, inp, n, vocab_begin, Vl);
  Launched();
  // Stable: a row's positions stay in ascending order.
  PT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      temp, temp_bytes, rows, rows + BT, positions, positions + BT, n, 0,
      end_bit, stream_));
  // A block a sorted index (up to Blocks' limit): the grid follows B·T alone,
  // not how many distinct tokens there are.
  EmbeddingRunsKernel<<<Blocks(BT, 1), kThreads, 0, stream_>>>(
      dwte, dout, rows + BT, positions + BT, n, C, Vl);
  Launched();
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
