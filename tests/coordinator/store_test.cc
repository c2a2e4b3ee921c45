// Store: jobs, attempts, events, checkpoints and loss history survive a
// reopen of the database (what a ptcoord restart relies on).
#include "coordinator/store.h"

#include <unistd.h>

#include <filesystem>

#include "gtest/gtest.h"

namespace ptrain {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("store_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string TempDb() const { return (dir_ / "ptcoord.db").string(); }
  std::filesystem::path dir_;
};

TEST_F(StoreTest, JobsAndHistorySurviveReopen) {
  const std::string path = TempDb();
  {
    auto store = Store::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    JobRecord r;
    r.job.set_name("a");
    r.job.set_state(v1::JOB_STATE_QUEUED);
    r.token = "t";
    auto a = (*store)->InsertJob(r);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->job.id(), "job-0001");
    auto b = (*store)->InsertJob(r);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->job.id(), "job-0002");
    EXPECT_GT(b->seq, a->seq);
    a->job.set_state(v1::JOB_STATE_RUNNING);
    a->pid = 42;
    ASSERT_TRUE((*store)->UpdateJob(*a).ok());
    v1::LossPoint p;
    p.set_step(1);
    p.set_loss(4.5);
    ASSERT_TRUE((*store)->AddLossPoint("job-0001", p).ok());
    v1::Checkpoint c;
    c.set_step(20);
    c.set_dir("/x/step-00000020");
    ASSERT_TRUE((*store)->AddCheckpoint("job-0001", c).ok());
    v1::Attempt at;
    at.set_number(1);
    at.set_exit_code(-1);
    ASSERT_TRUE((*store)->UpsertAttempt("job-0001", at).ok());
    ASSERT_TRUE((*store)->AddEvent("job-0001", 1, "hello").ok());
  }
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ((*jobs)[0].pid, 42);
  EXPECT_EQ((*jobs)[0].token, "t");
  auto h = (*store)->LossHistory("job-0001");
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->size(), 1u);
  EXPECT_EQ((*h)[0].loss(), 4.5);
  auto cps = (*store)->ListCheckpoints("job-0001");
  ASSERT_TRUE(cps.ok());
  ASSERT_EQ(cps->size(), 1u);
  EXPECT_EQ((*cps)[0].step(), 20);
  auto attempts = (*store)->ListAttempts("job-0001");
  ASSERT_TRUE(attempts.ok());
  EXPECT_EQ(attempts->size(), 1u);
  auto events = (*store)->ListEvents("job-0001");
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 1u);
}

TEST_F(StoreTest, UnknownJobIsNotFound) {
  auto store = Store::Open(TempDb());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->GetJob("job-9999").status().code(),
            absl::StatusCode::kNotFound);
  JobRecord r;
  r.job.set_id("job-9999");
  EXPECT_EQ((*store)->UpdateJob(r).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ptrain
