// The CUDA backend's AdamW update and the sums (of squares, for the
// gradient norm) in double, as kernels/cpu/adamw.cpp.
#include <algorithm>
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

// The table of `runs` in shared memory when `shared_table`, else `runs`
// itself.
__device__ __forceinline__ const RunEntry* TableOf(const RunEntry* runs, int n,
                                                   bool shared_table) {
  extern __shared__ RunEntry table[];
  if (!shared_table) return runs;
  for (int i = threadIdx.x; i < n; i += blockDim.x) table[i] = runs[i];
  __syncthreads();
  return table;
}

// adamw_update_runs in one launch: flat index k over the runs' elements
// one after another, its run found by FindRun.
// params_bf16, when not null, gets each updated parameter rounded (the
// compute copy).
__global__ void AdamWRunsKernel(float* params, __nv_bfloat16* params_bf16,
                                float* m, float* v, const float* grads,
                                const RunEntry* runs, int n, bool shared_table,
                                int64_t total, math::AdamWStep decay,
                                math::AdamWStep plain) {
  const RunEntry* t = TableOf(runs, n, shared_table);
  ForEachIndex(total, [&](int64_t k) {
    const RunEntry& r = t[FindRun(t, n, k)];
    const int64_t i = r.begin + (k - r.first);
    float p = params[i], mi = m[i], vi = v[i];
    math::AdamWUpdate(p, mi, vi, grads[i], r.tag != 0 ? decay : plain);
    params[i] = p;
    if (params_bf16 != nullptr) params_bf16[i] = __float2bfloat16_rn(p);
    m[i] = mi;
    v[i] = vi;
  });
}

// SumSquaresRuns' partials: block b writes the squares of its share of
// the runs tagged 0 and 1 at partials[b] and partials[gridDim.x + b].
__global__ void SumSquaresRunsKernel(double* partials, const float* x,
                                     const RunEntry* runs, int n,
                                     bool shared_table, int64_t total) {
  const RunEntry* t = TableOf(runs, n, shared_table);
  double acc[2] = {0.0, 0.0};
  ForEachIndex(total, [&](int64_t k) {
    const RunEntry& r = t[FindRun(t, n, k)];
    const double xi = x[r.begin + (k - r.first)];
    acc[r.tag != 0 ? 1 : 0] += xi * xi;
  });
  const double a0 = BlockReduce(acc[0], SumOp(), 0.0);
  const double a1 = BlockReduce(acc[1], SumOp(), 0.0);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = a0;
    partials[gridDim.x + blockIdx.x] = a1;
  }
}

// Reduce's partials: block b writes the sum of its share at partials[b].
template <bool kSquares>
__global__ void SumKernel(double* partials, const float* x, int64_t n) {
  double acc = 0.0;
  ForEachIndex(n, [&](int64_t i) {
    const double xi = x[i];
    acc += kSquares ? xi * xi : xi;
  });
  acc = BlockReduce(acc, SumOp(), 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block: out[s] = the sum of partials[s·blocks, (s+1)·blocks) for each
// s < sums, thread t adding t, t + blockDim.x, ... before BlockReduce. With
// the grid-stride shares above, an order fixed by the sizes alone: the
// same bits every run, where atomics added the blocks in the order they
// finished.
__global__ void SumPartialsKernel(double* out, const double* partials,
                                  int blocks, int sums) {
  for (int s = 0; s < sums; ++s) {
    double acc = 0.0;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
      acc += partials[static_cast<int64_t>(s) * blocks + b];
    }
    acc = BlockReduce(acc, SumOp(), 0.0);
    if (threadIdx.x == 0) out[s] = acc;
  }
}

}  // namespace

template <bool kSquares>
double CudaBackend::Reduce(const float* x, int64_t n) {
  const int blocks = std::clamp(Blocks(n), 1, kSumBlocks);
  SumKernel<kSquares><<<blocks, kThreads, 0, stream_>>>(SumPartials(), x, n);
  Launched();
  SumPartialsKernel<<<1, kThreads, 0, stream_>>>(sum_, SumPartials(), blocks,
                                                 1);
  Launched();
  double host = 0.0;
  PT_CUDA_CHECK(cudaMemcpyAsync(&host, sum_, sizeof(double),
                                cudaMemcpyDeviceToHost, stream_));
  PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host;
}

double CudaBackend::Sum(const float* x, int64_t n) {
  if (Refused("Sum")) return 0.0;
  return Reduce<false>(x, n);
}

double CudaBackend::SumSquares(const float* x, int64_t n) {
  if (Refused("SumSquares")) return 0.0;
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

bool CudaBackend::Upload(const Ops::Run* runs, int n, RunTable* table) {
  std::vector<RunEntry> entries(n);
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    entries[i] = {runs[i].begin, total, runs[i].tag};
    total += runs[i].count;
  }
  if (entries != table->host && !Refused("a new table of runs")) {
    // From pageable memory: the copy has read `entries` when it returns.
    PT_CUDA_CHECK(cudaMemcpyAsync(Grow(&table->dev, n), entries.data(),
                                  n * sizeof(RunEntry), cudaMemcpyHostToDevice,
                                  stream_));
    table->host = std::move(entries);
  }
  table->total = total;
  return n * sizeof(RunEntry) <= kRunTableSharedBytes;
}

void CudaBackend::adamw_update_runs(float* params, void* params_bf16, float* m,
                                    float* v, const float* grads,
                                    const Ops::Run* runs, int n, float lr,
                                    float beta1, float beta2, float eps,
                                    float weight_decay, int64_t t,
                                    float grad_scale) {
  if (n == 0) return;
  const bool shared = Upload(runs, n, &adam_runs_);
  if (adam_runs_.total == 0) return;
  const math::AdamWStep decay =
      math::MakeAdamWStep(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
  const math::AdamWStep plain =
      math::MakeAdamWStep(lr, beta1, beta2, eps, 0.0f, t, grad_scale);
  const OpScope scope(&times_, stream_, "adamw_update");
  AdamWRunsKernel<<<Blocks(adam_runs_.total), kThreads,
                    shared ? n * sizeof(RunEntry) : 0, stream_>>>(
      params, static_cast<__nv_bfloat16*>(params_bf16), m, v, grads,
      adam_runs_.dev.p, n, shared, adam_runs_.total, decay, plain);
  Launched();
}

void CudaBackend::SumSquaresRuns(const float* x, const Ops::Run* runs, int n,
                                 double sums[2]) {
  sums[0] = sums[1] = 0.0;
  if (n == 0 || Refused("SumSquaresRuns")) return;
  const bool shared = Upload(runs, n, &norm_runs_);
  if (norm_runs_.total == 0) return;
  {
    const OpScope scope(&times_, stream_, "SumSquaresRuns");
    const int blocks = std::min(Blocks(norm_runs_.total), kSumBlocks);
    SumSquaresRunsKernel<<<blocks, kThreads, shared ? n * sizeof(RunEntry) : 0,
                           stream_>>>(SumPartials(), x, norm_runs_.dev.p, n,
                                      shared, norm_runs_.total);
    Launched();
    SumPartialsKernel<<<1, kThreads, 0, stream_>>>(sum_, SumPartials(), blocks,
                                                   2);
    Launched();
  }
  PT_CUDA_CHECK(cudaMemcpyAsync(sums, sum_, 2 * sizeof(double),
                                cudaMemcpyDeviceToHost, stream_));
  PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace ptrain::kernels::cuda_impl
