// ptcoord: the control plane's server. Parses flags, recovers state, serves
// JobService and RankService until SIGINT/SIGTERM. Running jobs survive a
// stop (the next ptcoord re-adopts them); `ptctl cancel` ends a job.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator.h"
#include "coordinator/http.h"
#include "coordinator/service.h"
#include "spdlog/spdlog.h"

namespace {

namespace fs = std::filesystem;

fs::path SelfDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : exe.parent_path();
}

// The source tree that holds this binary's build folder (it has
// proto/ptrain/v1/job.proto), else the working directory.
fs::path RepositoryRoot() {
  for (fs::path p = SelfDir(); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p / "proto/ptrain/v1/job.proto")) return p;
    if (p == p.root_path()) break;
  }
  return fs::current_path();
}

// Whether this ptworker understands --resume-from (the checkpoint release);
// an older one would refuse the flag and every attempt would fail.
bool SupportsResume(const std::string& ptworker) {
  const std::string cmd = absl::StrCat("'", ptworker, "' --help 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return false;
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  pclose(p);
  return absl::StrContains(out, "--resume-from");
}

int Run(int argc, char** argv) {
  CLI::App app{
      "ptcoord: ptrain's control plane (jobs, scheduling, supervision)"};
  std::string listen = "127.0.0.1:7070", state_dir = "ptcoord-state",
              token_file;
  std::string ptworker, mpirun = "mpirun", work_root, advertise,
                        log_level = "info";
  std::vector<std::string> data_roots;
  int local_slots = static_cast<int>(std::thread::hardware_concurrency());
  double grace_s = 10;
  app.add_option("--listen", listen,
                 "host:port to serve on (port 0: any free port)");
  app.add_option("--state-dir", state_dir, "SQLite database and job folders");
  app.add_option("--local-slots", local_slots, "ranks this host runs at once")
      ->check(CLI::Range(1, 4096));
  app.add_option(
      "--token-file", token_file,
      "user tokens, one per line (default: generate STATE_DIR/user-token)");
  app.add_option(
      "--data-root", data_roots,
      "directory that spec paths must lie under (repeatable; default: "
      "the repository's data/ and checkpoints/)");
  app.add_option("--work-root", work_root,
                 "where relative spec paths resolve and ranks run (default: "
                 "the repository)");
  app.add_option("--ptworker", ptworker,
                 "ptworker binary (default: ../worker/ptworker)");
  app.add_option("--mpirun", mpirun, "mpirun binary");
  app.add_option(
      "--advertise", advertise,
      "address ranks use to reach this server (default: from --listen)");
  app.add_option("--cancel-grace-s", grace_s, "SIGTERM to SIGKILL delay")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  std::string metrics_listen;
  app.add_option("--metrics-listen", metrics_listen,
                 "serve Prometheus /metrics and /sd (rank discovery) on "
                 "HOST:PORT; ranks then serve their own /metrics");
  CLI11_PARSE(app, argc, argv);
  ptrain::SetupLogging(log_level);

  // Signals are taken by one thread with sigwait; block them everywhere first.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ptrain::CoordinatorOptions o;
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  o.state_dir = fs::absolute(state_dir).lexically_normal().string();
  o.local_slots = local_slots;
  const fs::path repo = RepositoryRoot();
  o.work_root =
      work_root.empty() ? repo.string() : fs::absolute(work_root).string();
  if (data_roots.empty())
    data_roots = {(repo / "data").string(), (repo / "checkpoints").string()};
  for (const std::string& r : data_roots)
    o.data_roots.push_back(fs::absolute(r).string());
  o.ptworker =
      ptworker.empty()
          ? (SelfDir() / "../worker/ptworker").lexically_normal().string()
          : fs::absolute(ptworker).string();
  o.mpirun = mpirun;
  o.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  o.cancel_grace = absl::Seconds(grace_s);
  if (!fs::exists(o.ptworker)) {
    std::fprintf(stderr,
                 "ptcoord: error: ptworker not found at %s (--ptworker)\n",
                 o.ptworker.c_str());
    return 2;
  }
  o.resume_flag = SupportsResume(o.ptworker);
  if (!o.resume_flag) {
    spdlog::warn(
        "{} has no --resume-from: restarted attempts start from step 0",
        o.ptworker);
  }
  if (token_file.empty()) {
    token_file = (fs::path(o.state_dir) / "user-token").string();
    if (!fs::exists(token_file)) {
      std::ofstream(token_file) << ptrain::GenerateToken() << "\n";
      chmod(token_file.c_str(), 0600);
    }
    spdlog::info("user token in {}", token_file);
  }
  absl::StatusOr<std::vector<std::string>> tokens =
      ptrain::LoadTokenFile(token_file);
  if (!tokens.ok()) {
    std::fprintf(stderr, "ptcoord: error: %s\n",
                 std::string(tokens.status().message()).c_str());
    return 2;
  }
  o.user_tokens = *tokens;
  if (!metrics_listen.empty()) o.rank_metrics_bind = "0.0.0.0:0";

  absl::StatusOr<std::unique_ptr<ptrain::Coordinator>> coordinator =
      ptrain::Coordinator::Create(o);
  if (!coordinator.ok()) {
    std::fprintf(stderr, "ptcoord: error: %s\n",
                 std::string(coordinator.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<ptrain::Coordinator> c = std::move(*coordinator);
  absl::StatusOr<ptrain::RunningServer> server =
      ptrain::StartServer(listen, c.get());
  if (!server.ok()) {
    std::fprintf(stderr, "ptcoord: error: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  // With port 0 the port is known only now; ranks need it.
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  const std::string bound = absl::StrCat(host, ":", server->port);
  c->SetAdvertiseAddress(advertise.empty() ? bound : advertise);
  c->Start();
  std::unique_ptr<ptrain::CoordinatorHttp> http;
  if (!metrics_listen.empty()) {
    auto h = ptrain::CoordinatorHttp::Start(metrics_listen, c.get());
    if (!h.ok()) {
      std::fprintf(stderr, "ptcoord: error: %s\n",
                   std::string(h.status().message()).c_str());
      return 2;
    }
    http = std::move(*h);
    const std::string metrics_host =
        metrics_listen.substr(0, metrics_listen.rfind(':'));
    const std::string metrics_at =
        absl::StrCat(metrics_host, ":", http->port());
    std::ofstream(fs::path(o.state_dir) / "metrics_address")
        << metrics_at << "\n";
    std::printf(
        "ptcoord: metrics and rank discovery on http://%s/metrics, "
        "/sd\n",
        metrics_at.c_str());
  }
  std::ofstream(fs::path(o.state_dir) / "address") << bound << "\n";
  std::printf("ptcoord: listening on %s\n", bound.c_str());
  std::fflush(stdout);
  spdlog::info("state {}, {} slots, data roots {}, work root {}", o.state_dir,
               o.local_slots, absl::StrJoin(o.data_roots, ","), o.work_root);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: stopping (running jobs keep running)", sig);
  server->server->Shutdown(std::chrono::system_clock::now() +
                           std::chrono::seconds(2));
  c->Stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
