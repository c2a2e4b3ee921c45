// Vectorisable elementwise math shared by the CPU kernels (internal header).
// glibc's vector expf is only offered to GCC under -ffast-math, so float gets
// its own; double (the gradient-check precision) keeps libm.
#ifndef PTRAIN_KERNELS_CPU_VEC_MATH_H_
#define PTRAIN_KERNELS_CPU_VEC_MATH_H_

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/common/math.h"

namespace ptrain::kernels::internal {

// exp(x) for float, branch-free so `omp simd` loops vectorise it: Cody-Waite
// reduction x = n ln2 + r, |r| <= ln2/2, and Cephes' expf polynomial for
// exp(r). Within 2 ulp of libm on [-87, 88]; inputs outside are clamped
// (exp(-87) ~ 1.6e-38 stands in for 0, which no caller can tell apart from a
// true 0 after adding it to 1).
inline float ExpF(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // Round to nearest by the 1.5 * 2^23 shift: std::floor does not vectorise
  // unless -fno-trapping-math.
  constexpr float kShift = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kShift) - kShift;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const float scale =
      std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return er * scale;
}

template <typename F>
inline F Exp(F x) {
  return std::exp(x);
}
template <>
inline float Exp<float>(float x) {
  return ExpF(x);
}

// GELU (tanh approximation; math.h's formula, the exp above): every CPU
// kernel that applies it calls this, so that a fused one rounds the same.
template <typename F>
inline F Gelu(F x) {
  return math::GeluFromExp(x, Exp(math::GeluExponent(x)));
}

// max(x[0..n)), -inf for n = 0. GCC does not vectorise a max reduction on
// floats without -ffinite-math-only, and a scalar chain of vmaxss costs 4
// cycles an element; a 64-byte vector accumulator does 16 floats per max.
template <typename F>
inline F MaxOf(const F* x, int n) {
  typedef F Vec __attribute__((vector_size(64)));
  constexpr int kWidth = 64 / sizeof(F);
  constexpr F kNegInf = -std::numeric_limits<F>::infinity();
  Vec acc;
  for (int j = 0; j < kWidth; j++) acc[j] = kNegInf;
  int i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    Vec v;
    std::memcpy(&v, x + i, sizeof(Vec));
    acc = v > acc ? v : acc;
  }
  F m = kNegInf;
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  for (int j = 0; j < kWidth; j++) m = acc[j] > m ? acc[j] : m;
  return m;
}

// x[0..n) replaced by exp(scale * (x - max)), max that of x[0..n); returns
// their sum: a softmax's numerators and denominator, the shift keeping exp
// in range (scale > 0).
template <typename F>
inline F ExpShifted(F* x, int n, F scale = F(1)) {
  const F m = MaxOf(x, n);
  F sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; j++) {
    const F e = Exp(scale * (x[j] - m));
    x[j] = e;
    sum += e;
  }
  return sum;
}

}  // namespace ptrain::kernels::internal

#endif  // PTRAIN_KERNELS_CPU_VEC_MATH_H_
