// How the CPU kernels split a loop over the OpenMP team (internal header).
#ifndef PTRAIN_KERNELS_CPU_PARALLEL_H_
#define PTRAIN_KERNELS_CPU_PARALLEL_H_

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace ptrain::kernels::internal {

// Runs body(begin, end) over [0, n) in contiguous static chunks, one per
// thread of a parallel region — or once over the whole range on the calling
// thread, without entering a region, where the team would be one thread
// (omp_get_max_threads() == 1, as for generation's one-position steps) or
// the caller is already inside a region. Entering a region costs about a
// microsecond even for one thread (its closing barrier wakes waiters with a
// system call): as much as a small kernel's whole work. Chunks start at
// multiples of `align` (16: whole 64-byte lines of floats; 1 for loops of
// few, heavy items).
template <typename Body>
void ParallelFor(int64_t n, Body&& body, int64_t align = 16) {
  if (n <= 0) return;
  if (omp_get_max_threads() == 1 || omp_in_parallel()) {
    body(int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads();
    const int64_t per =
        ((n + threads - 1) / threads + align - 1) / align * align;
    const int64_t begin = std::min(n, omp_get_thread_num() * per);
    const int64_t end = std::min(n, begin + per);
    if (begin < end) body(begin, end);
  }
}

}  // namespace ptrain::kernels::internal

#endif  // PTRAIN_KERNELS_CPU_PARALLEL_H_
