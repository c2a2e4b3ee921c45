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

// `ptcoord users add NAME --role ROLE`: what it takes.
struct AddUser {
  std::string name, role, users_file;
  ptrain::Quota quota;
};

CLI::App* AddUsersCommand(CLI::App& app, AddUser& a) {
  CLI::App* users = app.add_subcommand(
      "users", "manage the users file (--users-file) and exit");
  users->require_subcommand(1);
  users->footer(
      "add NAME --role admin|member|viewer --users-file FILE [--quota-slots "
      "N] [--quota-gpus N] [--quota-running-jobs N]: see `ptcoord users add "
      "--help`");
  CLI::App* add = users->add_subcommand(
      "add",
      "print a new token for user NAME (added with --role when new) and "
      "append its SHA-256 to the users file; send ptcoord SIGHUP to load it");
  add->add_option("NAME", a.name, "user name")->required();
  add->add_option("--role", a.role, "admin|member|viewer")
      ->required()
      ->check(CLI::IsMember({"admin", "member", "viewer"}));
  add->add_option("--users-file", a.users_file, "the users file")->required();
  add->add_option("--quota-slots", a.quota.slots,
                  "a new user's limit on slots its running jobs hold (0: none)")
      ->check(CLI::NonNegativeNumber);
  add->add_option("--quota-gpus", a.quota.gpus,
                  "a new user's limit on GPUs (0: none)")
      ->check(CLI::NonNegativeNumber);
  add->add_option("--quota-running-jobs", a.quota.running_jobs,
                  "a new user's limit on jobs running at once (0: none)")
      ->check(CLI::NonNegativeNumber);
  return add;
}

int RunAddUser(const AddUser& a) {
  absl::StatusOr<std::string> token = ptrain::AddUserToken(
      a.users_file, a.name, *ptrain::RoleOfName(a.role), a.quota);
  if (!token.ok()) return Fail(token.status(), 2);
  std::printf("%s\n", token->c_str());
  std::fflush(stdout);  // the token first, where both streams meet
  std::fprintf(stderr,
               "ptcoord: the token of %s (shown once, stored nowhere) is "
               "above; %s now holds its SHA-256. A running ptcoord loads it "
               "on SIGHUP.\n",
               a.name.c_str(), a.users_file.c_str());
  return 0;
}

int Run(int argc, char** argv) {
  // Everything ptcoord writes (database, tokens, logs, the attempts' files)
  // is its user's alone.
  umask(077);
  CLI::App app{
      "ptcoord: ptrain's control plane (jobs, scheduling, supervision)"};
  ptrain::PtcoordFlags flags;
  ptrain::AddFlags(app, flags);
  AddUser add_user;
  CLI::App* add = AddUsersCommand(app, add_user);
  CLI11_PARSE(app, argc, argv);
  if (*add) return RunAddUser(add_user);
  ptrain::SetupLogging(flags.log_level);

  // Signals are taken by one thread with sigwait; block them everywhere first.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);  // reload the users
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
  for (;;) {
    sigwait(&signals, &sig);
    if (sig != SIGHUP) break;
    if (absl::Status s = c->ReloadUsers(); s.ok()) {
      spdlog::info("SIGHUP: users reloaded ({} users)",
                   c->UsersNow()->users().size());
    } else {
      spdlog::error("SIGHUP: users not reloaded, the old ones stay: {}",
                    std::string(s.message()));
    }
  }
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
