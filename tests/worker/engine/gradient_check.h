// A one-stage model's gradients against central differences of its whole
// objective (the cross-entropy plus the losses its parts report), on a
// fixed random batch: the check the part tests share.
#ifndef PTRAIN_TESTS_WORKER_ENGINE_GRADIENT_CHECK_H_
#define PTRAIN_TESTS_WORKER_ENGINE_GRADIENT_CHECK_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/plan.h"
#include "worker/engine/model/rng.h"

namespace ptrain::gradient_check {

constexpr int kB = 2, kT = 8;

inline std::unique_ptr<GptStage> Stage(const GptConfig& c) {
  StageOptions o;
  o.max_B = kB;
  o.max_T = kT;
  return std::make_unique<GptStage>(c, BuildPlan(c, {}), o);
}

inline const ParamInfo& Tensor(const GptStage& s, const std::string& name) {
  for (const ParamInfo& p : s.layout()) {
    if (p.name == name) return p;
  }
  ADD_FAILURE() << "no tensor " << name;
  return s.layout().front();
}

struct Batch {
  std::vector<int32_t> in, tg;
};
inline Batch MakeBatch(const GptConfig& c) {
  Batch b{std::vector<int32_t>(kB * kT), std::vector<int32_t>(kB * kT)};
  for (int i = 0; i < kB * kT; ++i) {
    b.in[i] = CounterRandom64(7, 1, i) % c.vocab_size;
    b.tg[i] = CounterRandom64(7, 2, i) % c.vocab_size;
  }
  return b;
}

// The objective whose gradient Backward(dloss = 1) accumulates: B·T times
// the mean cross-entropy plus the parts' losses.
inline double Objective(GptStage& s, const Batch& b) {
  s.part_stats().Clear();
  const double ce = s.Forward(0, b.in.data(), nullptr, b.tg.data(), kB, kT);
  return double{kB} * kT * (ce + s.part_stats().losses);
}

// The stage's gradients of batch `b` (zeroed, then one forward and
// backward).
inline void Gradients(GptStage& s, const Batch& b) {
  s.ZeroGrad();
  Objective(s, b);
  s.Backward(0, b.in.data(), b.tg.data(), /*dloss=*/1.0f, nullptr);
}

// The relative error (over up to 16 of its elements) of tensor `name`'s
// gradient, as Gradients left it, against the objective's central
// differences; *numeric_norm gets the differences' norm.
inline double RelativeError(GptStage& s, const Batch& b,
                            const std::string& name, double* numeric_norm) {
  const ParamInfo& p = Tensor(s, name);
  double err2 = 0, num2 = 0;
  const int64_t stride = std::max<int64_t>(1, p.numel / 16);
  for (int64_t i = 0; i < p.numel; i += stride) {
    float* w = s.params() + p.offset + i;
    const float saved = *w;
    const float h = 1e-2f * std::max(1.0f, std::fabs(saved));
    *w = saved + h;
    const double plus = Objective(s, b);
    *w = saved - h;
    const double minus = Objective(s, b);
    *w = saved;
    const double numeric = (plus - minus) / (2.0 * h);
    const double analytic = s.grads()[p.offset + i];
    err2 += (analytic - numeric) * (analytic - numeric);
    num2 += numeric * numeric;
  }
  *numeric_norm = std::sqrt(num2);
  return std::sqrt(err2 / num2);
}

}  // namespace ptrain::gradient_check

#endif  // PTRAIN_TESTS_WORKER_ENGINE_GRADIENT_CHECK_H_
