// The per-rank memory estimate: saturates instead of overflowing on sizes
// past 64 bits, follows the ZeRO stage, and refuses what does not fit with a
// message naming the fields. (tests/worker/engine/memory_test.cc and
// tests/distributed/checkpoint_reshard_test.cc compare it with the engine's
// own buffers.)
#include "worker/engine/parallel/memory_estimate.h"

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

// The largest sizes the spec's bounds allow: the attention probabilities
// alone are B·NH·T² = 2^24·2^12·2^40 floats, far past int64.
TEST(MemoryEstimate, SizesPastSixtyFourBitsSaturateInsteadOfOverflowing) {
  const v1::JobSpec spec =
      Spec({"model.block_size=1048576", "train.global_batch=16777216",
            "model.n_head=4096", "model.n_embd=8192"});
  MemoryEstimate e = EstimateRankMemory(spec, 50257);
  EXPECT_EQ(e.activations, INT64_MAX);
  EXPECT_EQ(e.total(), INT64_MAX);
  EXPECT_GT(e.params, 0);
  EXPECT_LT(e.params, int64_t{1} << 50);
  const absl::Status s = CheckMemoryFits(spec, 50257, 1, int64_t{1} << 40);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("more than 2^63"), std::string::npos) << s;
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

// A GPU job's estimate is taken without the backend (not loaded there): its
// activations are the most any backend keeps, so at least what the bf16 CPU
// backend (which keeps the MLP's rounded GELU operand, as the GPU's does)
// keeps for the same job. An odd width keeps every activation fp32 in both,
// and at T 64 the probabilities the estimate counts in full are smaller
// than that operand (NH·T < 4·C): without it the GPU's would be the less.
TEST(MemoryEstimate, GpuActivationsAreTheMostABackendKeeps) {
  const std::vector<std::string> shape = {
      "model.block_size=64", "model.n_embd=387", "model.n_head=9",
      "train.precision=bf16", "train.global_batch=8"};
  std::vector<std::string> gpu = shape, cpu = shape;
  gpu.push_back("resources.device=cuda");
  cpu.push_back("resources.device=cpu");
  EXPECT_GE(EstimateRankMemory(Spec(gpu), 65).activations,
            EstimateRankMemory(Spec(cpu), 65).activations);
}

// parallel.offload=optimizer keeps the moments in host memory with a
// master copy of the weights the rank updates and their gradients: the
// optimizer's part doubles (two moments, then four arrays of the update's
// size); nothing else changes.
TEST(MemoryEstimate, OffloadCountsTheHostsMasterWeightsAndGradients) {
  for (int zero : {0, 1, 3}) {
    const std::vector<std::string> base = {
        "resources.device=cuda", "parallel.dp=4",
        "parallel.zero=" + std::to_string(zero), "train.global_batch=32"};
    std::vector<std::string> offload = base;
    offload.push_back("parallel.offload=optimizer");
    const MemoryEstimate plain = EstimateRankMemory(Spec(base), 65);
    const MemoryEstimate off = EstimateRankMemory(Spec(offload), 65);
    EXPECT_EQ(off.optimizer, 2 * plain.optimizer) << zero;
    EXPECT_EQ(off.params, plain.params) << zero;
    EXPECT_EQ(off.grads, plain.grads) << zero;
    EXPECT_EQ(off.activations, plain.activations) << zero;
  }
}

// checkpoint.async_save keeps one more copy of what the rank updates: its
// weights and both moments (its ZeRO share), only when it checkpoints.
TEST(MemoryEstimate, BackgroundSavesCountTheirCopyOfTheState) {
  for (int zero : {0, 3}) {
    const std::vector<std::string> base = {
        "parallel.dp=4", "parallel.zero=" + std::to_string(zero),
        "train.global_batch=32", "checkpoint.dir=/tmp/ck"};
    std::vector<std::string> async = base;
    async.push_back("checkpoint.async_save=true");
    const MemoryEstimate plain = EstimateRankMemory(Spec(base), 65);
    const MemoryEstimate background = EstimateRankMemory(Spec(async), 65);
    EXPECT_EQ(plain.checkpoint, 0);
    // Two moments are `optimizer`; the weights' share is one more of them.
    EXPECT_EQ(background.checkpoint * 2, plain.optimizer * 3) << zero;
    EXPECT_EQ(background.total(), plain.total() + background.checkpoint);
    async.push_back("checkpoint.dir=''");
    async.push_back("checkpoint.every=0");
    EXPECT_EQ(EstimateRankMemory(Spec(async), 65).checkpoint, 0);
  }
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
  EXPECT_EQ(s.message().find("would need"), std::string::npos) << s;
}

// A GPU job's estimate is split between its GPU (weights, gradients,
// activations, the optimizer unless offloaded) and host memory (an
// offloaded optimizer, a background save's copy), and each part is checked
// against its own memory: a rank that needs more than its GPU has is
// refused naming the fields and the GPU's bytes, told that offloading the
// optimizer would fit where it would; an offloaded job that fits its GPU
// but not the host is refused for the host.
TEST(MemoryEstimate, GpuJobsAreCheckedAgainstTheirGpuAndTheHost) {
  const std::vector<std::string> base = {
      "resources.device=cuda",     "model.n_layer=8",
      "model.n_embd=512",          "model.n_head=8",
      "train.global_batch=2",      "checkpoint.dir=/tmp/ck",
      "checkpoint.async_save=true"};
  std::vector<std::string> with_offload = base;
  with_offload.push_back("parallel.offload=optimizer");
  std::vector<std::string> with_recompute = base;
  with_recompute.push_back("train.recompute=full");
  const v1::JobSpec spec = Spec(base), offloaded = Spec(with_offload);
  const MemoryEstimate e = EstimateRankMemory(spec, 65);
  const MemoryEstimate off = EstimateRankMemory(offloaded, 65);
  const MemoryEstimate rec = EstimateRankMemory(Spec(with_recompute), 65);
  ASSERT_TRUE(e.gpu);
  EXPECT_EQ(e.device(), e.params + e.grads + e.activations + e.optimizer);
  EXPECT_EQ(e.host(), e.checkpoint);
  EXPECT_EQ(off.device(), e.device() - e.optimizer);
  EXPECT_EQ(off.host(), off.checkpoint + off.optimizer);
  // Recomputing does not bring it down as far as offloading does.
  ASSERT_GT(rec.device(), off.device());

  const int64_t host = int64_t{1} << 40;
  EXPECT_TRUE(CheckMemoryFits(spec, 65, 1, host, e.device()).ok());
  EXPECT_TRUE(CheckMemoryFits(spec, 65, 1, host, 0).ok());  // GPU unknown
  const absl::Status gpu = CheckMemoryFits(spec, 65, 1, host, off.device());
  EXPECT_EQ(gpu.code(), absl::StatusCode::kResourceExhausted);
  for (const std::string& part :
       {std::string("GPU memory: each rank needs ") +
            std::to_string(e.device()) + " bytes",
        std::string("model.n_embd=512"), std::string("train.global_batch=2"),
        std::string("its GPU has ") + std::to_string(off.device()) + " bytes",
        std::string("with parallel.offload=optimizer each rank would need")}) {
    EXPECT_NE(gpu.message().find(part), std::string::npos)
        << part << ": " << gpu;
  }
  // Offloaded it fits the GPU; the host must hold the optimizer.
  EXPECT_TRUE(CheckMemoryFits(offloaded, 65, 1, off.host(), off.device()).ok());
  const absl::Status h =
      CheckMemoryFits(offloaded, 65, 1, off.host() - 1, off.device());
  EXPECT_EQ(h.code(), absl::StatusCode::kResourceExhausted);
  for (const char* part :
       {"memory: each rank needs", "in host memory, offloaded optimizer",
        "parallel.offload=optimizer", "1 rank on this machine need"}) {
    EXPECT_NE(h.message().find(part), std::string::npos) << part << ": " << h;
  }
  // A CPU job's is all host memory; its GPU check never applies.
  const MemoryEstimate cpu = EstimateRankMemory(Spec({"model.n_embd=512"}), 65);
  EXPECT_EQ(cpu.host(), cpu.total());
  EXPECT_EQ(cpu.device(), 0);
}

// A job whose activations do not fit, but would with its blocks recomputed,
// is told so; one that would not fit either way is not.
TEST(MemoryEstimate, RefusalSaysWhenRecomputationWouldFit) {
  const v1::JobSpec spec = Spec({"model.n_layer=8", "model.block_size=256"});
  v1::JobSpec recomputed = spec;
  recomputed.mutable_train()->set_recompute("full");
  const int64_t need = EstimateRankMemory(spec, 65).total();
  const int64_t full = EstimateRankMemory(recomputed, 65).total();
  ASSERT_LT(full, need);
  const absl::Status s = CheckMemoryFits(spec, 65, 1, full);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("train.recompute=none;"), std::string::npos) << s;
  EXPECT_NE(s.message().find("with train.recompute=full each rank would need"),
            std::string::npos)
      << s;
  const absl::Status neither = CheckMemoryFits(spec, 65, 1, full - 1);
  EXPECT_EQ(neither.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(neither.message().find("would need"), std::string::npos) << neither;
  EXPECT_TRUE(CheckMemoryFits(recomputed, 65, 1, full).ok());
}

}  // namespace
}  // namespace ptrain
