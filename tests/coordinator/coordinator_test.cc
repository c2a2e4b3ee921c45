// Coordinator without RPC: submit validation, cancel, lookups, and the
// supervision rules driven by a fake mpirun (a shell script) through Tick().
#include "coordinator/coordinator.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "coordinator/launcher.h"
#include "gtest/gtest.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSpec = R"(name: t
data: {path: data/x.txt}
train: {steps: 10}
restart: {max_restarts: 1, hang_timeout_s: 1}
)";

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("coordinator_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    // Stands in for mpirun: its mode comes from the environment it inherits.
    const fs::path fake = dir_ / "fake_mpirun";
    std::ofstream(fake) << "#!/bin/sh\necho \"fake rank says goodbye\" >&2\n"
                           "case \"$FAKE_MODE\" in ok) exit 0;; fail) exit 3;; "
                           "*) exec sleep 100;; esac\n";
    fs::permissions(fake, fs::perms::owner_all);
    setenv("FAKE_MODE", "ok", 1);
    options_.state_dir = (dir_ / "state").string();
    options_.local_slots = 2;
    options_.user_tokens = {"user"};
    options_.data_roots = {(dir_ / "data").string()};
    options_.work_root = dir_.string();
    options_.ptworker = "/bin/true";
    options_.mpirun = fake.string();
    options_.advertise_address = "127.0.0.1:1";
    options_.cancel_grace = absl::Milliseconds(500);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<Coordinator> Make() {
    auto c = Coordinator::Create(options_);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }
  // Ticks until the job reaches `state` or 20 s pass.
  v1::Job TickUntil(Coordinator& c, const std::string& id, v1::JobState state) {
    v1::Job job;
    for (int i = 0; i < 400; ++i) {
      c.Tick();
      job = c.Get(id, false)->job();
      if (job.state() == state) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return job;
  }

  fs::path dir_;
  CoordinatorOptions options_;
};

TEST_F(CoordinatorTest, BadInputIsRefusedAndStoresNothing) {
  auto c = Make();
  auto bad_yaml = c->Submit("name: t\nmodel: {n_layer: [\n", {});
  EXPECT_EQ(bad_yaml.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_yaml.status().message().find("line"), absl::string_view::npos)
      << bad_yaml.status();
  auto big = c->Submit(std::string(kMaxSpecBytes + 1, '#'), {});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  auto outside = c->Submit(kSpec, {"data.path=/etc/passwd"});
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outside.status().message().find("data.path"),
            absl::string_view::npos);
  auto too_wide = c->Submit(kSpec, {"parallel.dp=4"});
  EXPECT_EQ(too_wide.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c->List(v1::JOB_STATE_UNSPECIFIED, 0)->empty());
  EXPECT_EQ(c->List(v1::JOB_STATE_UNSPECIFIED, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, UnknownJobIsNotFoundAndRankAuthFails) {
  auto c = Make();
  EXPECT_EQ(c->Get("job-0042", false).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(c->Cancel("job-0042").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->AuthenticateRank("job-0042", "Bearer x").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(c->AuthenticateUser("Bearer nope").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(c->AuthenticateUser("Bearer user").ok());
}

TEST_F(CoordinatorTest, CancelQueuedJobTwiceIsIdempotent) {
  auto c = Make();
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_QUEUED);
  auto first = c->Cancel(job->id());
  auto second = c->Cancel(job->id());
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(second->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(first->finished_unix_ms(), second->finished_unix_ms());
}

TEST_F(CoordinatorTest, ExitZeroSucceeds) {
  auto c = Make();
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok());
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.attempts(), 1);
  EXPECT_TRUE(fs::exists(dir_ / "state/jobs" / job->id() / "spec.yaml"));
}

TEST_F(CoordinatorTest, FailureRestartsThenFailsWithLastStderrLines) {
  setenv("FAKE_MODE", "fail", 1);
  auto c = Make();
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok());
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.attempts(), 2);  // max_restarts: 1
  EXPECT_NE(done.error().find("fake rank says goodbye"), std::string::npos)
      << done.error();
  EXPECT_NE(done.error().find("code 3"), std::string::npos) << done.error();
}

TEST_F(CoordinatorTest, SilentAttemptIsKilledAsHangAndRestarted) {
  setenv("FAKE_MODE", "sleep", 1);
  auto c = Make();
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok());
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.attempts(), 2);
  EXPECT_NE(done.error().find("hang at step 0"), std::string::npos)
      << done.error();
}

TEST_F(CoordinatorTest, CancelRunningJobEndsEveryProcess) {
  setenv("FAKE_MODE", "sleep", 1);
  options_.cancel_grace = absl::Seconds(5);
  auto c = Make();
  auto job = c->Submit(kSpec, {"restart.hang_timeout_s=600"});
  ASSERT_TRUE(job.ok());
  TickUntil(*c, job->id(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(c->Cancel(job->id()).ok());
  ASSERT_TRUE(c->Cancel(job->id()).ok());
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(CoordinatorTest, RestartReadoptsLiveAttempt) {
  setenv("FAKE_MODE", "sleep", 1);
  std::string id;
  {
    auto c = Make();
    auto job = c->Submit(kSpec, {"restart.hang_timeout_s=600"});
    ASSERT_TRUE(job.ok());
    id = job->id();
    TickUntil(*c, id, v1::JOB_STATE_RUNNING);
  }  // the coordinator goes away; its attempt keeps running
  auto c = Make();
  auto got = c->Get(id, false);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->job().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(got->job().attempts(), 1);
  ASSERT_TRUE(c->Cancel(id).ok());
  EXPECT_EQ(TickUntil(*c, id, v1::JOB_STATE_CANCELLED).state(),
            v1::JOB_STATE_CANCELLED);
}

}  // namespace
}  // namespace ptrain
