// What the CPU backend's bf16 kernels share (internal header): the rounding
// of fp32 to bf16, oneDNN's CPU engine and a parallel rounding pass.
#ifndef PTRAIN_KERNELS_CPU_BF16_H_
#define PTRAIN_KERNELS_CPU_BF16_H_

#include <cstdint>
#include <cstring>
#include <dnnl.hpp>

namespace ptrain::kernels::internal {

// x to the nearest bf16, ties to even; a NaN stays a (quiet) NaN, where
// rounding its bits could carry it into infinity.
inline uint16_t RoundToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The one oneDNN CPU engine of the process.
dnnl::engine& DnnlEngine();

// rows x cols of `src` (row stride ld) rounded into dense `dst` (rows,
// cols), over the OpenMP team when it is large.
void RoundRowsToBf16(uint16_t* dst, const float* src, int64_t rows,
                     int64_t cols, int64_t ld);

}  // namespace ptrain::kernels::internal

#endif  // PTRAIN_KERNELS_CPU_BF16_H_
