// The per-rank memory estimate: saturates instead of overflowing on absurd
// sizes, follows the ZeRO stage, and refuses what does not fit with a
// message naming the fields. (tests/worker/engine/memory_test.cc and
// tests/distributed/checkpoint_reshard_test.cc compare it with the engine's
// own buffers.)
#include "common/memory_estimate.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "common/spec.h"

namespace ptrain {
namespace {

v1::JobSpec Spec(std::vector<std::string> overrides) {
  auto spec = LoadJobSpecFile("examples/shakespeare-char.yaml", overrides);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(MemoryEstimate, AbsurdSizesSaturateInsteadOfOverflowing) {
  // Set directly: these need not pass the spec's bounds to be estimated.
  v1::JobSpec spec = Spec({});
  spec.mutable_model()->set_n_embd(1 << 30);
  MemoryEstimate e = EstimateRankMemory(spec, 65);
  EXPECT_EQ(e.params, INT64_MAX);
  EXPECT_EQ(e.total(), INT64_MAX);
  spec = Spec({});
  spec.mutable_train()->set_global_batch(2147483647);
  spec.mutable_model()->set_block_size(2147483647);
  e = EstimateRankMemory(spec, 50257);
  EXPECT_EQ(e.activations, INT64_MAX);
  EXPECT_GT(e.params, 0);
  EXPECT_LT(e.params, int64_t{1} << 50);
}

TEST(MemoryEstimate, ZeroStagesShardOptimizerThenGradientsThenWeights) {
  auto at = [](int zero) {
    return EstimateRankMemory(
        Spec({"parallel.dp=4", "parallel.zero=" + std::to_string(zero),
              "train.global_batch=32"}),
        65);
  };
  const MemoryEstimate z0 = at(0), z1 = at(1), z2 = at(2), z3 = at(3);
  EXPECT_EQ(z1.optimizer * 4, z0.optimizer);
  EXPECT_LT(z2.grads, z1.grads);
  EXPECT_LT(z3.params, z2.params);
  EXPECT_EQ(z0.activations, z3.activations);
}

TEST(MemoryEstimate, WhatDoesNotFitIsRefusedNamingTheFields) {
  const v1::JobSpec spec = Spec({"model.n_embd=256"});
  const int64_t need = EstimateRankMemory(spec, 65).total();
  EXPECT_TRUE(CheckMemoryFits(spec, 65, 1, need).ok());
  EXPECT_TRUE(CheckMemoryFits(spec, 65, 1, 0).ok());  // unknown: no check
  const absl::Status s = CheckMemoryFits(spec, 65, 2, need);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  for (const char* field :
       {"model.n_embd=256", "model.n_layer=4", "model.block_size=64",
        "train.global_batch=32", "parallel.zero=0", "2 ranks on this machine",
        "memory: each rank needs"}) {
    EXPECT_NE(s.message().find(field), std::string::npos) << field << ": " << s;
  }
  EXPECT_GT(AvailableMemoryBytes(), 0);
}

}  // namespace
}  // namespace ptrain
