// ProgressReporter: configured only by ptcoord's environment, and never a
// cost to training — records to an unreachable coordinator neither block nor
// fail the rank.
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/spec.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ptrain/v1/coordinator.grpc.pb.h"
#include "worker/progress_reporter.h"

namespace ptrain {
namespace {

// What ptcoord sets for a rank of attempt `attempt` of job-0001.
void SetRankEnvironment(const std::string& coordinator,
                        const std::string& attempt) {
  setenv("PTRAIN_COORDINATOR", coordinator.c_str(), 1);
  setenv("PTRAIN_JOB_ID", "job-0001", 1);
  setenv("PTRAIN_JOB_TOKEN", "t", 1);
  setenv("PTRAIN_ATTEMPT", attempt.c_str(), 1);
}

TEST(ProgressReporterTest, AbsentCoordinatorMeansNoReporter) {
  unsetenv("PTRAIN_COORDINATOR");
  auto r = ProgressReporter::FromEnvironment();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, nullptr);
}

TEST(ProgressReporterTest, IncompleteEnvironmentIsAnError) {
  SetRankEnvironment("127.0.0.1:1", "zero");
  EXPECT_EQ(ProgressReporter::FromEnvironment().status().code(),
            absl::StatusCode::kInvalidArgument);
  unsetenv("PTRAIN_JOB_TOKEN");
  setenv("PTRAIN_ATTEMPT", "1", 1);
  EXPECT_FALSE(ProgressReporter::FromEnvironment().ok());
  unsetenv("PTRAIN_COORDINATOR");
}

TEST(ProgressReporterTest, UnreachableCoordinatorNeverBlocksTraining) {
  // Port 1 on loopback: connection refused at once.
  SetRankEnvironment("127.0.0.1:1", "1");
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

// A RankService that only records the signs of life it gets.
class AliveRecorder final : public v1::RankService::Service {
 public:
  grpc::Status ReportAlive(grpc::ServerContext*,
                           const v1::ReportAliveRequest* req,
                           v1::ReportAliveResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    got_.push_back(*req);
    last_ = std::chrono::steady_clock::now();
    return grpc::Status::OK;
  }
  std::vector<v1::ReportAliveRequest> Got() {
    std::lock_guard<std::mutex> lock(mu_);
    return got_;
  }
  // When the newest request arrived.
  std::chrono::steady_clock::time_point Last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  std::mutex mu_;
  std::vector<v1::ReportAliveRequest> got_;
  std::chrono::steady_clock::time_point last_;
};

// A reporter of rank 1 of attempt `attempt` to `service`, served at once
// on a free port (*server).
absl::StatusOr<std::unique_ptr<ProgressReporter>> ReporterOfRank1(
    AliveRecorder& service, const std::string& attempt,
    std::unique_ptr<grpc::Server>* server) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  *server = builder.BuildAndStart();
  if (*server == nullptr) return absl::UnavailableError("no server");
  SetRankEnvironment("127.0.0.1:" + std::to_string(port), attempt);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  auto r = ProgressReporter::FromEnvironment();
  unsetenv("PTRAIN_COORDINATOR");
  unsetenv("OMPI_COMM_WORLD_RANK");
  return r;
}

// A rank busy with something that ends no step (loading a large data file)
// says it is alive at once and then at every interval, and stops once it
// is done: its hang timer then runs on its steps again.
TEST(ProgressReporterTest, ABusyRankSaysItIsAliveUntilItIsDone) {
  AliveRecorder service;
  std::unique_ptr<grpc::Server> server;
  auto r = ReporterOfRank1(service, "3", &server);
  ASSERT_TRUE(r.ok() && *r != nullptr);
  EXPECT_EQ(ProgressReporter::AliveInterval(20), std::chrono::seconds(5));
  EXPECT_EQ(ProgressReporter::AliveInterval(1), std::chrono::milliseconds(250));
  EXPECT_EQ(ProgressReporter::AliveInterval(3600), std::chrono::seconds(10));
  (*r)->SetAliveInterval(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(service.Got().empty());  // not busy: nothing to say
  (*r)->SetActivity("loading data");
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  (*r)->SetActivity("");
  const std::vector<v1::ReportAliveRequest> busy = service.Got();
  EXPECT_GE(busy.size(), 5u);
  EXPECT_LE(busy.size(), 12u);
  for (const v1::ReportAliveRequest& a : busy) {
    EXPECT_EQ(a.job_id(), "job-0001");
    EXPECT_EQ(a.attempt(), 3);
    EXPECT_EQ(a.rank(), 1);
    EXPECT_EQ(a.activity(), "loading data");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_LE(service.Got().size(), busy.size() + 1);  // one may be in flight
  r->reset();
  server->Shutdown();
}

// A rank whose coordinator answers trains on however long it runs; once no
// report has been answered for the grace (PTRAIN_COORDINATOR_GRACE_S), the
// rank is told, once, to stop at a checkpoint.
TEST(ProgressReporterTest, ACoordinatorSilentPastTheGraceStopsTheRankOnce) {
  AliveRecorder service;
  std::unique_ptr<grpc::Server> server;
  setenv("PTRAIN_COORDINATOR_GRACE_S", "0.6", 1);
  auto r = ReporterOfRank1(service, "1", &server);
  unsetenv("PTRAIN_COORDINATOR_GRACE_S");
  ASSERT_TRUE(r.ok() && *r != nullptr);
  std::atomic<int> lost{0};
  (*r)->OnCoordinatorLost([&lost] { ++lost; });
  (*r)->SetProgressProbe([] { return int64_t{0}; });
  (*r)->SetAliveInterval(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(lost, 0) << "stopped while its coordinator answered";
  ASSERT_GE(service.Got().size(), 1u) << "no report reached the coordinator";
  server->Shutdown();
  server.reset();
  const auto answered = service.Last();  // no answer after this one
  const auto gone = std::chrono::steady_clock::now();
  while (lost == 0 &&
         std::chrono::steady_clock::now() - gone < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double after_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - answered)
          .count();
  EXPECT_EQ(lost, 1) << "never told to stop";
  EXPECT_GE(after_s, 0.6) << "told before the grace had passed";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(lost, 1) << "told more than once";
  r->reset();
}

TEST(ProgressReporterTest, ABadGraceIsAnErrorNamingIt) {
  SetRankEnvironment("127.0.0.1:1", "1");
  for (const char* bad : {"-1", "soon", "nan", "1e9"}) {
    setenv("PTRAIN_COORDINATOR_GRACE_S", bad, 1);
    auto r = ProgressReporter::FromEnvironment();
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("PTRAIN_COORDINATOR_GRACE_S"),
              std::string::npos)
        << r.status();
  }
  unsetenv("PTRAIN_COORDINATOR_GRACE_S");
  unsetenv("PTRAIN_COORDINATOR");
}

// Every rank of a job under ptcoord says at every interval how long ago
// it last made progress, busy or not: what tells a long step from a hang.
TEST(ProgressReporterTest, WithAProbeEveryIntervalCarriesTheProgressAge) {
  AliveRecorder service;
  std::unique_ptr<grpc::Server> server;
  auto r = ReporterOfRank1(service, "2", &server);
  ASSERT_TRUE(r.ok() && *r != nullptr);
  (*r)->SetAliveInterval(std::chrono::milliseconds(100));
  std::atomic<int64_t> age{-1};
  (*r)->SetProgressProbe([&age] { return age.load(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  age = 1234;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  (*r)->SetProgressProbe(nullptr);
  const std::vector<v1::ReportAliveRequest> got = service.Got();
  ASSERT_GE(got.size(), 5u);
  EXPECT_LE(got.size(), 12u);
  EXPECT_EQ(got.front().progress_age_ms(), -1);
  EXPECT_EQ(got.back().progress_age_ms(), 1234);
  for (const v1::ReportAliveRequest& a : got) {
    EXPECT_EQ(a.activity(), "");  // not busy, only alive
    EXPECT_EQ(a.attempt(), 2);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_LE(service.Got().size(), got.size() + 1);  // off again
  r->reset();
  server->Shutdown();
}

// The ReportAlive requests with step times `service` got, waiting up to 5 s
// for `n` of them.
std::vector<v1::ReportAliveRequest> TimesGot(AliveRecorder& service, size_t n) {
  std::vector<v1::ReportAliveRequest> times;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (true) {
    times.clear();
    for (const v1::ReportAliveRequest& a : service.Got()) {
      if (a.has_times()) times.push_back(a);
    }
    if (times.size() >= n || std::chrono::steady_clock::now() > deadline) {
      return times;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

RankStep StepOf(int64_t step, double seconds, double exposed,
                std::map<std::string, double> comm) {
  RankStep s;
  s.step = step;
  s.seconds = seconds;
  s.comm_exposed = exposed;
  s.comm_seconds = std::move(comm);
  return s;
}

// A training rank's step times go out once an interval: the means per step
// of the steps since the previous report, each group's communication the
// difference of its running totals. The first step only sets the baseline
// (the totals then hold the setup's communication, which no step covers).
// They carry the progress age as every heartbeat does.
TEST(ProgressReporterTest, StepTimesAreMeansOverTheStepsSinceThePreviousOne) {
  AliveRecorder service;
  std::unique_ptr<grpc::Server> server;
  auto r = ReporterOfRank1(service, "4", &server);
  ASSERT_TRUE(r.ok() && *r != nullptr);
  ProgressReporter& rep = **r;
  EXPECT_EQ(ProgressReporter::kRankTimesEvery, std::chrono::seconds(1));
  rep.SetProgressProbe([] { return int64_t{42}; });
  // Not due until the interval is shortened below.
  rep.SetRankTimesInterval(std::chrono::hours(1));
  rep.OnRankStep(StepOf(10, 9.0, 1.0, {{"dp", 5.0}, {"tp", 2.0}}));
  rep.OnRankStep(
      StepOf(11, 0.125, 0.0, {{"dp", 5.25}, {"tp", 2.0}, {"world", 0.5}}));
  rep.OnRankStep(
      StepOf(12, 0.25, 0.03125, {{"dp", 5.5}, {"tp", 2.125}, {"world", 0.5}}));
  rep.SetRankTimesInterval(std::chrono::milliseconds(0));
  rep.OnRankStep(
      StepOf(13, 0.375, 0.0625, {{"dp", 5.75}, {"tp", 2.375}, {"world", 0.5}}));
  // Sent before the next step: while it waits, steps add to it instead.
  ASSERT_EQ(TimesGot(service, 1).size(), 1u);
  rep.OnRankStep(
      StepOf(14, 0.5, 0.0, {{"dp", 6.0}, {"tp", 2.375}, {"world", 0.75}}));
  const std::vector<v1::ReportAliveRequest> got = TimesGot(service, 2);
  ASSERT_EQ(got.size(), 2u);

  const v1::RankTimes& a = got[0].times();
  EXPECT_EQ(got[0].rank(), 1);
  EXPECT_EQ(got[0].attempt(), 4);
  EXPECT_EQ(got[0].progress_age_ms(), 42);
  EXPECT_EQ(got[0].activity(), "");
  EXPECT_EQ(a.step(), 13);
  EXPECT_EQ(a.steps(), 3);                  // 11, 12 and 13: not the first, 10
  EXPECT_DOUBLE_EQ(a.step_ms(), 250.0);     // (125 + 250 + 375) / 3
  EXPECT_DOUBLE_EQ(a.exposed_ms(), 31.25);  // (0 + 31.25 + 62.5) / 3
  ASSERT_EQ(a.comm_ms().size(), 3u);
  EXPECT_DOUBLE_EQ(a.comm_ms().at("dp"), 250.0);         // (5.75 - 5) / 3
  EXPECT_DOUBLE_EQ(a.comm_ms().at("tp"), 125.0);         // (2.375 - 2) / 3
  EXPECT_DOUBLE_EQ(a.comm_ms().at("world"), 500.0 / 3);  // new: from 0

  // The next covers step 14 alone, from the totals the first ended at.
  const v1::RankTimes& b = got[1].times();
  EXPECT_EQ(b.step(), 14);
  EXPECT_EQ(b.steps(), 1);
  EXPECT_DOUBLE_EQ(b.step_ms(), 500.0);
  EXPECT_DOUBLE_EQ(b.exposed_ms(), 0.0);
  ASSERT_EQ(b.comm_ms().size(), 3u);
  EXPECT_DOUBLE_EQ(b.comm_ms().at("dp"), 250.0);
  EXPECT_DOUBLE_EQ(b.comm_ms().at("tp"), 0.0);
  EXPECT_DOUBLE_EQ(b.comm_ms().at("world"), 250.0);
  r->reset();
  server->Shutdown();
}

// "g0" .. "g9".
std::string Group(int i) { return {'g', static_cast<char>('0' + i)}; }

// RankTimes holds at most 8 groups with names of at most 16 letters, digits
// or '_': another name is dropped, and of more groups the ones with the least
// time.
TEST(ProgressReporterTest, StepTimesKeepTheEightBusiestGroupsWithValidNames) {
  AliveRecorder service;
  std::unique_ptr<grpc::Server> server;
  auto r = ReporterOfRank1(service, "1", &server);
  ASSERT_TRUE(r.ok() && *r != nullptr);
  (*r)->SetRankTimesInterval(std::chrono::milliseconds(0));
  const std::string long_name(kMaxRankTimesGroupBytes + 1, 'x');
  const std::string longest(kMaxRankTimesGroupBytes, 'y');
  std::map<std::string, double> totals;
  (*r)->OnRankStep(StepOf(1, 1.0, 0.0, totals));
  // Group g<i> spent i seconds; the longest allowed name the most.
  for (int i = 0; i < 9; ++i) totals[Group(i)] = i;
  totals[long_name] = 100.0;
  totals["d-p"] = 100.0;  // not a name ptcoord takes
  totals[longest] = 50.0;
  (*r)->OnRankStep(StepOf(2, 1.0, 0.0, totals));
  const std::vector<v1::ReportAliveRequest> got = TimesGot(service, 1);
  ASSERT_EQ(got.size(), 1u);
  const auto& comm = got[0].times().comm_ms();
  EXPECT_EQ(comm.size(), kMaxRankTimesGroups);
  EXPECT_EQ(comm.count(long_name) + comm.count("d-p"), 0u);
  EXPECT_DOUBLE_EQ(comm.at(longest), 50e3);
  for (int i = 2; i < 9; ++i) {
    EXPECT_DOUBLE_EQ(comm.at(Group(i)), i * 1e3) << i;
  }
  EXPECT_EQ(comm.count("g0") + comm.count("g1"), 0u);
  r->reset();
  server->Shutdown();
}

}  // namespace
}  // namespace ptrain
