// The memory estimate (common/memory_estimate.h) against what the engine
// really allocates on one rank: params, grads, Adam moments and activations
// to the byte, for several model shapes and microbatch counts, GPT-2's and
// Llama's. Multi-rank ZeRO stages are compared in
// tests/distributed/checkpoint_reshard_test.cc.
#include <gtest/gtest.h>

#include "common/spec.h"
#include "kernels/cpu/kernels.h"
#include "worker/engine/parallel/memory_estimate.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

TEST(MemoryEstimate, EqualsTheEngineBuffersOnOneRank) {
  std::vector<std::vector<std::string>> configs = {
      {},
      {"model.n_layer=1", "model.n_head=2", "model.n_embd=24",
       "model.block_size=16", "train.global_batch=4"},
      {"model.n_layer=3", "model.n_head=3", "model.n_embd=48",
       "model.block_size=32", "train.global_batch=12",
       "parallel.microbatches=3"},
      {"model.n_layer=3", "model.n_head=3", "model.n_embd=48",
       "model.block_size=32", "train.global_batch=12",
       "parallel.microbatches=3", "train.recompute=full"},
      {"model.n_layer=3", "model.n_head=3", "model.n_embd=48",
       "model.block_size=32", "train.global_batch=12",
       "parallel.microbatches=3", "train.recompute=selective"},
      // Llama's parts: grouped-query attention (key/value heads fewer than
      // the query heads, or as many), a SwiGLU MLP of its own width.
      {"model.arch=llama"},
      {"model.arch=llama", "model.n_layer=3", "model.n_head=4",
       "model.n_kv_head=1", "model.n_embd=48", "model.ffn_hidden=136",
       "model.block_size=32", "train.global_batch=12",
       "parallel.microbatches=3"},
      {"model.arch=llama", "model.n_layer=3", "model.n_head=4",
       "model.n_kv_head=2", "model.n_embd=48", "model.block_size=32",
       "train.global_batch=12", "parallel.microbatches=3",
       "train.recompute=full"},
      {"model.arch=llama", "model.n_layer=3", "model.n_head=3",
       "model.n_embd=48", "model.block_size=32", "train.global_batch=12",
       "parallel.microbatches=3", "train.recompute=selective",
       "model.tie_embeddings=false"},
  };
  if (kernels::CpuHasBf16()) {  // bf16 rows: qkv and norms halved
    configs.push_back({"model.arch=llama", "train.precision=bf16"});
  }
  for (const auto& overrides : configs) {
    auto spec = LoadJobSpecFile("examples/shakespeare-char.yaml", overrides);
    ASSERT_TRUE(spec.ok()) << spec.status();
    TrainerOptions opt;
    opt.quiet = true;
    auto t = Trainer::Create(*spec, opt);
    ASSERT_TRUE(t.ok()) << t.status();
    const MemoryBytes real = (*t)->memory();
    const MemoryEstimate e = EstimateRankMemory(*spec, (*t)->data().vocab_size);
    EXPECT_EQ(e.params, real.params);
    EXPECT_EQ(e.grads, real.grads);
    EXPECT_EQ(e.optimizer, real.optimizer);
    EXPECT_EQ(e.activations, real.activations);
  }
}

TEST(MemoryEstimate, TrainerRefusesAModelThatDoesNotFitBeforeAllocating) {
  auto spec = LoadJobSpecFile("examples/shakespeare-char.yaml", {});
  ASSERT_TRUE(spec.ok());
  TrainerOptions opt;
  opt.memory_bytes = 1 << 20;  // 1 MB: far too little
  auto t = Trainer::Create(*spec, opt);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(t.status().message().find("but it has 1048576 bytes"),
            std::string::npos)
      << t.status();
}

}  // namespace
}  // namespace ptrain
