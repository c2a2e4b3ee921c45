// ptcoord: the control plane's server. This file is its wiring: flags
// (options.h) → options and TLS → the Coordinator → its servers (server.h),
// serving until SIGINT/SIGTERM. Running jobs survive a stop (the next
// ptcoord re-adopts them); `ptctl cancel` ends a job.
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/thread_entry.h"
#include "coordinator/coordinator.h"
#include "coordinator/options.h"
#include "coordinator/server.h"
#include "spdlog/spdlog.h"

namespace {

// Prints ptcoord's one error line; returns `exit_code`.
int Fail(const std::string& message, int exit_code) {
  std::fprintf(stderr, "ptcoord: error: %s\n", message.c_str());
  return exit_code;
}

int Fail(const absl::Status& s, int exit_code) {
  return Fail(std::string(s.message()), exit_code);
}

int Run(int argc, char** argv) {
  // Everything ptcoord writes (database, tokens, logs, the attempts' files)
  // is its user's alone.
  umask(077);
  CLI::App app{
      "ptcoord: ptrain's control plane (jobs, scheduling, supervision)"};
  ptrain::PtcoordFlags flags;
  ptrain::AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  ptrain::SetupLogging(flags.log_level);

  // Signals are taken by one thread with sigwait; block them everywhere first.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ptrain::CoordinatorOptions o;
  ptrain::ServerTls tls;
  if (std::optional<ptrain::Refusal> r =
          ptrain::OptionsFromFlags(flags, &o, &tls)) {
    return Fail(r->message, r->exit_code);
  }
  absl::StatusOr<std::unique_ptr<ptrain::Coordinator>> coordinator =
      ptrain::Coordinator::Create(o);
  if (!coordinator.ok()) return Fail(coordinator.status(), 1);
  std::unique_ptr<ptrain::Coordinator> c = std::move(*coordinator);
  absl::StatusOr<ptrain::RpcServer> rpc =
      ptrain::ServeRpc(flags.listen, c.get(), tls);
  if (!rpc.ok()) return Fail(rpc.status(), 1);
  c->SetAdvertiseAddress(flags.advertise.empty() ? rpc->address
                                                 : flags.advertise);
  // Refused before any job runs: a port in use, plain text off loopback.
  std::unique_ptr<ptrain::CoordinatorUi> ui;
  if (!flags.ui_listen.empty()) {
    auto u = ptrain::ServeUi(flags.ui_listen, flags.ui_insecure, c.get(),
                             o.state_dir, tls);
    if (!u.ok()) return Fail(u.status(), 2);
    ui = std::move(*u);
  } else if (flags.ui_insecure) {
    return Fail("--ui-insecure is for --ui-listen, which is not given", 2);
  }
  c->Start();
  std::unique_ptr<ptrain::CoordinatorHttp> http;
  if (!flags.metrics_listen.empty()) {
    auto h = ptrain::ServeMetrics(flags.metrics_listen, c.get(), o.state_dir);
    if (!h.ok()) return Fail(h.status(), 2);
    http = std::move(*h);
  }
  ptrain::AnnounceAddress(o.state_dir, rpc->address, tls);
  spdlog::info("state {}, {} slots, data roots {}, work root {}", o.state_dir,
               o.local_slots, absl::StrJoin(o.data_roots, ","), o.work_root);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: stopping (running jobs keep running)", sig);
  rpc->running.server->Shutdown(std::chrono::system_clock::now() +
                                std::chrono::seconds(2));
  c->Stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ptrain::MainEntry([&] { return Run(argc, argv); });
}
