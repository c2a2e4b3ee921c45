// ProgressReporter: configured only by ptcoord's environment, and never a
// cost to training — records to an unreachable coordinator neither block nor
// fail the rank.
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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
    return grpc::Status::OK;
  }
  std::vector<v1::ReportAliveRequest> Got() {
    std::lock_guard<std::mutex> lock(mu_);
    return got_;
  }

 private:
  std::mutex mu_;
  std::vector<v1::ReportAliveRequest> got_;
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

}  // namespace
}  // namespace ptrain
