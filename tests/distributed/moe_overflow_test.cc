// A Mixture-of-Experts dispatch past its rank's buffer stops the job with a
// message naming the layer, the expert and the counts by ep rank. Runs
// under `mpirun -n 4` (ep 4, one expert a rank): every rank's selection
// bias sends all its 16 tokens to expert 0, whose rank would receive 64
// rows, past its dropless bound of twice its share (32). ctest passes the
// run on that message (PASS_REGULAR_EXPRESSION); a step that completes
// fails it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "absl/strings/match.h"
#include "common/spec.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/parallel/zero_store.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

TEST(MoeDispatch, PastTheBufferStopsTheJobNamingLayerExpertAndCounts) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ASSERT_EQ(world, 4) << "run under mpirun -n 4";
  auto spec = LoadJobSpecFile(
      "examples/shakespeare-char.yaml",
      {"model.n_layer=1", "model.n_head=2", "model.n_embd=24",
       "model.block_size=16", "train.global_batch=4", "train.steps=1",
       "train.warmup_steps=1", "train.eval_every=0", "train.eval_batches=1",
       "train.sample_tokens=0", "checkpoint.dir=''", "checkpoint.every=0",
       "parallel.dp=4", "parallel.ep=4", "model.moe.experts=4",
       "model.moe.top_k=1", "model.moe.expert_hidden=8",
       "model.moe.balance=bias", "model.moe.aux_loss_coef=0"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto dims = ParallelDims::Create(spec->parallel(), MPI_COMM_WORLD);
  ASSERT_TRUE(dims.ok()) << dims.status();
  TrainerOptions opt;
  opt.peak_flops = 1e12;
  opt.quiet = true;
  auto trainer = Trainer::Create(*spec, opt, dims->get());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ZeroStore& store = (*trainer)->store();
  float* params = store.update_params();
  int biased = 0;
  store.ForEachUpdateStretch(
      [&](const ParamInfo& p, int64_t lo, int64_t hi, int64_t at) {
        if (!absl::EndsWith(p.name, ".mlp.router.expert_bias") || lo > 0 ||
            hi == 0) {
          return;
        }
        params[at] = 100.0f;  // expert 0 first for every token
        ++biased;
      });
  ASSERT_EQ(biased, 1);
  (*trainer)->TrainStep(0);
  ADD_FAILURE() << "a dispatch of every token to one expert's rank ran past "
                   "its buffer without stopping the job";
}

}  // namespace
}  // namespace ptrain
