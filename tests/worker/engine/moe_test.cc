// The Mixture-of-Experts MLP (parts/moe_mlp.cc) on one rank: its gradients
// are the central differences of the whole objective (the cross-entropy
// plus the balance and z losses the stage reports), for GELU and SwiGLU
// experts, with shared experts, dropless and with a capacity that drops
// tokens; one expert chosen by every token is the dense MLP.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/worker/engine/gradient_check.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/plan.h"
#include "worker/engine/model/rng.h"
#include "worker/engine/parallel/zero_store.h"
#include "worker/engine/report/expert_load.h"
#include "worker/engine/train/expert_report.h"

namespace ptrain {
namespace {

using gradient_check::Batch;
using gradient_check::Gradients;
using gradient_check::kB;
using gradient_check::kT;
using gradient_check::MakeBatch;
using gradient_check::Objective;
using gradient_check::RelativeError;
using gradient_check::Stage;
using gradient_check::Tensor;

GptConfig MoeConfig(bool llama, float capacity_factor) {
  GptConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 12;
  c.block_size = kT;
  c.vocab_size = 13;
  c.padded_vocab = 128;
  if (llama) {
    c.arch = "llama";
    c.ffn_hidden = 16;
  }
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.shared = 1;
  c.moe.hidden = 10;
  c.moe.capacity_factor = capacity_factor;
  c.moe.aux_coef = 0.1f;
  c.moe.z_coef = 0.01f;
  return c;
}

struct Case {
  bool llama;
  float capacity_factor;
};

class MoeGradient : public ::testing::TestWithParam<Case> {};

TEST_P(MoeGradient, GradientsAreTheObjectivesCentralDifferences) {
  const GptConfig c = MoeConfig(GetParam().llama, GetParam().capacity_factor);
  auto stage = Stage(c);
  stage->InitParams(5);
  // Router logits far apart next to the steps below, so that a step never
  // changes which experts a token chooses (the objective is not smooth
  // there).
  // The experts' weights larger too, for gradients well above the
  // differences' rounding (SwiGLU's product of two small layers is tiny at
  // initialisation).
  for (const ParamInfo& p : stage->layout()) {
    const bool router = p.name == "h.0.mlp.router.weight";
    if (!router && p.name.find(".mlp.") == std::string::npos) continue;
    for (int64_t i = 0; i < p.numel; ++i) {
      stage->params()[p.offset + i] *= router ? 60 : 8;
    }
  }
  const Batch b = MakeBatch(c);
  Gradients(*stage, b);
  const std::string first = c.arch == "llama" ? "gate_up_proj" : "c_fc";
  const std::string second = c.arch == "llama" ? "down_proj" : "c_proj";
  for (const std::string& name :
       {std::string("mlp.router.weight"), "mlp.experts.0." + first + ".weight",
        "mlp.experts.3." + second + ".weight",
        "mlp.shared." + first + ".weight", "mlp.shared." + second + ".weight",
        std::string("ln_2.weight")}) {
    double numeric = 0;
    const double rel = RelativeError(*stage, b, "h.0." + name, &numeric);
    std::printf("%-36s |numeric| %.3e  relative error %.3e\n", name.c_str(),
                numeric, rel);
    EXPECT_GT(numeric, 1e-3) << name << ": no gradient to check";
    EXPECT_LT(rel, 2e-2) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Experts, MoeGradient,
                         ::testing::Values(Case{false, 0.0f}, Case{true, 0.0f},
                                           Case{false, 1.0f}, Case{true, 1.0f}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.llama ? "SwiGLU"
                                                            : "GELU") +
                                  (i.param.capacity_factor > 0 ? "Capacity"
                                                               : "Dropless");
                         });

// A capacity factor of 1 drops tokens here (the router's scores are
// skewed by its scaled weights), and dropping changes the loss.
TEST(MoeCapacity, ATightCapacityDropsTokensAndChangesTheLoss) {
  auto loss = [](float capacity_factor) {
    const GptConfig c = MoeConfig(false, capacity_factor);
    auto stage = Stage(c);
    stage->InitParams(5);
    const ParamInfo& router = Tensor(*stage, "h.0.mlp.router.weight");
    for (int64_t i = 0; i < router.numel; ++i) {
      stage->params()[router.offset + i] *= 60;
    }
    return Objective(*stage, MakeBatch(c));
  };
  EXPECT_NE(loss(0.5f), loss(0.0f));
  // The stage counts each layer's load: the tokens kept per expert and the
  // choices dropped add up to the microbatch's choices.
  const GptConfig c = MoeConfig(false, 0.5f);
  auto stage = Stage(c);
  stage->InitParams(5);
  Objective(*stage, MakeBatch(c));
  const PartStats& stats = stage->part_stats();
  ASSERT_EQ(stats.tokens.size(), 1u);
  const std::vector<double>& kept = stats.tokens.at(0);
  ASSERT_EQ(kept.size(), 4u);
  double sum = 0;
  for (double n : kept) {
    EXPECT_LE(n, kB * c.moe.Capacity(kT));
    sum += n;
  }
  EXPECT_GT(stats.dropped.at(0), 0);
  EXPECT_EQ(sum + stats.dropped.at(0), kB * kT * c.moe.top_k);
  // A capacity no sequence reaches drops nothing.
  EXPECT_EQ(loss(8.0f), loss(0.0f));
}

// Routing, capacity and the balance losses are per sequence: a batch in
// two microbatches of one sequence accumulates the gradients of the batch
// in one, and the same part losses, tokens dropped or not.
TEST(MoeMlp, MicrobatchesAccumulateTheWholeBatch) {
  for (float capacity_factor : {0.0f, 1.0f}) {
    const GptConfig c = MoeConfig(true, capacity_factor);
    auto whole = Stage(c), half = Stage(c);
    whole->InitParams(3);
    half->InitParams(3);
    whole->ZeroGrad();
    half->ZeroGrad();
    const Batch b = MakeBatch(c);
    const float dloss = 1.0f / (kB * kT);
    const double l = Objective(*whole, b);
    whole->Backward(0, b.in.data(), b.tg.data(), dloss, nullptr);
    double l2 = 0;
    for (int s = 0; s < kB; ++s) {
      const int32_t* in = b.in.data() + s * kT;
      const int32_t* tg = b.tg.data() + s * kT;
      half->part_stats().Clear();
      const float ce = half->Forward(0, in, nullptr, tg, 1, kT);
      l2 += double{kT} * (ce + half->part_stats().losses);
      half->Backward(0, in, tg, dloss, nullptr);
    }
    EXPECT_NEAR(l, l2, 1e-4 * l);
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < whole->buffer_size(); ++i) {
      diff = std::max(diff,
                      double{std::fabs(whole->grads()[i] - half->grads()[i])});
      scale = std::max(scale, double{std::fabs(whole->grads()[i])});
    }
    EXPECT_GT(scale, 0.0);
    EXPECT_LE(diff, 1e-5 * scale) << "capacity factor " << capacity_factor;
  }
}

// Gives `moe`'s tensors the weights of `dense`'s: every tensor but the
// router is named alike, expert 0's as the dense MLP's.
void CopyDenseWeights(GptStage& dense, GptStage* moe) {
  for (const ParamInfo& p : moe->layout()) {
    std::string name = p.name;
    const std::string expert = "mlp.experts.0.";
    if (name.find("mlp.router") != std::string::npos) continue;
    if (const size_t at = name.find(expert); at != std::string::npos) {
      name.replace(at, expert.size(), "mlp.");
    }
    const ParamInfo& q = Tensor(dense, name);
    ASSERT_EQ(q.numel, p.numel) << name;
    std::copy(dense.params() + q.offset, dense.params() + q.offset + q.numel,
              moe->params() + p.offset);
  }
}

// One expert that every token chooses with weight 1 (softmax over one
// logit), no shared experts and no balance losses, is the dense MLP: the
// same loss and the same gradients, given the same weights.
TEST(MoeMlp, OneExpertIsTheDenseMlp) {
  for (bool llama : {false, true}) {
    GptConfig moe = MoeConfig(llama, 0.0f);
    moe.moe = {};
    moe.moe.experts = 1;
    moe.moe.top_k = 1;
    GptConfig dense = moe;
    dense.moe = {};
    moe.moe.hidden = dense.hidden();
    auto a = Stage(dense), e = Stage(moe);
    a->InitParams(9);
    e->InitParams(9);
    const std::string second = llama ? "down_proj" : "c_proj";
    CopyDenseWeights(*a, e.get());
    const Batch b = MakeBatch(moe);
    a->ZeroGrad();
    e->ZeroGrad();
    const float la = a->Forward(0, b.in.data(), nullptr, b.tg.data(), kB, kT);
    const float le = e->Forward(0, b.in.data(), nullptr, b.tg.data(), kB, kT);
    EXPECT_NEAR(le, la, 1e-6) << (llama ? "llama" : "gpt");
    a->Backward(0, b.in.data(), b.tg.data(), 1.0f / (kB * kT), nullptr);
    e->Backward(0, b.in.data(), b.tg.data(), 1.0f / (kB * kT), nullptr);
    const ParamInfo& pe = Tensor(*e, "h.0.mlp.experts.0." + second + ".weight");
    const ParamInfo& pa = Tensor(*a, "h.0.mlp." + second + ".weight");
    const ParamInfo& we = Tensor(*e, "wte");
    const ParamInfo& wa = Tensor(*a, "wte");
    double diff = 0, scale = 0;
    for (const auto& [x, y] : {std::pair{&pe, &pa}, std::pair{&we, &wa}}) {
      for (int64_t i = 0; i < x->numel; ++i) {
        const double g = a->grads()[y->offset + i];
        diff = std::max(diff, std::fabs(e->grads()[x->offset + i] - g));
        scale = std::max(scale, std::fabs(g));
      }
    }
    EXPECT_GT(scale, 0.0);
    EXPECT_LE(diff, 1e-5 * scale) << (llama ? "llama" : "gpt");
    // The router's gradient is zero: one expert's score is 1 whatever it.
    const ParamInfo& r = Tensor(*e, "h.0.mlp.router.weight");
    for (int64_t i = 0; i < r.numel; ++i) {
      EXPECT_EQ(e->grads()[r.offset + i], 0.0f);
    }
  }
}

// model.moe.every=2: blocks 0 and 2 have the dense MLP's tensors (its
// biases too) and no router, blocks 1 and 3 the experts; with one expert
// weighing 1 the model is the dense one (the same loss and gradients, the
// dense blocks' and the experts' alike, in a split backward too), and only
// the MoE blocks report a load.
TEST(MoeMlp, EverySecondBlockIsDense) {
  for (bool llama : {false, true}) {
    GptConfig moe = MoeConfig(llama, 0.0f);
    moe.n_layer = 4;
    moe.moe = {};
    moe.moe.experts = 1;
    moe.moe.top_k = 1;
    moe.moe.every = 2;
    GptConfig dense = moe;
    dense.moe = {};
    moe.moe.hidden = dense.hidden();
    const std::string first = llama ? "gate_up_proj" : "c_fc";
    const std::string second = llama ? "down_proj" : "c_proj";
    std::set<std::string> names;
    for (const ParamInfo& p : GptTensors(moe)) names.insert(p.name);
    for (int l : {0, 2}) {
      const std::string at = "h." + std::to_string(l) + ".mlp.";
      EXPECT_EQ(names.count(at + first + ".weight"), 1u) << at;
      EXPECT_EQ(names.count(at + "router.weight"), 0u) << at;
      EXPECT_EQ(names.count(at + "experts.0." + first + ".weight"), 0u) << at;
    }
    for (int l : {1, 3}) {
      const std::string at = "h." + std::to_string(l) + ".mlp.";
      EXPECT_EQ(names.count(at + first + ".weight"), 0u) << at;
      EXPECT_EQ(names.count(at + "router.weight"), 1u) << at;
    }
    if (!llama) {
      EXPECT_EQ(names.count("h.2.mlp.c_fc.bias"), 1u);
    }
    for (bool split : {false, true}) {
      StageOptions o;
      o.max_B = kB;
      o.max_T = kT;
      o.split_backward = split;
      GptStage a(dense, BuildPlan(dense, {}), o), e(moe, BuildPlan(moe, {}), o);
      a.InitParams(9);
      e.InitParams(9);
      CopyDenseWeights(a, &e);
      const Batch b = MakeBatch(moe);
      a.ZeroGrad();
      e.ZeroGrad();
      e.part_stats().Clear();
      const float la = a.Forward(0, b.in.data(), nullptr, b.tg.data(), kB, kT);
      const float le = e.Forward(0, b.in.data(), nullptr, b.tg.data(), kB, kT);
      EXPECT_NEAR(le, la, 1e-6) << (llama ? "llama" : "gpt");
      std::vector<int> loaded;
      for (const auto& [layer, tokens] : e.part_stats().tokens) {
        loaded.push_back(layer);
      }
      EXPECT_EQ(loaded, (std::vector<int>{1, 3}));
      for (GptStage* s : {&a, &e}) {
        const float dloss = 1.0f / (kB * kT);
        if (split) {
          s->BackwardInput(0, b.in.data(), b.tg.data(), dloss, nullptr);
          s->BackwardWeights(0);
        } else {
          s->Backward(0, b.in.data(), b.tg.data(), dloss, nullptr);
        }
      }
      for (const std::string& name :
           {"h.0.mlp." + first + ".weight", "h.2.mlp." + second + ".weight",
            "h.3.mlp.experts.0." + second + ".weight", std::string("wte")}) {
        std::string dense_name = name;
        if (const size_t at = name.find("experts.0."); at != std::string::npos)
          dense_name.erase(at, 10);
        const ParamInfo& pe = Tensor(e, name);
        const ParamInfo& pa = Tensor(a, dense_name);
        double diff = 0, scale = 0;
        for (int64_t i = 0; i < pe.numel; ++i) {
          const double g = a.grads()[pa.offset + i];
          diff = std::max(diff, std::fabs(e.grads()[pe.offset + i] - g));
          scale = std::max(scale, std::fabs(g));
        }
        EXPECT_GT(scale, 0.0) << name;
        EXPECT_LE(diff, 1e-5 * scale) << name << (split ? " split" : "");
      }
    }
  }
}

// balance: bias: the selection bias picks the experts but weighs nothing
// and has no gradient. A large bias on expert 3 makes every token choose
// it; the loss changes (other experts' outputs), the bias's gradient stays
// zero.
TEST(MoeBias, TheBiasChoosesTheExpertsAndHasNoGradient) {
  GptConfig c = MoeConfig(false, 0.0f);
  c.moe.bias = true;
  c.moe.bias_rate = 0.001f;
  auto s = Stage(c);
  s->InitParams(5);
  const Batch b = MakeBatch(c);
  s->part_stats().Clear();
  const float even = s->Forward(0, b.in.data(), nullptr, b.tg.data(), kB, kT);
  const ParamInfo& bias = Tensor(*s, "h.0.mlp.router.expert_bias");
  ASSERT_EQ(bias.numel, 4);
  for (int64_t i = 0; i < bias.numel; ++i) {
    EXPECT_EQ(s->params()[bias.offset + i], 0.0f) << "zero at first";
  }
  s->params()[bias.offset + 3] = 100.0f;
  s->part_stats().Clear();
  s->ZeroGrad();
  const float pushed = s->Forward(0, b.in.data(), nullptr, b.tg.data(), kB, kT);
  EXPECT_NE(pushed, even);
  const std::vector<double>& tokens = s->part_stats().tokens.at(0);
  EXPECT_EQ(tokens[3], double{kB} * kT) << "every token chose expert 3";
  s->Backward(0, b.in.data(), b.tg.data(), 1.0f / (kB * kT), nullptr);
  for (int64_t i = 0; i < bias.numel; ++i) {
    EXPECT_EQ(s->grads()[bias.offset + i], 0.0f);
  }
}

// MoveExpertBias: each expert's bias moves by the rate against its load,
// up below the layer's mean, down above it, not at it; in every ZeRO
// stage's update buffer (the shard it updates).
TEST(MoeBias, EachStepMovesTheBiasAgainstTheLoad) {
  GptConfig c = MoeConfig(false, 0.0f);
  c.n_layer = 2;
  c.moe.bias = true;
  c.moe.bias_rate = 0.25f;
  ExpertLoad load;
  load.layers = {{0, {10, 30, 20, 20}, 0}, {1, {0, 0, 0, 80}, 0}};
  // Two steps: layer 0 (mean 20) moves once, layer 1 (mean 20) twice.
  const std::vector<std::vector<float>> want = {{0.25f, -0.25f, 0, 0},
                                                {0.5f, 0.5f, 0.5f, -0.5f}};
  ZeroStore store(BuildPlan(c, {}), 1, ZeroOptions{}, nullptr,
                  &kernels::CpuOps());
  store.InitParams(1);
  MoveExpertBias(store, load, c);
  load.layers[0].tokens = {20, 20, 20, 20};
  load.layers[1].tokens = {10, 10, 10, 50};
  MoveExpertBias(store, load, c);
  for (int l = 0; l < 2; ++l) {
    const std::string name =
        "h." + std::to_string(l) + ".mlp.router.expert_bias";
    store.ForEachUpdateStretch(
        [&](const ParamInfo& p, int64_t lo, int64_t hi, int64_t at) {
          if (p.name != name) return;
          for (int64_t i = lo; i < hi; ++i) {
            EXPECT_EQ(store.update_params()[at + i - lo], want[l][i])
                << name << "[" << i << "]";
          }
        });
  }
  GptConfig aux = c;
  aux.moe.bias = false;
  ZeroStore none(BuildPlan(aux, {}), 1, ZeroOptions{}, nullptr,
                 &kernels::CpuOps());
  none.InitParams(1);
  const std::vector<float> before(none.update_params(),
                                  none.update_params() + none.update_size());
  MoveExpertBias(none, load, aux);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), none.update_params()))
      << "balance: aux moves nothing";
}

}  // namespace
}  // namespace ptrain
