// ProgressReporter: configured only by ptcoord's environment, and never a
// cost to training — records to an unreachable coordinator neither block nor
// fail the rank.
#include <stdlib.h>

#include <chrono>

#include "gtest/gtest.h"
#include "worker/progress_reporter.h"

namespace ptrain {
namespace {

TEST(ProgressReporterTest, AbsentCoordinatorMeansNoReporter) {
  unsetenv("PTRAIN_COORDINATOR");
  auto r = ProgressReporter::FromEnvironment();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, nullptr);
}

TEST(ProgressReporterTest, IncompleteEnvironmentIsAnError) {
  setenv("PTRAIN_COORDINATOR", "127.0.0.1:1", 1);
  setenv("PTRAIN_JOB_ID", "job-0001", 1);
  setenv("PTRAIN_JOB_TOKEN", "t", 1);
  setenv("PTRAIN_ATTEMPT", "zero", 1);
  EXPECT_EQ(ProgressReporter::FromEnvironment().status().code(),
            absl::StatusCode::kInvalidArgument);
  unsetenv("PTRAIN_JOB_TOKEN");
  setenv("PTRAIN_ATTEMPT", "1", 1);
  EXPECT_FALSE(ProgressReporter::FromEnvironment().ok());
  unsetenv("PTRAIN_COORDINATOR");
}

TEST(ProgressReporterTest, UnreachableCoordinatorNeverBlocksTraining) {
  // Port 1 on loopback: connection refused at once.
  setenv("PTRAIN_COORDINATOR", "127.0.0.1:1", 1);
  setenv("PTRAIN_JOB_ID", "job-0001", 1);
  setenv("PTRAIN_JOB_TOKEN", "t", 1);
  setenv("PTRAIN_ATTEMPT", "1", 1);
  auto r = ProgressReporter::FromEnvironment();
  unsetenv("PTRAIN_COORDINATOR");
  ASSERT_TRUE(r.ok() && *r != nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= 10000; ++i) {
    (*r)->OnRecord({{"type", "step"}, {"step", i}, {"loss", 1.0}});
  }
  (*r)->OnRecord({{"type", "checkpoint"}, {"step", 10}, {"dir", "/x"}});
  (*r)->OnRecord({{"type", "memory"}, {"params_bytes", 1}});  // ignored
  const double enqueue_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_LT(enqueue_s, 5.0) << "OnRecord waited on the network";
  EXPECT_GT((*r)->dropped(), 0);  // the queue is bounded
  r->reset();                     // drains for at most ~3 s, then gives up
}

}  // namespace
}  // namespace ptrain
