// `parallel: auto` at submit (the coordinator with ptcoord's planner): the job
// is stored (and runs) with the planner's fastest layout over the slots the
// coordinator's backend has, keeps the prediction, and is refused, with nothing
// stored, where no profile or no node can plan it.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/spec.h"
#include "coordinator/coordinator.h"
#include "coordinator/layout_planner.h"
#include "gtest/gtest.h"
#include "planner/profile.h"
#include "planner/search.h"
#include "tests/testing/coordinator_options.h"
#include "tests/testing/cpu_profile.h"
#include "tests/testing/files.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSpec = R"(name: auto
data: {path: data/x.txt}
model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 64, vocab_size: 65}
train: {steps: 10, global_batch: 8}
parallel: auto
)";

planner::HardwareProfile CpuProfile() {
  absl::StatusOr<planner::HardwareProfile> p =
      planner::ParseProfile(testing::kCpuProfile, "test");
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

class AutoLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTempDir(
        "auto_layout_test",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ / "data");
    std::ofstream(dir_ / "data" / "x.txt") << "some text to train on\n";
    options_ = testing::LocalCoordinatorOptions(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<Coordinator> Make() {
    auto c = Coordinator::Create(options_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // What `ptctl plan` proposes first for kSpec with `sets` on this host's
  // two slots.
  planner::RankedLayout PlannersBest(const std::vector<std::string>& sets) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(kSpec, sets, "spec");
    EXPECT_TRUE(spec.ok()) << spec.status();
    const planner::HardwareProfile profile = CpuProfile();
    planner::Cluster cluster;
    cluster.nodes = 1;
    cluster.ranks_per_node = 2;
    cluster.threads_per_rank = spec->resources().threads_per_rank();
    absl::StatusOr<planner::PlanResult> r =
        planner::PlanLayouts(planner::PlanInputOf(*spec, profile), cluster,
                             profile, planner::AutoLayoutOptions(*spec));
    EXPECT_TRUE(r.ok()) << r.status();
    return r->best.front();
  }

  fs::path dir_;
  CoordinatorOptions options_;
};

TEST_F(AutoLayoutTest,
       TheJobRunsThePlannersFastestLayoutAndKeepsItsPrediction) {
  options_.plan_layout = PlannerWith(
      std::make_shared<const planner::HardwareProfile>(CpuProfile()));
  auto c = Make();
  ASSERT_NE(c, nullptr);
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::Job stored = c->Get(job->id(), false)->job();
  const planner::RankedLayout best = PlannersBest({});

  // The stored spec is what ranks run: a layout written out, the
  // planner's, over both slots.
  EXPECT_FALSE(IsAutoLayout(stored.spec()));
  EXPECT_TRUE(CheckLayoutResolved(stored.spec()).ok());
  EXPECT_EQ(planner::LayoutWords(stored.spec()),
            planner::LayoutWords(best.spec));
  EXPECT_EQ(stored.world_size(), 2);
  EXPECT_EQ(WorldSize(stored.spec()), 2);
  // What the planner said stays with the job.
  ASSERT_TRUE(stored.has_plan());
  EXPECT_EQ(stored.plan().layout(), planner::LayoutWords(best.spec));
  EXPECT_EQ(stored.plan().profile(), "test-cpu");
  EXPECT_EQ(stored.plan().nodes(), 1);
  EXPECT_EQ(stored.plan().ranks_per_node(), 2);
  EXPECT_GT(stored.plan().layouts_considered(), 1);
  EXPECT_DOUBLE_EQ(stored.plan().step_s(), best.prediction.step_s);
  EXPECT_EQ(stored.plan().memory_bytes(), best.prediction.memory_need);
  auto events = c->Events(job->id());
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(std::any_of(events->begin(), events->end(), [&](const auto& e) {
    return e.second.find(
               "layout chosen by the planner: " + stored.plan().layout() +
               " (profile test-cpu") != std::string::npos;
  }));

  // A dry run says the same choice and submits nothing more.
  auto dry = c->DryRunSubmit(kSpec, {}, "", 0);
  ASSERT_TRUE(dry.ok()) << dry.status();
  EXPECT_EQ(dry->plan().layout(), stored.plan().layout());
  EXPECT_EQ(dry->world_size(), 2);
  EXPECT_EQ(c->List(v1::JOB_STATE_UNSPECIFIED, 0)->size(), 1u);
}

TEST_F(AutoLayoutTest, ARecomputationTheSpecNamesIsKept) {
  options_.plan_layout = PlannerWith(
      std::make_shared<const planner::HardwareProfile>(CpuProfile()));
  auto c = Make();
  ASSERT_NE(c, nullptr);
  for (const std::string recompute : {"none", "full"}) {
    const std::vector<std::string> sets = {"train.recompute=" + recompute};
    auto job = c->Submit(kSpec, sets);
    ASSERT_TRUE(job.ok()) << job.status();
    const v1::Job stored = c->Get(job->id(), false)->job();
    EXPECT_EQ(stored.spec().train().recompute(), recompute);
    EXPECT_EQ(planner::LayoutWords(stored.spec()),
              planner::LayoutWords(PlannersBest(sets).spec));
  }
}

TEST_F(AutoLayoutTest, WhatCannotBePlannedIsRefusedAndNothingStored) {
  struct Case {
    bool profile;
    std::vector<std::string> sets;
    std::string says;
  };
  const std::vector<Case> cases = {
      {false, {}, "--planner-profile"},
      {true, {"resources.device=cuda"}, "resources.device=cuda"},
      {true, {"parallel.tp=2"}, "parallel.tp"},
      {true, {"parallel.layout=fast"}, "parallel.layout"},
      // A model no layout of two 24 GiB ranks holds.
      {true,
       {"model.n_layer=96", "model.n_head=96", "model.n_embd=12288"},
       "parallel: auto on 1 node(s) × 2 ranks"},
  };
  for (const Case& k : cases) {
    options_.plan_layout =
        k.profile
            ? PlannerWith(std::make_shared<const planner::HardwareProfile>(
                  CpuProfile()))
            : LayoutPlanner();
    auto c = Make();
    ASSERT_NE(c, nullptr);
    auto job = c->Submit(kSpec, k.sets);
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument)
        << k.says;
    EXPECT_NE(job.status().message().find(k.says), std::string::npos)
        << job.status();
    EXPECT_TRUE(c->List(v1::JOB_STATE_UNSPECIFIED, 0)->empty());
  }
}

TEST(ShapeOf, TheSmallestNodeAndTheSpecsRanksPerNodeBound) {
  EXPECT_EQ(ShapeOf({8, 8}, 0).nodes, 2);
  EXPECT_EQ(ShapeOf({8, 8}, 0).ranks_per_node, 8);
  // A node without a slot (a GPU job: without a GPU) is left out.
  EXPECT_EQ(ShapeOf({8, 4, 0}, 0).nodes, 2);
  EXPECT_EQ(ShapeOf({8, 4, 0}, 0).ranks_per_node, 4);
  EXPECT_EQ(ShapeOf({8, 8}, 2).ranks_per_node, 2);
  EXPECT_EQ(ShapeOf({}, 0).nodes, 0);
}

}  // namespace
}  // namespace ptrain
