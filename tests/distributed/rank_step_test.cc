// TrainerOptions::on_rank_step under a data-parallel run: every rank, not
// only the one that writes the log, reports each step it completes, with
// running communication totals by group that never fall. Runs under
// `mpirun -n 2`.
#include <gtest/gtest.h>
#include <mpi.h>

#include <map>
#include <string>
#include <vector>

#include "common/spec.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

TEST(RankStep, EveryRankReportsEveryStepWithRunningCommTotals) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ASSERT_EQ(world, 2) << "run under mpirun -n 2";
  constexpr int kSteps = 4;
  auto spec = LoadJobSpecFile(
      "examples/shakespeare-char.yaml",
      {"model.n_layer=2", "model.n_head=2", "model.n_embd=24",
       "model.block_size=16", "train.global_batch=4",
       "train.steps=" + std::to_string(kSteps), "train.warmup_steps=1",
       "train.eval_every=0", "train.eval_batches=1", "train.sample_tokens=0",
       "checkpoint.dir=''", "checkpoint.every=0", "parallel.dp=2"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::vector<RankStep> got;
  {
    auto dims = ParallelDims::Create(spec->parallel(), MPI_COMM_WORLD);
    ASSERT_TRUE(dims.ok()) << dims.status();
    TrainerOptions opt;
    opt.peak_flops = 1e12;
    opt.quiet = true;
    opt.on_rank_step = [&got](const RankStep& s) { got.push_back(s); };
    auto trainer = Trainer::Create(*spec, opt, dims->get());
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const absl::Status ran = (*trainer)->Run();
    ASSERT_TRUE(ran.ok()) << ran;
  }
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << "rank " << rank;
  std::map<std::string, double> before;
  for (int i = 0; i < kSteps; ++i) {
    const RankStep& s = got[i];
    EXPECT_EQ(s.step, i + 1);
    EXPECT_GT(s.seconds, 0.0);
    EXPECT_GE(s.comm_exposed, 0.0);
    EXPECT_LE(s.comm_exposed, s.seconds);
    for (const auto& [group, seconds] : s.comm_seconds) {
      EXPECT_GE(seconds, before[group]) << group << " at step " << s.step;
    }
    before = s.comm_seconds;
  }
  // The gradients' all-reduce over dp runs every step.
  EXPECT_GT(got.back().comm_seconds["dp"], got.front().comm_seconds["dp"]);
  EXPECT_EQ(got.back().comm_seconds.count(""), 0u);
}

}  // namespace
}  // namespace ptrain
