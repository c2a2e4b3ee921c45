// The NCCL communicator (comm_nccl.h) on GPU memory. On a machine with one
// GPU NCCL runs only a group of one rank (it refuses two ranks on one GPU),
// so this checks what a group of one can show: each collective's contract
// (identities and copies at size 1, in place or not), its order with the
// kernels around it (it runs on a communication stream beside the
// backend's: after the kernels issued before it, before those issued after
// a blocking one or after its handle is waited for), host and mixed buffers
// passing through MPI, the times recorded per operation, and a ZeRO-1
// trainer whose dp group is NCCL tracking the plain run. Runs under
// mpirun -n 1; skips without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/spec.h"
#include "kernels/backends.h"
#include "worker/engine/comm/comm_mpi.h"
#include "worker/engine/comm/comm_nccl.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    std::string error;
    ops_ = kernels::MakeCudaOps({}, &error);
    ASSERT_NE(ops_, nullptr) << error;
    stats_ = std::make_shared<CommStats>();
    mpi_ = MakeMpiCommunicator(MPI_COMM_WORLD, "dp", stats_);
    auto nccl = MakeNcclCommunicator(mpi_.get(), ops_.get(), nullptr);
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    nccl_ = std::move(*nccl);
  }
  // A GPU buffer holding `host`.
  kernels::Buffer Device(const std::vector<float>& host) {
    kernels::Buffer b(ops_.get(), static_cast<int64_t>(host.size()));
    ops_->FromHost(b.data(), host.data(), b.size());
    return b;
  }
  std::vector<float> Host(const kernels::Buffer& b) {
    std::vector<float> h(b.size());
    ops_->ToHost(h.data(), b.data(), b.size());
    return h;
  }

  std::unique_ptr<kernels::Ops> ops_;
  std::shared_ptr<CommStats> stats_;
  std::unique_ptr<Communicator> mpi_, nccl_;
};

TEST_F(NcclCommunicatorTest, CollectivesOfOneRankKeepTheirContracts) {
  ASSERT_EQ(nccl_->size(), 1);
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  const int64_t n = static_cast<int64_t>(values.size());
  kernels::Buffer x = Device(values);
  nccl_->AllReduce(x.data(), n);
  EXPECT_EQ(Host(x), values);
  nccl_->AllReduceMax(x.data(), n);
  EXPECT_EQ(Host(x), values);
  nccl_->Broadcast(x.data(), n, 0);
  EXPECT_EQ(Host(x), values);
  kernels::Buffer out(ops_.get(), n);
  nccl_->ReduceScatter(x.data(), out.data(), n);
  EXPECT_EQ(Host(out), values);
  ops_->Zero(out.data(), n);
  nccl_->AllGather(x.data(), out.data(), n);
  EXPECT_EQ(Host(out), values);
  nccl_->AllGather(out.data(), out.data(), n);  // in place
  EXPECT_EQ(Host(out), values);
  auto h = nccl_->AllReduceAsync(x.data(), n);
  h->Wait();  // the backend's stream waits for it
  EXPECT_EQ(Host(x), values);
  EXPECT_TRUE(h->Test());  // finished once the stream passed it

  // Host and mixed buffers go through MPI (staged where one side is GPU).
  std::vector<float> host = values, gathered(n, 0.0f);
  nccl_->AllReduce(host.data(), n);
  EXPECT_EQ(host, values);
  nccl_->AllGather(x.data(), gathered.data(), n);
  EXPECT_EQ(gathered, values);
  double sum = 2.5;
  nccl_->AllReduce(&sum, 1);
  EXPECT_EQ(sum, 2.5);

  // The all-to-all of one rank copies its own block: GPU buffers through
  // NCCL (its time recorded as the group's all_to_all), mixed ones staged.
  const int64_t counts[] = {n};
  kernels::Buffer moved(ops_.get(), n);
  nccl_->AllToAllV(x.data(), counts, moved.data(), counts);
  EXPECT_EQ(Host(moved), values);
  std::vector<float> back(n, 0.0f);
  nccl_->AllToAllV(moved.data(), counts, back.data(), counts);
  EXPECT_EQ(back, values);
  EXPECT_EQ(nccl_->stats().Get("dp", CommOp::kAllToAll).calls, 1);
}

TEST_F(NcclCommunicatorTest, RunsInOrderWithTheKernelsAroundIt) {
  // A kernel writes x, the collective reads it, a kernel reads its result:
  // no host waits in between, so only the streams' order makes this right.
  const int64_t n = 1 << 20;
  std::vector<float> ones(n, 1.0f);
  kernels::Buffer src = Device(ones), x(ops_.get(), n), y(ops_.get(), n);
  for (int i = 0; i < 3; ++i) {
    ops_->Add(x.data(), src.data(), n);  // x = i + 1
    nccl_->AllReduce(x.data(), n);
    ops_->Copy(y.data(), x.data(), n);
  }
  const std::vector<float> got = Host(y);
  EXPECT_EQ(got.front(), 3.0f);
  EXPECT_EQ(got.back(), 3.0f);
}

// An async collective runs on the communication stream beside the kernels
// issued after it, which must not touch its buffer, until its handle is
// waited for: the kernels after that see its result; Test says when it
// has finished.
TEST_F(NcclCommunicatorTest, AsyncCollectivesRunBesideTheKernelsUntilWaited) {
  const int64_t n = 1 << 22;
  std::vector<float> ones(n, 1.0f);
  kernels::Buffer src = Device(ones), x(ops_.get(), n), y(ops_.get(), n),
                  z(ops_.get(), n);
  for (int i = 0; i < 3; ++i) {
    ops_->Add(x.data(), src.data(), n);  // x = i + 1
    auto h = nccl_->AllReduceAsync(x.data(), n);
    for (int k = 0; k < 4; ++k) ops_->Add(z.data(), src.data(), n);
    h->Wait();
    ops_->Copy(y.data(), x.data(), n);
    ops_->Synchronize();
    EXPECT_TRUE(h->Test()) << i;
  }
  EXPECT_EQ(Host(y).back(), 3.0f);
  EXPECT_EQ(Host(z).back(), 12.0f);
}

TEST_F(NcclCommunicatorTest, RecordsEachOperationsGpuTime) {
  const int64_t n = 1 << 16;
  kernels::Buffer x(ops_.get(), n), out(ops_.get(), n);
  for (int i = 0; i < 4; ++i) nccl_->AllReduce(x.data(), n);
  nccl_->AllGather(x.data(), out.data(), n);
  ops_->Synchronize();
  const CommStat all_reduce = nccl_->stats().Get("dp", CommOp::kAllReduce);
  const CommStat all_gather = nccl_->stats().Get("dp", CommOp::kAllGather);
  std::printf("  all_reduce: %lld calls, %.3g s; all_gather: %lld, %.3g s\n",
              static_cast<long long>(all_reduce.calls), all_reduce.seconds,
              static_cast<long long>(all_gather.calls), all_gather.seconds);
  EXPECT_EQ(all_reduce.calls, 4);
  EXPECT_EQ(all_reduce.bytes, 4 * n * 4);
  EXPECT_GT(all_reduce.seconds, 0.0);
  EXPECT_EQ(all_gather.calls, 1);
}

TEST(NcclTrainer, ZeroOneOverAnNcclGroupTracksThePlainRun) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto losses = [](int zero, const char* comm) {
    setenv("PTRAIN_CUDA_COMM", comm, 1);
    auto spec = LoadJobSpecFile(
        "examples/shakespeare-char.yaml",
        {"resources.device=cuda", "train.precision=fp32", "model.n_layer=2",
         "model.n_head=4", "model.n_embd=64", "model.block_size=32",
         "train.global_batch=4", "train.steps=10", "train.sample_tokens=0",
         "parallel.zero=" + std::to_string(zero)});
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto dims = ParallelDims::Create(spec->parallel(), MPI_COMM_WORLD);
    EXPECT_TRUE(dims.ok()) << dims.status();
    TrainerOptions opt;
    opt.peak_flops = 1e12;
    opt.quiet = true;
    auto t = Trainer::Create(*spec, opt, dims->get());
    EXPECT_TRUE(t.ok()) << t.status();
    std::vector<float> out;
    for (int s = 0; s < 10; ++s) out.push_back((*t)->TrainStep(s).loss);
    const CommStat rs =
        (*dims)->comm_stats()->Get("dp", CommOp::kReduceScatter);
    std::printf("  zero %d over %s: dp reduce_scatter %lld calls\n", zero, comm,
                static_cast<long long>(rs.calls));
    unsetenv("PTRAIN_CUDA_COMM");
    return out;
  };
  const std::vector<float> want = losses(0, "staged");
  const std::vector<float> got = losses(1, "nccl");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::fabs(got[i] - want[i]) / want[i], 1e-5) << "step " << i;
  }
}

}  // namespace
}  // namespace ptrain
