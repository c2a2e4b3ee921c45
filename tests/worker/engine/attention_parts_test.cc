// Llama's grouped-query attention with Qwen3's options on one rank: heads
// apart from the width (model.head_dim) and each query and key head
// normalised (model.qk_norm). Its tensors have the shapes those give, and
// every gradient is the objective's central differences.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/worker/engine/gradient_check.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/plan.h"

namespace ptrain {
namespace {

using gradient_check::Batch;
using gradient_check::kT;

struct Case {
  int head_dim;
  bool qk_norm;
};

GptConfig AttentionConfig(const Case& k) {
  GptConfig c;
  c.arch = "llama";
  c.n_layer = 1;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.n_embd = 12;
  c.head_dim = k.head_dim;
  c.qk_norm = k.qk_norm;
  c.ffn_hidden = 16;
  c.block_size = kT;
  c.vocab_size = 13;
  c.padded_vocab = 128;
  return c;
}

class AttentionGradient : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionGradient, ShapesAndGradientsAreTheObjectivesDifferences) {
  const GptConfig c = AttentionConfig(GetParam());
  const int64_t hs = c.head_size(), A = 2 * hs;
  auto stage = gradient_check::Stage(c);
  stage->InitParams(5);
  EXPECT_EQ(gradient_check::Tensor(*stage, "h.0.attn.q_proj.weight").shape,
            (std::vector<int64_t>{A, 12}));
  EXPECT_EQ(gradient_check::Tensor(*stage, "h.0.attn.k_proj.weight").shape,
            (std::vector<int64_t>{hs, 12}));
  EXPECT_EQ(gradient_check::Tensor(*stage, "h.0.attn.o_proj.weight").shape,
            (std::vector<int64_t>{12, A}));
  std::vector<std::string> names = {"attn.q_proj.weight", "attn.k_proj.weight",
                                    "attn.v_proj.weight", "attn.o_proj.weight"};
  if (c.qk_norm) {
    for (const char* n : {"attn.q_norm.weight", "attn.k_norm.weight"}) {
      const ParamInfo& p =
          gradient_check::Tensor(*stage, "h.0." + std::string(n));
      EXPECT_EQ(p.shape, (std::vector<int64_t>{hs}));
      // Away from their initial ones, for a gradient that tells them apart.
      for (int64_t i = 0; i < p.numel; ++i) {
        stage->params()[p.offset + i] = 0.5f + 0.1f * static_cast<float>(i);
      }
      names.push_back(n);
    }
  }
  // The projections larger, for gradients well above the differences'
  // rounding.
  for (const ParamInfo& p : stage->layout()) {
    if (p.name.find(".attn.") == std::string::npos ||
        p.name.find("_norm") != std::string::npos) {
      continue;
    }
    for (int64_t i = 0; i < p.numel; ++i) stage->params()[p.offset + i] *= 8;
  }
  const Batch b = gradient_check::MakeBatch(c);
  gradient_check::Gradients(*stage, b);
  for (const std::string& name : names) {
    double numeric = 0;
    const double rel =
        gradient_check::RelativeError(*stage, b, "h.0." + name, &numeric);
    std::printf("%-24s |numeric| %.3e  relative error %.3e\n", name.c_str(),
                numeric, rel);
    EXPECT_GT(numeric, 1e-3) << name << ": no gradient to check";
    EXPECT_LT(rel, 2e-2) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Qwen3, AttentionGradient,
                         ::testing::Values(Case{0, false}, Case{8, false},
                                           Case{0, true}, Case{8, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.head_dim > 0
                                                  ? "HeadDim8"
                                                  : "HeadDimOfTheWidth") +
                                  (i.param.qk_norm ? "QkNorm" : "");
                         });

}  // namespace
}  // namespace ptrain
