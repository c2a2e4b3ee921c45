// See daemon.h.
#include "worker/daemon/daemon.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/auth_token.h"
#include "common/digest.h"
#include "common/echo.h"
#include "common/exit_codes.h"
#include "common/gpu_inventory.h"
#include "common/net.h"
#include "common/process.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace {

constexpr const char* kVersion = "0.1.0";
// The programs OpenMPI may start here: its daemon, and ptworker itself
// (what mpirun runs directly when a node is also the launching host).
const std::vector<std::string> kAllowed = {"orted", "ptworker"};

// Set by RequestStop; the loops below look at it between waits.
volatile sig_atomic_t stop = 0;

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

grpc::Status Refuse(grpc::StatusCode code, const std::string& message) {
  spdlog::warn("exec refused: {}", message);
  return grpc::Status(code, message);
}

// The `authorization` header of a call, when it has one.
std::optional<std::string> Authorization(const grpc::ServerContext& ctx) {
  auto it = ctx.client_metadata().find("authorization");
  if (it == ctx.client_metadata().end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

v1::NodeSpec DescribeNode(const std::string& name, int slots, int gpus) {
  v1::NodeSpec spec;
  spec.set_name(name);
  spec.set_slots(slots);
  // The CPUs this daemon (and the ranks it starts) may use: ptcoord binds
  // each slot's ranks to their own run of them.
  const std::vector<int> cpus = AllowedCpus();
  spec.mutable_cpus()->Add(cpus.begin(), cpus.end());
  spec.set_cores(cpus.empty() ? static_cast<int>(std::max(
                                    1u, std::thread::hardware_concurrency()))
                              : static_cast<int>(cpus.size()));
  spec.set_memory_bytes(HostMemoryBytes());
  spec.set_gpus(gpus >= 0 ? gpus : HostGpuCount());
  spec.set_version(kVersion);
  return spec;
}

void RequestStop() { stop = 1; }

Daemon::Daemon(std::shared_ptr<grpc::Channel> channel, std::string token,
               v1::NodeSpec spec, std::chrono::seconds orphan_timeout,
               NodeSecretFile secret_file)
    : stub_(v1::NodeService::NewStub(channel)),
      token_(std::move(token)),
      spec_(std::move(spec)),
      orphan_timeout_(orphan_timeout),
      secret_file_(std::move(secret_file)) {}

int Daemon::Run() {
  last_contact_ = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> secret = secret_file_.Load();
  if (!secret.ok()) {
    std::fprintf(stderr, "ptworkerd: error: %s\n",
                 std::string(secret.status().message()).c_str());
    return kExitBadInput;
  }
  secret_ = *secret;
  bool explained = false;  // in this run of failed registrations
  while (!stop) {
    grpc::Status s = Register();
    // A refused token, flag or node secret is refused again on retry.
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
        s.error_code() == grpc::StatusCode::DATA_LOSS) {
      std::fprintf(stderr, "ptworkerd: error: registration refused: %s\n",
                   s.error_message().c_str());
      return kExitBadInput;
    }
    if (!s.ok()) {
      spdlog::warn("cannot register with the coordinator ({}); retrying",
                   s.error_message());
      if (!explained && s.error_code() == grpc::StatusCode::UNAVAILABLE &&
          explain_) {
        explained = true;
        if (const std::string why = explain_(); !why.empty()) {
          spdlog::error("{}", why);
        }
      }
      CheckOrphans();
      Sleep(std::chrono::seconds(1));
      continue;
    }
    explained = false;
    ReapOrphans();
    spdlog::info("registered as {} ({} slots, {} GPUs), heartbeat every {} ms",
                 spec_.name(), spec_.slots(), spec_.gpus(), interval_.count());
    HeartbeatUntilLost();
  }
  attempts_.KillAll();
  return 0;
}

grpc::Status Daemon::Exec(grpc::ServerContext* ctx, const v1::ExecRequest* req,
                          grpc::ServerWriter<v1::ExecOutput>* out) {
  // Who asks first: a caller without a running attempt's token learns
  // nothing of the command rules and gets none of its input back.
  absl::StatusOr<std::string> token = BearerToken(Authorization(*ctx));
  if (!token.ok()) {
    return Refuse(grpc::StatusCode::UNAUTHENTICATED,
                  "no attempt token (authorization: Bearer TOKEN)");
  }
  v1::AuthorizeExecResponse who;
  if (grpc::Status s = Authorize(Sha256Hex(*token), &who); !s.ok()) {
    return Refuse(s.error_code(), s.error_message());
  }
  // Then the shape and the program: even an attempt's token runs nothing
  // outside the allow-list.
  std::map<std::string, std::string> env_now = {
      {"PATH", Getenv("PATH", "/usr/bin:/bin")},
      {"LD_LIBRARY_PATH", Getenv("LD_LIBRARY_PATH", "")}};
  absl::StatusOr<NodeCommand> cmd =
      ParseNodeCommand(req->command(), kAllowed, env_now);
  if (!cmd.ok()) {
    return Refuse(cmd.status().code() == absl::StatusCode::kPermissionDenied
                      ? grpc::StatusCode::PERMISSION_DENIED
                      : grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("job ", Echo(who.job_id()), " attempt ",
                               who.attempt(), ": ", cmd.status().message()));
  }
  return Execute(ctx, *cmd, who, out);
}

grpc::Status Daemon::KillAttempt(grpc::ServerContext* ctx,
                                 const v1::KillAttemptRequest* req,
                                 v1::KillAttemptResponse* resp) {
  if (!CheckBearer(Authorization(*ctx), {token_}).ok()) {
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
               Echo(req->attempt_uid()), sig, resp->processes());
  return grpc::Status::OK;
}

grpc::Status Daemon::DumpAttempt(grpc::ServerContext* ctx,
                                 const v1::DumpAttemptRequest* req,
                                 v1::DumpAttemptResponse* resp) {
  if (!CheckBearer(Authorization(*ctx), {token_}).ok()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "DumpAttempt needs the cluster's join token");
  }
  if (req->attempt_uid().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "attempt_uid must be set");
  }
  resp->set_host(HostName(""));
  for (const AttemptRank& p : Attempts::Ranks(req->attempt_uid())) {
    // A stopped rank keeps it pending: it dumps once it runs again.
    kill(p.pid, SIGUSR2);
    v1::RankProcess* r = resp->add_ranks();
    r->set_pid(p.pid);
    r->set_rank(p.rank);
    r->set_state(p.state);
  }
  spdlog::info("DumpAttempt {}: asked {} ranks", Echo(req->attempt_uid()),
               resp->ranks_size());
  return grpc::Status::OK;
}

std::unique_ptr<grpc::ClientContext> Daemon::Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("authorization", "Bearer " + token_);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return ctx;
}

grpc::Status Daemon::Authorize(const std::string& token_sha256,
                               v1::AuthorizeExecResponse* who) {
  v1::AuthorizeExecRequest req;
  req.set_name(spec_.name());
  {
    absl::MutexLock lock(&mu_);
    req.set_session(session_);
  }
  req.set_token_sha256(token_sha256);
  return stub_->AuthorizeExec(Context().get(), req, who);
}

grpc::Status Daemon::Execute(grpc::ServerContext* ctx, const NodeCommand& cmd,
                             const v1::AuthorizeExecResponse& who,
                             grpc::ServerWriter<v1::ExecOutput>* out) {
  absl::StatusOr<Child> child = Start(cmd, who);
  if (!child.ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        std::string(child.status().message()));
  }
  const pid_t pid = child->pid;
  bool cancelled = false;
  std::optional<int> exit_code = Relay(ctx, *child, out, &cancelled);
  child->out.CloseRead();
  child->err.CloseRead();
  if (!exit_code.has_value()) {
    int status = 0;
    if (waitpid(pid, &status, 0) == pid) exit_code = ExitCodeOf(status);
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
  v1::ExecOutput last;
  last.set_exited(true);
  last.set_exit_code(exit_code.value_or(255));
  out->WriteLast(last, grpc::WriteOptions());
  return grpc::Status::OK;
}

absl::StatusOr<Daemon::Child> Daemon::Start(
    const NodeCommand& cmd, const v1::AuthorizeExecResponse& who) {
  SpawnOptions o;
  o.env = {{"PATH", Getenv("PATH", "/usr/bin:/bin")},
           {"HOME", Getenv("HOME", "/")},
           {"PTRAIN_ATTEMPT_UID", who.attempt_uid()},
           {"PTRAIN_JOB_ID", who.job_id()}};
  for (const NodeCommand::Assignment& a : cmd.assignments) {
    if (a.exported) o.env[a.name] = a.value;
  }
  absl::StatusOr<Pipe> out = Pipe::Open();
  absl::StatusOr<Pipe> err =
      out.ok() ? Pipe::Open() : absl::StatusOr<Pipe>(out.status());
  if (!out.ok() || !err.ok()) return absl::InternalError("pipe failed");
  attempts_.Started(who.attempt_uid());
  o.argv = cmd.argv;
  o.argv[0] = Resolve(o.argv[0]);
  o.stdout_fd = out->write_fd();
  o.stderr_fd = err->write_fd();
  o.own_process_group = true;
  o.die_with_parent = true;
  o.fds = SpawnOptions::Fds::kCloseAll;
  o.setup_failed_exit = 126;
  absl::StatusOr<pid_t> pid = Spawn(o);
  if (!pid.ok()) return pid.status();
  {
    absl::MutexLock lock(&mu_);
    exec_children_.insert(*pid);
  }
  out->CloseWrite();
  err->CloseWrite();
  spdlog::info("exec for {} attempt {}: {} (pid {})", who.job_id(),
               who.attempt(), o.argv[0], *pid);
  return Child{*pid, std::move(*out), std::move(*err)};
}

std::optional<int> Daemon::Relay(grpc::ServerContext* ctx, Child& child,
                                 grpc::ServerWriter<v1::ExecOutput>* out,
                                 bool* cancelled) {
  bool out_open = true, err_open = true;
  char buf[16384];
  while (out_open || err_open) {
    if (ctx->IsCancelled() || stop) {
      *cancelled = true;
      kill(-child.pid, SIGKILL);
    }
    pollfd fds[2] = {{out_open ? child.out.read_fd() : -1, POLLIN, 0},
                     {err_open ? child.err.read_fd() : -1, POLLIN, 0}};
    const int ready = poll(fds, 2, 200);
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        (i == 0 ? out_open : err_open) = false;
        continue;
      }
      v1::ExecOutput chunk;
      (i == 0 ? chunk.mutable_stdout() : chunk.mutable_stderr())
          ->assign(buf, static_cast<size_t>(n));
      if (!*cancelled && !out->Write(chunk)) {
        *cancelled = true;
        kill(-child.pid, SIGKILL);
      }
    }
    // The child may end while something it left behind holds the pipes.
    int status = 0;
    if (waitpid(child.pid, &status, WNOHANG) == child.pid) {
      return ExitCodeOf(status);
    }
  }
  return std::nullopt;
}

grpc::Status Daemon::Register() {
  v1::RegisterNodeRequest req;
  *req.mutable_node() = spec_;
  req.set_node_secret(secret_);
  v1::RegisterNodeResponse resp;
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
    spdlog::info("bound to a new node secret, kept in {}", secret_file_.path());
  }
  if (s.ok()) {
    NoteApproval(resp.pending_approval());
    absl::MutexLock lock(&mu_);
    session_ = resp.session();
    interval_ =
        std::chrono::milliseconds(std::max(100, resp.heartbeat_interval_ms()));
    last_contact_ = std::chrono::steady_clock::now();
  }
  return s;
}

void Daemon::NoteApproval(bool pending) {
  if (pending && !pending_approval_) {
    spdlog::warn(
        "registered, and waiting for approval: ptcoord requires it of a new "
        "node (--require-node-approval); no job runs here until an operator "
        "runs 'ptctl nodes approve {}'",
        spec_.name());
  } else if (!pending && pending_approval_) {
    spdlog::info("approved: jobs may now be placed on this node");
  }
  pending_approval_ = pending;
}

void Daemon::ReapOrphans() {
  for (pid_t pid : ZombieChildren()) {
    {
      absl::MutexLock lock(&mu_);
      if (exec_children_.count(pid)) continue;
    }
    waitpid(pid, nullptr, WNOHANG);
  }
}

void Daemon::CheckOrphans() {
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

void Daemon::HeartbeatUntilLost() {
  while (!stop) {
    Sleep(interval_);
    if (stop) return;
    ReapOrphans();
    v1::NodeHeartbeatRequest req;
    req.set_name(spec_.name());
    {
      absl::MutexLock lock(&mu_);
      req.set_session(session_);
    }
    req.set_load1(HostLoad1());
    req.set_processes(attempts_.Processes());
    v1::NodeHeartbeatResponse resp;
    const auto asked = std::chrono::steady_clock::now();
    grpc::Status s = stub_->Heartbeat(Context().get(), req, &resp);
    if (s.ok()) {
      last_contact_ = std::chrono::steady_clock::now();
      NoteApproval(resp.pending_approval());
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

}  // namespace ptrain
