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

// adamw_update_runs in one launch: flat index k over the runs' elements
// one after another; its run is the last whose `first` is at most k, found
// by binary search in the table (copied into shared memory when it fits).
__global__ void AdamWRunsKernel(float* params, float* m, float* v,
                                const float* grads, const AdamWRunEntry* runs,
                                int n, bool shared_table, int64_t total,
                                math::AdamWStep decay, math::AdamWStep plain) {
  extern __shared__ AdamWRunEntry table[];
  const AdamWRunEntry* t = runs;
  if (shared_table) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) table[i] = runs[i];
    __syncthreads();
    t = table;
  }
  ForEachIndex(total, [&](int64_t k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (t[mid].first <= k) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int64_t i = t[lo].begin + (k - t[lo].first);
    float p = params[i], mi = m[i], vi = v[i];
    math::AdamWUpdate(p, mi, vi, grads[i], t[lo].decay ? decay : plain);
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

void CudaBackend::adamw_update_runs(float* params, float* m, float* v,
                                    const float* grads, const AdamWRun* runs,
                                    int n, float lr, float beta1, float beta2,
                                    float eps, float weight_decay, int64_t t,
                                    float grad_scale) {
  if (n == 0) return;
  // The table in the flat index space, uploaded when it differs from the
  // last one (an optimizer's runs stay the same from step to step).
  std::vector<AdamWRunEntry> table(n);
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    table[i] = {runs[i].begin, total, runs[i].decay ? 1 : 0};
    total += runs[i].count;
  }
  if (total == 0) return;
  if (table != adam_runs_host_) {
    AdamWRunEntry* dev = Grow(&adam_runs_, n);
    PT_CUDA_CHECK(cudaMemcpyAsync(dev, table.data(), n * sizeof(AdamWRunEntry),
                                  cudaMemcpyHostToDevice, stream_));
    // The copy reads pageable memory: done with `table` on return.
    adam_runs_host_ = std::move(table);
  }
  const math::AdamWStep decay =
      math::MakeAdamWStep(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
  const math::AdamWStep plain =
      math::MakeAdamWStep(lr, beta1, beta2, eps, 0.0f, t, grad_scale);
  const size_t bytes = n * sizeof(AdamWRunEntry);
  const bool shared_table = bytes <= (32u << 10);
  const OpScope scope(&times_, stream_, "adamw_update");
  AdamWRunsKernel<<<Blocks(total), kThreads, shared_table ? bytes : 0,
                    stream_>>>(params, m, v, grads, adam_runs_.p, n,
                               shared_table, total, decay, plain);
  Launched();
}

}  // namespace ptrain::kernels::cuda_impl
