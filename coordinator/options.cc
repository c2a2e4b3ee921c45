// ptcoord's flags into CoordinatorOptions; see options.h. The checks run in
// the order a user meets them: TLS and GPU flags, token files, the state
// dir, paths and binaries, the launcher.
#include "coordinator/options.h"

#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/auth_token.h"
#include "common/gpu_inventory.h"
#include "common/net.h"
#include "common/pem.h"
#include "common/process.h"
#include "coordinator/auth.h"
#include "coordinator/launcher.h"
#include "coordinator/layout_planner.h"
#include "coordinator/users.h"
#include "planner/profile.h"
#include "spdlog/spdlog.h"

namespace ptrain {

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
                           const std::string& rank_ca, ServerTls* tls,
                           std::string* rank_ca_pem) {
  absl::StatusOr<std::string> cert_pem =
      ReadCertificateFile("--tls-cert", cert);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadPemFile("--tls-key", key);
  if (!key_pem.ok()) return key_pem.status();
  if (absl::Status s = CheckKeyPair("--tls-cert", cert, *cert_pem, "--tls-key",
                                    key, *key_pem);
      !s.ok()) {
    return s;
  }
  if (!client_ca.empty()) {
    absl::StatusOr<std::string> pem =
        ReadCertificateFile("--tls-client-ca", client_ca);
    if (!pem.ok()) return pem.status();
    // Said once at start: a refused client certificate ends in the TLS
    // handshake, where gRPC logs no more than "certificate verify failed".
    std::vector<std::string> subjects;
    for (const CertificateNames& n : DescribeCertificates(*pem)) {
      subjects.push_back(n.subject);
    }
    spdlog::info(
        "mutual TLS: the job API takes client certificates issued by {} "
        "(--tls-client-ca {})",
        absl::StrJoin(subjects, " or "), client_ca);
    tls->client_ca_pem = std::move(*pem);
  }
  if (!rank_ca.empty()) {
    absl::StatusOr<std::string> pem = ReadCertificateFile("--tls-ca", rank_ca);
    if (!pem.ok()) return pem.status();
    *rank_ca_pem = std::move(*pem);
  } else {
    *rank_ca_pem = *cert_pem;  // a self-signed certificate is its own CA
  }
  tls->cert_pem = std::move(*cert_pem);
  tls->key_pem = std::move(*key_pem);
  return absl::OkStatus();
}

bool IsLoopbackHost(std::string host) {
  if (host.size() >= 2 && host.front() == '[')
    host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

Refusal Refuse(const absl::Status& s, int exit_code) {
  return Refusal{std::string(s.message()), exit_code};
}

// The TLS and GPU flags: pairs given together, --local-gpus within what
// the host shows, the TLS files loaded (`o.tls_ca_pem`: what the ranks
// trust), else a warning when plain text would leave loopback.
std::optional<Refusal> CheckTlsAndGpus(const PtcoordFlags& f,
                                       CoordinatorOptions* o, ServerTls* tls) {
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    return Refusal{"--tls-cert and --tls-key go together"};
  }
  if (f.tls_cert.empty() && (!f.tls_client_ca.empty() || !f.tls_ca.empty())) {
    return Refusal{
        "--tls-client-ca and --tls-ca need --tls-cert and --tls-key"};
  }
  if (f.local_gpus >= 0) {
    const int shown = GpuCount();
    if (f.local_gpus > shown) {
      const std::string why =
          shown == 0 ? " (" + GpuUnavailableReason() + ")" : "";
      return Refusal{absl::StrCat("--local-gpus ", f.local_gpus,
                                  ": this host shows ", shown, " GPU(s)", why)};
    }
  }
  // Every file a flag names is read and checked before anything is
  // written: a refused flag leaves no state folder behind.
  if (!f.tls_cert.empty()) {
    if (absl::Status s = LoadServerTls(f.tls_cert, f.tls_key, f.tls_client_ca,
                                       f.tls_ca, tls, &o->tls_ca_pem);
        !s.ok()) {
      return Refuse(s, 2);
    }
  } else if (const std::string host = f.listen.substr(0, f.listen.rfind(':'));
             !IsLoopbackHost(host)) {
    // Loud on purpose: tokens and job data would cross the network in clear.
    std::fprintf(stderr,
                 "ptcoord: WARNING: serving plain text on %s, which is not "
                 "loopback: bearer tokens, specs and logs cross the network "
                 "unencrypted and can be read or forged. Use --tls-cert and "
                 "--tls-key, or --listen 127.0.0.1:PORT.\n",
                 f.listen.c_str());
    spdlog::warn("plain text on a non-loopback address ({}); use TLS",
                 f.listen);
  }
  return std::nullopt;
}

// --ui-listen in plain text off loopback (--ui-insecure): as loud as the
// warning for --listen, since the login form and cookie carry a user token.
void WarnOfPlainTextUi(const PtcoordFlags& f) {
  if (f.ui_listen.empty() || !f.tls_cert.empty() || !f.ui_insecure) return;
  const std::string host = f.ui_listen.substr(0, f.ui_listen.rfind(':'));
  if (IsLoopbackHost(host)) return;
  std::fprintf(stderr,
               "ptcoord: WARNING: the web UI serves plain text on %s, which "
               "is not loopback (--ui-insecure): the user token (login form, "
               "cookie) and job data cross the network unencrypted and can "
               "be read or replayed. Use --tls-cert and --tls-key, or "
               "--ui-listen 127.0.0.1:PORT.\n",
               f.ui_listen.c_str());
  spdlog::warn("web UI in plain text on a non-loopback address ({}); use TLS",
               f.ui_listen);
}

// The token files: --token-file into `o.user_tokens`, --join-token-file into
// `o.nodes.join_tokens` (and --require-node-approval, which needs it).
// Tokens short enough to guess are accepted, with a warning each.
std::optional<Refusal> LoadTokenFiles(const PtcoordFlags& f,
                                      CoordinatorOptions* o) {
  if (f.require_node_approval && f.join_token_file.empty()) {
    return Refusal{
        "--require-node-approval needs --join-token-file (it holds the nodes "
        "that join with a join token until an operator approves them; "
        "without one no node joins)"};
  }
  o->nodes.require_approval = f.require_node_approval;
  std::vector<std::string> short_tokens;
  if (!f.users_file.empty() && !f.token_file.empty()) {
    return Refusal{
        "--users-file and --token-file: give one (a users file names each "
        "token's user and role; docs/users.md says how to move to one)"};
  }
  if (!f.users_file.empty()) {
    const std::string path = fs::absolute(f.users_file).string();
    absl::StatusOr<UserTable> t = UserTable::Load(path);
    if (!t.ok()) return Refuse(t.status(), 2);
    o->users_file = path;
  }
  if (!f.token_file.empty()) {
    absl::StatusOr<std::vector<std::string>> t =
        LoadTokenFile(f.token_file, "--token-file", &short_tokens);
    if (!t.ok()) return Refuse(t.status(), 2);
    o->user_tokens = std::move(*t);
    o->token_file = fs::absolute(f.token_file).string();
  }
  o->audit_max_bytes = static_cast<size_t>(f.audit_max_mb * (1 << 20));
  o->audit_keep = static_cast<size_t>(f.audit_keep);
  o->preempt_grace = absl::Seconds(f.preempt_grace_s);
  o->fairshare_half_life = absl::Hours(f.fairshare_half_life_h);
  if (!f.join_token_file.empty()) {
    absl::StatusOr<std::vector<std::string>> t =
        LoadTokenFile(f.join_token_file, "--join-token-file", &short_tokens);
    if (!t.ok()) return Refuse(t.status(), 2);
    o->nodes.join_tokens = std::move(*t);
    // A connect refused or unanswered may pass (a node still starting, a
    // network hiccup): the daemon tries again. A name that does not
    // resolve will not: it is refused for good.
    o->nodes.check_address = [](const std::string& address) {
      absl::Status s = CheckConnects(address, 2000);
      if (s.ok() || s.code() == absl::StatusCode::kInvalidArgument) return s;
      return absl::FailedPreconditionError(s.message());
    };
  }
  for (const std::string& warning : short_tokens) {
    std::fprintf(stderr, "ptcoord: WARNING: %s\n", warning.c_str());
  }
  return std::nullopt;
}

// The state dir (created, private), the roots, the binaries and the
// defaults that follow from where this binary is.
std::optional<Refusal> SetPaths(const PtcoordFlags& f, CoordinatorOptions* o) {
  std::error_code ec;
  fs::create_directories(f.state_dir, ec);
  o->state_dir = fs::absolute(f.state_dir).lexically_normal().string();
  // Before anything is written into it (the user token below).
  if (absl::Status s = CheckPrivateDir(o->state_dir); !s.ok()) {
    return Refuse(s, 1);
  }
  o->local_slots = f.local_slots;
  o->local_gpus = f.local_gpus;
  const fs::path repo = RepositoryRoot();
  o->work_root =
      f.work_root.empty() ? repo.string() : fs::absolute(f.work_root).string();
  std::vector<std::string> data_roots = f.data_roots;
  if (data_roots.empty()) {
    data_roots = {(repo / "data").string(), (repo / "checkpoints").string()};
    // Where the examples checkpoint (checkpoint.dir: checkpoints/...): a
    // fresh checkout has no such folder, and ranks confined to the data
    // roots could not make one. Made if it can be; else the ranks say so.
    fs::create_directories(repo / "checkpoints", ec);
    ec.clear();
  }
  // Resolved (symlinks followed) as the ranks get them in PTRAIN_DATA_ROOTS,
  // where ':' separates them.
  for (const std::string& r : data_roots) {
    const std::string root = fs::weakly_canonical(fs::absolute(r), ec).string();
    if (ec || root.find(':') != std::string::npos) {
      return Refusal{absl::StrCat("--data-root ", r, ": ",
                                  ec ? ec.message() : "must not contain ':'")};
    }
    o->data_roots.push_back(root);
  }
  const std::string ckpt_root =
      f.checkpoint_root.empty()
          ? (fs::path(o->state_dir) / "checkpoints").string()
          : fs::absolute(f.checkpoint_root).string();
  fs::create_directories(ckpt_root, ec);
  if (ec) {
    return Refusal{absl::StrCat("--checkpoint-root ", ckpt_root,
                                ": cannot create it: ", ec.message())};
  }
  o->checkpoint_root = fs::weakly_canonical(ckpt_root, ec).string();
  if (ec || o->checkpoint_root.find(':') != std::string::npos) {
    return Refusal{absl::StrCat("--checkpoint-root ", ckpt_root, ": ",
                                ec ? ec.message() : "must not contain ':'")};
  }
  o->ptworker =
      f.ptworker.empty()
          ? (SelfDir() / "../worker/ptworker").lexically_normal().string()
          : fs::absolute(f.ptworker).string();
  o->mpirun = f.mpirun;
  o->cores =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  o->cpus = AllowedCpus();
  o->cancel_grace = absl::Seconds(f.grace_s);
  o->rank_coordinator_grace = absl::Seconds(f.orphan_grace_s);
  o->ended_job_retention = absl::Hours(24) * f.retain_ended_days;
  if (!fs::exists(o->ptworker)) {
    return Refusal{
        absl::StrCat("ptworker not found at ", o->ptworker, " (--ptworker)")};
  }
  o->resume_flag = SupportsResume(o->ptworker);
  if (!o->resume_flag) {
    spdlog::warn(
        "{} has no --resume-from: restarted attempts start from step 0",
        o->ptworker);
  }
  return std::nullopt;
}

// Without --users-file or --token-file: the token in STATE/user-token,
// generated once, an admin's.
std::optional<Refusal> SetDefaultUserToken(const PtcoordFlags& f,
                                           CoordinatorOptions* o) {
  if (!f.token_file.empty() || !f.users_file.empty()) return std::nullopt;
  const std::string token_file =
      (fs::path(o->state_dir) / "user-token").string();
  if (!fs::exists(token_file)) {
    if (absl::Status s = ReplacePrivateFile(token_file, GenerateToken() + "\n");
        !s.ok()) {
      return Refuse(s, 1);
    }
  }
  spdlog::info("user token in {}", token_file);
  absl::StatusOr<std::vector<std::string>> t =
      LoadTokenFile(token_file, "user token file");
  if (!t.ok()) return Refuse(t.status(), 2);
  o->user_tokens = std::move(*t);
  o->token_file = token_file;
  return std::nullopt;
}

// --launcher (default: nodes with a join token, else local) and what each
// launcher takes: Slurm's options, the nodes' timeout and launch agent.
std::optional<Refusal> SetLauncher(const PtcoordFlags& f,
                                   CoordinatorOptions* o) {
  const std::string launcher = !f.launcher.empty()         ? f.launcher
                               : f.join_token_file.empty() ? "local"
                                                           : "nodes";
  if ((launcher == "nodes") != !f.join_token_file.empty()) {
    return Refusal{absl::StrCat(
        "--launcher ", launcher, " ",
        launcher == "nodes" ? "needs" : "does not take",
        " --join-token-file (nodes join with it, and only the nodes "
        "launcher uses them)")};
  }
  o->slurm = launcher == "slurm";
  o->slurm_options.partition = f.slurm_partition;
  o->slurm_options.account = f.slurm_account;
  o->slurm_options.node_grace = absl::Seconds(f.slurm_node_grace_s);
  o->slurm_options.extra =
      absl::StrSplit(f.slurm_extra, ' ', absl::SkipWhitespace());
  o->nodes.timeout = absl::Seconds(f.node_timeout_s);
  o->ptrsh = f.ptrsh.empty()
                 ? (SelfDir() / "../worker/ptrsh").lexically_normal().string()
                 : fs::absolute(f.ptrsh).string();
  o->cluster_network = f.cluster_network;
  if (!o->nodes.join_tokens.empty() && !fs::exists(o->ptrsh)) {
    return Refusal{absl::StrCat("ptrsh not found at ", o->ptrsh, " (--ptrsh)")};
  }
  o->nodes.heartbeat_interval = o->nodes.timeout / 5;
  if (!f.metrics_listen.empty()) o->rank_metrics_bind = "0.0.0.0:0";
  return std::nullopt;
}

}  // namespace

void AddFlags(CLI::App& app, PtcoordFlags& f) {
  app.add_option("--listen", f.listen,
                 "host:port to serve on (port 0: any free port)");
  app.add_option("--state-dir", f.state_dir, "SQLite database and job folders");
  app.add_option("--local-slots", f.local_slots, "ranks this host runs at once")
      ->check(CLI::Range(1, 4096));
  app.add_option("--local-gpus", f.local_gpus,
                 "GPUs of this host its jobs may take, from index 0 (default: "
                 "every GPU the driver shows)")
      ->check(CLI::Range(0, 4096));
  app.add_option(
      "--token-file", f.token_file,
      "user tokens, one per line, each an admin named token-N (default: "
      "generate STATE_DIR/user-token); see --users-file");
  app.add_option("--users-file", f.users_file,
                 "users, roles, token hashes and quotas (YAML, "
                 "docs/users.md); reread on SIGHUP; `ptcoord users add` "
                 "makes tokens");
  app.add_option("--audit-max-mb", f.audit_max_mb,
                 "STATE_DIR/audit.jsonl turns over at this size")
      ->check(CLI::Range(0.01, 1e6));
  app.add_option("--preempt-grace-s", f.preempt_grace_s,
                 "how long a job preempted for one of higher priority has to "
                 "save its step and stop before it is killed (it then goes "
                 "on from its newest checkpoint)")
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--fairshare-half-life", f.fairshare_half_life_h,
                 "hours in which a user's past usage (slot-seconds) halves; "
                 "among queued jobs of one priority the user of the least "
                 "goes first")
      ->check(CLI::Range(0.0001, 1e6));
  app.add_option("--audit-keep", f.audit_keep,
                 "older audit files kept (audit.1.jsonl ...)")
      ->check(CLI::Range(1, 1000));
  app.add_option(
      "--data-root", f.data_roots,
      "directory that spec paths must lie under (repeatable; default: "
      "the repository's data/ and checkpoints/)");
  app.add_option("--checkpoint-root", f.checkpoint_root,
                 "where a job whose spec names no checkpoint.dir checkpoints "
                 "(a folder per job; default: STATE_DIR/checkpoints)");
  app.add_option("--work-root", f.work_root,
                 "where relative spec paths resolve and ranks run (default: "
                 "the repository)");
  app.add_option("--ptworker", f.ptworker,
                 "ptworker binary (default: ../worker/ptworker)");
  app.add_option("--mpirun", f.mpirun, "mpirun binary");
  app.add_option(
      "--advertise", f.advertise,
      "address ranks use to reach this server (default: from --listen)");
  app.add_option("--cancel-grace-s", f.grace_s, "SIGTERM to SIGKILL delay")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--orphan-grace-s", f.orphan_grace_s,
                 "ranks that cannot reach this ptcoord for so long stop at "
                 "a checkpoint (exit 3); 0: never")
      ->check(CLI::Range(0.0, 7.0 * 24 * 3600));
  app.add_option("--retain-ended-days", f.retain_ended_days,
                 "forget an ended job this many days after it finished, as "
                 "`ptctl delete` (its checkpoints kept); 0: keep every job")
      ->check(CLI::Range(0.0, 36500.0));
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error");
  app.add_option("--metrics-listen", f.metrics_listen,
                 "serve Prometheus /metrics and /sd (rank discovery) on "
                 "HOST:PORT; ranks then serve their own /metrics");
  app.add_option(
      "--ui-listen", f.ui_listen,
      "serve the web UI (jobs, loss curves, ranks, nodes; read-only, "
      "behind the user token) on HOST:PORT, over TLS with "
      "--tls-cert");
  app.add_flag("--ui-insecure", f.ui_insecure,
               "allow --ui-listen in plain text on an address that is not "
               "loopback");
  app.add_option("--join-token-file", f.join_token_file,
                 "tokens nodes (ptworkerd) join with, one per line (default: "
                 "no node may register)");
  app.add_flag("--require-node-approval", f.require_node_approval,
               "a node that joins under a new name takes no job until an "
               "operator runs 'ptctl nodes approve NAME' (stored; nodes known "
               "before keep their standing)");
  app.add_option("--node-timeout-s", f.node_timeout_s,
                 "a node without a heartbeat for this long is down (nodes "
                 "heartbeat five times as often)")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--launcher", f.launcher,
                 "local (mpirun on this host), nodes (mpirun through ptrsh on "
                 "the registered nodes) or slurm (one sbatch per attempt); "
                 "default: nodes with --join-token-file, else local")
      ->check(CLI::IsMember({"local", "nodes", "slurm"}));
  app.add_option("--slurm-partition", f.slurm_partition, "sbatch --partition");
  app.add_option("--slurm-account", f.slurm_account, "sbatch --account");
  app.add_option("--slurm-extra", f.slurm_extra,
                 "more sbatch arguments, separated by spaces");
  app.add_option("--slurm-node-grace-s", f.slurm_node_grace_s,
                 "a failed Slurm attempt waits this long for Slurm to report "
                 "one of its nodes down before the failure counts as a "
                 "restart (about SlurmdTimeout)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--ptrsh", f.ptrsh,
                 "the launch agent mpirun starts ranks on nodes with "
                 "(default: ../worker/ptrsh)");
  app.add_option("--cluster-network", f.cluster_network,
                 "CIDR of the network nodes and ptcoord share (e.g. "
                 "10.0.0.0/24); OpenMPI's TCP is confined to it");
  app.add_option("--planner-profile", f.planner_profile,
                 "the hardware `parallel: auto` jobs are planned on: a100, "
                 "h100, h200, or a file `ptworker profile` wrote (default: "
                 "none, and such jobs are refused)");
  app.add_option("--tls-cert", f.tls_cert,
                 "serve TLS with this certificate (PEM, chain leaf first)");
  app.add_option("--tls-key", f.tls_key, "the private key of --tls-cert (PEM)");
  app.add_option("--tls-client-ca", f.tls_client_ca,
                 "require job API clients (ptctl) to present a certificate "
                 "this CA signed (mutual TLS); ranks use their attempt token");
  app.add_option("--tls-ca", f.tls_ca,
                 "the CA ranks trust for --tls-cert (default: --tls-cert "
                 "itself, right for a self-signed certificate)");
}

std::optional<Refusal> OptionsFromFlags(const PtcoordFlags& flags,
                                        CoordinatorOptions* options,
                                        ServerTls* tls) {
  if (std::optional<Refusal> r = CheckTlsAndGpus(flags, options, tls)) {
    return r;
  }
  WarnOfPlainTextUi(flags);
  if (std::optional<Refusal> r = LoadTokenFiles(flags, options)) return r;
  if (std::optional<Refusal> r = SetPaths(flags, options)) return r;
  if (std::optional<Refusal> r = SetDefaultUserToken(flags, options)) return r;
  if (!flags.planner_profile.empty()) {
    absl::StatusOr<planner::HardwareProfile> profile =
        planner::LoadProfile(flags.planner_profile);
    if (!profile.ok()) {
      return Refusal{absl::StrCat("--planner-profile ", flags.planner_profile,
                                  ": ", profile.status().message())};
    }
    options->plan_layout = PlannerWith(
        std::make_shared<const planner::HardwareProfile>(std::move(*profile)));
  }
  return SetLauncher(flags, options);
}

}  // namespace ptrain
