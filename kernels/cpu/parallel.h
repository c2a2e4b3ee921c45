// How the CPU kernels split a loop over the OpenMP team (internal header).
#ifndef PTRAIN_KERNELS_CPU_PARALLEL_H_
#define PTRAIN_KERNELS_CPU_PARALLEL_H_

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

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

// Column sums over the rows of a (rows, cols) pass: kSums accumulators of
// cols values each, added to (never overwritten). body(r0, r1, partial)
// handles rows [r0, r1) and adds each row's contribution to partial[k][c];
// it may write per-row outputs as well. The rows go in blocks of a
// multiple of kSumRows rows (at most kSumBlocks blocks, which bounds the
// scratch), their partial sums (zeroed for each block) then into `sums` in
// block order: the blocks follow from `rows` alone, so the result depends
// on neither the thread count nor the schedule. Each thread streams whole
// rows: splitting by columns instead (one owner per sum) has every thread
// touch every row, which here runs two threads 2-3x slower than one.
inline constexpr int64_t kSumRows = 64;
inline constexpr int64_t kSumBlocks = 256;

template <int kSums, typename F, typename Body>
void ColumnSums(int64_t rows, int64_t cols, const std::array<F*, kSums>& sums,
                Body&& body) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t units = (rows + kSumRows - 1) / kSumRows;
  const int64_t block_rows = (units + kSumBlocks - 1) / kSumBlocks * kSumRows;
  const int64_t blocks = (rows + block_rows - 1) / block_rows;
  std::vector<F> partial(blocks * kSums * cols, F(0));
  ParallelFor(
      blocks,
      [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; b++) {
          std::array<F*, kSums> p;
          for (int k = 0; k < kSums; k++) {
            p[k] = partial.data() + (b * kSums + k) * cols;
          }
          body(b * block_rows, std::min(rows, (b + 1) * block_rows), p);
        }
      },
      /*align=*/1);
  ParallelFor(cols, [&](int64_t c0, int64_t c1) {
    for (int64_t b = 0; b < blocks; b++) {
      for (int k = 0; k < kSums; k++) {
        const F* p = partial.data() + (b * kSums + k) * cols;
        F* out = sums[k];
#pragma omp simd
        for (int64_t c = c0; c < c1; c++) out[c] += p[c];
      }
    }
  });
}

}  // namespace ptrain::kernels::internal

#endif  // PTRAIN_KERNELS_CPU_PARALLEL_H_
