// Tests of the CPU kernels: double-precision gradient checks against central
// finite differences, accumulation of every gradient, float against double,
// and the properties of attention, AdamW and the sum of squares.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/backends.h"
#include "kernels/common/math.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/kernels.h"
#include "kernels/ops.h"
#include "tests/testing/finite_difference.h"

namespace ptrain::kernels {
namespace {

// The CPU's bf16 kernels run on oneDNN's bf16 matmul, which needs AVX-512
// (the trainer takes bf16 on the cpu only with AVX512_BF16, CpuHasBf16):
// elsewhere their tests skip.
constexpr char kNoBf16[] =
    "no AVX512_BF16 on this CPU: oneDNN has no bf16 matmul here, and the "
    "trainer refuses bf16 on it";

using Vec = std::vector<double>;

// Odd, non-power-of-two sizes so that no stride or remainder bug hides.
constexpr int kB = 2;
constexpr int kT = 5;
constexpr int kC = 12;
constexpr int kNH = 3;
constexpr int kOC = 7;
constexpr int kV = 11;

// Central differences in double: truncation ~h^2 and rounding ~1e-16 |L| / h
// are both ~1e-10 for these losses, so 1e-6 leaves margin while any wrong or
// missing term (errors of 1e-3 and up) fails.
constexpr double kStep = 1e-6;
constexpr double kGradTol = 1e-6;
// Float against double, relative to the tensor's largest value: float
// rounding over sums of a few hundred terms stays near 1e-6.
constexpr double kFloatTol = 1e-5;

Vec Random(size_t n, std::mt19937_64* rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double& x : v) x = dist(*rng);
  return v;
}

std::vector<int32_t> RandomTokens(size_t n, int V, std::mt19937_64* rng) {
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(*rng);
  return v;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

std::vector<float> ToFloat(const Vec& v) { return {v.begin(), v.end()}; }

// tests/testing/finite_difference.h's, at this file's step and tolerance.
double MaxGradError(const std::string& name, Vec* x, const Vec& analytic,
                    const std::function<double()>& loss) {
  return testing::MaxGradError(name, x, analytic, loss, kStep, kGradTol);
}

// What backward() leaves in `buffers`, run once on zeros (`fresh`) and once
// on noise (`noise`, then `after`).
struct ZeroThenNoise {
  std::vector<Vec> fresh, noise, after;
};
ZeroThenNoise RunOnZerosThenNoise(const std::vector<Vec*>& buffers,
                                  const std::function<void()>& backward) {
  ZeroThenNoise r;
  for (Vec* g : buffers) std::fill(g->begin(), g->end(), 0.0);
  backward();
  std::mt19937_64 rng(7);
  for (Vec* g : buffers) {
    r.fresh.push_back(*g);
    r.noise.push_back(Random(g->size(), &rng));
    *g = r.noise.back();
  }
  backward();
  for (Vec* g : buffers) r.after.push_back(*g);
  return r;
}

// The second run's result must be the noise plus the first.
void ExpectAccumulates(const std::vector<Vec*>& grads,
                       const std::function<void()>& backward) {
  const ZeroThenNoise r = RunOnZerosThenNoise(grads, backward);
  for (size_t k = 0; k < grads.size(); k++) {
    double maxdiff = 0;
    for (size_t i = 0; i < r.fresh[k].size(); i++) {
      maxdiff = std::max(
          maxdiff, std::abs(r.after[k][i] - r.noise[k][i] - r.fresh[k][i]));
    }
    EXPECT_LE(maxdiff, 1e-12) << "gradient buffer " << k << " not accumulated";
  }
}

// The second run's result must be the first (the noise overwritten).
void ExpectOverwrites(const std::vector<Vec*>& outputs,
                      const std::function<void()>& backward) {
  const ZeroThenNoise r = RunOnZerosThenNoise(outputs, backward);
  for (size_t k = 0; k < outputs.size(); k++) {
    EXPECT_EQ(r.after[k], r.fresh[k]) << "buffer " << k << " not overwritten";
  }
}

// Prints and checks max |f - d| / max |d|: relative to the tensor's scale, not
// each element's, because float sums with cancellation (a GEMM's dot
// products, K = 384) carry errors relative to their partial sums.
void ExpectFloatMatchesDouble(const std::string& name,
                              const std::vector<float>& f, const Vec& d,
                              double tol = kFloatTol) {
  ASSERT_EQ(f.size(), d.size());
  double maxdiff = 0;
  double scale = 1e-300;
  for (size_t i = 0; i < d.size(); i++) {
    maxdiff = std::max(maxdiff, std::abs(double(f[i]) - d[i]));
    scale = std::max(scale, std::abs(d[i]));
  }
  std::printf("%-28s float vs double maxdiff %.3e  rel %.3e  (tol %.0e)\n",
              name.c_str(), maxdiff, maxdiff / scale, tol);
  EXPECT_LE(maxdiff / scale, tol) << name;
}

// ---------------------------------------------------------------- encoder

struct EncoderProblem {
  EncoderProblem() : rng(1) {
    tokens = RandomTokens(kB * kT, kV, &rng);
    tokens[3] = tokens[0];  // repeated tokens share a row of dwte
    tokens[8] = tokens[0];
    wte = Random(kV * kC, &rng);
    wpe = Random(kT * kC, &rng);
    dout = Random(kB * kT * kC, &rng);
    out.resize(dout.size());
    dwte.resize(wte.size());
    dwpe.resize(wpe.size());
  }
  double Loss() {
    encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT,
                    kC);
    return Dot(out, dout);
  }
  void Backward() {
    encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), kB,
                     kT, kC);
  }
  std::mt19937_64 rng;
  std::vector<int32_t> tokens;
  Vec wte, wpe, dout, out, dwte, dwpe;
};

TEST(EncoderTest, BackwardMatchesFiniteDifferences) {
  EncoderProblem p;
  p.Backward();
  auto loss = [&] { return p.Loss(); };
  EXPECT_LE(MaxGradError("encoder dwte", &p.wte, p.dwte, loss), kGradTol);
  EXPECT_LE(MaxGradError("encoder dwpe", &p.wpe, p.dwpe, loss), kGradTol);
}

TEST(EncoderTest, BackwardAccumulates) {
  EncoderProblem p;
  ExpectAccumulates({&p.dwte, &p.dwpe}, [&] { p.Backward(); });
}

TEST(EncoderTest, FloatForwardMatchesDouble) {
  EncoderProblem p;
  p.Loss();
  std::vector<float> out(p.out.size());
  encoder_forward(out.data(), p.tokens.data(), ToFloat(p.wte).data(),
                  ToFloat(p.wpe).data(), kB, kT, kC);
  ExpectFloatMatchesDouble("encoder out", out, p.out);
}

// A vocabulary split over ranks: each part's rows, then the sum over parts,
// is the whole encoder; positions from an offset are the rows of wpe there.
TEST(EncoderTest, VocabularyPartsSumToTheWholeEmbedding) {
  EncoderProblem p;
  p.Loss();
  const int parts[][2] = {{0, 4}, {4, 4}, {8, 4}};  // the last one pads past V
  Vec sum(p.out.size(), 0.0), part(p.out.size());
  Vec dwte(p.wte.size(), 0.0);
  for (const auto& [begin, rows] : parts) {
    Vec wte(static_cast<size_t>(rows) * kC, 0.0);
    for (int r = 0; r < rows && begin + r < kV; r++) {
      std::copy_n(p.wte.begin() + (begin + r) * kC, kC, wte.begin() + r * kC);
    }
    embedding_forward(part.data(), p.tokens.data(), wte.data(), kB, kT, kC,
                      begin, rows);
    for (size_t i = 0; i < sum.size(); i++) sum[i] += part[i];
    Vec dpart(wte.size(), 0.0);
    embedding_backward(dpart.data(), p.dout.data(), p.tokens.data(), kB, kT, kC,
                       begin, rows);
    for (int r = 0; r < rows && begin + r < kV; r++) {
      std::copy_n(dpart.begin() + r * kC, kC, dwte.begin() + (begin + r) * kC);
    }
  }
  position_forward(sum.data(), p.wpe.data(), kB, kT, kC, 0);
  EXPECT_EQ(sum, p.out);
  p.Backward();
  EXPECT_EQ(dwte, p.dwte);
}

TEST(EncoderTest, PositionsStartAtTheirOffset) {
  EncoderProblem p;
  const int t0 = 2, T = kT - t0;
  Vec out(static_cast<size_t>(kB) * T * kC, 0.0), dwpe(p.wpe.size(), 0.0);
  position_forward(out.data(), p.wpe.data(), kB, T, kC, t0);
  for (int b = 0; b < kB; b++) {
    for (int t = 0; t < T; t++) {
      for (int c = 0; c < kC; c++) {
        ASSERT_EQ(out[(b * T + t) * kC + c], p.wpe[(t0 + t) * kC + c]);
      }
    }
  }
  position_backward(dwpe.data(), p.dout.data(), kB, T, kC, t0);
  for (int c = 0; c < kC; c++) EXPECT_EQ(dwpe[c], 0.0);  // position 0 unused
  EXPECT_NE(dwpe[t0 * kC], 0.0);
}

// -------------------------------------------------------------- layernorm

struct LayernormProblem {
  LayernormProblem() : rng(2) {
    inp = Random(kB * kT * kC, &rng, -0.5, 1.5);  // nonzero mean per row
    weight = Random(kC, &rng);
    bias = Random(kC, &rng);
    dout = Random(inp.size(), &rng);
    out.resize(inp.size());
    mean.resize(kB * kT);
    rstd.resize(kB * kT);
    dinp.resize(inp.size());
    dweight.resize(kC);
    dbias.resize(kC);
  }
  double Loss() {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(),
                      weight.data(), bias.data(), kB, kT, kC);
    return Dot(out, dout);
  }
  void Backward() {
    Loss();  // mean and rstd at the unperturbed point
    layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(),
                       inp.data(), weight.data(), mean.data(), rstd.data(), kB,
                       kT, kC);
  }
  std::mt19937_64 rng;
  Vec inp, weight, bias, dout, out, mean, rstd, dinp, dweight, dbias;
};

TEST(LayernormTest, BackwardMatchesFiniteDifferences) {
  LayernormProblem p;
  p.Backward();
  auto loss = [&] { return p.Loss(); };
  EXPECT_LE(MaxGradError("layernorm dinp", &p.inp, p.dinp, loss), kGradTol);
  EXPECT_LE(MaxGradError("layernorm dweight", &p.weight, p.dweight, loss),
            kGradTol);
  EXPECT_LE(MaxGradError("layernorm dbias", &p.bias, p.dbias, loss), kGradTol);
}

TEST(LayernormTest, BackwardAccumulates) {
  LayernormProblem p;
  ExpectAccumulates({&p.dinp, &p.dweight, &p.dbias}, [&] { p.Backward(); });
}

TEST(LayernormTest, ForwardNormalisesRows) {
  LayernormProblem p;
  std::fill(p.weight.begin(), p.weight.end(), 1.0);
  std::fill(p.bias.begin(), p.bias.end(), 0.0);
  p.Loss();
  for (int r = 0; r < kB * kT; r++) {
    double sum = 0;
    double sum_sq = 0;
    for (int i = 0; i < kC; i++) {
      sum += p.out[r * kC + i];
      sum_sq += p.out[r * kC + i] * p.out[r * kC + i];
    }
    EXPECT_NEAR(sum / kC, 0.0, 1e-12);
    // Variance 1 up to the eps = 1e-5 in the denominator.
    const double var_in = 1.0 / (p.rstd[r] * p.rstd[r]) - 1e-5;
    EXPECT_NEAR(sum_sq / kC, var_in / (var_in + 1e-5), 1e-12);
  }
}

// The residual add and the LayerNorm after it in one pass: bit for bit the
// two kernels one after the other, in both precisions and through the CPU
// backend's op.
template <typename F>
void ExpectResidualLayernormIsAddThenLayernorm() {
  constexpr int B = 3, T = 7, C = 96;
  std::mt19937_64 rng(9);
  auto random = [&](size_t n) {
    const Vec v = Random(n, &rng);
    return std::vector<F>(v.begin(), v.end());
  };
  const std::vector<F> a = random(B * T * C), b = random(B * T * C),
                       w = random(C), bias = random(C);
  std::vector<F> want_res(B * T * C), want_out(B * T * C), want_mean(B * T),
      want_rstd(B * T);
  residual_forward(want_res.data(), a.data(), b.data(), int64_t{B} * T * C);
  layernorm_forward(want_out.data(), want_mean.data(), want_rstd.data(),
                    want_res.data(), w.data(), bias.data(), B, T, C);
  std::vector<F> res(B * T * C, F(7)), out(B * T * C, F(7)), mean(B * T),
      rstd(B * T);
  residual_layernorm_forward(res.data(), out.data(), mean.data(), rstd.data(),
                             a.data(), b.data(), w.data(), bias.data(), B, T,
                             C);
  EXPECT_EQ(res, want_res);
  EXPECT_EQ(out, want_out);
  EXPECT_EQ(mean, want_mean);
  EXPECT_EQ(rstd, want_rstd);
  if constexpr (std::is_same_v<F, float>) {
    std::fill(res.begin(), res.end(), 7.0f);
    std::fill(out.begin(), out.end(), 7.0f);
    CpuOps().residual_layernorm_forward(res.data(), out.data(), mean.data(),
                                        rstd.data(), a.data(), b.data(),
                                        w.data(), bias.data(), B, T, C);
    EXPECT_EQ(res, want_res);
    EXPECT_EQ(out, want_out);
  }
}

TEST(LayernormTest, ResidualLayernormIsTheAddThenTheLayernorm) {
  ExpectResidualLayernormIsAddThenLayernorm<double>();
  ExpectResidualLayernormIsAddThenLayernorm<float>();
}

// -------------------------------------------------------------- rmsnorm

constexpr double kRmsEps = 1e-6;  // Llama 2's; not LayerNorm's 1e-5

struct RmsnormProblem {
  RmsnormProblem() : rng(4) {
    inp = Random(kB * kT * kC, &rng, -0.5, 1.5);
    weight = Random(kC, &rng);
    dout = Random(inp.size(), &rng);
    out.resize(inp.size());
    rstd.resize(kB * kT);
    dinp.resize(inp.size());
    dweight.resize(kC);
  }
  double Loss() {
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), kRmsEps,
                    kB, kT, kC);
    return Dot(out, dout);
  }
  void Backward() {
    Loss();  // rstd at the unperturbed point
    rmsnorm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(),
                     weight.data(), rstd.data(), kB, kT, kC);
  }
  std::mt19937_64 rng;
  Vec inp, weight, dout, out, rstd, dinp, dweight;
};

TEST(RmsnormTest, ForwardIsTheFormula) {
  RmsnormProblem p;
  p.Loss();
  for (int r = 0; r < kB * kT; r++) {
    double sum_sq = 0;
    for (int i = 0; i < kC; i++)
      sum_sq += p.inp[r * kC + i] * p.inp[r * kC + i];
    const double s = 1.0 / std::sqrt(sum_sq / kC + kRmsEps);
    EXPECT_NEAR(p.rstd[r], s, 1e-12 * s);
    for (int i = 0; i < kC; i++) {
      EXPECT_NEAR(p.out[r * kC + i], p.inp[r * kC + i] * s * p.weight[i],
                  1e-12);
    }
  }
}

TEST(RmsnormTest, BackwardMatchesFiniteDifferences) {
  RmsnormProblem p;
  p.Backward();
  auto loss = [&] { return p.Loss(); };
  EXPECT_LE(MaxGradError("rmsnorm dinp", &p.inp, p.dinp, loss), kGradTol);
  EXPECT_LE(MaxGradError("rmsnorm dweight", &p.weight, p.dweight, loss),
            kGradTol);
}

TEST(RmsnormTest, BackwardAccumulates) {
  RmsnormProblem p;
  ExpectAccumulates({&p.dinp, &p.dweight}, [&] { p.Backward(); });
}

// The residual add fused into RMSNorm is bit for bit the add then the norm,
// in both precisions; through the CPU backend in fp32 and with a bf16
// output, which is the fp32 output rounded.
template <typename F>
void ExpectResidualRmsnormIsAddThenRmsnorm() {
  constexpr int B = 3, T = 7, C = 96;
  std::mt19937_64 rng(10);
  auto random = [&](size_t n) {
    const Vec v = Random(n, &rng);
    return std::vector<F>(v.begin(), v.end());
  };
  const std::vector<F> a = random(B * T * C), b = random(B * T * C),
                       w = random(C);
  const F eps = F(kRmsEps);
  std::vector<F> want_res(B * T * C), want_out(B * T * C), want_rstd(B * T);
  residual_forward(want_res.data(), a.data(), b.data(), int64_t{B} * T * C);
  rmsnorm_forward(want_out.data(), want_rstd.data(), want_res.data(), w.data(),
                  eps, B, T, C);
  std::vector<F> res(B * T * C, F(7)), out(B * T * C, F(7)), rstd(B * T);
  residual_rmsnorm_forward(res.data(), out.data(), rstd.data(), a.data(),
                           b.data(), w.data(), eps, B, T, C);
  EXPECT_EQ(res, want_res);
  EXPECT_EQ(out, want_out);
  EXPECT_EQ(rstd, want_rstd);
  if constexpr (std::is_same_v<F, float>) {
    std::fill(res.begin(), res.end(), 7.0f);
    std::fill(out.begin(), out.end(), 7.0f);
    CpuOps().residual_rmsnorm_forward(res.data(), out.data(), rstd.data(),
                                      a.data(), b.data(), w.data(), eps, B, T,
                                      C);
    EXPECT_EQ(res, want_res);
    EXPECT_EQ(out, want_out);
    std::vector<uint16_t> out16(B * T * C), fused16(B * T * C);
    rmsnorm_forward_bf16(out16.data(), rstd.data(), want_res.data(), w.data(),
                         eps, B, T, C);
    residual_rmsnorm_forward_bf16(res.data(), fused16.data(), rstd.data(),
                                  a.data(), b.data(), w.data(), eps, B, T, C);
    EXPECT_EQ(fused16, out16);
    std::vector<float> unpacked(B * T * C);
    FromBf16Values(unpacked.data(), out16.data(), B * T * C);
    for (int i = 0; i < B * T * C; i++) {
      ASSERT_EQ(unpacked[i], Bf16Round(want_out[i])) << i;
    }
  }
}

TEST(RmsnormTest, ResidualRmsnormIsTheAddThenTheRmsnorm) {
  ExpectResidualRmsnormIsAddThenRmsnorm<double>();
  ExpectResidualRmsnormIsAddThenRmsnorm<float>();
}

// -------------------------------------------------------------- swiglu

// out = silu(gate)·up over rows of [gate | up]: the formula, its gradient by
// finite differences (the backward writes, not adds), and fp32 against
// double.
TEST(SwigluTest, FormulaGradientAndPrecision) {
  constexpr int rows = kB * kT, H = kOC;
  std::mt19937_64 rng(12);
  Vec gate_up = Random(rows * 2 * H, &rng, -4, 4),
      dout = Random(rows * H, &rng);
  Vec out(rows * H), dgate_up(gate_up.size(), 123.0);
  auto loss = [&] {
    swiglu_forward(out.data(), gate_up.data(), rows, H);
    return Dot(out, dout);
  };
  loss();
  for (int r = 0; r < rows; r++) {
    for (int i = 0; i < H; i++) {
      const double g = gate_up[r * 2 * H + i], u = gate_up[r * 2 * H + H + i];
      EXPECT_NEAR(out[r * H + i], g / (1 + std::exp(-g)) * u, 1e-14);
    }
  }
  swiglu_backward(dgate_up.data(), dout.data(), gate_up.data(), rows, H);
  EXPECT_LE(MaxGradError("swiglu dgate_up", &gate_up, dgate_up, loss),
            kGradTol);
  const std::vector<float> gate_up32 = ToFloat(gate_up);
  std::vector<float> out32(out.size()), d32(gate_up.size());
  CpuOps().swiglu_forward(out32.data(), gate_up32.data(), rows, H);
  CpuOps().swiglu_backward(d32.data(), ToFloat(dout).data(), gate_up32.data(),
                           rows, H);
  ExpectFloatMatchesDouble("swiglu out", out32, out);
  ExpectFloatMatchesDouble("swiglu dgate_up", d32, dgate_up);
}

// ---------------------------------------------------------------- rope

// The angles of RoPE against the formula written here in double: channel i
// of a head pairs with i + hs/2 and turns by p·theta^(-2i/hs); the rows
// of every sequence start at pos0; channels past `heads` heads stay.
TEST(RopeTest, TurnsEachPairByItsPositionsAngle) {
  constexpr int B = 2, n = 5, heads = 3, hs = 8, pos0 = 7, stride = 30;
  std::mt19937_64 rng(21);
  const std::vector<float> x = ToFloat(Random(B * n * stride, &rng));
  std::vector<float> y = x;
  math::Rope rope;
  rope.theta = 500000.0f;
  CpuOps().rope_forward(y.data(), stride, B, n, heads, hs, pos0, rope, false);
  for (int r = 0; r < B * n; r++) {
    const int p = pos0 + r % n;
    for (int c = 0; c < stride; c++) {
      const int at = r * stride + c;
      if (c >= heads * hs) {
        EXPECT_EQ(y[at], x[at]) << "row " << r << " channel " << c;
        continue;
      }
      const int i = c % hs, half = hs / 2, pair = i % half;
      const double angle = p * std::pow(500000.0, -2.0 * pair / hs);
      const double a = x[at - i + pair], b = x[at - i + pair + half];
      const double want = i < half ? a * std::cos(angle) - b * std::sin(angle)
                                   : b * std::cos(angle) + a * std::sin(angle);
      EXPECT_NEAR(y[at], want, 2e-6) << "row " << r << " channel " << c;
    }
  }
  // The inverse turns back.
  CpuOps().rope_forward(y.data(), stride, B, n, heads, hs, pos0, rope, true);
  for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(y[i], x[i], 1e-6) << i;
}

// What RoPE is for: the product of a query at position p and a key at q
// depends on p − q only. And the backward is the forward's transpose: for
// any x and g, <rope(x), g> = <x, rope⁻¹(g)>.
TEST(RopeTest, ProductsDependOnTheDistanceAndTheBackwardIsTheTranspose) {
  constexpr int hs = 16;
  std::mt19937_64 rng(22);
  const std::vector<float> q = ToFloat(Random(hs, &rng)),
                           k = ToFloat(Random(hs, &rng));
  math::Rope rope;
  auto dot_at = [&](int pq, int pk) {
    std::vector<float> a = q, b = k;
    CpuOps().rope_forward(a.data(), hs, 1, 1, 1, hs, pq, rope, false);
    CpuOps().rope_forward(b.data(), hs, 1, 1, 1, hs, pk, rope, false);
    double d = 0;
    for (int i = 0; i < hs; i++) d += double{a[i]} * b[i];
    return d;
  };
  EXPECT_NEAR(dot_at(3, 1), dot_at(12, 10), 1e-5);
  EXPECT_NEAR(dot_at(40, 0), dot_at(140, 100), 1e-5);
  EXPECT_GT(std::abs(dot_at(3, 1) - dot_at(3, 2)), 1e-3);
  const std::vector<float> g = ToFloat(Random(hs, &rng));
  std::vector<float> rx = q, rg = g;
  CpuOps().rope_forward(rx.data(), hs, 1, 1, 1, hs, 9, rope, false);
  CpuOps().rope_forward(rg.data(), hs, 1, 1, 1, hs, 9, rope, true);
  double lhs = 0, rhs = 0;
  for (int i = 0; i < hs; i++) {
    lhs += double{rx[i]} * g[i];
    rhs += double{q[i]} * rg[i];
  }
  EXPECT_NEAR(lhs, rhs, 1e-6);
}

// Llama 3's scaling of the frequencies, against its rule written here:
// wavelengths under original/high kept, over original/low divided by the
// factor, those between blended.
TEST(RopeTest, Llama3ScalingKeepsHighDividesLowAndBlendsBetween) {
  math::Rope r;
  r.theta = 500000.0f;
  r.factor = 32.0f;
  r.low_freq_factor = 1.0f;
  r.high_freq_factor = 4.0f;
  r.original_context = 8192;
  constexpr int hs = 64;
  int kept = 0, divided = 0, blended = 0;
  for (int i = 0; i < hs / 2; i++) {
    const double inv = std::pow(500000.0, -2.0 * i / hs);
    const double wavelen = 2 * M_PI / inv;
    double want = inv;
    if (wavelen > 8192.0) {
      want = inv / 32;
      ++divided;
    } else if (wavelen >= 8192.0 / 4) {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * inv / 32 + smooth * inv;
      ++blended;
    } else {
      ++kept;
    }
    EXPECT_NEAR(math::RopeInvFreq(i, hs, r), want, 1e-6 * want) << i;
    math::Rope plain = r;
    plain.factor = 0;
    EXPECT_NEAR(math::RopeInvFreq(i, hs, plain), inv, 1e-6 * inv) << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

// gate_up stored in bf16 (the rows the bf16 backends keep): both passes are
// the fp32 ops on its values widened, bit for bit.
TEST(SwigluTest, Bf16StoredInputIsItsValuesWidened) {
  constexpr int rows = 7, H = 37;
  std::mt19937_64 rng(13);
  const std::vector<float> gu = ToFloat(Random(rows * 2 * H, &rng, -6, 6)),
                           dout = ToFloat(Random(rows * H, &rng));
  std::vector<uint16_t> gu16(gu.size());
  std::vector<float> widened(gu.size());
  for (size_t i = 0; i < gu.size(); i++) {
    gu16[i] = internal::RoundToBf16(gu[i]);
    widened[i] = internal::FromBf16(gu16[i]);
  }
  std::vector<float> out(rows * H), want(rows * H), d(gu.size()),
      dwant(gu.size());
  swiglu_forward_bf16_input(out.data(), gu16.data(), rows, H);
  CpuOps().swiglu_forward(want.data(), widened.data(), rows, H);
  EXPECT_EQ(out, want);
  swiglu_backward_bf16_input(d.data(), dout.data(), gu16.data(), rows, H);
  CpuOps().swiglu_backward(dwant.data(), dout.data(), widened.data(), rows, H);
  EXPECT_EQ(d, dwant);
  // Not the unrounded input's.
  CpuOps().swiglu_forward(want.data(), gu.data(), rows, H);
  EXPECT_NE(out, want);
}

// Sums over rows (LayerNorm's dweight and dbias, a linear layer's dbias in
// fp32 and bf16) go through fixed blocks of rows, so their bits do not
// depend on how many threads ran them. 150 rows: two whole blocks and part
// of a third; entries spanning four decades, so that another order of
// addition shows in the last bits.
TEST(ColumnSumsTest, GradientSumsAreTheSameWhateverTheThreadCount) {
  constexpr int B = 3, T = 50, C = 96, OC = 200;
  std::mt19937_64 rng(5);
  auto spread = [&](size_t n) {
    Vec v = Random(n, &rng);
    for (size_t i = 0; i < n; i += 7) v[i] *= 1e4;
    return ToFloat(v);
  };
  const std::vector<float> inp = spread(B * T * C), dout_ln = spread(B * T * C),
                           dout = spread(B * T * OC), weight_ln = spread(C),
                           weight = spread(OC * C);
  std::vector<float> mean(B * T), rstd(B * T), ln_out(B * T * C);
  const std::vector<float> bias_ln(C, 0.5f);
  layernorm_forward(ln_out.data(), mean.data(), rstd.data(), inp.data(),
                    weight_ln.data(), bias_ln.data(), B, T, C);
  struct Sums {
    std::vector<float> ln_dinp, ln_dw, ln_db, db, db_bf16;
  };
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Sums s{std::vector<float>(B * T * C, 0.25f), std::vector<float>(C, 1.0f),
           std::vector<float>(C, -1.0f), std::vector<float>(OC, 2.0f),
           std::vector<float>(OC, 2.0f)};
    layernorm_backward(s.ln_dinp.data(), s.ln_dw.data(), s.ln_db.data(),
                       dout_ln.data(), inp.data(), weight_ln.data(),
                       mean.data(), rstd.data(), B, T, C);
    std::vector<float> dinp(B * T * C), dw(OC * C, 0.0f);
    matmul_backward(dinp.data(), dw.data(), s.db.data(), dout.data(),
                    inp.data(), weight.data(), B, T, C, OC);
    std::fill(dw.begin(), dw.end(), 0.0f);
    if (CpuHasBf16()) {  // the bf16 kernels' CPUs (kNoBf16)
      matmul_backward_bf16(dinp.data(), dw.data(), s.db_bf16.data(),
                           dout.data(), inp.data(), weight.data(), B * T, C,
                           OC);
    }
    return s;
  };
  const int saved = omp_get_max_threads();
  const Sums one = run(1);
  for (int threads : {2, 3}) {
    const Sums many = run(threads);
    EXPECT_EQ(many.ln_dinp, one.ln_dinp) << threads << " threads";
    EXPECT_EQ(many.ln_dw, one.ln_dw) << threads << " threads";
    EXPECT_EQ(many.ln_db, one.ln_db) << threads << " threads";
    EXPECT_EQ(many.db, one.db) << threads << " threads";
    EXPECT_EQ(many.db_bf16, one.db_bf16) << threads << " threads";
  }
  // Over 256 blocks of 64 rows the blocks grow instead (a bound on the
  // scratch); still the same whatever the thread count.
  constexpr int kLongT = 64 * 256 * 2 + 77;
  const std::vector<float> long_dout = spread(kLongT * 16);
  const std::vector<float> long_inp = spread(kLongT * 4), long_w = spread(64);
  auto long_sums = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> dinp(kLongT * 4), dw(64, 0.0f), db(16, 0.0f);
    matmul_backward(dinp.data(), dw.data(), db.data(), long_dout.data(),
                    long_inp.data(), long_w.data(), 1, kLongT, 4, 16);
    return db;
  };
  const std::vector<float> long_one = long_sums(1);
  EXPECT_EQ(long_sums(3), long_one);
  omp_set_num_threads(saved);
}

TEST(LayernormTest, FloatForwardMatchesDouble) {
  LayernormProblem p;
  p.Loss();
  std::vector<float> out(p.out.size()), mean(p.mean.size()),
      rstd(p.rstd.size());
  layernorm_forward(out.data(), mean.data(), rstd.data(), ToFloat(p.inp).data(),
                    ToFloat(p.weight).data(), ToFloat(p.bias).data(), kB, kT,
                    kC);
  ExpectFloatMatchesDouble("layernorm out", out, p.out);
  ExpectFloatMatchesDouble("layernorm mean", mean, p.mean);
  ExpectFloatMatchesDouble("layernorm rstd", rstd, p.rstd);
}

// ----------------------------------------------------------------- matmul

struct MatmulProblem {
  MatmulProblem(bool with_bias, int B = kB, int T = kT, int C = kC,
                int OC = kOC)
      : rng(3), B(B), T(T), C(C), OC(OC), with_bias(with_bias) {
    inp = Random(B * T * C, &rng);
    weight = Random(OC * C, &rng);
    bias = Random(OC, &rng);
    dout = Random(B * T * OC, &rng);
    out.resize(dout.size());
    dinp.resize(inp.size());
    dweight.resize(weight.size());
    dbias.resize(bias.size());
  }
  double Loss() {
    matmul_forward(out.data(), inp.data(), weight.data(),
                   with_bias ? bias.data() : nullptr, B, T, C, OC);
    return Dot(out, dout);
  }
  void Backward() {
    matmul_backward(dinp.data(), dweight.data(),
                    with_bias ? dbias.data() : nullptr, dout.data(), inp.data(),
                    weight.data(), B, T, C, OC);
  }
  std::mt19937_64 rng;
  int B, T, C, OC;
  bool with_bias;
  Vec inp, weight, bias, dout, out, dinp, dweight, dbias;
};

TEST(MatmulTest, BackwardWithBiasMatchesFiniteDifferences) {
  MatmulProblem p(/*with_bias=*/true);
  p.Backward();
  auto loss = [&] { return p.Loss(); };
  EXPECT_LE(MaxGradError("matmul dinp", &p.inp, p.dinp, loss), kGradTol);
  EXPECT_LE(MaxGradError("matmul dweight", &p.weight, p.dweight, loss),
            kGradTol);
  EXPECT_LE(MaxGradError("matmul dbias", &p.bias, p.dbias, loss), kGradTol);
}

TEST(MatmulTest, BackwardWithoutBiasMatchesFiniteDifferences) {
  MatmulProblem p(/*with_bias=*/false);
  p.Backward();
  auto loss = [&] { return p.Loss(); };
  EXPECT_LE(MaxGradError("matmul(nobias) dinp", &p.inp, p.dinp, loss),
            kGradTol);
  EXPECT_LE(MaxGradError("matmul(nobias) dweight", &p.weight, p.dweight, loss),
            kGradTol);
}

TEST(MatmulTest, BackwardWritesDinpAndAccumulatesWeightGradients) {
  MatmulProblem p(/*with_bias=*/true);
  ExpectOverwrites({&p.dinp}, [&] { p.Backward(); });
  ExpectAccumulates({&p.dweight, &p.dbias}, [&] { p.Backward(); });
}

// The same contract on the float paths, fp32 and bf16 (oneDNN's GEMMs with
// beta 0 for dinp).
TEST(MatmulTest, FloatBackwardWritesDinp) {
  for (bool bf16 : {false, true}) {
    if (bf16 && !CpuHasBf16()) continue;  // kNoBf16
    MatmulProblem p(/*with_bias=*/true, 2, 37, 64, 96);
    const std::vector<float> inp = ToFloat(p.inp), w = ToFloat(p.weight),
                             dout = ToFloat(p.dout);
    auto backward = [&](std::vector<float>* dinp) {
      std::vector<float> dw(w.size()), db(p.OC);
      matmul_backward(dinp->data(), dw.data(), db.data(), dout.data(),
                      inp.data(), w.data(), p.B, p.T, p.C, p.OC, bf16);
    };
    std::vector<float> fresh(inp.size(), 0.0f), noisy = ToFloat(p.inp);
    backward(&fresh);
    backward(&noisy);
    EXPECT_EQ(noisy, fresh) << (bf16 ? "bf16" : "fp32");
  }
}

TEST(MatmulTest, BackwardWithNullDinpStillAccumulatesDweight) {
  MatmulProblem p(/*with_bias=*/true);
  p.Backward();
  const Vec dweight = p.dweight;
  const Vec dbias = p.dbias;
  std::fill(p.dweight.begin(), p.dweight.end(), 0.0);
  std::fill(p.dbias.begin(), p.dbias.end(), 0.0);
  matmul_backward<double>(nullptr, p.dweight.data(), p.dbias.data(),
                          p.dout.data(), p.inp.data(), p.weight.data(), kB, kT,
                          kC, kOC);
  EXPECT_EQ(p.dweight, dweight);
  EXPECT_EQ(p.dbias, dbias);
}

TEST(MatmulTest, FloatForwardAndBackwardMatchDouble) {
  // Large enough for sgemm's blocked paths (C = 384 as in the model).
  for (bool with_bias : {true, false}) {
    MatmulProblem p(with_bias, 2, 37, 384, 129);
    p.Loss();
    p.Backward();
    std::vector<float> out(p.out.size()), dinp(p.dinp.size()),
        dweight(p.dweight.size()), dbias(p.dbias.size());
    const std::vector<float> inp = ToFloat(p.inp), weight = ToFloat(p.weight),
                             bias = ToFloat(p.bias), dout = ToFloat(p.dout);
    matmul_forward(out.data(), inp.data(), weight.data(),
                   with_bias ? bias.data() : nullptr, p.B, p.T, p.C, p.OC);
    matmul_backward(dinp.data(), dweight.data(),
                    with_bias ? dbias.data() : nullptr, dout.data(), inp.data(),
                    weight.data(), p.B, p.T, p.C, p.OC);
    ExpectFloatMatchesDouble("matmul out", out, p.out);
    ExpectFloatMatchesDouble("matmul dinp", dinp, p.dinp);
    ExpectFloatMatchesDouble("matmul dweight", dweight, p.dweight);
    ExpectFloatMatchesDouble("matmul dbias", dbias, p.dbias);
  }
}

// bf16 products: against the double products of the same operands rounded
// to bf16 they differ by fp32 accumulation only, while unrounded operands
// would be ~1e-3 away.
Vec RoundedToBf16(const Vec& v) {
  Vec out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = Bf16Round(static_cast<float>(v[i]));
  }
  return out;
}

TEST(MatmulTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(Bf16Round(1.0f), 1.0f);
  // bf16 keeps 8 significant bits: 1 + 2^-8 is a tie (to even: 1), 1 + 3 *
  // 2^-8 a tie the other way (to 1 + 2^-6), 1 + 2^-8 + 2^-12 rounds up.
  EXPECT_EQ(Bf16Round(1.0f + 0x1p-8f), 1.0f);
  EXPECT_EQ(Bf16Round(1.0f + 0x3p-8f), 1.0f + 0x1p-6f);
  EXPECT_EQ(Bf16Round(1.0f + 0x1p-8f + 0x1p-12f), 1.0f + 0x1p-7f);
  EXPECT_EQ(Bf16Round(-3.0f), -3.0f);
  EXPECT_TRUE(std::isnan(Bf16Round(std::nanf(""))));
  EXPECT_TRUE(std::isinf(Bf16Round(INFINITY)));
}

// The right operand is rounded as Bf16Round rounds, whichever path packs
// it (stored plain, or transposed: 16 columns at a time in registers where
// the CPU has AVX-512): ties to even, and a NaN or an infinity stays one in
// its own column. B's entries are 1 + 2^-8 (a tie: rounds to 1), except
// a NaN in column 5 and an infinity in column 9; A is ones.
TEST(MatmulTest, Bf16OperandKeepsTiesNansAndInfinitiesInPlace) {
  if (!CpuHasBf16()) GTEST_SKIP() << kNoBf16;
  const int64_t M = 3, N = 64, K = 64;
  const std::vector<float> a(M * K, 1.0f);
  for (bool tb : {false, true}) {
    std::vector<float> b(N * K, 1.0f + 0x1p-8f);
    auto at = [&](int64_t k, int64_t n) -> float& {
      return tb ? b[n * K + k] : b[k * N + n];
    };
    // A NaN whose rounding, done as for numbers, would carry into infinity.
    const uint32_t nan_bits = 0x7f800001u;
    std::memcpy(&at(3, 5), &nan_bits, sizeof(nan_bits));
    at(10, 9) = INFINITY;
    std::vector<float> c(M * N, -1.0f);
    gemm_bf16(false, tb, M, N, K, a.data(), K, b.data(), tb ? K : N, 0.0f,
              c.data(), N);
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        const float got = c[i * N + j];
        if (j == 5) {
          EXPECT_TRUE(std::isnan(got)) << "tb " << tb << " row " << i;
        } else if (j == 9) {
          EXPECT_TRUE(std::isinf(got) && got > 0) << "tb " << tb;
        } else {
          ASSERT_EQ(got, float(K)) << "tb " << tb << " at " << i << "," << j;
        }
      }
    }
  }
}

// Dense operands let oneDNN's matmul ask for its blocked layout of B (which
// gemm_bf16 packs itself); a strided C makes it take B plain (rounded by
// oneDNN's reorder). Shapes with whole and partial blocks of 32 K rows by
// 64 columns, each operand plain and transposed.
TEST(MatmulTest, Bf16GemmIsTheProductOfRoundedOperands) {
  if (!CpuHasBf16()) GTEST_SKIP() << kNoBf16;
  std::mt19937_64 rng(11);
  struct Case {
    int64_t M, N, K, pad;
  };
  for (const Case& shape : {Case{37, 53, 70, 3}, Case{37, 53, 70, 0},
                            Case{40, 130, 96, 0}, Case{9, 64, 32, 0}}) {
    const int64_t M = shape.M, N = shape.N, K = shape.K, pad = shape.pad;
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          const bool with_bias = beta == 0.0f;  // as matmul_forward calls it
          const Vec bias = Random(N, &rng);
          // Leading dimensions wider than the rows, to test the strides.
          const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad,
                        ldc = N + pad;
          const Vec a = Random((ta ? K : M) * lda, &rng);
          const Vec b = Random((tb ? N : K) * ldb, &rng);
          const Vec c0 = Random(M * ldc, &rng);
          const Vec ar = RoundedToBf16(a), br = RoundedToBf16(b);
          Vec want = c0;
          double scale = 0;
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) {
              double sum = beta * c0[i * ldc + j] + (with_bias ? bias[j] : 0.0);
              for (int64_t k = 0; k < K; ++k) {
                const double x = ta ? ar[k * lda + i] : ar[i * lda + k];
                const double y = tb ? br[j * ldb + k] : br[k * ldb + j];
                sum += x * y;
              }
              want[i * ldc + j] = sum;
              scale = std::max(scale, std::abs(sum));
            }
          }
          std::vector<float> c = ToFloat(c0);
          const std::vector<float> af = ToFloat(a), bf = ToFloat(b),
                                   biasf = ToFloat(bias);
          gemm_bf16(ta, tb, M, N, K, af.data(), lda, bf.data(), ldb, beta,
                    c.data(), ldc, with_bias ? biasf.data() : nullptr);
          double err = 0;
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) {
              err = std::max(err, std::abs(c[i * ldc + j] - want[i * ldc + j]));
            }
            // The padding of C is not written.
            for (int64_t j = N; j < ldc; ++j) {
              EXPECT_EQ(c[i * ldc + j], static_cast<float>(c0[i * ldc + j]));
            }
          }
          EXPECT_LT(err / scale, kFloatTol)
              << "M=" << M << " N=" << N << " K=" << K << " pad=" << pad
              << " ta=" << ta << " tb=" << tb << " beta=" << beta;
        }
      }
    }
  }
}

TEST(MatmulTest, Bf16ForwardAndBackwardAreTheProductsOfRoundedOperands) {
  if (!CpuHasBf16()) GTEST_SKIP() << kNoBf16;
  for (bool with_bias : {true, false}) {
    MatmulProblem p(with_bias, 2, 37, 384, 129);
    const Vec inp = p.inp, weight = p.weight, dout = p.dout;
    // The double reference of what bf16 computes: the forward and dweight
    // take rounded inp and weight; dinp and dweight a rounded dout.
    p.inp = RoundedToBf16(inp);
    p.weight = RoundedToBf16(weight);
    p.dout = RoundedToBf16(dout);
    p.Loss();
    p.Backward();
    std::vector<float> out(p.out.size()), dinp(p.dinp.size()),
        dweight(p.dweight.size()), dbias(p.dbias.size());
    const std::vector<float> inpf = ToFloat(inp), weightf = ToFloat(weight),
                             bias = ToFloat(p.bias), doutf = ToFloat(dout);
    matmul_forward(out.data(), inpf.data(), weightf.data(),
                   with_bias ? bias.data() : nullptr, p.B, p.T, p.C, p.OC,
                   /*bf16=*/true);
    matmul_backward(dinp.data(), dweight.data(),
                    with_bias ? dbias.data() : nullptr, doutf.data(),
                    inpf.data(), weightf.data(), p.B, p.T, p.C, p.OC,
                    /*bf16=*/true);
    ExpectFloatMatchesDouble("bf16 matmul out", out, p.out);
    ExpectFloatMatchesDouble("bf16 matmul dinp", dinp, p.dinp);
    ExpectFloatMatchesDouble("bf16 matmul dweight", dweight, p.dweight);
    // The bias gradient sums the unrounded dout (fp32).
    Vec dbias_want(p.OC, 0.0);
    for (int64_t r = 0; r < int64_t{p.B} * p.T; ++r) {
      for (int o = 0; o < p.OC; ++o) dbias_want[o] += dout[r * p.OC + o];
    }
    if (with_bias)
      ExpectFloatMatchesDouble("bf16 matmul dbias", dbias, dbias_want);
  }
}

// LayerNorm outputs stored in bf16 (Ops::activation_type of the bf16
// backend) and the matmuls that read them: the LayerNorm's fp32 output
// rounded to nearest even, and bit for bit the products, gradients included,
// of the fp32 input they were rounded from. Shapes with partial blocks of
// the packed layout, and a width that oneDNN may lay out itself.
TEST(MatmulTest, Bf16StoredInputGivesTheProductsOfItsFp32Source) {
  if (!CpuHasBf16()) GTEST_SKIP() << kNoBf16;
  Ops& ops = CpuBf16Ops();
  ASSERT_EQ(ops.activation_type(), DType::kBf16);
  ASSERT_EQ(CpuOps().activation_type(), DType::kF32);
  struct Shape {
    int B, T, C, OC;
  };
  for (const Shape& sh :
       {Shape{2, 37, 96, 40}, Shape{1, 64, 256, 64}, Shape{3, 11, 54, 29}}) {
    std::mt19937_64 rng(17);
    const int64_t rows = int64_t{sh.B} * sh.T;
    const std::vector<float> x = ToFloat(Random(rows * sh.C, &rng, -3, 3)),
                             y = ToFloat(Random(rows * sh.C, &rng, -1, 1)),
                             lw = ToFloat(Random(sh.C, &rng, 0.5, 1.5)),
                             lb = ToFloat(Random(sh.C, &rng, -0.2, 0.2)),
                             w = ToFloat(Random(sh.OC * sh.C, &rng, -1, 1)),
                             b = ToFloat(Random(sh.OC, &rng, -1, 1)),
                             dout = ToFloat(Random(rows * sh.OC, &rng, -1, 1));
    // fp32 LayerNorm output, and the same into bf16 (two to a float).
    std::vector<float> ln(rows * sh.C), mean(rows), rstd(rows);
    std::vector<float> ln16((rows * sh.C + 1) / 2), mean16(rows), rstd16(rows);
    ops.layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(),
                          lw.data(), lb.data(), sh.B, sh.T, sh.C);
    ops.layernorm_forward(Act(ln16.data(), DType::kBf16), mean16.data(),
                          rstd16.data(), x.data(), lw.data(), lb.data(), sh.B,
                          sh.T, sh.C);
    const auto* bits = reinterpret_cast<const uint16_t*>(ln16.data());
    for (int64_t i = 0; i < rows * sh.C; ++i) {
      ASSERT_EQ(internal::FromBf16(bits[i]), Bf16Round(ln[i])) << i;
    }
    EXPECT_EQ(mean16, mean);
    EXPECT_EQ(rstd16, rstd);
    // The residual add and LayerNorm together: the same, and the residual.
    std::vector<float> res(rows * sh.C), res16(rows * sh.C),
        rln16((rows * sh.C + 1) / 2);
    ops.residual_layernorm_forward(
        res16.data(), Act(rln16.data(), DType::kBf16), mean16.data(),
        rstd16.data(), x.data(), y.data(), lw.data(), lb.data(), sh.B, sh.T,
        sh.C);
    ops.residual_layernorm_forward(res.data(), ln.data(), mean.data(),
                                   rstd.data(), x.data(), y.data(), lw.data(),
                                   lb.data(), sh.B, sh.T, sh.C);
    EXPECT_EQ(res16, res);
    bits = reinterpret_cast<const uint16_t*>(rln16.data());
    for (int64_t i = 0; i < rows * sh.C; ++i) {
      ASSERT_EQ(internal::FromBf16(bits[i]), Bf16Round(ln[i])) << i;
    }
    // The matmuls of the stored input against those of its fp32 source.
    const ConstAct stored(rln16.data(), DType::kBf16);
    std::vector<float> out(rows * sh.OC), out16(out.size());
    ops.matmul_forward(out.data(), ln.data(), w.data(), b.data(), sh.B, sh.T,
                       sh.C, sh.OC);
    ops.matmul_forward(out16.data(), stored, w.data(), b.data(), sh.B, sh.T,
                       sh.C, sh.OC);
    EXPECT_EQ(out16, out);
    // A bf16 output of it (qkv, fch), written by oneDNN: out rounded.
    std::vector<float> half((rows * sh.OC + 1) / 2);
    ops.matmul_forward(Act(half.data(), DType::kBf16), stored, w.data(),
                       b.data(), sh.B, sh.T, sh.C, sh.OC);
    const auto* hb = reinterpret_cast<const uint16_t*>(half.data());
    for (int64_t i = 0; i < rows * sh.OC; ++i) {
      ASSERT_EQ(internal::FromBf16(hb[i]), Bf16Round(out[i])) << i;
    }
    std::vector<float> dinp(rows * sh.C), dw(w.size(), 0.5f), db(sh.OC, 0.25f);
    std::vector<float> dinp16 = dinp, dw16 = dw, db16 = db;
    ops.matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(),
                        ln.data(), w.data(), sh.B, sh.T, sh.C, sh.OC);
    ops.matmul_backward(dinp16.data(), dw16.data(), db16.data(), dout.data(),
                        stored, w.data(), sh.B, sh.T, sh.C, sh.OC);
    EXPECT_EQ(dinp16, dinp);
    EXPECT_EQ(dw16, dw);
    EXPECT_EQ(db16, db);
  }
}

// The bf16 compute copy of a weight (what a store keeps beside the fp32
// master weights under bf16, written by the optimizer): every matmul that
// reads a weight gives bit for bit what it gives with the fp32 weight it was
// rounded from — forward (fp32 and bf16 inputs, a bf16 output), both halves
// of the backward and the whole, and the MLP projection's GELU matmuls.
TEST(MatmulTest, Bf16ComputeCopyOfTheWeightGivesTheProductsOfItsMaster) {
  if (!CpuHasBf16()) GTEST_SKIP() << kNoBf16;
  Ops& ops = CpuBf16Ops();
  const DType bf = DType::kBf16;
  const int B = 2, T = 23, C = 72, OC = 56;
  const int64_t rows = int64_t{B} * T;
  std::mt19937_64 rng(29);
  const std::vector<float> x = ToFloat(Random(rows * C, &rng, -2, 2)),
                           w = ToFloat(Random(OC * C, &rng, -0.5, 0.5)),
                           b = ToFloat(Random(OC, &rng, -1, 1)),
                           dout = ToFloat(Random(rows * OC, &rng, -1, 1));
  std::vector<float> w16((w.size() + 1) / 2), x16((x.size() + 1) / 2);
  RoundToBf16Rows(reinterpret_cast<uint16_t*>(w16.data()), w.data(), OC, C);
  RoundToBf16Rows(reinterpret_cast<uint16_t*>(x16.data()), x.data(), rows, C);
  const ConstAct copy(w16.data(), bf), stored(x16.data(), bf);
  for (const ConstAct in : {ConstAct(x.data()), stored}) {
    std::vector<float> out(rows * OC), out16(out.size());
    ops.matmul_forward(out.data(), in, w.data(), b.data(), B, T, C, OC);
    ops.matmul_forward(out16.data(), in, copy, b.data(), B, T, C, OC);
    EXPECT_EQ(out16, out);
    // Whole backward, input gradient only, weight gradients only.
    for (int half = 0; half < 3; ++half) {
      std::vector<float> dinp(rows * C), dw(w.size(), 0.5f), db(OC, 0.25f);
      std::vector<float> dinp16 = dinp, dw16 = dw, db16 = db;
      const bool with_dinp = half != 2, with_dw = half != 1;
      ops.matmul_backward(with_dinp ? dinp.data() : nullptr,
                          with_dw ? dw.data() : nullptr,
                          with_dw ? db.data() : nullptr, dout.data(), in,
                          w.data(), B, T, C, OC);
      ops.matmul_backward(
          with_dinp ? dinp16.data() : nullptr, with_dw ? dw16.data() : nullptr,
          with_dw ? db16.data() : nullptr, dout.data(), in, copy, B, T, C, OC);
      EXPECT_EQ(dinp16, dinp) << half;
      EXPECT_EQ(dw16, dw) << half;
      EXPECT_EQ(db16, db) << half;
    }
  }
  std::vector<float> y16((rows * OC + 1) / 2), y16c(y16.size());
  ops.matmul_forward(Act(y16.data(), bf), stored, w.data(), b.data(), B, T, C,
                     OC);
  ops.matmul_forward(Act(y16c.data(), bf), stored, copy, b.data(), B, T, C, OC);
  EXPECT_EQ(y16c, y16);
  // The projection of GELU(x): forward (its kept operand) and backward.
  std::vector<float> hidden(rows * C), out(rows * OC), out16(out.size());
  std::vector<float> saved(ops.gelu_saved_floats(rows, C)),
      saved16(saved.size());
  ops.gelu_matmul_forward(out.data(), hidden.data(), saved.data(), x.data(),
                          w.data(), b.data(), B, T, C, OC);
  ops.gelu_matmul_forward(out16.data(), hidden.data(), saved16.data(), x.data(),
                          copy, b.data(), B, T, C, OC);
  EXPECT_EQ(out16, out);
  std::vector<float> dx(rows * C), dw(w.size()), db(OC);
  std::vector<float> dx16 = dx, dw16 = dw, db16 = db;
  ops.gelu_matmul_backward(dx.data(), dw.data(), db.data(), dout.data(),
                           hidden.data(), saved.data(), x.data(), w.data(), B,
                           T, C, OC);
  ops.gelu_matmul_backward(dx16.data(), dw16.data(), db16.data(), dout.data(),
                           hidden.data(), saved16.data(), x.data(), copy, B, T,
                           C, OC);
  EXPECT_EQ(dx16, dx);
  EXPECT_EQ(dw16, dw);
  EXPECT_EQ(db16, db);
}

// The MLP's hidden layer (fch) stored in bf16: the fc matmul's output
// rounded; GELU's gradient and the projection's GELU operand of the stored
// value bit for bit those of the fp32 value it stands for (full
// recomputation's path, GELU made again, and the forward's kept operand
// alike).
TEST(MatmulTest, Bf16StoredHiddenLayerIsItsFp32Value) {
  if (!CpuHasBf16()) GTEST_SKIP() << kNoBf16;
  Ops& ops = CpuBf16Ops();
  const int B = 2, T = 19, C = 40, H = 160;  // fc: C -> H, projection H -> C
  const int64_t rows = int64_t{B} * T;
  std::mt19937_64 rng(23);
  const std::vector<float> x = ToFloat(Random(rows * C, &rng, -2, 2)),
                           w = ToFloat(Random(H * C, &rng, -0.3, 0.3)),
                           b = ToFloat(Random(H, &rng, -1, 1)),
                           w2 = ToFloat(Random(C * H, &rng, -0.3, 0.3)),
                           b2 = ToFloat(Random(C, &rng, -1, 1)),
                           dgelu = ToFloat(Random(rows * H, &rng, -1, 1)),
                           dout = ToFloat(Random(rows * C, &rng, -1, 1));
  std::vector<float> fch(rows * H), fch16((rows * H + 1) / 2);
  ops.matmul_forward(fch.data(), x.data(), w.data(), b.data(), B, T, C, H);
  ops.matmul_forward(Act(fch16.data(), DType::kBf16), x.data(), w.data(),
                     b.data(), B, T, C, H);
  const auto* bits = reinterpret_cast<const uint16_t*>(fch16.data());
  std::vector<float> rounded(rows * H);
  for (int64_t i = 0; i < rows * H; ++i) {
    rounded[i] = internal::FromBf16(bits[i]);
    ASSERT_EQ(rounded[i], Bf16Round(fch[i])) << i;
  }
  const ConstAct stored(fch16.data(), DType::kBf16);
  std::vector<float> g(rows * H), g16 = dgelu;
  ops.gelu_backward(g.data(), rounded.data(), dgelu.data(), rows * H);
  ops.gelu_backward(g16.data(), stored, g16.data(), rows * H);  // in place
  EXPECT_EQ(g16, g);
  for (bool keep : {false, true}) {
    SCOPED_TRACE(keep ? "operand kept" : "GELU made again");
    std::vector<float> saved(keep ? ops.gelu_saved_floats(rows, H) : 0),
        saved16(saved.size());
    float* s = keep ? saved.data() : nullptr;
    float* s16 = keep ? saved16.data() : nullptr;
    std::vector<float> out(rows * C), out16(rows * C), hidden(rows * H);
    std::vector<float> dinp(rows * H), dw(w2.size()), db(C);
    std::vector<float> dinp16 = dinp, dw16 = dw, db16 = db;
    ops.gelu_matmul_forward(out.data(), hidden.data(), s, rounded.data(),
                            w2.data(), b2.data(), B, T, H, C);
    ops.gelu_matmul_forward(out16.data(), hidden.data(), s16, stored, w2.data(),
                            b2.data(), B, T, H, C);
    EXPECT_EQ(out16, out);
    ops.gelu_matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(),
                             hidden.data(), s, rounded.data(), w2.data(), B, T,
                             H, C);
    ops.gelu_matmul_backward(dinp16.data(), dw16.data(), db16.data(),
                             dout.data(), hidden.data(), s16, stored, w2.data(),
                             B, T, H, C);
    EXPECT_EQ(dinp16, dinp);
    EXPECT_EQ(dw16, dw);
    EXPECT_EQ(db16, db);
    // The gradient of fch itself in bf16 (under bf16 it feeds only the fc
    // matmul's backward): the fp32 one rounded.
    std::vector<float> dfch16((rows * H + 1) / 2), dw_b = dw, db_b = db;
    std::fill(dw_b.begin(), dw_b.end(), 0.0f);
    std::fill(db_b.begin(), db_b.end(), 0.0f);
    std::vector<float> dw_f = dw_b, db_f = db_b;
    hidden.assign(hidden.size(), 0.0f);
    ops.gelu_matmul_backward(Act(dfch16.data(), DType::kBf16), dw_b.data(),
                             db_b.data(), dout.data(), hidden.data(), s16,
                             stored, w2.data(), B, T, H, C);
    ops.gelu_matmul_backward(dinp.data(), dw_f.data(), db_f.data(), dout.data(),
                             hidden.data(), s16, stored, w2.data(), B, T, H, C);
    EXPECT_EQ(dw_b, dw_f);
    EXPECT_EQ(db_b, db_f);
    const auto* gb = reinterpret_cast<const uint16_t*>(dfch16.data());
    std::vector<float> dfch_rounded(rows * H);
    for (int64_t i = 0; i < rows * H; ++i) {
      ASSERT_EQ(internal::FromBf16(gb[i]), Bf16Round(dinp[i])) << i;
      dfch_rounded[i] = internal::FromBf16(gb[i]);
    }
    // The fc matmul's backward of that bf16 gradient: the products of its
    // values, the bias gradient their sums.
    std::vector<float> ga(rows * C), gw(w.size()), gbias(H),
        ga16 = ga, gw16 = gw, gbias16 = gbias;
    ops.matmul_backward(ga.data(), gw.data(), gbias.data(), dfch_rounded.data(),
                        x.data(), w.data(), B, T, C, H);
    ops.matmul_backward(ga16.data(), gw16.data(), gbias16.data(),
                        ConstAct(dfch16.data(), DType::kBf16), x.data(),
                        w.data(), B, T, C, H);
    EXPECT_EQ(ga16, ga);
    EXPECT_EQ(gw16, gw);
    for (int h = 0; h < H; ++h) {
      double want = 0.0;
      for (int64_t r = 0; r < rows; ++r) want += dfch_rounded[r * H + h];
      EXPECT_NEAR(gbias16[h], want, 1e-4 * (1.0 + std::abs(want))) << h;
    }
  }
}

// Attention over a bf16-stored qkv into a bf16-stored output, on each
// path (probabilities kept below kFlashAttentionT, flash from it on; and
// generation's cached attention): the results for the fp32 values the
// stored ones stand for, the output rounded.
TEST(AttentionTest, Bf16StoredInputAndOutputAreTheirFp32Values) {
  if (!CpuHasBf16()) GTEST_SKIP() << kNoBf16;
  Ops& ops = CpuBf16Ops();
  const DType bf = DType::kBf16;
  for (int T : {24, static_cast<int>(kFlashAttentionT)}) {
    SCOPED_TRACE(T);
    const int B = 1, C = 32, NH = 2;
    const int64_t n = int64_t{B} * T * C;
    std::mt19937_64 rng(29);
    std::vector<float> qkv = ToFloat(Random(3 * n, &rng, -1, 1));
    for (float& x : qkv) x = Bf16Round(x);  // values a bf16 tensor can hold
    std::vector<float> qkv16((3 * n + 1) / 2);
    RoundToBf16Rows(reinterpret_cast<uint16_t*>(qkv16.data()), qkv.data(), 1,
                    3 * n);
    const std::vector<float> dout = ToFloat(Random(n, &rng, -1, 1));
    std::vector<float> att(ops.attention_saved_floats(B, T, C, NH)),
        att16(att.size()), datt(ops.attention_scratch_floats(B, T, C, NH)),
        out(n), out16((n + 1) / 2);
    ops.attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, NH);
    ops.attention_forward(Act(out16.data(), bf), att16.data(),
                          ConstAct(qkv16.data(), bf), B, T, C, NH, NH);
    EXPECT_EQ(att16, att);
    const auto* bits = reinterpret_cast<const uint16_t*>(out16.data());
    std::vector<float> out_rounded(n);
    for (int64_t i = 0; i < n; ++i) {
      out_rounded[i] = internal::FromBf16(bits[i]);
      ASSERT_EQ(out_rounded[i], Bf16Round(out[i])) << i;
    }
    // The backward reads the stored output (flash: its rows' dot with dout)
    // as the fp32 value it stands for.
    std::vector<float> dinp(3 * n, 0.0f), dinp16(3 * n, 0.0f);
    ops.attention_backward(dinp.data(), datt.data(), dout.data(), qkv.data(),
                           out_rounded.data(), att.data(), B, T, C, NH, NH);
    ops.attention_backward(
        dinp16.data(), datt.data(), dout.data(), ConstAct(qkv16.data(), bf),
        ConstAct(out16.data(), bf), att16.data(), B, T, C, NH, NH);
    EXPECT_EQ(dinp16, dinp);
  }
  // Generation: three positions into a cache of 8.
  const int C = 32, NH = 2, cap = 8, n = 3;
  std::mt19937_64 rng(31);
  std::vector<float> qkv = ToFloat(Random(n * 3 * C, &rng, -1, 1));
  for (float& x : qkv) x = Bf16Round(x);
  std::vector<float> qkv16((n * 3 * C + 1) / 2);
  RoundToBf16Rows(reinterpret_cast<uint16_t*>(qkv16.data()), qkv.data(), 1,
                  n * 3 * C);
  std::vector<float> k(NH * cap * (C / NH)), v(k.size()), k16(k.size()),
      v16(k.size()), out(n * C), out16((n * C + 1) / 2);
  ops.attention_decode(out.data(), k.data(), v.data(), qkv.data(), n, 0, C, NH,
                       NH, cap);
  ops.attention_decode(Act(out16.data(), bf), k16.data(), v16.data(),
                       ConstAct(qkv16.data(), bf), n, 0, C, NH, NH, cap);
  EXPECT_EQ(k16, k);
  EXPECT_EQ(v16, v);
  const auto* bits = reinterpret_cast<const uint16_t*>(out16.data());
  for (int i = 0; i < n * C; ++i) {
    ASSERT_EQ(internal::FromBf16(bits[i]), Bf16Round(out[i])) << i;
  }
}

// The MLP projection of GELU(inp) with GELU's output not kept
// (Ops::gelu_matmul_*): bit for bit what gelu_forward then the matmul give
// (then gelu_backward: the input gradient is inp's, through GELU),
// on both CPU precisions (bf16 applies GELU as it rounds the operand; its
// forward and dweight then differ from unfused GELU by any bit of GELU, so
// EQ is the test). Shapes with partial blocks of the packed layout; the
// working space starts as noise and must not leak into a result. The
// backward gives the same from what the forward kept (gelu_saved_floats;
// bf16 keeps the rounded operand) as from computing GELU again.
TEST(MatmulTest, GeluMatmulIsTheMatmulOfGeluOutput) {
  struct Shape {
    int B, T, C, OC;
  };
  for (Ops* ops : {&CpuOps(), &CpuBf16Ops()}) {
    if (ops == &CpuBf16Ops() && !CpuHasBf16()) continue;  // kNoBf16
    for (const Shape& sh :
         {Shape{2, 37, 96, 40}, Shape{1, 64, 256, 64}, Shape{3, 11, 53, 29}}) {
      std::mt19937_64 rng(11);
      const int64_t rows = int64_t{sh.B} * sh.T;
      const std::vector<float> inp = ToFloat(Random(rows * sh.C, &rng, -4, 4)),
                               w = ToFloat(Random(int64_t{sh.OC} * sh.C, &rng)),
                               bias = ToFloat(Random(sh.OC, &rng)),
                               dout = ToFloat(Random(rows * sh.OC, &rng));
      const std::vector<float> noise = ToFloat(Random(inp.size(), &rng));
      std::vector<float> act(inp.size());
      ops->gelu_forward(act.data(), inp.data(), act.size());
      std::vector<float> want_out(rows * sh.OC), want_dinp(inp.size()),
          want_dw(w.size(), 0.5f), want_db(sh.OC, 0.25f);
      ops->matmul_forward(want_out.data(), act.data(), w.data(), bias.data(),
                          sh.B, sh.T, sh.C, sh.OC);
      ops->matmul_backward(want_dinp.data(), want_dw.data(), want_db.data(),
                           dout.data(), act.data(), w.data(), sh.B, sh.T, sh.C,
                           sh.OC);
      // The input gradient through GELU: that of inp itself.
      ops->gelu_backward(want_dinp.data(), inp.data(), want_dinp.data(),
                         want_dinp.size());
      std::vector<float> saved =
          ToFloat(Random(ops->gelu_saved_floats(rows, sh.C), &rng));
      float* kept = saved.empty() ? nullptr : saved.data();
      std::vector<float> out(want_out.size()), hidden = noise;
      ops->gelu_matmul_forward(out.data(), hidden.data(), kept, inp.data(),
                               w.data(), bias.data(), sh.B, sh.T, sh.C, sh.OC);
      const std::string what = ops->name() + " " + std::to_string(rows) + "x" +
                               std::to_string(sh.C) + "x" +
                               std::to_string(sh.OC);
      EXPECT_EQ(out, want_out) << what;
      for (const float* from : {static_cast<const float*>(kept),
                                static_cast<const float*>(nullptr)}) {
        std::vector<float> dinp(inp.size()), dw(w.size(), 0.5f),
            db(sh.OC, 0.25f);
        hidden = noise;
        ops->gelu_matmul_backward(dinp.data(), dw.data(), db.data(),
                                  dout.data(), hidden.data(), from, inp.data(),
                                  w.data(), sh.B, sh.T, sh.C, sh.OC);
        const std::string how =
            what + (from != nullptr ? " from the kept GELU" : "");
        EXPECT_EQ(dinp, want_dinp) << how;
        EXPECT_EQ(dw, want_dw) << how;
        EXPECT_EQ(db, want_db) << how;
      }
    }
    if (ops == &CpuBf16Ops()) {
      EXPECT_EQ(ops->gelu_saved_floats(37, 96), 37 * 96 / 2);
    } else {
      EXPECT_EQ(ops->gelu_saved_floats(37, 96), 0);
    }
  }
}

// -------------------------------------------------------------- attention

struct AttentionProblem {
  AttentionProblem(int B = kB, int T = kT, int C = kC, int NH = kNH)
      : rng(4), B(B), T(T), C(C), NH(NH) {
    inp = Random(B * T * 3 * C, &rng);
    dout = Random(B * T * C, &rng);
    out.resize(dout.size());
    att.resize(B * NH * T * T);
    datt.resize(att.size());
    dinp.resize(inp.size());
  }
  double Loss() {
    attention_forward(out.data(), att.data(), inp.data(), B, T, C, NH, NH);
    return Dot(out, dout);
  }
  void Backward() {
    Loss();  // att at the unperturbed point
    attention_backward(dinp.data(), datt.data(), dout.data(), inp.data(),
                       att.data(), B, T, C, NH, NH);
  }
  std::mt19937_64 rng;
  int B, T, C, NH;
  Vec inp, dout, out, att, datt, dinp;
};

TEST(AttentionTest, BackwardMatchesFiniteDifferences) {
  AttentionProblem p;
  p.Backward();
  EXPECT_LE(
      MaxGradError("attention dinp", &p.inp, p.dinp, [&] { return p.Loss(); }),
      kGradTol);
}

TEST(AttentionTest, BackwardMatchesFiniteDifferencesAcrossCausalTiles) {
  // T = 70 spans two query tiles (the kernel tiles by 64 rows), the second
  // one partial.
  AttentionProblem p(/*B=*/1, /*T=*/70, /*C=*/6, /*NH=*/2);
  p.Backward();
  EXPECT_LE(MaxGradError("attention(T=70) dinp", &p.inp, p.dinp,
                         [&] { return p.Loss(); }),
            kGradTol);
}

TEST(AttentionTest, BackwardAccumulates) {
  AttentionProblem p;
  ExpectAccumulates({&p.dinp}, [&] { p.Backward(); });
}

TEST(AttentionTest, ProbabilitiesAreCausalAndRowsSumToOne) {
  AttentionProblem p(2, 70, 12, 3);
  p.Loss();
  for (int bh = 0; bh < p.B * p.NH; bh++) {
    for (int t = 0; t < p.T; t++) {
      const double* row = &p.att[(static_cast<size_t>(bh) * p.T + t) * p.T];
      double sum = 0;
      for (int t2 = 0; t2 <= t; t2++) {
        EXPECT_GT(row[t2], 0.0);
        sum += row[t2];
      }
      EXPECT_NEAR(sum, 1.0, 1e-12) << "bh " << bh << " t " << t;
      for (int t2 = t + 1; t2 < p.T; t2++) ASSERT_EQ(row[t2], 0.0);
    }
  }
}

TEST(AttentionTest, FutureKeysAndValuesDoNotChangeEarlierOutputs) {
  AttentionProblem p(2, 70, 12, 3);
  const int C = p.C;
  for (int t_changed : {3, 66}) {
    p.Loss();
    const Vec before = p.out;
    AttentionProblem q = p;
    for (int b = 0; b < p.B; b++) {
      // Every key and value (columns C..3C) at position t_changed.
      double* kv = &q.inp[(static_cast<size_t>(b) * p.T + t_changed) * 3 * C];
      for (int i = C; i < 3 * C; i++) kv[i] += 0.5;
    }
    q.Loss();
    for (int b = 0; b < p.B; b++) {
      for (int t = 0; t < p.T; t++) {
        for (int i = 0; i < C; i++) {
          const size_t idx = (static_cast<size_t>(b) * p.T + t) * C + i;
          if (t < t_changed) {
            ASSERT_EQ(q.out[idx], before[idx]) << "t " << t;
          }
        }
      }
      const size_t at = (static_cast<size_t>(b) * p.T + t_changed) * C;
      EXPECT_NE(q.out[at], before[at]) << "the change itself must be seen";
    }
  }
}

TEST(AttentionTest, FloatForwardAndBackwardMatchDouble) {
  // T = 150 covers full and partial causal tiles; hs = 64 as in the model.
  AttentionProblem p(/*B=*/2, /*T=*/150, /*C=*/128, /*NH=*/2);
  p.Backward();
  std::vector<float> out(p.out.size()), att(p.att.size()), datt(p.datt.size()),
      dinp(p.dinp.size());
  const std::vector<float> inp = ToFloat(p.inp), dout = ToFloat(p.dout);
  attention_forward(out.data(), att.data(), inp.data(), p.B, p.T, p.C, p.NH,
                    p.NH);
  attention_backward(dinp.data(), datt.data(), dout.data(), inp.data(),
                     att.data(), p.B, p.T, p.C, p.NH, p.NH);
  ExpectFloatMatchesDouble("attention out", out, p.out);
  ExpectFloatMatchesDouble("attention att", att, p.att);
  ExpectFloatMatchesDouble("attention dinp", dinp, p.dinp);
}

// The attention that keeps no probabilities: by finite differences on its
// own (one tile, and query tiles of 64 that end mid-way), and against the
// materialised kernel (itself checked so) where a query tile's keys span
// two key tiles of 512 and the online softmax carries between them.
double FlashLoss(const AttentionProblem& p, Vec* out, Vec* lse) {
  flash_attention_forward(out->data(), lse->data(), p.inp.data(), p.B, p.T, p.C,
                          p.NH, p.NH);
  return Dot(*out, p.dout);
}

TEST(FlashAttentionTest, BackwardMatchesFiniteDifferences) {
  for (int T : {kT, 70}) {
    AttentionProblem p(kB, T, kC, kNH);
    Vec out(p.out.size()), lse(static_cast<size_t>(p.B) * p.NH * T),
        dinp(p.inp.size(), 0.0);
    FlashLoss(p, &out, &lse);
    flash_attention_backward(dinp.data(), p.dout.data(), p.inp.data(),
                             out.data(), lse.data(), p.B, T, p.C, p.NH, p.NH);
    EXPECT_LE(MaxGradError("flash attention dinp T" + std::to_string(T), &p.inp,
                           dinp, [&] { return FlashLoss(p, &out, &lse); }),
              kGradTol);
  }
}

TEST(FlashAttentionTest, MatchesTheMaterialisedKernelAcrossKeyTiles) {
  AttentionProblem p(/*B=*/1, /*T=*/600, /*C=*/24, /*NH=*/3);
  p.Backward();
  Vec out(p.out.size()), lse(static_cast<size_t>(p.NH) * p.T),
      dinp(p.inp.size(), 0.0);
  FlashLoss(p, &out, &lse);
  flash_attention_backward(dinp.data(), p.dout.data(), p.inp.data(), out.data(),
                           lse.data(), p.B, p.T, p.C, p.NH, p.NH);
  for (size_t i = 0; i < out.size(); i++) {
    ASSERT_NEAR(out[i], p.out[i], 1e-12) << "out " << i;
  }
  for (size_t i = 0; i < dinp.size(); i++) {
    ASSERT_NEAR(dinp[i], p.dinp[i], 1e-12) << "dinp " << i;
  }
  // lse is the log of each row's softmax denominator.
  const int C = p.C, hs = C / p.NH;
  for (int h = 0; h < p.NH; h++) {
    for (int t : {0, 63, 64, 511, 512, 599}) {
      const double* q = &p.inp[t * 3 * C + h * hs];
      double sum = 0;
      for (int j = 0; j <= t; j++) {
        const double* k = &p.inp[j * 3 * C + C + h * hs];
        double dot = 0;
        for (int d = 0; d < hs; d++) dot += q[d] * k[d];
        sum += std::exp(dot / std::sqrt(static_cast<double>(hs)));
      }
      EXPECT_NEAR(lse[h * p.T + t], std::log(sum), 1e-12) << h << " " << t;
    }
  }
  // Float within float rounding of double.
  std::vector<float> fout(out.size()), flse(lse.size()), fdinp(dinp.size());
  const std::vector<float> finp = ToFloat(p.inp), fdout = ToFloat(p.dout);
  flash_attention_forward(fout.data(), flse.data(), finp.data(), p.B, p.T, p.C,
                          p.NH, p.NH);
  flash_attention_backward(fdinp.data(), fdout.data(), finp.data(), fout.data(),
                           flse.data(), p.B, p.T, p.C, p.NH, p.NH);
  ExpectFloatMatchesDouble("flash attention out", fout, p.out);
  ExpectFloatMatchesDouble("flash attention dinp", fdinp, p.dinp);
}

// Ring attention's pieces: each of cp ranks holds chunks r and 2cp−1−r of
// a sequence cut in 2cp (zigzag); its queries' attention, folded block by
// block over every rank's keys and values in the ring's order (its own
// first), is the whole attention's at those positions, with each row's
// log-sum-exp; the blocks' backwards, each from the whole output and
// log-sum-exp, sum to the whole attention's input gradient. Short blocks
// (one tile of query rows) and long ones (several tiles, one of them
// across the boundary of the block's two chunks).
class AttentionBlockTest : public ::testing::TestWithParam<std::array<int, 4>> {
};

TEST_P(AttentionBlockTest, ZigzagBlocksInRingOrderAreTheWholeAttention) {
  const auto [pB, pT, pC, pNH] = GetParam();
  AttentionProblem p(pB, pT, pC, pNH);
  p.Backward();
  const int B = p.B, T = p.T, C = p.C, NH = p.NH;
  for (int cp : {1, 2, 3, 4}) {
    if (T % (2 * cp) != 0) continue;
    SCOPED_TRACE("T " + std::to_string(T) + " cp " + std::to_string(cp));
    const int Tl = T / cp, chunk = T / (2 * cp);
    // Chunks r and 2cp−1−r, as ZigzagPosition numbers them.
    auto positions = [&](int r) {
      std::vector<int> pos;
      for (int c : {r, 2 * cp - 1 - r}) {
        for (int i = 0; i < chunk; ++i) pos.push_back(c * chunk + i);
      }
      for (int t = 0; t < Tl; ++t) {
        EXPECT_EQ(ZigzagPosition(t, Tl, cp, r), pos[t]);
      }
      return pos;
    };
    // Rows of a (B,T,width) tensor at `pos`, columns [c0, c0 + n).
    auto rows = [&](const Vec& x, int width, const std::vector<int>& pos,
                    int c0, int n) {
      Vec out(static_cast<size_t>(B) * Tl * n);
      for (int b = 0; b < B; ++b) {
        for (int t = 0; t < Tl; ++t) {
          for (int i = 0; i < n; ++i) {
            out[(b * Tl + t) * n + i] =
                x[(static_cast<size_t>(b) * T + pos[t]) * width + c0 + i];
          }
        }
      }
      return out;
    };
    Vec dinp(p.inp.size(), 0.0);
    for (int r = 0; r < cp; ++r) {
      SCOPED_TRACE("cp " + std::to_string(cp) + " rank " + std::to_string(r));
      const std::vector<int> mine = positions(r);
      const Vec qkv = rows(p.inp, 3 * C, mine, 0, 3 * C);
      Vec out(static_cast<size_t>(B) * Tl * C), lse(B * NH * Tl);
      for (int s = 0; s < cp; ++s) {
        const int src = (r - s + cp) % cp;
        const std::vector<int> theirs = positions(src);
        const Vec kv = rows(p.inp, 3 * C, theirs, C, 2 * C);
        attention_block_forward(out.data(), lse.data(), qkv.data(), kv.data(),
                                2 * C, B, Tl, C, NH, NH, cp, r, src,
                                /*first=*/s == 0);
      }
      const Vec want = rows(p.out, C, mine, 0, C);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(out[i], want[i], 1e-12) << "out " << i;
      }
      // lse of row t, head h: the log of its softmax's denominator.
      const int hs = C / NH;
      for (int t : {0, Tl - 1}) {
        double sum = 0;
        for (int j = 0; j <= mine[t]; ++j) {
          double dot = 0;
          for (int d = 0; d < hs; ++d) {
            dot += p.inp[mine[t] * 3 * C + d] * p.inp[j * 3 * C + C + d];
          }
          sum += std::exp(dot / std::sqrt(static_cast<double>(hs)));
        }
        EXPECT_NEAR(lse[t], std::log(sum), 1e-12) << "row " << t;
      }
      const Vec dout = rows(p.dout, C, mine, 0, C);
      Vec dqkv(qkv.size(), 0.0);
      for (int s = 0; s < cp; ++s) {
        const int src = (r - s + cp) % cp;
        const std::vector<int> theirs = positions(src);
        const Vec kv = rows(p.inp, 3 * C, theirs, C, 2 * C);
        Vec dkv(kv.size(), 0.0);
        attention_block_backward(dqkv.data(), dkv.data(), dout.data(),
                                 qkv.data(), out.data(), lse.data(), kv.data(),
                                 2 * C, B, Tl, C, NH, NH, cp, r, src);
        for (int b = 0; b < B; ++b) {
          for (int t = 0; t < Tl; ++t) {
            for (int i = 0; i < 2 * C; ++i) {
              dinp[(b * T + theirs[t]) * 3 * C + C + i] +=
                  dkv[(b * Tl + t) * 2 * C + i];
            }
          }
        }
      }
      for (int b = 0; b < B; ++b) {
        for (int t = 0; t < Tl; ++t) {
          for (int i = 0; i < C; ++i) {
            dinp[(b * T + mine[t]) * 3 * C + i] +=
                dqkv[(b * Tl + t) * 3 * C + i];
          }
        }
      }
    }
    for (size_t i = 0; i < dinp.size(); ++i) {
      ASSERT_NEAR(dinp[i], p.dinp[i], 1e-12) << "cp " << cp << " dinp " << i;
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionBlockTest,
                         ::testing::Values(std::array<int, 4>{2, 24, 12, 3},
                                           std::array<int, 4>{1, 300, 8, 2}));

// The CPU backend keeps the probabilities below kFlashAttentionT positions
// and one float per row from there, and computes the same attention
// either way.
TEST(FlashAttentionTest, CpuBackendSwitchesAtItsLengthAndAgrees) {
  Ops& ops = CpuOps();
  const int B = 1, C = 16, NH = 2, T = static_cast<int>(kFlashAttentionT);
  EXPECT_EQ(ops.attention_saved_floats(B, T - 1, C, NH),
            int64_t{B} * NH * (T - 1) * (T - 1));
  EXPECT_EQ(ops.attention_saved_floats(B, T, C, NH), int64_t{B} * NH * T);
  EXPECT_EQ(ops.attention_scratch_floats(B, T, C, NH), 0);
  std::mt19937_64 rng(8);
  const std::vector<float> inp = ToFloat(Random(size_t{B} * T * 3 * C, &rng)),
                           dout = ToFloat(Random(size_t{B} * T * C, &rng));
  std::vector<float> want(dout.size()), att(size_t{B} * NH * T * T),
      datt(att.size()), want_dinp(inp.size());
  attention_forward(want.data(), att.data(), inp.data(), B, T, C, NH, NH);
  attention_backward(want_dinp.data(), datt.data(), dout.data(), inp.data(),
                     att.data(), B, T, C, NH, NH);
  // The backend writes dinp whole: what it held before does not matter.
  std::vector<float> out(want.size()),
      saved(ops.attention_saved_floats(B, T, C, NH)), dinp(inp.size(), 7.0f);
  ops.attention_forward(out.data(), saved.data(), inp.data(), B, T, C, NH, NH);
  ops.attention_backward(dinp.data(), nullptr, dout.data(), inp.data(),
                         out.data(), saved.data(), B, T, C, NH, NH);
  ExpectFloatMatchesDouble("backend attention out", out,
                           Vec(want.begin(), want.end()));
  ExpectFloatMatchesDouble("backend attention dinp", dinp,
                           Vec(want_dinp.begin(), want_dinp.end()));
}

// Generation: a sequence fed through the cache in pieces of any size gives
// every position the output the whole-sequence forward gives it, and the
// cache holds each position's key and value.
// bf16 attention (the bf16 CPU backend's below kFlashAttentionT) against a
// double reference that rounds to bf16 where it does: q, k, v, the
// probabilities entering P V and P^T dY, dY, and dS = scale P (dP - sum(P
// dP)) with P the rounded one. What remains is fp32 accumulation and
// softmax, and now and then a value on the other side of a rounding
// boundary: 3e-4 of each tensor's scale. T = 150 has full and partial
// tiles; B = 1 puts the heads of a sequence in groups; the input gradient
// accumulates onto what it held.
TEST(AttentionTest, Bf16IsTheAttentionOfRoundedOperands) {
  if (!CpuHasBf16()) GTEST_SKIP() << kNoBf16;
  {
    // A call at another T first leaves its values all over the kernel's
    // per-thread scratch: what it does not write there must not be read.
    std::mt19937_64 rng(5);
    const int B = 3, T = 97, C = 128, NH = 4;
    const std::vector<float> inp = ToFloat(Random(size_t(B) * T * 3 * C, &rng)),
                             dout = ToFloat(Random(size_t(B) * T * C, &rng));
    std::vector<float> out(dout.size()), dinp(inp.size()),
        att((int64_t{B} * NH * T * T + 1) / 2);
    attention_forward_bf16(out.data(), att.data(), inp.data(), B, T, C, NH, NH);
    attention_backward_bf16(dinp.data(), nullptr, dout.data(), inp.data(),
                            att.data(), B, T, C, NH, NH);
  }
  for (const int B : {1, 3}) {
    const int T = 150, C = 128, NH = 4, hs = C / NH;
    const int64_t C3 = 3 * C;
    std::mt19937_64 rng(21);
    const Vec inp = Random(size_t(B) * T * C3, &rng, -2, 2),
              dout = Random(size_t(B) * T * C, &rng),
              dinp0 = Random(inp.size(), &rng);
    const Vec r = RoundedToBf16(inp), dy = RoundedToBf16(dout);
    const double scale = 1.0 / std::sqrt(double(hs));
    Vec out(size_t(B) * T * C, 0.0), dinp = dinp0;
    std::vector<Vec> probs;  // per (b, h): (T, T), rounded
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        auto q = [&](int t, int d) { return r[(b * T + t) * C3 + h * hs + d]; };
        auto k = [&](int t, int d) {
          return r[(b * T + t) * C3 + C + h * hs + d];
        };
        auto v = [&](int t, int d) {
          return r[(b * T + t) * C3 + 2 * C + h * hs + d];
        };
        auto g = [&](int t, int d) { return dy[(b * T + t) * C + h * hs + d]; };
        Vec P(size_t(T) * T, 0.0), dS(size_t(T) * T, 0.0);
        for (int t = 0; t < T; ++t) {
          Vec s(t + 1);
          double m = -1e300, sum = 0;
          for (int j = 0; j <= t; ++j) {
            for (int d = 0; d < hs; ++d) s[j] += q(t, d) * k(j, d);
            m = std::max(m, s[j]);
          }
          for (int j = 0; j <= t; ++j) sum += std::exp(scale * (s[j] - m));
          for (int j = 0; j <= t; ++j) {
            P[t * T + j] = Bf16Round(float(std::exp(scale * (s[j] - m)) / sum));
          }
          for (int d = 0; d < hs; ++d) {
            double y = 0;
            for (int j = 0; j <= t; ++j) y += P[t * T + j] * v(j, d);
            out[(b * T + t) * C + h * hs + d] = y;
          }
          Vec dP(t + 1);
          double dot = 0;
          for (int j = 0; j <= t; ++j) {
            for (int d = 0; d < hs; ++d) dP[j] += g(t, d) * v(j, d);
            dot += P[t * T + j] * dP[j];
          }
          for (int j = 0; j <= t; ++j) {
            dS[t * T + j] =
                Bf16Round(float(scale * P[t * T + j] * (dP[j] - dot)));
          }
        }
        for (int t = 0; t < T; ++t) {
          for (int d = 0; d < hs; ++d) {
            double dq = 0, dk = 0, dv = 0;
            for (int j = 0; j < T; ++j) {
              dq += dS[t * T + j] * k(j, d);  // row t of dS
              dk += dS[j * T + t] * q(j, d);  // column t
              dv += P[j * T + t] * g(j, d);
            }
            const int64_t at = (b * T + t) * C3 + h * hs + d;
            dinp[at] += dq;
            dinp[at + C] += dk;
            dinp[at + 2 * C] += dv;
          }
        }
        probs.push_back(std::move(P));
      }
    }
    const std::vector<float> finp = ToFloat(inp), fdout = ToFloat(dout);
    std::vector<float> fout(out.size()), fdinp = ToFloat(dinp0);
    // att starts as bf16 ones: what the kernel does not write must not be
    // read.
    std::vector<float> att((int64_t{B} * NH * T * T + 1) / 2);
    std::fill(reinterpret_cast<uint16_t*>(att.data()),
              reinterpret_cast<uint16_t*>(att.data()) + 2 * att.size(),
              uint16_t{0x3f80});
    attention_forward_bf16(fout.data(), att.data(), finp.data(), B, T, C, NH,
                           NH);
    attention_backward_bf16(fdinp.data(), nullptr, fdout.data(), finp.data(),
                            att.data(), B, T, C, NH, NH);
    SCOPED_TRACE("B " + std::to_string(B));
    ExpectFloatMatchesDouble("bf16 attention out", fout, out, 3e-4);
    ExpectFloatMatchesDouble("bf16 attention dinp", fdinp, dinp, 3e-4);
    // The kept probabilities: the rounded ones, on and below the diagonal.
    const uint16_t* kept = reinterpret_cast<const uint16_t*>(att.data());
    int64_t off_by_more_than_an_ulp = 0;
    for (int64_t bh = 0; bh < int64_t{B} * NH; ++bh) {
      for (int t = 0; t < T; ++t) {
        for (int j = 0; j <= t; ++j) {
          const float got = internal::FromBf16(kept[(bh * T + t) * T + j]);
          const double want = probs[bh][t * T + j];
          if (std::abs(got - want) > std::abs(want) * 0x1p-7 + 1e-30) {
            ++off_by_more_than_an_ulp;
          }
        }
      }
    }
    EXPECT_EQ(off_by_more_than_an_ulp, 0);
  }
}

TEST(AttentionTest, DecodeInPiecesMatchesTheWholeForward) {
  AttentionProblem p(/*B=*/1, /*T=*/37, /*C=*/24, /*NH=*/3);
  p.Loss();
  const int C = p.C, hs = C / p.NH, capacity = 40;
  Vec out(p.out.size()), kcache(p.NH * capacity * hs, -7.0),
      vcache(kcache.size(), -7.0);
  int pos = 0;
  for (int n : {5, 1, 1, 9, 1, 20}) {
    ASSERT_LE(pos + n, p.T);
    attention_decode(&out[pos * C], kcache.data(), vcache.data(),
                     &p.inp[pos * 3 * C], n, pos, C, p.NH, p.NH, capacity);
    pos += n;
  }
  ASSERT_EQ(pos, p.T);
  for (size_t i = 0; i < out.size(); i++) {
    ASSERT_NEAR(out[i], p.out[i], 1e-12) << "position " << i / C;
  }
  for (int h = 0; h < p.NH; h++) {
    for (int t = 0; t < p.T; t++) {
      for (int d = 0; d < hs; d++) {
        const double* qkv = &p.inp[t * 3 * C + h * hs + d];
        const size_t at = (static_cast<size_t>(h) * capacity + t) * hs + d;
        ASSERT_EQ(kcache[at], qkv[C]) << "head " << h << " position " << t;
        ASSERT_EQ(vcache[at], qkv[2 * C]) << "head " << h << " position " << t;
      }
    }
  }
  // Float, one position at a time: within float rounding of double.
  std::vector<float> fout(out.size()), fk(kcache.size()), fv(vcache.size());
  const std::vector<float> finp = ToFloat(p.inp);
  for (int t = 0; t < p.T; t++) {
    attention_decode(&fout[t * C], fk.data(), fv.data(), &finp[t * 3 * C], 1, t,
                     C, p.NH, p.NH, capacity);
  }
  ExpectFloatMatchesDouble("attention decode out", fout, p.out);
}

// Grouped-query attention (KVH < NH) is multi-head attention over its
// key and value heads repeated for each query head of their group, the
// repeated heads' gradients summed: every kernel, without the repetition.
struct GroupedProblem {
  GroupedProblem(int B_, int T_, int NH_, int KVH_, int hs_, uint64_t seed)
      : B(B_),
        T(T_),
        NH(NH_),
        KVH(KVH_),
        hs(hs_),
        C(NH_ * hs_),
        heads(math::MakeAttentionHeads(C, NH, KVH)) {
    std::mt19937_64 rng(seed);
    grouped = Random(int64_t{B} * T * heads.row(), &rng);
    dout = Random(int64_t{B} * T * C, &rng);
    full = Repeat(grouped);
  }
  // Grouped rows as multi-head rows (3C), each key/value head repeated.
  Vec Repeat(const Vec& g) const {
    Vec m(int64_t{B} * T * 3 * C);
    for (int64_t r = 0; r < int64_t{B} * T; ++r) {
      const double* x = &g[r * heads.row()];
      double* y = &m[r * 3 * C];
      std::copy(x, x + C, y);
      for (int h = 0; h < NH; ++h) {
        const double* k = x + C + h / (NH / KVH) * hs;  // the group's head
        std::copy(k, k + hs, y + C + h * hs);
        std::copy(k + heads.K(), k + heads.K() + hs, y + 2 * C + h * hs);
      }
    }
    return m;
  }
  // A multi-head rows' gradient summed into grouped rows.
  Vec Sum(const Vec& m) const {
    Vec g(int64_t{B} * T * heads.row(), 0.0);
    for (int64_t r = 0; r < int64_t{B} * T; ++r) {
      const double* x = &m[r * 3 * C];
      double* y = &g[r * heads.row()];
      for (int c = 0; c < C; ++c) y[c] += x[c];
      for (int h = 0; h < NH; ++h) {
        double* k = y + C + h / (NH / KVH) * hs;
        for (int d = 0; d < hs; ++d) {
          k[d] += x[C + h * hs + d];
          k[heads.K() + d] += x[2 * C + h * hs + d];
        }
      }
    }
    return g;
  }
  int B, T, NH, KVH, hs, C;
  math::AttentionHeads heads;
  Vec grouped, full, dout;
};

void ExpectClose(const std::string& what, const Vec& got, const Vec& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-12) << what << " " << i;
  }
}

TEST(GroupedQueryAttentionTest, EveryKernelIsMultiHeadOverRepeatedHeads) {
  for (int KVH : {1, 2}) {
    // T 70: past one 64-row tile; 600: past the flash kernel's 512 keys.
    for (int T : {70, 600}) {
      SCOPED_TRACE("KVH " + std::to_string(KVH) + " T " + std::to_string(T));
      const GroupedProblem p(/*B=*/2, T, /*NH=*/4, KVH, /*hs=*/8, 41 + KVH);
      const int64_t BT = int64_t{p.B} * T, n = BT * p.C;
      Vec att(int64_t{p.B} * p.NH * T * T), datt(att.size());
      // The probabilities' kernels.
      Vec want(n), got(n);
      attention_forward(want.data(), att.data(), p.full.data(), p.B, T, p.C,
                        p.NH, p.NH);
      attention_forward(got.data(), att.data(), p.grouped.data(), p.B, T, p.C,
                        p.NH, KVH);
      ExpectClose("attention out", got, want);
      Vec dfull(p.full.size(), 0.0), dgrouped(p.grouped.size(), 0.0);
      attention_backward(dfull.data(), datt.data(), p.dout.data(),
                         p.full.data(), att.data(), p.B, T, p.C, p.NH, p.NH);
      attention_backward(dgrouped.data(), datt.data(), p.dout.data(),
                         p.grouped.data(), att.data(), p.B, T, p.C, p.NH, KVH);
      ExpectClose("attention dinp", dgrouped, p.Sum(dfull));
      // The flash kernels.
      Vec lse(int64_t{p.B} * p.NH * T), lse_full(lse.size());
      flash_attention_forward(want.data(), lse_full.data(), p.full.data(), p.B,
                              T, p.C, p.NH, p.NH);
      flash_attention_forward(got.data(), lse.data(), p.grouped.data(), p.B, T,
                              p.C, p.NH, KVH);
      ExpectClose("flash out", got, want);
      ExpectClose("flash lse", lse, lse_full);
      std::fill(dfull.begin(), dfull.end(), 0.0);
      std::fill(dgrouped.begin(), dgrouped.end(), 0.0);
      flash_attention_backward(dfull.data(), p.dout.data(), p.full.data(),
                               want.data(), lse.data(), p.B, T, p.C, p.NH,
                               p.NH);
      flash_attention_backward(dgrouped.data(), p.dout.data(), p.grouped.data(),
                               got.data(), lse.data(), p.B, T, p.C, p.NH, KVH);
      ExpectClose("flash dinp", dgrouped, p.Sum(dfull));
      // Ring attention's blocks: cp 2, rank 1's queries over rank 0's keys
      // (the same rows standing for both ranks' blocks).
      const int64_t R = p.heads.row();
      Vec bwant(n), bgot(n), blse_full(lse.size()), blse(lse.size());
      attention_block_forward(bwant.data(), blse_full.data(), p.full.data(),
                              p.full.data() + p.C, 3 * p.C, p.B, T, p.C, p.NH,
                              p.NH, 2, 1, 0, /*first=*/true);
      attention_block_forward(bgot.data(), blse.data(), p.grouped.data(),
                              p.grouped.data() + p.C, R, p.B, T, p.C, p.NH, KVH,
                              2, 1, 0, /*first=*/true);
      ExpectClose("block out", bgot, bwant);
      std::fill(dfull.begin(), dfull.end(), 0.0);
      std::fill(dgrouped.begin(), dgrouped.end(), 0.0);
      attention_block_backward(dfull.data(), dfull.data() + p.C, p.dout.data(),
                               p.full.data(), bwant.data(), blse_full.data(),
                               p.full.data() + p.C, 3 * p.C, p.B, T, p.C, p.NH,
                               p.NH, 2, 1, 0);
      attention_block_backward(dgrouped.data(), dgrouped.data() + p.C,
                               p.dout.data(), p.grouped.data(), bgot.data(),
                               blse.data(), p.grouped.data() + p.C, R, p.B, T,
                               p.C, p.NH, KVH, 2, 1, 0);
      ExpectClose("block dinp", dgrouped, p.Sum(dfull));
    }
  }
}

// The bf16 kernels read grouped rows as they are, a unit's heads sharing
// one key/value head (broadcast over their batched products): the same
// forward as multi-head attention's over the repeated heads, bit for bit;
// the same gradient up to the fp32 sum over a group, which is one unit's,
// in one order whatever the thread count. Over several tiles, a sequence
// or two, and thread counts whose units take one or several heads.
TEST(GroupedQueryAttentionTest, Bf16KernelsAreMultiHeadOverRepeatedHeads) {
  if (!CpuHasBf16()) GTEST_SKIP() << kNoBf16;
  const int saved = omp_get_max_threads();
  for (int B : {1, 2}) {
    for (int KVH : {1, 2}) {
      const GroupedProblem p(B, /*T=*/130, /*NH=*/4, KVH, /*hs=*/8, 47 + KVH);
      const int64_t n = int64_t{p.B} * p.T * p.C;
      const std::vector<float> full = ToFloat(p.full),
                               grouped = ToFloat(p.grouped),
                               dout = ToFloat(p.dout);
      std::vector<float> dg_one;
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(::testing::Message() << "B " << B << " KVH " << KVH << ", "
                                          << threads << " threads");
        omp_set_num_threads(threads);
        std::vector<float> att((int64_t{p.B} * p.NH * p.T * p.T + 1) / 2),
            att_g(att.size()), want(n), got(n);
        attention_forward_bf16(want.data(), att.data(), full.data(), p.B, p.T,
                               p.C, p.NH, p.NH);
        attention_forward_bf16(got.data(), att_g.data(), grouped.data(), p.B,
                               p.T, p.C, p.NH, p.KVH);
        EXPECT_EQ(got, want);
        EXPECT_EQ(att_g, att);
        std::vector<float> dfull(full.size(), 0.0f), dg(grouped.size(), 0.0f);
        attention_backward_bf16(dfull.data(), nullptr, dout.data(), full.data(),
                                att.data(), p.B, p.T, p.C, p.NH, p.NH);
        attention_backward_bf16(dg.data(), nullptr, dout.data(), grouped.data(),
                                att.data(), p.B, p.T, p.C, p.NH, p.KVH);
        const Vec sum = p.Sum(Vec(dfull.begin(), dfull.end()));
        for (size_t i = 0; i < dg.size(); ++i) {
          ASSERT_NEAR(dg[i], sum[i], 1e-6 * (1 + std::fabs(sum[i]))) << i;
        }
        if (dg_one.empty()) dg_one = dg;
        EXPECT_EQ(dg, dg_one);
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(GroupedQueryAttentionTest, DecodeCachesEachKeyValueHeadOnce) {
  const GroupedProblem p(/*B=*/1, /*T=*/21, /*NH=*/6, /*KVH=*/2, /*hs=*/4, 43);
  const int cap = 24, C = p.C, hs = p.hs;
  Vec want(int64_t{p.T} * C), got(want.size());
  Vec kf(int64_t{p.NH} * cap * hs), vf(kf.size());
  Vec kg(int64_t{p.KVH} * cap * hs, -7.0), vg(kg.size(), -7.0);
  int pos = 0;
  for (int n : {4, 1, 16}) {
    attention_decode(&want[pos * C], kf.data(), vf.data(), &p.full[pos * 3 * C],
                     n, pos, C, p.NH, p.NH, cap);
    attention_decode(&got[pos * C], kg.data(), vg.data(),
                     &p.grouped[pos * p.heads.row()], n, pos, C, p.NH, p.KVH,
                     cap);
    pos += n;
  }
  ExpectClose("decode out", got, want);
  for (int g = 0; g < p.KVH; ++g) {
    for (int t = 0; t < p.T; ++t) {
      for (int d = 0; d < hs; ++d) {
        const double* k = &p.grouped[t * p.heads.row() + C + g * hs + d];
        const size_t at = (static_cast<size_t>(g) * cap + t) * hs + d;
        ASSERT_EQ(kg[at], k[0]) << "head " << g << " position " << t;
        ASSERT_EQ(vg[at], k[p.heads.K()]) << "head " << g << " position " << t;
      }
    }
  }
}

// ------------------------------------------------------------------- gelu

TEST(GeluTest, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(5);
  Vec inp = Random(157, &rng, -5.0, 5.0);
  const Vec dout = Random(inp.size(), &rng);
  Vec out(inp.size()), dinp(inp.size());
  gelu_backward(dinp.data(), inp.data(), dout.data(), inp.size());
  auto loss = [&] {
    gelu_forward(out.data(), inp.data(), inp.size());
    return Dot(out, dout);
  };
  EXPECT_LE(MaxGradError("gelu dinp", &inp, dinp, loss), kGradTol);
  ExpectOverwrites({&dinp}, [&] {
    gelu_backward(dinp.data(), inp.data(), dout.data(), inp.size());
  });
  // In place over dout, as the engine calls it.
  Vec in_place = dout;
  gelu_backward(in_place.data(), inp.data(), in_place.data(), inp.size());
  EXPECT_EQ(in_place, dinp);
}

// The tanh formula itself in long double. 1 + tanh(u) cancels for negative
// x, so it is trusted only down to x = -5, where it is ~1e-7 and long double
// still keeps ~12 digits of it.
double GeluReference(double x) {
  const long double xl = x;
  const long double u =
      std::sqrt(2.0L / M_PIl) * (xl + 0.044715L * xl * xl * xl);
  return static_cast<double>(0.5L * xl * (1.0L + std::tanh(u)));
}

// The shared formulas with an exact exp, as the GPU computes them (the CPU's
// ExpF saturates, which hid this): for x below about -10, exp(-2u)
// overflows to inf, and the gradient must still be finite (0), not NaN —
// a NaN there stopped GPU runs after a thousand steps at a high learning rate.
TEST(GeluTest, SharedFormulasStayFiniteWhereExpOverflows) {
  for (float x : {-10.0f, -10.5f, -12.0f, -20.0f, -100.0f, -1e4f, 0.0f, 1e-30f,
                  20.0f, 100.0f, 1e4f}) {
    const float e = std::exp(math::GeluExponent(x));
    const float y = math::GeluFromExp(x, e);
    const float dy = math::GeluGradFromExp(x, e);
    EXPECT_TRUE(std::isfinite(y)) << "x " << x << " e " << e;
    EXPECT_TRUE(std::isfinite(dy)) << "x " << x << " e " << e;
    if (x <= -12.0f) {
      EXPECT_EQ(dy, 0.0f) << "x " << x;
    }
    if (x >= 20.0f) {
      EXPECT_FLOAT_EQ(dy, 1.0f) << "x " << x;
    }
  }
  // Near the overflow the gradient is tiny and of the right sign (GELU
  // falls towards 0 from below as x decreases: dGELU/dx < 0 there).
  const float x = -9.0f;
  const float dy = math::GeluGradFromExp(x, std::exp(math::GeluExponent(x)));
  EXPECT_LE(dy, 0.0f);
  EXPECT_GT(dy, -1e-10f);
}

TEST(GeluTest, ForwardMatchesTanhFormula) {
  Vec inp;
  for (double x = -12.0; x <= 12.0; x += 1.0 / 64) inp.push_back(x);
  Vec out(inp.size());
  std::vector<float> outf(inp.size());
  gelu_forward(out.data(), inp.data(), inp.size());
  gelu_forward(outf.data(), ToFloat(inp).data(), inp.size());
  double maxrel_d = 0;
  double maxrel_f = 0;
  double worst_x = 0;
  for (size_t i = 0; i < inp.size(); i++) {
    if (inp[i] < -5.0) {
      // |GELU(x)| < 3e-7 here; float's 0.5 x (1 + tanhf) already gives 0.
      EXPECT_LE(std::abs(outf[i]), 3e-7) << "x " << inp[i];
      EXPECT_LE(std::abs(out[i]), 3e-7) << "x " << inp[i];
      continue;
    }
    const double ref = GeluReference(inp[i]);
    const double scale = std::max(std::abs(ref), 1e-300);
    maxrel_d = std::max(maxrel_d, std::abs(out[i] - ref) / scale);
    const double rel_f = std::abs(outf[i] - ref) / scale;
    if (rel_f > maxrel_f) {
      maxrel_f = rel_f;
      worst_x = inp[i];
    }
  }
  std::printf(
      "gelu vs tanh formula on [-5,12]: double maxrel %.3e, float maxrel "
      "%.3e (at x = %.4f)\n",
      maxrel_d, maxrel_f, worst_x);
  EXPECT_LE(maxrel_d, 1e-12);
  EXPECT_LE(maxrel_f, 2e-6);
}

TEST(GeluTest, FloatForwardAndBackwardMatchDouble) {
  std::mt19937_64 rng(6);
  const Vec inp = Random(1001, &rng, -6.0, 6.0);
  const Vec dout = Random(inp.size(), &rng);
  Vec out(inp.size()), dinp(inp.size());
  std::vector<float> outf(inp.size()), dinpf(inp.size());
  gelu_forward(out.data(), inp.data(), inp.size());
  gelu_backward(dinp.data(), inp.data(), dout.data(), inp.size());
  gelu_forward(outf.data(), ToFloat(inp).data(), inp.size());
  gelu_backward(dinpf.data(), ToFloat(inp).data(), ToFloat(dout).data(),
                inp.size());
  ExpectFloatMatchesDouble("gelu out", outf, out);
  ExpectFloatMatchesDouble("gelu dinp", dinpf, dinp);
}

// --------------------------------------------------------------- residual

TEST(ResidualTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  std::mt19937_64 rng(8);
  Vec inp1 = Random(97, &rng), inp2 = Random(97, &rng);
  const Vec dout = Random(97, &rng);
  Vec out(97), dinp1(97), dinp2(97);
  residual_backward(dinp1.data(), dinp2.data(), dout.data(), 97);
  auto loss = [&] {
    residual_forward(out.data(), inp1.data(), inp2.data(), 97);
    return Dot(out, dout);
  };
  EXPECT_LE(MaxGradError("residual dinp1", &inp1, dinp1, loss), kGradTol);
  EXPECT_LE(MaxGradError("residual dinp2", &inp2, dinp2, loss), kGradTol);
  ExpectAccumulates({&dinp1, &dinp2}, [&] {
    residual_backward(dinp1.data(), dinp2.data(), dout.data(), 97);
  });
  std::vector<float> outf(97);
  residual_forward(outf.data(), ToFloat(inp1).data(), ToFloat(inp2).data(), 97);
  loss();
  ExpectFloatMatchesDouble("residual out", outf, out);
}

// ----------------------------------------------------------- crossentropy

struct CrossentropyProblem {
  explicit CrossentropyProblem(int V = kV) : rng(9), V(V) {
    logits = Random(kB * kT * V, &rng, -3.0, 3.0);
    targets = RandomTokens(kB * kT, V, &rng);
    losses.resize(kB * kT);
    probs.resize(logits.size());
    dlogits.resize(logits.size());
  }
  // Mean loss over positions, as training uses it.
  double Loss() {
    crossentropy_softmax_forward(losses.data(), probs.data(), logits.data(),
                                 targets.data(), kB, kT, V);
    double sum = 0;
    for (double l : losses) sum += l;
    return sum * dloss;
  }
  void Backward() {
    Loss();
    crossentropy_softmax_backward(dlogits.data(), probs.data(), targets.data(),
                                  dloss, kB, kT, V);
  }
  std::mt19937_64 rng;
  int V;
  double dloss = 1.0 / (kB * kT);
  Vec logits;
  std::vector<int32_t> targets;
  Vec losses, probs, dlogits;
};

TEST(CrossentropyTest, BackwardMatchesFiniteDifferences) {
  CrossentropyProblem p;
  p.Backward();
  EXPECT_LE(MaxGradError("crossentropy dlogits", &p.logits, p.dlogits,
                         [&] { return p.Loss(); }),
            kGradTol);
}

// The backward overwrites dlogits (whatever it held) and may write it in
// place of the probabilities.
TEST(CrossentropyTest, BackwardOverwritesAndMayAliasProbs) {
  CrossentropyProblem p;
  p.Backward();
  const Vec want = p.dlogits;
  for (double& x : p.dlogits) x = 7.0;
  p.Backward();
  EXPECT_EQ(p.dlogits, want);
  Vec in_place = p.probs;
  crossentropy_softmax_backward(in_place.data(), in_place.data(),
                                p.targets.data(), p.dloss, kB, kT, p.V);
  EXPECT_EQ(in_place, want);
}

TEST(CrossentropyTest, ForwardIsStableForLargeLogits) {
  CrossentropyProblem p;
  for (double& x : p.logits) x += 1000.0;  // exp would overflow unshifted
  const double shifted = p.Loss();
  for (double& x : p.logits) x -= 1000.0;
  EXPECT_NEAR(shifted, p.Loss(), 1e-9);
  EXPECT_TRUE(std::isfinite(shifted));
}

TEST(CrossentropyTest, ForwardInPlaceMatchesSeparateProbs) {
  CrossentropyProblem p(/*V=*/1001);
  p.Loss();
  std::vector<float> logits = ToFloat(p.logits), probs(logits.size());
  std::vector<float> losses(kB * kT), losses_inplace(kB * kT);
  crossentropy_softmax_forward(losses.data(), probs.data(), logits.data(),
                               p.targets.data(), kB, kT, p.V);
  crossentropy_softmax_forward(losses_inplace.data(), logits.data(),
                               logits.data(), p.targets.data(), kB, kT, p.V);
  EXPECT_EQ(losses, losses_inplace);
  EXPECT_EQ(probs, logits);
  ExpectFloatMatchesDouble("crossentropy losses", losses, p.losses);
  ExpectFloatMatchesDouble("crossentropy probs", probs, p.probs);
}

void FusedClassifierOverBf16Logits(int Vl, int V);

// The fused classifier over logits stored in bf16: the losses and the
// gradient the fp32 classifier gives on their values, the gradient rounded
// to bf16 over them.
TEST(CrossentropyTest, FusedClassifierOverBf16LogitsIsTheFp32OneOfTheirValues) {
  // A vocabulary wide enough to be taken a few rows at a time, too.
  for (auto [Vl, V] : {std::pair{72, 67}, std::pair{300000, 299998}}) {
    SCOPED_TRACE(Vl);
    FusedClassifierOverBf16Logits(Vl, V);
  }
}

void FusedClassifierOverBf16Logits(int Vl, int V) {
  Ops& ops = CpuBf16Ops();
  const int B = 2, T = 5;
  const int64_t rows = int64_t{B} * T, n = rows * Vl;
  std::mt19937_64 rng(31);
  std::vector<float> logits = ToFloat(Random(n, &rng, -6, 6));
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = (r * 13) % V;
  std::vector<float> packed((n + 1) / 2);
  auto* bits = reinterpret_cast<uint16_t*>(packed.data());
  RoundToBf16Rows(bits, logits.data(), rows, Vl);
  std::vector<float> values(n);
  FromBf16Values(values.data(), bits, n);
  const float dloss = 0.05f;
  std::vector<float> losses(rows), stats(3 * rows), losses16(rows),
      stats16(3 * rows);
  CpuOps().crossentropy_forward_backward(losses.data(), values.data(),
                                         targets.data(), dloss, stats.data(), B,
                                         T, Vl, V);
  ops.crossentropy_forward_backward(
      losses16.data(), Act(packed.data(), DType::kBf16), targets.data(), dloss,
      stats16.data(), B, T, Vl, V);
  EXPECT_EQ(losses16, losses);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(internal::FromBf16(bits[i]), Bf16Round(values[i])) << i;
  }
}

// The vocabulary split in parts of Vl columns (the last padded past V),
// reduced by hand between the steps as a tensor-parallel group would: the
// losses and probabilities are those of the whole vocabulary, and each
// part's gradient is its columns of the whole gradient.
TEST(CrossentropyTest, VocabularyPartsReducedBetweenStepsEqualTheWhole) {
  CrossentropyProblem p;
  p.Backward();
  const int V = p.V, rows = kB * kT, Vl = 4, nparts = (V + Vl - 1) / Vl;
  ASSERT_GT(nparts * Vl, V);  // some padding
  std::vector<Vec> logits(nparts), probs(nparts), dlogits(nparts);
  std::vector<Vec> maxes(nparts, Vec(rows)), sums(nparts, Vec(rows)),
      shifted(nparts, Vec(rows));
  for (int k = 0; k < nparts; k++) {
    logits[k].assign(static_cast<size_t>(rows) * Vl, 1e30);  // padding: ignored
    for (int r = 0; r < rows; r++) {
      for (int j = 0; j < Vl && k * Vl + j < V; j++) {
        logits[k][r * Vl + j] = p.logits[r * V + k * Vl + j];
      }
    }
    probs[k].resize(logits[k].size());
    dlogits[k].assign(logits[k].size(), 0.0);
    crossentropy_parallel_max(maxes[k].data(), logits[k].data(), kB, kT, Vl,
                              k * Vl, V);
  }
  Vec max(rows, -1e300), sum(rows, 0.0), target(rows, 0.0), losses(rows);
  for (int k = 0; k < nparts; k++) {
    for (int r = 0; r < rows; r++) max[r] = std::max(max[r], maxes[k][r]);
  }
  for (int k = 0; k < nparts; k++) {
    crossentropy_parallel_exp(sums[k].data(), shifted[k].data(),
                              probs[k].data(), logits[k].data(), max.data(),
                              p.targets.data(), kB, kT, Vl, k * Vl, V);
    for (int r = 0; r < rows; r++) {
      sum[r] += sums[k][r];
      target[r] += shifted[k][r];
    }
  }
  for (int k = 0; k < nparts; k++) {
    crossentropy_parallel_finish(losses.data(), probs[k].data(), sum.data(),
                                 target.data(), kB, kT, Vl);
    crossentropy_parallel_backward(dlogits[k].data(), probs[k].data(),
                                   p.targets.data(), p.dloss, kB, kT, Vl,
                                   k * Vl);
  }
  double maxdiff = 0;
  for (int r = 0; r < rows; r++) {
    maxdiff = std::max(maxdiff, std::abs(losses[r] - p.losses[r]));
    for (int k = 0; k < nparts; k++) {
      for (int j = 0; j < Vl; j++) {
        const int g = k * Vl + j;
        const double want_p = g < V ? p.probs[r * V + g] : 0.0;
        const double want_d = g < V ? p.dlogits[r * V + g] : 0.0;
        maxdiff = std::max(maxdiff, std::abs(probs[k][r * Vl + j] - want_p));
        maxdiff = std::max(maxdiff, std::abs(dlogits[k][r * Vl + j] - want_d));
      }
    }
  }
  std::printf("crossentropy in %d vocabulary parts: maxdiff %.3e (tol 1e-12)\n",
              nparts, maxdiff);
  EXPECT_LE(maxdiff, 1e-12);
}

// ------------------------------------------------------------------ adamw

// PyTorch's single-tensor AdamW step, scalar, in double.
void AdamwReference(Vec* params, Vec* m, Vec* v, const Vec& grads, float lr,
                    float beta1, float beta2, float eps, float weight_decay,
                    int64_t t, float grad_scale) {
  const double b1 = beta1, b2 = beta2;
  const double bc1 = 1.0 - std::pow(b1, double(t));
  const double bc2 = 1.0 - std::pow(b2, double(t));
  for (size_t i = 0; i < params->size(); i++) {
    const double g = grads[i] * double(grad_scale);
    (*params)[i] *= 1.0 - double(lr) * double(weight_decay);
    (*m)[i] = b1 * (*m)[i] + (1.0 - b1) * g;
    (*v)[i] = b2 * (*v)[i] + (1.0 - b2) * g * g;
    const double denom = std::sqrt((*v)[i]) / std::sqrt(bc2) + double(eps);
    (*params)[i] -= double(lr) / bc1 * (*m)[i] / denom;
  }
}

TEST(AdamwTest, ThreeStepsMatchPytorchAdamw) {
  constexpr size_t kN = 1003;
  constexpr float kLr = 1e-2f, kBeta1 = 0.9f, kBeta2 = 0.95f, kEps = 1e-8f,
                  kWd = 0.1f, kGradScale = 0.7f;
  std::mt19937_64 rng(10);
  Vec ref_p = Random(kN, &rng), ref_m(kN), ref_v(kN);
  Vec p = ref_p, m(kN), v(kN);
  std::vector<float> pf = ToFloat(ref_p), mf(kN), vf(kN);
  for (int64_t t = 1; t <= 3; t++) {
    const Vec grads = Random(kN, &rng);
    AdamwReference(&ref_p, &ref_m, &ref_v, grads, kLr, kBeta1, kBeta2, kEps,
                   kWd, t, kGradScale);
    adamw_update(p.data(), m.data(), v.data(), grads.data(), kN, kLr, kBeta1,
                 kBeta2, kEps, kWd, t, kGradScale);
    adamw_update(pf.data(), mf.data(), vf.data(), ToFloat(grads).data(), kN,
                 kLr, kBeta1, kBeta2, kEps, kWd, t, kGradScale);
  }
  double maxdiff = 0;
  for (size_t i = 0; i < kN; i++) {
    maxdiff = std::max(maxdiff, std::abs(p[i] - ref_p[i]));
  }
  std::printf("adamw double vs reference maxdiff %.3e (tol 1e-12)\n", maxdiff);
  EXPECT_LE(maxdiff, 1e-12);
  ExpectFloatMatchesDouble("adamw params", pf, ref_p, 1e-6);
  ExpectFloatMatchesDouble("adamw m", mf, ref_m, 1e-6);
  ExpectFloatMatchesDouble("adamw v", vf, ref_v, 1e-6);
}

// ------------------------------------------------------------ sum_squares

TEST(SumSquaresTest, MatchesSimpleLoop) {
  std::mt19937_64 rng(11);
  const Vec x = Random(100003, &rng);
  const std::vector<float> xf = ToFloat(x);
  double ref = 0;
  double ref_f = 0;
  for (size_t i = 0; i < x.size(); i++) {
    ref += x[i] * x[i];
    ref_f += double(xf[i]) * double(xf[i]);
  }
  EXPECT_NEAR(sum_squares(x.data(), x.size()), ref, 1e-10 * ref);
  EXPECT_NEAR(sum_squares(xf.data(), xf.size()), ref_f, 1e-10 * ref_f);
  EXPECT_EQ(sum_squares(x.data(), 0), 0.0);
}

// The order of the additions is fixed (kernels/cpu/adamw.cpp): blocks of
// 2^14 elements, element i of a block in lane i % 8, the lanes added as a
// tree, the blocks in order. The same bits on any thread count, and the
// same as that order computed one element at a time here (test code is
// built at -O1: not vectorized), so not the compiler's vector width: the
// gradient norm and the clipped update are the same on every CPU.
TEST(SumSquaresTest, OneOrderWhateverTheThreadsAndTheVectorWidth) {
  std::mt19937_64 rng(12);
  const std::vector<float> x = ToFloat(Random(3 * 16384 + 1237, &rng));
  const int64_t n = static_cast<int64_t>(x.size());
  double want = 0;
  for (int64_t b = 0; b < n; b += 16384) {
    double lane[8] = {};
    for (int64_t i = b; i < std::min(n, b + 16384); ++i) {
      lane[(i - b) % 8] += double(x[i]) * double(x[i]);  // exact products
    }
    want += ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
            ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
  const int threads = omp_get_max_threads();
  for (int t : {1, 2, 3, 5}) {
    omp_set_num_threads(t);
    EXPECT_EQ(sum_squares(x.data(), n), want) << t << " threads";
  }
  omp_set_num_threads(threads);
}

// bf16 training needs bf16 tensor cores (compute capability 8.0): older
// GPUs are refused with their capability and the rule; 8.0 and newer pass.
TEST(CudaCapability, Bf16NeedsComputeCapabilityEight) {
  for (int ok : {80, 86, 89, 90, 100}) {
    EXPECT_EQ(Bf16Unsupported(ok), "") << ok;
  }
  const std::string volta = Bf16Unsupported(70);
  EXPECT_NE(volta.find("7.0"), std::string::npos) << volta;
  EXPECT_NE(volta.find("8.0 or newer"), std::string::npos) << volta;
  EXPECT_NE(Bf16Unsupported(75).find("7.5"), std::string::npos);
  EXPECT_NE(Bf16Unsupported(0).find("unknown"), std::string::npos);
  // No device of that number (or no backend): nothing to read.
  EXPECT_EQ(CudaComputeCapability(CudaDeviceCount()), 0);
}

}  // namespace
}  // namespace ptrain::kernels
