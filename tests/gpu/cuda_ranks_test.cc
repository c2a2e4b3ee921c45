// More ranks on a node than it has GPUs: ptworker refuses the job at start,
// naming the field, unless the ranks are told to share GPUs
// (PTRAIN_CUDA_SHARE_GPUS=1, how the GPU layout tests run on one device);
// and the GPU of each rank that ptcoord chose (PTRAIN_RANK_GPUS) is checked.
// Runs under mpirun; skips without a GPU, or where every rank has its own.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <string>

#include "common/spec.h"
#include "kernels/backends.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

TEST(CudaRanks, MoreRanksOnANodeThanGpusIsRefusedUnlessTheyShare) {
  const int gpus = kernels::CudaDeviceCount();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device";
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world <= gpus) {
    GTEST_SKIP() << world << " ranks, " << gpus << " GPUs: none to share";
  }
  auto spec = LoadJobSpecFile(
      "examples/shakespeare-char.yaml",
      {"resources.device=cuda", "parallel.dp=" + std::to_string(world),
       "model.n_layer=1", "model.n_embd=32", "model.n_head=2",
       "model.block_size=16", "train.steps=1", "train.sample_tokens=0",
       "train.global_batch=" + std::to_string(2 * world)});
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto dims = ParallelDims::Create(spec->parallel(), MPI_COMM_WORLD);
  ASSERT_TRUE(dims.ok()) << dims.status();
  EXPECT_EQ((*dims)->local_size(), world);  // one node

  TrainerOptions opt;
  opt.peak_flops = 1e12;
  opt.quiet = true;
  unsetenv("PTRAIN_CUDA_SHARE_GPUS");
  const absl::Status refused =
      Trainer::Create(*spec, opt, dims->get()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("resources.ranks_per_node"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("GPU"), std::string::npos) << refused;

  setenv("PTRAIN_CUDA_SHARE_GPUS", "1", 1);
  auto shared = Trainer::Create(*spec, opt, dims->get());
  EXPECT_TRUE(shared.ok()) << shared.status();
  if (shared.ok()) shared->reset();

  // ptcoord's choice of GPU per rank (PTRAIN_RANK_GPUS) must name one GPU
  // of the node for every rank.
  const std::string every_rank_gpu0 = [&] {
    std::string s = "0";
    for (int r = 1; r < world; ++r) s += ",0";
    return s;
  }();
  for (const std::string& bad :
       {std::string("0"), every_rank_gpu0 + ",0",
        std::to_string(gpus) + every_rank_gpu0.substr(1),
        std::string("x") + every_rank_gpu0.substr(1)}) {
    setenv("PTRAIN_RANK_GPUS", bad.c_str(), 1);
    const absl::Status s = Trainer::Create(*spec, opt, dims->get()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad << ": " << s;
    EXPECT_NE(s.message().find("PTRAIN_RANK_GPUS"), std::string::npos) << s;
  }
  setenv("PTRAIN_RANK_GPUS", every_rank_gpu0.c_str(), 1);
  auto chosen = Trainer::Create(*spec, opt, dims->get());
  EXPECT_TRUE(chosen.ok()) << chosen.status();
  unsetenv("PTRAIN_RANK_GPUS");
}

}  // namespace
}  // namespace ptrain
