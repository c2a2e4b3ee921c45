// Per-element math shared by the CPU and CUDA kernels: one formula for both
// backends, so the CPU tests exercise what the GPU runs. Everything here is
// `PT_HD` (host and device under nvcc, plain inline otherwise) and takes
// the exponentials it needs as arguments where a backend has its own fast
// exp (the CPU's vectorised ExpF, the GPU's expf).
#ifndef PTRAIN_KERNELS_COMMON_MATH_H_
#define PTRAIN_KERNELS_COMMON_MATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PT_HD __host__ __device__ __forceinline__
#else
#define PT_HD inline
#endif

namespace ptrain::kernels::math {

// GELU, tanh approximation: GELU(x) = 0.5 x (1 + tanh(u)),
// u = sqrt(2/pi) (x + 0.044715 x^3), computed through
// 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)): one exp, and no 1 + tanh
// cancellation for negative x.
constexpr double kGeluScale = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCube = 0.044715;

// The exponent -2u of x; the caller takes e = exp(GeluExponent(x)).
template <typename F>
PT_HD F GeluExponent(F x) {
  return x * (F(-2 * kGeluScale) + F(-2 * kGeluScale * kGeluCube) * x * x);
}
template <typename F>
PT_HD F GeluFromExp(F x, F e) {
  return x / (F(1) + e);
}
// dGELU/dx with s = 1 / (1 + e): s + 2 x s (1 - s) du/dx, where
// 1 - s = 1 / (1 + 1/e) keeps its precision where s rounds to 1, and stays
// finite where e overflows to infinity (x below about -10 in float, where
// an exact exp — the GPU's expf — gives inf; e s^2 was inf * 0 = NaN there).
template <typename F>
PT_HD F GeluGradFromExp(F x, F e) {
  const F s = F(1) / (F(1) + e);
  const F one_minus_s = F(1) / (F(1) + F(1) / e);
  return s +
         x * (s * one_minus_s) *
             (F(2 * kGeluScale) + F(2 * kGeluScale * 3 * kGeluCube) * x * x);
}

// LayerNorm: eps is PyTorch's default.
constexpr double kLayerNormEps = 1e-5;
template <typename F>
PT_HD F LayerNormRstd(F variance) {
  return F(1) / std::sqrt(variance + F(kLayerNormEps));
}
// RMSNorm: eps is the model's (model.norm_eps).
template <typename F>
PT_HD F RmsNormRstd(F mean_square, F eps) {
  return F(1) / std::sqrt(mean_square + eps);
}
// The input gradient of one element of either norm (RMSNorm's: a zero
// dnorm_mean), given the row means of
// dnorm = weight * dout and of dnorm * norm.
template <typename F>
PT_HD F LayerNormInputGrad(F dnorm, F norm, F dnorm_mean, F dnorm_norm_mean,
                           F rstd) {
  return (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd;
}

// SwiGLU (Llama's MLP): silu(g)·u, silu(g) = g·sigmoid(g).
template <typename F>
PT_HD F Sigmoid(F x) {
  return F(1) / (F(1) + std::exp(-x));
}
// sigmoid(x) from e = exp(-x): a backend passes its own exp (the CPU's
// vectorised one).
template <typename F>
PT_HD F SigmoidFromExp(F e) {
  return F(1) / (F(1) + e);
}
// silu'(g) from s = sigmoid(g).
template <typename F>
PT_HD F SiluGrad(F g, F s) {
  return s * (F(1) + g * (F(1) - s));
}

// Cross-entropy of one position from its softmax sum (of exp(logit - max))
// and its target's logit minus the max: -log(exp(shifted) / sum), without
// rounding the target's probability first.
template <typename F>
PT_HD F CrossEntropyLoss(F sum, F target_shifted) {
  return std::log(sum) - target_shifted;
}

// AdamW (PyTorch's formulation, decoupled weight decay). The per-step
// constants are computed once on the host, in double where they lose digits
// in float (1 - beta2^t is tiny early on).
struct AdamWStep {
  double lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  double inv_bias_correction1, inv_bias_correction2, grad_scale;
};
inline AdamWStep MakeAdamWStep(float lr, float beta1, float beta2, float eps,
                               float weight_decay, int64_t t,
                               float grad_scale) {
  AdamWStep s;
  s.lr = lr;
  s.beta1 = beta1;
  s.beta2 = beta2;
  s.one_minus_beta1 = 1.0 - double(beta1);
  s.one_minus_beta2 = 1.0 - double(beta2);
  s.eps = eps;
  s.weight_decay = weight_decay;
  s.inv_bias_correction1 = 1.0 / (1.0 - std::pow(double(beta1), double(t)));
  s.inv_bias_correction2 = 1.0 / (1.0 - std::pow(double(beta2), double(t)));
  s.grad_scale = grad_scale;
  return s;
}
// One element: g = grad * grad_scale; m, v move; param steps. Each constant
// is rounded to F once, by the caller's loop hoisting or here.
template <typename F>
PT_HD void AdamWUpdate(F& param, F& m, F& v, F grad, const AdamWStep& s) {
  const F g = grad * F(s.grad_scale);
  const F mi = F(s.beta1) * m + F(s.one_minus_beta1) * g;
  const F vi = F(s.beta2) * v + F(s.one_minus_beta2) * g * g;
  m = mi;
  v = vi;
  const F mhat = mi * F(s.inv_bias_correction1);
  const F vhat = vi * F(s.inv_bias_correction2);
  param -= F(s.lr) *
           (F(s.weight_decay) * param + mhat / (std::sqrt(vhat) + F(s.eps)));
}

// Grouped-query attention's rows (kernels/ops.h attention_forward): NH
// query heads of hs channels (C = NH·hs), then KVH key heads, then KVH
// value heads; query head h reads key/value head h / (NH / KVH).
struct AttentionHeads {
  int NH, KVH, hs;
  PT_HD int64_t C() const { return int64_t{NH} * hs; }
  PT_HD int64_t K() const { return int64_t{KVH} * hs; }
  PT_HD int64_t row() const { return C() + 2 * K(); }
  PT_HD int group() const { return NH / KVH; }
  PT_HD int Kv(int h) const { return h / group(); }
  // Columns of query head h, and of key head g (its value head is K()
  // further), in a row.
  PT_HD int64_t q(int h) const { return int64_t{h} * hs; }
  PT_HD int64_t k(int g) const { return C() + int64_t{g} * hs; }
};
PT_HD AttentionHeads MakeAttentionHeads(int C, int NH, int KVH) {
  return {NH, KVH, C / NH};
}

// Context parallelism's zigzag: a sequence cut into 2·cp chunks, rank r
// holding chunks r and 2·cp−1−r (Tl positions: every rank the same causal
// work). The global position of its row t (Tl even).
PT_HD int ZigzagPosition(int t, int Tl, int cp, int rank) {
  const int chunk = Tl / 2;
  return t < chunk ? rank * chunk + t : (2 * cp - 1 - rank) * chunk + t - chunk;
}

// A Mixture-of-Experts router's score of each expert: softmax over a
// token's E logits, or the sigmoid of each logit on its own.
enum class RouterScore { kSoftmax, kSigmoid };

// Keeps a router's normalised weights finite where every chosen score has
// underflowed to 0 (sigmoids of very negative logits); far below any score
// that has not.
constexpr double kRouterNormEps = 1e-20;

// One token's experts ex (k): those of highest s[e] + bias[e] (bias null:
// s[e]), highest first, the lower index first among equals: an insertion
// into the sorted row, which moves an entry only past strictly lower keys.
template <typename F>
PT_HD void RouterTopK(int32_t* ex, const F* s, const F* bias, int E, int k) {
  int filled = 0;
  for (int e = 0; e < E; e++) {
    const F v = bias != nullptr ? s[e] + bias[e] : s[e];
    if (filled == k) {
      const int32_t last = ex[k - 1];
      if (!(v > (bias != nullptr ? s[last] + bias[last] : s[last]))) continue;
    }
    int i = filled < k ? filled++ : k - 1;
    for (; i > 0; i--) {
      const int32_t before = ex[i - 1];
      if (!(v > (bias != nullptr ? s[before] + bias[before] : s[before]))) {
        break;
      }
      ex[i] = before;
    }
    ex[i] = e;
  }
}

// The chosen scores' sum, the weights' denominator when normalised.
template <typename F>
PT_HD F RouterChosenSum(const F* s, const int32_t* ex, int k) {
  F sum = 0;
  for (int j = 0; j < k; j++) sum += s[ex[j]];
  return sum + F(kRouterNormEps);
}

// One token's router backward, experts held fixed: dx (E) += the gradient
// through its weights of dw (k). With S the chosen scores' sum and w_j =
// s_j / S (normalised): dL/ds_j = (dw_j − Σ_i dw_i w_i) / S, else dw_j,
// nonzero only at the k chosen experts; then through the scores: softmax
// dx_e = p_e (ds_e − Σ_f ds_f p_f), sigmoid dx_e = ds_e σ(1−σ).
template <typename F>
PT_HD void RouterBackwardRow(F* dx, const F* dw, const int32_t* ex, const F* s,
                             int E, int k, RouterScore kind, bool normalize) {
  F inv = 1, shift = 0;
  if (normalize) {
    inv = F(1) / RouterChosenSum(s, ex, k);
    for (int j = 0; j < k; j++) shift += dw[j] * s[ex[j]] * inv;
  }
  if (kind == RouterScore::kSoftmax) {
    F dot = 0;
    for (int j = 0; j < k; j++) dot += (dw[j] - shift) * inv * s[ex[j]];
    for (int e = 0; e < E; e++) dx[e] -= s[e] * dot;
    for (int j = 0; j < k; j++) dx[ex[j]] += s[ex[j]] * (dw[j] - shift) * inv;
  } else {
    for (int j = 0; j < k; j++) {
      const F sj = s[ex[j]];
      dx[ex[j]] += (dw[j] - shift) * inv * sj * (F(1) - sj);
    }
  }
}

// Rotary positions (RoPE): the frequencies of a head of hs channels,
// channel i < hs/2 paired with i + hs/2 ("rotate half") and turned by the
// angle p·inv_freq(i) at position p. inv_freq(i) = theta^(-2i/hs); with a
// Llama 3 scaling (factor > 0), frequencies whose wavelength exceeds
// original_context / low_freq_factor are divided by factor, those under
// original_context / high_freq_factor kept, and those between blended
// (smooth = (original_context / wavelength − low) / (high − low)).
struct Rope {
  float theta = 10000.0f;
  float factor = 0.0f;  // 0: no scaling
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_context = 8192;
};

// In fp32 steps, as the published reference computes them.
PT_HD float RopeInvFreq(int i, int hs, const Rope& r) {
  const float inv =
      1.0f / powf(r.theta, static_cast<float>(2 * i) / static_cast<float>(hs));
  if (r.factor <= 0.0f) return inv;
  const float pi = 3.14159265358979323846f;
  const float wavelen = 2.0f * pi / inv;
  const float ctx = static_cast<float>(r.original_context);
  const float low_wavelen = ctx / r.low_freq_factor;
  const float high_wavelen = ctx / r.high_freq_factor;
  if (wavelen < high_wavelen) return inv;
  if (wavelen > low_wavelen) return inv / r.factor;
  const float smooth = (ctx / wavelen - r.low_freq_factor) /
                       (r.high_freq_factor - r.low_freq_factor);
  return (1.0f - smooth) * inv / r.factor + smooth * inv;
}

// The cosine and sine of position p's angle for channel pair i: the angle
// an fp32 product, its cosine and sine in double rounded to fp32 (the same
// on both backends).
PT_HD void RopeCosSin(int p, float inv_freq, float* c, float* s) {
  const double angle = static_cast<double>(static_cast<float>(p) * inv_freq);
  *c = static_cast<float>(cos(angle));
  *s = static_cast<float>(sin(angle));
}

// One channel pair (x1 = channel i, x2 = i + hs/2) turned by the angle
// (c, s), or back (inverse: the gradient's rotation, by −angle).
PT_HD void RopeRotate(float* x1, float* x2, float c, float s, bool inverse) {
  const float a = *x1, b = *x2;
  if (inverse) {
    *x1 = a * c + b * s;
    *x2 = b * c - a * s;
  } else {
    *x1 = a * c - b * s;
    *x2 = b * c + a * s;
  }
}

// x rounded to the nearest bf16, ties to even, as its 16 bits; a NaN stays
// a (quiet) NaN, where rounding its bits could carry it into infinity.
PT_HD uint16_t RoundToBf16(float x) {
#if defined(__CUDA_ARCH__)
  uint32_t u = __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
#endif
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x40u);
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace ptrain::kernels::math

#endif  // PTRAIN_KERNELS_COMMON_MATH_H_
