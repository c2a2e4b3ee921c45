// Elementwise CPU kernels: GELU (tanh approximation), SwiGLU, RoPE, the
// residual add and the bias add, forward and backward. Memory-bound streams;
// one pass each.
#include <cmath>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ptrain::kernels {

// GELU (tanh approximation; the formula is math.h's, the exp the vectorised
// one). out, inp are (N).
template <typename F>
void gelu_forward(F* out, const F* inp, int64_t N) {
  internal::ParallelFor(N, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) out[i] = internal::Gelu(inp[i]);
  });
}

// dinp, inp, dout are (N).
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, int64_t N) {
  internal::ParallelFor(N, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
      const F x = inp[i];
      const F e = internal::Exp(math::GeluExponent(x));
      dinp[i] = math::GeluGradFromExp(x, e) * dout[i];
    }
  });
}

namespace {

// A stored element as the compute type: fp32 or double as it is, bf16
// widened (exactly).
template <typename F>
F In(F x) {
  return x;
}
inline float In(uint16_t x) { return internal::FromBf16(x); }

// gate_up (rows,2H) = [gate | up] per row, of stored type S; out (rows,H).
template <typename F, typename S>
void SwigluForward(F* out, const S* gate_up, int64_t rows, int H) {
  internal::ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const S* g = gate_up + r * 2 * H;
      const S* u = g + H;
      F* o = out + r * H;
#pragma omp simd
      for (int i = 0; i < H; i++) {
        const F x = In(g[i]);
        o[i] = x * math::SigmoidFromExp(internal::Exp(-x)) * In(u[i]);
      }
    }
  });
}

template <typename F, typename S>
void SwigluBackward(F* dgate_up, const F* dout, const S* gate_up, int64_t rows,
                    int H) {
  internal::ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const S* g = gate_up + r * 2 * H;
      const S* u = g + H;
      const F* dy = dout + r * H;
      F* dg = dgate_up + r * 2 * H;
      F* du = dg + H;
#pragma omp simd
      for (int i = 0; i < H; i++) {
        const F x = In(g[i]), y = In(u[i]);
        const F s = math::SigmoidFromExp(internal::Exp(-x));
        dg[i] = dy[i] * y * math::SiluGrad(x, s);
        du[i] = dy[i] * x * s;
      }
    }
  });
}

}  // namespace

template <typename F>
void swiglu_forward(F* out, const F* gate_up, int64_t rows, int H) {
  SwigluForward(out, gate_up, rows, H);
}

template <typename F>
void swiglu_backward(F* dgate_up, const F* dout, const F* gate_up, int64_t rows,
                     int H) {
  SwigluBackward(dgate_up, dout, gate_up, rows, H);
}

void swiglu_forward_bf16_input(float* out, const uint16_t* gate_up,
                               int64_t rows, int H) {
  SwigluForward(out, gate_up, rows, H);
}

void swiglu_backward_bf16_input(float* dgate_up, const float* dout,
                                const uint16_t* gate_up, int64_t rows, int H) {
  SwigluBackward(dgate_up, dout, gate_up, rows, H);
}

template <typename F>
void rope_forward(F* x, int64_t stride, int B, int n, int heads, int hs,
                  int pos0, const math::Rope& rope, bool inverse) {
  const int half = hs / 2;
  // Each position's cosines and sines once, for every sequence and head.
  std::vector<float> cs(static_cast<size_t>(n) * 2 * half);
  std::vector<float> inv(half);
  for (int i = 0; i < half; i++) inv[i] = math::RopeInvFreq(i, hs, rope);
  for (int t = 0; t < n; t++) {
    for (int i = 0; i < half; i++) {
      float* at = cs.data() + (static_cast<size_t>(t) * half + i) * 2;
      math::RopeCosSin(pos0 + t, inv[i], at, at + 1);
    }
  }
  internal::ParallelFor(int64_t{B} * n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const float* row_cs = cs.data() + (r % n) * 2 * half;
      for (int h = 0; h < heads; h++) {
        F* head = x + r * stride + int64_t{h} * hs;
        for (int i = 0; i < half; i++) {
          float a = static_cast<float>(head[i]),
                b = static_cast<float>(head[i + half]);
          math::RopeRotate(&a, &b, row_cs[2 * i], row_cs[2 * i + 1], inverse);
          head[i] = static_cast<F>(a);
          head[i + half] = static_cast<F>(b);
        }
      }
    }
  });
}

namespace {

float AsStored(float v, float*) { return v; }
uint16_t AsStored(float v, uint16_t*) { return internal::RoundToBf16(v); }

// gelu_backward of a bf16-stored inp, the gradient written as O (fp32, or
// bf16 rounded).
template <typename O>
void GeluBackwardOfBf16(O* dinp, const uint16_t* inp, const float* dout,
                        int64_t N) {
  internal::ParallelFor(N, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
      const float x = internal::FromBf16(inp[i]);
      const float e = internal::Exp(math::GeluExponent(x));
      dinp[i] = AsStored(math::GeluGradFromExp(x, e) * dout[i], dinp);
    }
  });
}

}  // namespace

void gelu_backward_bf16_input(float* dinp, const uint16_t* inp,
                              const float* dout, int64_t N) {
  GeluBackwardOfBf16(dinp, inp, dout, N);
}

void gelu_backward_bf16(uint16_t* dinp, const uint16_t* inp, const float* dout,
                        int64_t N) {
  GeluBackwardOfBf16(dinp, inp, dout, N);
}

// out, inp1, inp2 are (N).
template <typename F>
void residual_forward(F* out, const F* inp1, const F* inp2, int64_t N) {
  internal::ParallelFor(N, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) out[i] = inp1[i] + inp2[i];
  });
}

// dinp1, dinp2, dout are (N).
template <typename F>
void residual_backward(F* dinp1, F* dinp2, const F* dout, int64_t N) {
  internal::ParallelFor(N, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
      dinp1[i] += dout[i];
      dinp2[i] += dout[i];
    }
  });
}

// out is (rows,OC), bias is (OC): out[r,:] += bias.
template <typename F>
void bias_forward(F* out, const F* bias, int64_t rows, int OC) {
  internal::ParallelFor(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      F* o = out + r * OC;
#pragma omp simd
      for (int i = 0; i < OC; i++) o[i] += bias[i];
    }
  });
}

template void bias_forward<float>(float*, const float*, int64_t, int);
template void bias_forward<double>(double*, const double*, int64_t, int);
template void rope_forward<float>(float*, int64_t, int, int, int, int, int,
                                  const math::Rope&, bool);
template void swiglu_forward<float>(float*, const float*, int64_t, int);
template void swiglu_forward<double>(double*, const double*, int64_t, int);
template void swiglu_backward<float>(float*, const float*, const float*,
                                     int64_t, int);
template void swiglu_backward<double>(double*, const double*, const double*,
                                      int64_t, int);
template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*,
                                    int64_t);
template void residual_forward<float>(float*, const float*, const float*,
                                      int64_t);
template void residual_forward<double>(double*, const double*, const double*,
                                       int64_t);
template void residual_backward<float>(float*, float*, const float*, int64_t);
template void residual_backward<double>(double*, double*, const double*,
                                        int64_t);

}  // namespace ptrain::kernels
