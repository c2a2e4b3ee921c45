// ptworkerd: the daemon of one node. Registers the node with ptcoord
// (NodeService, with the cluster's join token), then heartbeats at the
// interval ptcoord asks for, reporting its load; registers again when
// ptcoord no longer knows its session (ptcoord restarted) and keeps trying
// while ptcoord is unreachable. Serves DaemonService: Exec runs what OpenMPI
// sends through ptrsh for an attempt placed here (authorized by ptcoord),
// KillAttempt signals an attempt's processes. What it started is killed
// when ptcoord says the attempt no longer runs here, when ptcoord has been
// unreachable for --orphan-timeout-s, and when the daemon stops (SIGINT/
// SIGTERM); an Exec child also dies with the daemon (PR_SET_PDEATHSIG).
// A refused join token or a refused registration (bad flags) ends it with
// exit code 2.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/auth_token.h"
#include "common/digest.h"
#include "common/gpu_inventory.h"
#include "common/logging.h"
#include "common/pem.h"
#include "common/process.h"
#include "common/spawn.h"
#include "grpcpp/grpcpp.h"
#include "ptrain/v1/node.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "worker/daemon/command.h"
#include "worker/daemon/node_secret.h"

namespace {

constexpr const char* kVersion = "0.1.0";
// The programs OpenMPI may start here: its daemon, and ptworker itself
// (what mpirun runs directly when a node is also the launching host).
const std::vector<std::string> kAllowed = {"orted", "ptworker"};

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "node";
  return buf;
}

// MemTotal of /proc/meminfo in bytes (0 when unreadable).
int64_t MemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

double Load1() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  in >> load;
  return in ? load : 0.0;
}

// Set by SIGINT/SIGTERM; the loops below look at it between waits.
volatile sig_atomic_t stop = 0;
void OnSignal(int) { stop = 1; }

// Sleeps up to `d`, waking early on a stop request.
void Sleep(std::chrono::milliseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (!stop && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string Getenv(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// The program's path: `program` itself when it names a file, else the
// first executable of that name on the daemon's own PATH.
std::string Resolve(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  for (absl::string_view dir :
       absl::StrSplit(Getenv("PATH", "/usr/bin:/bin"), ':')) {
    const std::string p = absl::StrCat(dir, "/", program);
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return program;
}

// The attempts this daemon started processes for, and when it first did.
class Attempts {
 public:
  void Started(const std::string& uid) {
    absl::MutexLock lock(&mu_);
    if (!first_.count(uid)) first_[uid] = std::chrono::steady_clock::now();
  }
  // Kills (SIGKILL) the processes of every attempt started before `asked`
  // that is not in `keep`, and forgets them.
  void KeepOnly(const std::set<std::string>& keep,
                std::chrono::steady_clock::time_point asked) {
    std::vector<std::string> gone;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [uid, t] : first_) {
        if (t < asked && !keep.count(uid)) gone.push_back(uid);
      }
      for (const std::string& uid : gone) first_.erase(uid);
    }
    for (const std::string& uid : gone) {
      const int n = Kill(uid, SIGKILL);
      if (n > 0) {
        spdlog::info("attempt {} no longer runs here: killed {} processes", uid,
                     n);
      }
    }
  }
  void KillAll() { KeepOnly({}, kForever); }
  int Processes() {
    int n = 0;
    for (const std::string& uid : Uids()) n += Pids(uid).size();
    return n;
  }
  static std::vector<pid_t> Pids(const std::string& uid) {
    return ptrain::ProcessesWithEnv({"PTRAIN_ATTEMPT_UID=" + uid});
  }
  static int Kill(const std::string& uid, int sig) {
    int n = 0;
    for (pid_t p : Pids(uid)) n += kill(p, sig) == 0 ? 1 : 0;
    return n;
  }

 private:
  static constexpr std::chrono::steady_clock::time_point kForever =
      std::chrono::steady_clock::time_point::max();
  std::vector<std::string> Uids() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& [uid, t] : first_) out.push_back(uid);
    return out;
  }
  absl::Mutex mu_;
  std::map<std::string, std::chrono::steady_clock::time_point> first_
      ABSL_GUARDED_BY(mu_);
};

grpc::Status Refuse(grpc::StatusCode code, const std::string& message) {
  spdlog::warn("exec refused: {}", message);
  return grpc::Status(code, message);
}

class Daemon final : public ptrain::v1::DaemonService::Service {
 public:
  Daemon(std::shared_ptr<grpc::Channel> channel, std::string token,
         ptrain::v1::NodeSpec spec, std::chrono::seconds orphan_timeout,
         ptrain::NodeSecretFile secret_file)
      : stub_(ptrain::v1::NodeService::NewStub(channel)),
        token_(std::move(token)),
        spec_(std::move(spec)),
        orphan_timeout_(orphan_timeout),
        secret_file_(std::move(secret_file)) {}

  // Where ptrsh reaches this daemon; set before Run().
  void SetAddress(const std::string& address) { spec_.set_address(address); }

  // Registers and heartbeats until a stop request (0) or a refusal (2).
  int Run() {
    last_contact_ = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> secret = secret_file_.Load();
    if (!secret.ok()) {
      std::fprintf(stderr, "ptworkerd: error: %s\n",
                   std::string(secret.status().message()).c_str());
      return 2;
    }
    secret_ = *secret;
    while (!stop) {
      grpc::Status s = Register();
      // A refused token, flag or node secret is refused again on retry.
      if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
          s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
          s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
          s.error_code() == grpc::StatusCode::DATA_LOSS) {
        std::fprintf(stderr, "ptworkerd: error: registration refused: %s\n",
                     s.error_message().c_str());
        return 2;
      }
      if (!s.ok()) {
        spdlog::warn("cannot register with the coordinator ({}); retrying",
                     s.error_message());
        CheckOrphans();
        Sleep(std::chrono::seconds(1));
        continue;
      }
      ReapOrphans();
      spdlog::info(
          "registered as {} ({} slots, {} GPUs), heartbeat every {} ms",
          spec_.name(), spec_.slots(), spec_.gpus(), interval_.count());
      HeartbeatUntilLost();
    }
    attempts_.KillAll();
    return 0;
  }

  grpc::Status Exec(grpc::ServerContext* ctx,
                    const ptrain::v1::ExecRequest* req,
                    grpc::ServerWriter<ptrain::v1::ExecOutput>* out) override {
    // The shape and the program first: a command outside the allow-list is
    // refused whoever asks.
    std::map<std::string, std::string> env_now = {
        {"PATH", Getenv("PATH", "/usr/bin:/bin")},
        {"LD_LIBRARY_PATH", Getenv("LD_LIBRARY_PATH", "")}};
    absl::StatusOr<ptrain::NodeCommand> cmd =
        ptrain::ParseNodeCommand(req->command(), kAllowed, env_now);
    if (!cmd.ok()) {
      return Refuse(cmd.status().code() == absl::StatusCode::kPermissionDenied
                        ? grpc::StatusCode::PERMISSION_DENIED
                        : grpc::StatusCode::INVALID_ARGUMENT,
                    std::string(cmd.status().message()));
    }
    std::optional<std::string> header;
    auto it = ctx->client_metadata().find("authorization");
    if (it != ctx->client_metadata().end()) {
      header = std::string(it->second.data(), it->second.size());
    }
    absl::StatusOr<std::string> token = ptrain::BearerToken(header);
    if (!token.ok()) {
      return Refuse(grpc::StatusCode::UNAUTHENTICATED,
                    "no attempt token (authorization: Bearer TOKEN)");
    }
    ptrain::v1::AuthorizeExecResponse who;
    if (grpc::Status s = Authorize(ptrain::Sha256Hex(*token), &who); !s.ok()) {
      return Refuse(s.error_code(), s.error_message());
    }
    return Run(ctx, *cmd, who, out);
  }

  grpc::Status KillAttempt(grpc::ServerContext* ctx,
                           const ptrain::v1::KillAttemptRequest* req,
                           ptrain::v1::KillAttemptResponse* resp) override {
    std::optional<std::string> header;
    auto it = ctx->client_metadata().find("authorization");
    if (it != ctx->client_metadata().end()) {
      header = std::string(it->second.data(), it->second.size());
    }
    if (!ptrain::CheckBearer(header, {token_}).ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "KillAttempt needs the cluster's join token");
    }
    if (req->attempt_uid().empty() || req->signal() < 0 || req->signal() > 64) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "attempt_uid must be set and signal in 0..64");
    }
    const int sig = req->signal() == 0 ? SIGKILL : req->signal();
    resp->set_processes(Attempts::Kill(req->attempt_uid(), sig));
    spdlog::info("KillAttempt {}: signal {} to {} processes",
                 req->attempt_uid(), sig, resp->processes());
    return grpc::Status::OK;
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", "Bearer " + token_);
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    return ctx;
  }

  grpc::Status Authorize(const std::string& token_sha256,
                         ptrain::v1::AuthorizeExecResponse* who) {
    ptrain::v1::AuthorizeExecRequest req;
    req.set_name(spec_.name());
    {
      absl::MutexLock lock(&mu_);
      req.set_session(session_);
    }
    req.set_token_sha256(token_sha256);
    return stub_->AuthorizeExec(Context().get(), req, who);
  }

  // Runs the command in its own process group, streaming its output; the
  // exit code is the stream's last message. A cancelled call (ptrsh gone)
  // kills the group.
  grpc::Status Run(grpc::ServerContext* ctx, const ptrain::NodeCommand& cmd,
                   const ptrain::v1::AuthorizeExecResponse& who,
                   grpc::ServerWriter<ptrain::v1::ExecOutput>* out) {
    std::map<std::string, std::string> env = {
        {"PATH", Getenv("PATH", "/usr/bin:/bin")},
        {"HOME", Getenv("HOME", "/")},
        {"PTRAIN_ATTEMPT_UID", who.attempt_uid()},
        {"PTRAIN_JOB_ID", who.job_id()}};
    for (const ptrain::NodeCommand::Assignment& a : cmd.assignments) {
      if (a.exported) env[a.name] = a.value;
    }
    absl::StatusOr<ptrain::Pipe> out_pipe = ptrain::Pipe::Open();
    if (!out_pipe.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "pipe failed");
    }
    absl::StatusOr<ptrain::Pipe> err_pipe = ptrain::Pipe::Open();
    if (!err_pipe.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "pipe failed");
    }
    attempts_.Started(who.attempt_uid());
    ptrain::SpawnOptions o;
    o.argv = cmd.argv;
    o.argv[0] = Resolve(o.argv[0]);
    o.env = std::move(env);
    o.stdout_fd = out_pipe->write_fd();
    o.stderr_fd = err_pipe->write_fd();
    o.own_process_group = true;
    o.die_with_parent = true;
    o.fds = ptrain::SpawnOptions::Fds::kCloseAll;
    o.setup_failed_exit = 126;
    absl::StatusOr<pid_t> spawned = ptrain::Spawn(o);
    if (!spawned.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          std::string(spawned.status().message()));
    }
    const pid_t pid = *spawned;
    {
      absl::MutexLock lock(&mu_);
      exec_children_.insert(pid);
    }
    out_pipe->CloseWrite();
    err_pipe->CloseWrite();
    spdlog::info("exec for {} attempt {}: {} (pid {})", who.job_id(),
                 who.attempt(), o.argv[0], pid);

    std::optional<int> exit_code;
    bool out_open = true, err_open = true, cancelled = false;
    char buf[16384];
    while (out_open || err_open) {
      if (ctx->IsCancelled() || stop) {
        cancelled = true;
        kill(-pid, SIGKILL);
      }
      pollfd fds[2] = {{out_open ? out_pipe->read_fd() : -1, POLLIN, 0},
                       {err_open ? err_pipe->read_fd() : -1, POLLIN, 0}};
      const int ready = poll(fds, 2, 200);
      if (ready < 0 && errno != EINTR) break;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || fds[i].revents == 0) continue;
        const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
        if (n <= 0) {
          (i == 0 ? out_open : err_open) = false;
          continue;
        }
        ptrain::v1::ExecOutput chunk;
        (i == 0 ? chunk.mutable_stdout() : chunk.mutable_stderr())
            ->assign(buf, static_cast<size_t>(n));
        if (!cancelled && !out->Write(chunk)) {
          cancelled = true;
          kill(-pid, SIGKILL);
        }
      }
      // The child may end while something it left behind holds the pipes.
      if (!exit_code.has_value()) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) {
          exit_code = ptrain::ExitCodeOf(status);
          break;
        }
      }
    }
    out_pipe->CloseRead();
    err_pipe->CloseRead();
    if (!exit_code.has_value()) {
      int status = 0;
      if (waitpid(pid, &status, 0) == pid)
        exit_code = ptrain::ExitCodeOf(status);
    }
    {
      absl::MutexLock lock(&mu_);
      exec_children_.erase(pid);
    }
    spdlog::info("exec for {} attempt {} ended: exit code {}{}", who.job_id(),
                 who.attempt(), exit_code.value_or(-1),
                 cancelled ? " (cancelled)" : "");
    if (cancelled) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "exec cancelled");
    }
    ptrain::v1::ExecOutput last;
    last.set_exited(true);
    last.set_exit_code(exit_code.value_or(255));
    out->WriteLast(last, grpc::WriteOptions());
    return grpc::Status::OK;
  }

  grpc::Status Register() {
    ptrain::v1::RegisterNodeRequest req;
    *req.mutable_node() = spec_;
    req.set_node_secret(secret_);
    ptrain::v1::RegisterNodeResponse resp;
    grpc::Status s = stub_->Register(Context().get(), req, &resp);
    if (s.ok() && !resp.node_secret().empty()) {
      // Kept before it is used: a daemon that restarts must prove the name.
      if (absl::Status k = secret_file_.Store(resp.node_secret()); !k.ok()) {
        return grpc::Status(
            grpc::StatusCode::DATA_LOSS,
            absl::StrCat("registered, but the node secret ptcoord issued "
                         "cannot be kept (",
                         k.message(),
                         "); this node's name cannot be proved again: fix "
                         "--state-dir, then 'ptctl forget-node ",
                         spec_.name(), "' once this daemon is stopped"));
      }
      secret_ = resp.node_secret();
      spdlog::info("bound to a new node secret, kept in {}",
                   secret_file_.path());
    }
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      session_ = resp.session();
      interval_ = std::chrono::milliseconds(
          std::max(100, resp.heartbeat_interval_ms()));
      last_contact_ = std::chrono::steady_clock::now();
    }
    return s;
  }

  // Ranks whose orted died come to this daemon (it is a subreaper, or the
  // init of a container's PID namespace): reap them, leaving the Exec
  // children to the calls that wait for them.
  void ReapOrphans() {
    for (pid_t pid : ptrain::ZombieChildren()) {
      {
        absl::MutexLock lock(&mu_);
        if (exec_children_.count(pid)) continue;
      }
      waitpid(pid, nullptr, WNOHANG);
    }
  }

  // Without ptcoord for longer than the orphan timeout, nobody can stop
  // what runs here: it is killed.
  void CheckOrphans() {
    if (std::chrono::steady_clock::now() - last_contact_ > orphan_timeout_) {
      if (attempts_.Processes() > 0) {
        spdlog::warn(
            "no contact with the coordinator for {} s: killing every "
            "attempt process",
            orphan_timeout_.count());
      }
      attempts_.KillAll();
    }
  }

  // Returns when ptcoord no longer knows the session (or on stop).
  void HeartbeatUntilLost() {
    while (!stop) {
      Sleep(interval_);
      if (stop) return;
      ReapOrphans();
      ptrain::v1::NodeHeartbeatRequest req;
      req.set_name(spec_.name());
      {
        absl::MutexLock lock(&mu_);
        req.set_session(session_);
      }
      req.set_load1(Load1());
      req.set_processes(attempts_.Processes());
      ptrain::v1::NodeHeartbeatResponse resp;
      const auto asked = std::chrono::steady_clock::now();
      grpc::Status s = stub_->Heartbeat(Context().get(), req, &resp);
      if (s.ok()) {
        last_contact_ = std::chrono::steady_clock::now();
        attempts_.KeepOnly(
            {resp.attempt_uids().begin(), resp.attempt_uids().end()}, asked);
        continue;
      }
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
        spdlog::info(
            "the coordinator does not know this session: registering "
            "again");
        return;
      }
      spdlog::warn("heartbeat failed ({}); retrying", s.error_message());
      CheckOrphans();
    }
  }

  std::unique_ptr<ptrain::v1::NodeService::Stub> stub_;
  const std::string token_;
  ptrain::v1::NodeSpec spec_;
  const std::chrono::seconds orphan_timeout_;
  const ptrain::NodeSecretFile secret_file_;
  std::string secret_;  // "" until ptcoord issued one; Run's thread only
  Attempts attempts_;
  absl::Mutex mu_;
  std::string session_ ABSL_GUARDED_BY(mu_);
  std::set<pid_t> exec_children_ ABSL_GUARDED_BY(mu_);
  std::chrono::milliseconds interval_{3000};
  std::chrono::steady_clock::time_point last_contact_;
};

int Run(int argc, char** argv) {
  CLI::App app{"ptworkerd: the node daemon of a ptrain cluster"};
  std::string coordinator, name = HostName(), token_file, advertise, tls_ca,
                           listen = "0.0.0.0:7071", log_level = "info";
  int slots =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int orphan_timeout_s = 60;
  int gpus = -1;
  std::string state_dir = "/var/lib/ptworkerd";
  app.add_option("--state-dir", state_dir,
                 "where the node secret that binds this node's name is kept "
                 "(default /var/lib/ptworkerd)");
  app.add_option("--coordinator", coordinator, "ptcoord's HOST:PORT")
      ->required();
  app.add_option("--name", name, "this node's name (default: the host name)");
  app.add_option("--slots", slots,
                 "ranks this node runs at once (default: "
                 "its cores)");
  app.add_option("--gpus", gpus,
                 "CUDA devices this node offers to jobs on resources.device="
                 "cuda, one per rank (default: those the NVIDIA driver shows)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--join-token-file", token_file,
                 "the cluster's join token (first token line of the file)")
      ->required();
  app.add_option("--listen", listen,
                 "HOST:PORT to serve ptrsh on (default 0.0.0.0:7071)");
  app.add_option("--advertise", advertise,
                 "HOST:PORT where ptrsh reaches this daemon (default: "
                 "NAME and the --listen port)");
  app.add_option("--orphan-timeout-s", orphan_timeout_s,
                 "kill every attempt process after this long without the "
                 "coordinator (default 60)")
      ->check(CLI::Range(1, 86400));
  app.add_option("--tls-ca", tls_ca,
                 "CA that signed ptcoord's certificate (default: plain text)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  CLI11_PARSE(app, argc, argv);
  ptrain::SetupLogging(log_level);

  absl::StatusOr<std::vector<std::string>> tokens =
      ptrain::LoadTokenFile(token_file, "--join-token-file");
  if (!tokens.ok()) {
    std::fprintf(stderr, "ptworkerd: error: %s\n",
                 std::string(tokens.status().message()).c_str());
    return 2;
  }
  ptrain::v1::NodeSpec spec;
  spec.set_name(name);
  spec.set_slots(slots);
  spec.set_cores(
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  spec.set_memory_bytes(MemoryBytes());
  spec.set_gpus(gpus >= 0 ? gpus : ptrain::GpuCount());
  spec.set_version(kVersion);

  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (!tls_ca.empty()) {
    absl::StatusOr<std::string> ca =
        ptrain::ReadCertificateFile("--tls-ca", tls_ca);
    if (!ca.ok()) {
      std::fprintf(stderr, "ptworkerd: error: %s\n",
                   std::string(ca.status().message()).c_str());
      return 2;
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *ca;
    credentials = grpc::SslCredentials(ssl);
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);
  // Processes an Exec child leaves behind come back to this daemon when
  // their parent dies, so none escapes to init unnoticed.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Reconnect within a second or two of ptcoord coming back.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);

  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  const std::string port_text = listen.substr(listen.rfind(':') + 1);
  spec.set_address(advertise.empty() ? absl::StrCat(name, ":", port_text)
                                     : advertise);
  // Before serving anything: a secret ptcoord issues must have a home.
  absl::StatusOr<ptrain::NodeSecretFile> secret_file =
      ptrain::NodeSecretFile::Open(state_dir, name);
  if (!secret_file.ok()) {
    std::fprintf(stderr, "ptworkerd: error: %s\n",
                 std::string(secret_file.status().message()).c_str());
    return 2;
  }
  Daemon daemon(grpc::CreateCustomChannel(coordinator, credentials, args),
                tokens->front(), spec, std::chrono::seconds(orphan_timeout_s),
                *secret_file);
  builder.RegisterService(&daemon);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "ptworkerd: error: --listen %s: cannot bind\n",
                 listen.c_str());
    return 2;
  }
  if (advertise.empty() && port_text == "0") {
    spec.set_address(absl::StrCat(name, ":", port));
    daemon.SetAddress(spec.address());
  }
  spdlog::info("serving ptrsh on port {} (advertised as {})", port,
               spec.address());
  const int rc = daemon.Run();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return rc;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
