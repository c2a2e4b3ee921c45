// The planner against Megatron-LM's published weak-scaling runs (A100
// 80GB, Narayanan et al. 2021): with the paper's tp and pp it predicts
// each run's teraFLOP/s per GPU within 20%, and left free it proposes a
// layout predicted at least as fast.
#include "planner/published.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ptrain::planner {
namespace {

TEST(Published, MegatronWeakScalingWithinTwentyPercent) {
  absl::StatusOr<HardwareProfile> a100 = LoadProfile("a100");
  ASSERT_TRUE(a100.ok()) << a100.status();
  for (const PublishedRun& run : MegatronWeakScaling()) {
    absl::StatusOr<PublishedComparison> c = CompareWithPublished(run, *a100);
    ASSERT_TRUE(c.ok()) << run.billions << "B: " << c.status();
    EXPECT_LE(std::abs(c->pinned_tflops / run.tflops_per_gpu - 1), 0.20)
        << run.billions << "B: predicted " << c->pinned_tflops
        << " TFLOP/s a GPU, published " << run.tflops_per_gpu << " ("
        << LayoutWords(c->pinned.spec) << ")";
    EXPECT_GE(c->free_tflops, c->pinned_tflops * (1 - 1e-9))
        << run.billions << "B: " << LayoutWords(c->free.spec);
  }
}

}  // namespace
}  // namespace ptrain::planner
