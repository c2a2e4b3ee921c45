// control_plane_bench: the control plane's two figures — submit to first
// training step of a small job, and Get/List latency under 200 concurrent
// clients with ptcoord's RSS before and after. Prints figures; never fails
// on time.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "grpcpp/grpcpp.h"
#include "ptrain/v1/coordinator.grpc.pb.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr const char* kToken = "bench-token";

long RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  long value = 0;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> value;
      return value;
    }
  }
  return -1;
}

std::unique_ptr<grpc::ClientContext> Ctx(int timeout_s = 30) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("authorization", std::string("Bearer ") + kToken);
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(timeout_s));
  return ctx;
}

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"control_plane_bench: ptcoord submit latency and Get/List load"};
  const fs::path self = fs::read_symlink("/proc/self/exe").parent_path();
  std::string ptcoord =
      (self / "../coordinator/ptcoord").lexically_normal().string();
  std::string ptworker, spec_path = "examples/shakespeare-char.yaml";
  int clients = 200, seconds = 10, submits = 3;
  app.add_option("--ptcoord", ptcoord, "ptcoord binary");
  app.add_option("--ptworker", ptworker,
                 "ptworker binary (default: ptcoord's)");
  app.add_option("--spec", spec_path, "job spec for the submit figure");
  app.add_option("--clients", clients, "concurrent Get/List clients");
  app.add_option("--seconds", seconds, "load duration");
  app.add_option("--submits", submits, "small jobs timed submit -> first step");
  CLI11_PARSE(app, argc, argv);

  const fs::path dir =
      fs::temp_directory_path() / ("cp_bench_" + std::to_string(getpid()));
  fs::create_directories(dir / "ckpt");
  std::ofstream(dir / "tokens") << kToken << "\n";
  const pid_t coord = fork();
  if (coord == 0) {
    std::vector<std::string> args = {ptcoord,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--state-dir",
                                     (dir / "state").string(),
                                     "--local-slots",
                                     "2",
                                     "--token-file",
                                     (dir / "tokens").string(),
                                     "--data-root",
                                     "data",
                                     "--data-root",
                                     (dir / "ckpt").string(),
                                     "--log-level",
                                     "warn"};
    if (!ptworker.empty()) {
      args.push_back("--ptworker");
      args.push_back(ptworker);
    }
    std::vector<char*> a;
    for (auto& s : args) a.push_back(s.data());
    a.push_back(nullptr);
    freopen((dir / "ptcoord.log").c_str(), "w", stdout);
    execv(a[0], a.data());
    _exit(127);
  }
  std::string address;
  for (int i = 0; i < 300 && address.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream(dir / "state" / "address") >> address;
  }
  if (address.empty()) {
    std::fprintf(stderr, "ptcoord did not start; see %s\n",
                 (dir / "ptcoord.log").c_str());
    return 1;
  }
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = ptrain::v1::JobService::NewStub(channel);
  std::stringstream spec;
  spec << std::ifstream(spec_path).rdbuf();

  std::printf(
      "ptcoord %s (pid %d)\n\nsubmit -> first training step (target <= 2 s)\n",
      address.c_str(), coord);
  std::vector<std::string> ids;
  for (int i = 0; i < submits; ++i) {
    ptrain::v1::SubmitJobRequest req;
    req.set_spec_yaml(spec.str());
    for (const char* s :
         {"model.n_layer=1", "model.n_embd=32", "model.n_head=2",
          "train.steps=20", "train.sample_every=0", "train.eval_every=0"}) {
      req.add_overrides(s);
    }
    req.add_overrides("checkpoint.dir=" + (dir / "ckpt").string());
    ptrain::v1::SubmitJobResponse resp;
    const auto t0 = Clock::now();
    grpc::Status s = stub->SubmitJob(Ctx().get(), req, &resp);
    if (!s.ok()) {
      std::printf("  submit failed: %s\n", s.error_message().c_str());
      break;
    }
    ids.push_back(resp.job().id());
    ptrain::v1::WatchJobRequest w;
    w.set_job_id(resp.job().id());
    auto ctx = Ctx(120);
    auto reader = stub->WatchJob(ctx.get(), w);
    ptrain::v1::JobEvent ev;
    double first_step = -1;
    while (reader->Read(&ev)) {
      if (first_step < 0 && ev.job().progress().step() >= 1) {
        first_step = std::chrono::duration<double>(Clock::now() - t0).count();
      }
    }
    reader->Finish();
    if (first_step < 0) {
      std::printf(
          "  %s: no progress report (is the progress reporter wired?), ended "
          "%s\n",
          resp.job().id().c_str(),
          ptrain::v1::JobState_Name(ev.job().state()).c_str());
    } else {
      std::printf("  %s: first step after %.3f s\n", resp.job().id().c_str(),
                  first_step);
    }
  }

  const long rss_before = RssKiB(coord);
  std::atomic<long> errors{0};
  std::vector<std::vector<double>> lat(clients);
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      // One channel per client: 200 connections, as 200 ptctl would open.
      grpc::ChannelArguments args;
      args.SetInt("grpc.use_local_subchannel_pool", 1);
      auto ch = grpc::CreateCustomChannel(
          address, grpc::InsecureChannelCredentials(), args);
      auto st = ptrain::v1::JobService::NewStub(ch);
      for (int i = 0; Clock::now() < end; ++i) {
        const auto t0 = Clock::now();
        grpc::Status s;
        if (i % 2 == 0 && !ids.empty()) {
          ptrain::v1::GetJobRequest r;
          r.set_job_id(ids[i % ids.size()]);
          ptrain::v1::GetJobResponse resp;
          s = st->GetJob(Ctx().get(), r, &resp);
        } else {
          ptrain::v1::ListJobsRequest r;
          ptrain::v1::ListJobsResponse resp;
          s = st->ListJobs(Ctx().get(), r, &resp);
        }
        lat[c].push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - t0)
                .count());
        if (!s.ok()) ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  const long rss_after = RssKiB(coord);
  std::printf("\n%d clients x %d s of GetJob/ListJobs (target: 0 errors)\n",
              clients, seconds);
  std::printf("  requests %zu  (%.0f/s)  errors %ld\n", all.size(),
              all.size() / static_cast<double>(seconds), errors.load());
  std::printf("  latency p50 %.2f ms  p99 %.2f ms\n", Percentile(all, 0.5),
              Percentile(all, 0.99));
  std::printf("  ptcoord RSS before %.1f MiB, after %.1f MiB\n",
              rss_before / 1024.0, rss_after / 1024.0);

  kill(coord, SIGTERM);
  waitpid(coord, nullptr, 0);
  fs::remove_all(dir);
  return 0;
}
