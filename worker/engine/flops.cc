#include "worker/engine/flops.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/cpu/kernels.h"

namespace ptrain {

double MeasureSgemmPeakFlops(int n, int reps) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f);
  std::vector<float> b(static_cast<size_t>(n) * n, 0.25f);
  std::vector<float> c(static_cast<size_t>(n) * n, 0.0f);
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::gemm<float>(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n,
                         0.0f, c.data(), n);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (r > 0) best = std::min(best, s);  // the first call warms up
  }
  return 2.0 * n * static_cast<double>(n) * n / best;
}

double MeasureMatmulPeakFlops(kernels::Ops& ops, int n, int reps) {
  const int64_t nn = static_cast<int64_t>(n) * n;
  kernels::Buffer a(&ops, nn), b(&ops, nn), c(&ops, nn);
  std::vector<float> host(nn, 0.5f);
  ops.FromHost(a.data(), host.data(), nn);
  ops.FromHost(b.data(), host.data(), nn);
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    ops.Synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    ops.matmul_forward(c.data(), a.data(), b.data(), nullptr, 1, n, n, n);
    ops.Synchronize();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (r > 0) best = std::min(best, s);  // the first call warms up
  }
  return 2.0 * n * static_cast<double>(n) * n / best;
}

}  // namespace ptrain
