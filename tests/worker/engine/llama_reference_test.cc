// arch llama against the PyTorch Llama of bench/pytorch_llama.py, written
// from the published formulas: the same random weights, read from the
// Hugging Face folder that script wrote through model.init_from's reader
// (HfSource), the same batch, 21 passes with 20 AdamW steps between them,
// fp32 here against float64 there. PT_LLAMA_REFERENCE_DIRS names the
// folders (":"-separated: without and with Llama 3's rope scaling); ctest
// runs the script first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/hf_config.h"
#include "common/spec.h"
#include "kernels/cpu/kernels.h"
#include "tests/worker/engine/reference_io.h"
#include "worker/engine/checkpoint/hf_checkpoint.h"
#include "worker/engine/parallel/optimizer.h"

namespace ptrain {
namespace {

std::vector<std::string> Dirs() {
  const char* dirs = std::getenv("PT_LLAMA_REFERENCE_DIRS");
  if (dirs == nullptr) return {};
  return absl::StrSplit(dirs, ':', absl::SkipEmpty());
}

class LlamaReference : public ::testing::TestWithParam<int> {};

TEST_P(LlamaReference, LossesOfTwentyAdamWStepsTrackPyTorch) {
  const std::vector<std::string> dirs = Dirs();
  ASSERT_GT(dirs.size(), static_cast<size_t>(GetParam()))
      << "PT_LLAMA_REFERENCE_DIRS names no folder " << GetParam();
  const std::string dir = dirs[GetParam()];
  const testing::Records ref = testing::ReadRecords(dir + "/reference.bin");
  const std::vector<float>& cfg = ref.at("config").f32;
  const int L = cfg[0], NH = cfg[1], KVH = cfg[2], C = cfg[3], H = cfg[4],
            V = cfg[5], B = cfg[6], T = cfg[7];

  // The model as the folder's config.json says it.
  std::ifstream in(dir + "/config.json");
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  auto hf = ParseHfConfig(text, dir + "/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  GptConfig c{L, NH, C, T, V};
  c.arch = "llama";
  c.n_kv_head = KVH;
  c.ffn_hidden = H;
  c.tie_embeddings = false;
  c.norm_eps = static_cast<float>(hf->model.norm_eps());
  // Qwen3's attention: heads apart from the width, query/key norms.
  c.head_dim = hf->model.head_dim();
  c.qk_norm = hf->model.qk_norm();
  c.rope.theta = static_cast<float>(hf->model.rope_theta());
  const v1::RopeScalingSpec& rs = hf->model.rope_scaling();
  c.rope.factor = static_cast<float>(rs.factor());
  if (rs.factor() > 0) {
    c.rope.low_freq_factor = static_cast<float>(rs.low_freq_factor());
    c.rope.high_freq_factor = static_cast<float>(rs.high_freq_factor());
    c.rope.original_context = rs.original_context();
  }
  // Mixtral's folder: its experts (no balance loss: the reference's
  // objective is the cross-entropy alone).
  const v1::MoeSpec moe = MoeOf(hf->model);
  if (moe.experts() > 0) {
    c.moe.experts = moe.experts();
    c.moe.top_k = moe.top_k();
    c.moe.hidden = moe.expert_hidden();
    c.moe.every = moe.every();
    c.moe.aux_coef = static_cast<float>(moe.aux_loss_coef());
    EXPECT_EQ(c.moe.aux_coef, 0.0f);
  }
  c.padded_vocab = PaddedVocab(V, 1);
  EXPECT_EQ(hf->model.n_kv_head(), KVH);

  StageOptions o;
  o.max_B = B;
  o.max_T = T;
  GptStage model(c, BuildPlan(c, {}), o);
  auto src = HfSource::Open(dir, c);
  ASSERT_TRUE(src.ok()) << src.status();
  for (const ParamInfo& p : model.layout()) {
    ASSERT_TRUE(
        (*src)
            ->Read(p.name, WholeBox(p.global_shape), model.params() + p.offset)
            .ok())
        << p.name;
  }

  const std::vector<float>& h = ref.at("hyper").f32;
  v1::TrainSpec train;
  train.set_lr(h[0]);
  train.set_min_lr(h[1]);
  train.set_warmup_steps(static_cast<int>(h[2]));
  train.set_steps(static_cast<int>(h[3]));
  train.set_weight_decay(h[4]);
  train.set_grad_clip(h[5]);
  train.set_beta1(h[6]);
  train.set_beta2(h[7]);
  train.set_eps(h[8]);
  std::vector<int32_t> inputs, targets;
  for (float x : ref.at("inputs").f32) inputs.push_back(static_cast<int>(x));
  for (float x : ref.at("targets").f32) targets.push_back(static_cast<int>(x));

  AdamW opt(model.layout(), 0, model.buffer_size(), train);
  const std::vector<float>& want = ref.at("losses").f32;
  ASSERT_EQ(want.size(), static_cast<size_t>(train.steps() + 1));
  double worst = 0;
  for (int64_t s = 0; s <= train.steps(); ++s) {
    model.ZeroGrad();
    const float loss =
        model.Forward(0, inputs.data(), nullptr, targets.data(), B, T);
    const double d = std::fabs(loss - want[s]) / std::fabs(want[s]);
    std::printf("step %2lld loss %.7f vs %.7f (relative diff %.2e)\n",
                static_cast<long long>(s), loss, want[s], d);
    worst = std::max(worst, d);
    if (s == train.steps()) break;
    model.Backward(0, inputs.data(), targets.data(),
                   1.0f / static_cast<float>(B * T), nullptr);
    const double norm =
        std::sqrt(kernels::sum_squares(model.grads(), model.buffer_size()));
    opt.Step(model.params(), nullptr, model.grads(),
             static_cast<float>(LearningRate(train, s)),
             ClipScale(norm, train.grad_clip()));
  }
  std::printf("%s: losses maxdiff (relative) %.3e (tolerance 1e-4)\n",
              dir.c_str(), worst);
  EXPECT_LE(worst, 1e-4);
  // The run must learn, or matching losses would prove little.
  EXPECT_LT(want.back(), want.front() - 1.0);
}

// 0: rope_theta 500000; 1: with Llama 3's rope scaling; 2: Mixtral's
// experts; 3: Qwen3 (head_dim 16 over a width of 64 in 8 heads, query/key
// norms); 4: Qwen3-MoE (the same with experts in blocks 1 and 3).
INSTANTIATE_TEST_SUITE_P(Folders, LlamaReference,
                         ::testing::Values(0, 1, 2, 3, 4));

}  // namespace
}  // namespace ptrain
