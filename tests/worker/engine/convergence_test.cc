// Behaviour, not time: the trainer, as ptworker runs it, brings the
// validation loss on character-level Shakespeare under 2.0 within a fixed
// number of steps (a unigram model sits near 3.3, an untrained one at ln 65).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/spec.h"
#include "kernels/cpu/kernels.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

TEST(Convergence, ShakespeareValLossFallsBelowTwoWithinFixedSteps) {
  auto spec = LoadJobSpecFile(
      "examples/shakespeare-char.yaml",
      {"train.steps=400", "train.global_batch=32", "train.lr=6e-3",
       "train.min_lr=6e-4", "train.warmup_steps=40", "train.eval_batches=8",
       "parallel.dp=1", "parallel.zero=0", "parallel.microbatches=1"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  TrainerOptions options;
  options.peak_flops = 1e12;  // MFU is not under test; skip the measurement
  auto trainer = Trainer::Create(*spec, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const float initial = (*trainer)->Evaluate();
  EXPECT_NEAR(initial, std::log(65.0), 0.3);
  float loss = 0;
  for (int64_t s = 0; s < spec->train().steps(); ++s) {
    loss = (*trainer)->TrainStep(s).loss;
  }
  const float val = (*trainer)->Evaluate();
  std::printf("val loss %.4f -> %.4f after %lld steps (train loss %.4f)\n",
              initial, val, static_cast<long long>(spec->train().steps()),
              loss);
  EXPECT_LT(val, 2.0f);
}

// train.precision=bf16 on the CPU (bf16 matmul products, fp32 everything
// else) tracks fp32 on config S: every step's loss within 1e-2 relative over
// 200 steps, the validation loss after them within 0.02.
TEST(Convergence, CpuBf16TracksFp32OnConfigS) {
  if (!kernels::CpuHasBf16()) {
    GTEST_SKIP() << "this CPU has no AVX512_BF16: train.precision=bf16 is "
                    "refused on it";
  }
  struct Run {
    std::vector<float> losses;
    float val = 0;
  };
  auto train = [](const std::string& precision) {
    Run run;
    auto spec = LoadJobSpecFile(
        "examples/shakespeare-char.yaml",
        {"train.steps=200", "train.global_batch=16", "train.eval_batches=8",
         "train.precision=" + precision, "parallel.dp=1", "parallel.zero=0",
         "parallel.microbatches=1"});
    EXPECT_TRUE(spec.ok()) << spec.status();
    if (!spec.ok()) return run;
    TrainerOptions options;
    options.peak_flops = 1e12;
    auto trainer = Trainer::Create(*spec, options);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (!trainer.ok()) return run;
    for (int64_t s = 0; s < spec->train().steps(); ++s) {
      run.losses.push_back((*trainer)->TrainStep(s).loss);
    }
    run.val = (*trainer)->Evaluate();
    return run;
  };
  const Run fp32 = train("fp32");
  const Run bf16 = train("bf16");
  ASSERT_EQ(fp32.losses.size(), 200u);
  ASSERT_EQ(bf16.losses.size(), 200u);
  double worst = 0;
  bool differs = false;
  for (size_t i = 0; i < fp32.losses.size(); ++i) {
    const double rel =
        std::abs(bf16.losses[i] - fp32.losses[i]) / std::abs(fp32.losses[i]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-2) << "step " << i << ": bf16 " << bf16.losses[i]
                         << ", fp32 " << fp32.losses[i];
    differs = differs || bf16.losses[i] != fp32.losses[i];
  }
  std::printf(
      "loss %.4f -> %.4f (fp32), %.4f -> %.4f (bf16); worst step %.2e "
      "relative; val %.4f (fp32) %.4f (bf16)\n",
      fp32.losses.front(), fp32.losses.back(), bf16.losses.front(),
      bf16.losses.back(), worst, fp32.val, bf16.val);
  EXPECT_NEAR(bf16.val, fp32.val, 0.02);
  // The products really were rounded: bf16 is not fp32 under another name.
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace ptrain
