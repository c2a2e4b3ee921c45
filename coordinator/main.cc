// ptcoord: the control plane's server. Parses flags, recovers state, serves
// JobService and RankService (TLS with --tls-cert/--tls-key) until
// SIGINT/SIGTERM. Running jobs survive a stop (the next ptcoord re-adopts
// them); `ptctl cancel` ends a job.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/auth_token.h"
#include "common/gpu_inventory.h"
#include "common/logging.h"
#include "common/pem.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator.h"
#include "coordinator/http.h"
#include "coordinator/launcher.h"
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

// The PEM texts of the TLS flags, each checked as TLS will use it: the
// certificates parse and the key is the certificate's. A wrong file is an
// error naming its flag now, not a server that cannot listen later.
absl::Status LoadServerTls(const std::string& cert, const std::string& key,
                           const std::string& client_ca,
                           const std::string& rank_ca, ptrain::ServerTls* tls,
                           std::string* rank_ca_pem) {
  absl::StatusOr<std::string> cert_pem =
      ptrain::ReadCertificateFile("--tls-cert", cert);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ptrain::ReadPemFile("--tls-key", key);
  if (!key_pem.ok()) return key_pem.status();
  if (absl::Status s = ptrain::CheckKeyPair("--tls-cert", cert, *cert_pem,
                                            "--tls-key", key, *key_pem);
      !s.ok()) {
    return s;
  }
  if (!client_ca.empty()) {
    absl::StatusOr<std::string> pem =
        ptrain::ReadCertificateFile("--tls-client-ca", client_ca);
    if (!pem.ok()) return pem.status();
    tls->client_ca_pem = std::move(*pem);
  }
  if (!rank_ca.empty()) {
    absl::StatusOr<std::string> pem =
        ptrain::ReadCertificateFile("--tls-ca", rank_ca);
    if (!pem.ok()) return pem.status();
    *rank_ca_pem = std::move(*pem);
  } else {
    *rank_ca_pem = *cert_pem;  // a self-signed certificate is its own CA
  }
  tls->cert_pem = std::move(*cert_pem);
  tls->key_pem = std::move(*key_pem);
  return absl::OkStatus();
}

// Prints `s` as ptcoord's one error line; returns `exit_code`.
int Fail(const absl::Status& s, int exit_code) {
  std::fprintf(stderr, "ptcoord: error: %s\n",
               std::string(s.message()).c_str());
  return exit_code;
}

bool IsLoopbackHost(std::string host) {
  if (host.size() >= 2 && host.front() == '[')
    host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

int Run(int argc, char** argv) {
  // Everything ptcoord writes (database, tokens, logs, the attempts' files)
  // is its user's alone.
  umask(077);
  CLI::App app{
      "ptcoord: ptrain's control plane (jobs, scheduling, supervision)"};
  std::string listen = "127.0.0.1:7070", state_dir = "ptcoord-state",
              token_file;
  std::string ptworker, mpirun = "mpirun", work_root, advertise,
                        log_level = "info";
  std::vector<std::string> data_roots;
  int local_slots = static_cast<int>(std::thread::hardware_concurrency());
  int local_gpus = -1;
  double grace_s = 10;
  app.add_option("--listen", listen,
                 "host:port to serve on (port 0: any free port)");
  app.add_option("--state-dir", state_dir, "SQLite database and job folders");
  app.add_option("--local-slots", local_slots, "ranks this host runs at once")
      ->check(CLI::Range(1, 4096));
  app.add_option("--local-gpus", local_gpus,
                 "GPUs of this host its jobs may take, from index 0 (default: "
                 "every GPU the driver shows)")
      ->check(CLI::Range(0, 4096));
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
  std::string join_token_file;
  double node_timeout_s = 15;
  app.add_option("--join-token-file", join_token_file,
                 "tokens nodes (ptworkerd) join with, one per line (default: "
                 "no node may register)");
  app.add_option("--node-timeout-s", node_timeout_s,
                 "a node without a heartbeat for this long is down (nodes "
                 "heartbeat five times as often)")
      ->check(CLI::Range(1.0, 3600.0));
  std::string launcher, slurm_partition, slurm_account, slurm_extra;
  app.add_option("--launcher", launcher,
                 "local (mpirun on this host), nodes (mpirun through ptrsh on "
                 "the registered nodes) or slurm (one sbatch per attempt); "
                 "default: nodes with --join-token-file, else local")
      ->check(CLI::IsMember({"local", "nodes", "slurm"}));
  app.add_option("--slurm-partition", slurm_partition, "sbatch --partition");
  app.add_option("--slurm-account", slurm_account, "sbatch --account");
  app.add_option("--slurm-extra", slurm_extra,
                 "more sbatch arguments, separated by spaces");
  double slurm_node_grace_s = 30;
  app.add_option("--slurm-node-grace-s", slurm_node_grace_s,
                 "a failed Slurm attempt waits this long for Slurm to report "
                 "one of its nodes down before the failure counts as a "
                 "restart (about SlurmdTimeout)")
      ->check(CLI::Range(0.0, 3600.0));
  std::string ptrsh, cluster_network;
  app.add_option("--ptrsh", ptrsh,
                 "the launch agent mpirun starts ranks on nodes with "
                 "(default: ../worker/ptrsh)");
  app.add_option("--cluster-network", cluster_network,
                 "CIDR of the network nodes and ptcoord share (e.g. "
                 "10.0.0.0/24); OpenMPI's TCP is confined to it");
  std::string tls_cert, tls_key, tls_client_ca, tls_ca;
  app.add_option("--tls-cert", tls_cert,
                 "serve TLS with this certificate (PEM, chain leaf first)");
  app.add_option("--tls-key", tls_key, "the private key of --tls-cert (PEM)");
  app.add_option("--tls-client-ca", tls_client_ca,
                 "require job API clients (ptctl) to present a certificate "
                 "this CA signed (mutual TLS); ranks use their attempt token");
  app.add_option("--tls-ca", tls_ca,
                 "the CA ranks trust for --tls-cert (default: --tls-cert "
                 "itself, right for a self-signed certificate)");
  CLI11_PARSE(app, argc, argv);
  ptrain::SetupLogging(log_level);

  // Signals are taken by one thread with sigwait; block them everywhere first.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ptrain::ServerTls tls;
  if (tls_cert.empty() != tls_key.empty()) {
    std::fprintf(stderr,
                 "ptcoord: error: --tls-cert and --tls-key go together\n");
    return 2;
  }
  if (tls_cert.empty() && (!tls_client_ca.empty() || !tls_ca.empty())) {
    std::fprintf(stderr,
                 "ptcoord: error: --tls-client-ca and --tls-ca need "
                 "--tls-cert and --tls-key\n");
    return 2;
  }
  if (local_gpus >= 0) {
    const int shown = ptrain::GpuCount();
    if (local_gpus > shown) {
      const std::string why =
          shown == 0 ? " (" + ptrain::GpuUnavailableReason() + ")" : "";
      std::fprintf(stderr,
                   "ptcoord: error: --local-gpus %d: this host shows %d "
                   "GPU(s)%s\n",
                   local_gpus, shown, why.c_str());
      return 2;
    }
  }
  // Every file a flag names is read and checked before anything is
  // written: a refused flag leaves no state folder behind.
  std::string rank_ca_pem;
  if (!tls_cert.empty()) {
    if (absl::Status s = LoadServerTls(tls_cert, tls_key, tls_client_ca, tls_ca,
                                       &tls, &rank_ca_pem);
        !s.ok()) {
      return Fail(s, 2);
    }
  } else if (const std::string host = listen.substr(0, listen.rfind(':'));
             !IsLoopbackHost(host)) {
    // Loud on purpose: tokens and job data would cross the network in clear.
    std::fprintf(stderr,
                 "ptcoord: WARNING: serving plain text on %s, which is not "
                 "loopback: bearer tokens, specs and logs cross the network "
                 "unencrypted and can be read or forged. Use --tls-cert and "
                 "--tls-key, or --listen 127.0.0.1:PORT.\n",
                 listen.c_str());
    spdlog::warn("plain text on a non-loopback address ({}); use TLS", listen);
  }

  std::vector<std::string> user_tokens, join_tokens;
  if (!token_file.empty()) {
    absl::StatusOr<std::vector<std::string>> t =
        ptrain::LoadTokenFile(token_file, "--token-file");
    if (!t.ok()) return Fail(t.status(), 2);
    user_tokens = std::move(*t);
  }
  if (!join_token_file.empty()) {
    absl::StatusOr<std::vector<std::string>> t =
        ptrain::LoadTokenFile(join_token_file, "--join-token-file");
    if (!t.ok()) return Fail(t.status(), 2);
    join_tokens = std::move(*t);
  }

  ptrain::CoordinatorOptions o;
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  o.state_dir = fs::absolute(state_dir).lexically_normal().string();
  // Before anything is written into it (the user token below).
  if (absl::Status s = ptrain::CheckPrivateDir(o.state_dir); !s.ok()) {
    std::fprintf(stderr, "ptcoord: error: %s\n",
                 std::string(s.message()).c_str());
    return 1;
  }
  o.tls_ca_pem = rank_ca_pem;
  o.local_slots = local_slots;
  o.local_gpus = local_gpus;
  const fs::path repo = RepositoryRoot();
  o.work_root =
      work_root.empty() ? repo.string() : fs::absolute(work_root).string();
  if (data_roots.empty())
    data_roots = {(repo / "data").string(), (repo / "checkpoints").string()};
  // Resolved (symlinks followed) as the ranks get them in PTRAIN_DATA_ROOTS,
  // where ':' separates them.
  for (const std::string& r : data_roots) {
    const std::string root = fs::weakly_canonical(fs::absolute(r), ec).string();
    if (ec || root.find(':') != std::string::npos) {
      std::fprintf(stderr, "ptcoord: error: --data-root %s: %s\n", r.c_str(),
                   ec ? ec.message().c_str() : "must not contain ':'");
      return 2;
    }
    o.data_roots.push_back(root);
  }
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
      if (absl::Status s = ptrain::WritePrivateFile(
              token_file, ptrain::GenerateToken() + "\n");
          !s.ok()) {
        return Fail(s, 1);
      }
    }
    spdlog::info("user token in {}", token_file);
    absl::StatusOr<std::vector<std::string>> t =
        ptrain::LoadTokenFile(token_file, "user token file");
    if (!t.ok()) return Fail(t.status(), 2);
    user_tokens = std::move(*t);
  }
  o.user_tokens = std::move(user_tokens);
  o.nodes.join_tokens = std::move(join_tokens);
  if (launcher.empty()) launcher = join_token_file.empty() ? "local" : "nodes";
  if ((launcher == "nodes") != !join_token_file.empty()) {
    std::fprintf(stderr,
                 "ptcoord: error: --launcher %s %s --join-token-file (nodes "
                 "join with it, and only the nodes launcher uses them)\n",
                 launcher.c_str(),
                 launcher == "nodes" ? "needs" : "does not take");
    return 2;
  }
  o.slurm = launcher == "slurm";
  o.slurm_options.partition = slurm_partition;
  o.slurm_options.account = slurm_account;
  o.slurm_options.node_grace = absl::Seconds(slurm_node_grace_s);
  o.slurm_options.extra =
      absl::StrSplit(slurm_extra, ' ', absl::SkipWhitespace());
  o.nodes.timeout = absl::Seconds(node_timeout_s);
  o.ptrsh = ptrsh.empty()
                ? (SelfDir() / "../worker/ptrsh").lexically_normal().string()
                : fs::absolute(ptrsh).string();
  o.cluster_network = cluster_network;
  if (!o.nodes.join_tokens.empty() && !fs::exists(o.ptrsh)) {
    std::fprintf(stderr, "ptcoord: error: ptrsh not found at %s (--ptrsh)\n",
                 o.ptrsh.c_str());
    return 2;
  }
  o.nodes.heartbeat_interval = o.nodes.timeout / 5;
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
      ptrain::StartServer(listen, c.get(), tls);
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
    ptrain::WritePrivateFile(
        (fs::path(o.state_dir) / "metrics_address").string(), metrics_at + "\n")
        .IgnoreError();
    std::printf(
        "ptcoord: metrics and rank discovery on http://%s/metrics, "
        "/sd\n",
        metrics_at.c_str());
  }
  ptrain::WritePrivateFile((fs::path(o.state_dir) / "address").string(),
                           bound + "\n")
      .IgnoreError();
  std::printf("ptcoord: listening on %s (%s)\n", bound.c_str(),
              tls.cert_pem.empty()        ? "plain text"
              : tls.client_ca_pem.empty() ? "TLS"
                                          : "TLS, client certificates");
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
