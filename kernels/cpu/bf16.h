// What the CPU backend's bf16 kernels share (internal header): the rounding
// of fp32 to bf16 and back, per-thread scratch, oneDNN's CPU engine and a
// parallel rounding pass.
#ifndef PTRAIN_KERNELS_CPU_BF16_H_
#define PTRAIN_KERNELS_CPU_BF16_H_

#include <cstdint>
#include <cstring>
#include <dnnl.hpp>
#include <vector>

#include "kernels/common/math.h"

namespace ptrain::kernels::internal {

// x to the nearest bf16, ties to even (the formula the checkpoint's bf16
// export rounds by too).
using math::RoundToBf16;

// A bf16 value as the float it stands for (exact).
inline float FromBf16(uint16_t x) {
  const uint32_t u = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Buffer `which` (< 4) of the calling thread's scratch pool `Pool`, at
// least n elements of V: grown as needed and kept. Each caller names its
// own pool (a tag type), so that pools of different kernels never alias.
template <typename Pool, typename V>
V* ThreadScratch(int which, int64_t n) {
  thread_local std::vector<V> buffers[4];
  std::vector<V>& b = buffers[which];
  if (static_cast<int64_t>(b.size()) < n) b.resize(n);
  return b.data();
}

// The one oneDNN CPU engine of the process.
dnnl::engine& DnnlEngine();

// rows x cols of `src` (row stride ld) rounded into dense `dst` (rows,
// cols), over the OpenMP team when it is large.
void RoundRowsToBf16(uint16_t* dst, const float* src, int64_t rows,
                     int64_t cols, int64_t ld);

}  // namespace ptrain::kernels::internal

#endif  // PTRAIN_KERNELS_CPU_BF16_H_
