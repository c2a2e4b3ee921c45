// ptworkerd's daemon of one node. Registers the node with ptcoord
// (NodeService, with the cluster's join token), then heartbeats at the
// interval ptcoord asks for, reporting its load; registers again when
// ptcoord no longer knows its session (ptcoord restarted) and keeps trying
// while ptcoord is unreachable. Serves DaemonService: Exec runs what OpenMPI
// sends through ptrsh for an attempt placed here (authorized by ptcoord),
// KillAttempt signals an attempt's processes, DumpAttempt asks its ranks
// for their flight recorder dumps. What it started is killed
// when ptcoord says the attempt no longer runs here, when ptcoord has been
// unreachable for the orphan timeout, and when the daemon stops
// (RequestStop); an Exec child also dies with the daemon (PR_SET_PDEATHSIG).
// Not the flags, the server or the signal handlers: main.cc's.
#ifndef PTRAIN_WORKER_DAEMON_DAEMON_H_
#define PTRAIN_WORKER_DAEMON_DAEMON_H_

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/spawn.h"
#include "grpcpp/grpcpp.h"
#include "ptrain/v1/node.grpc.pb.h"
#include "worker/daemon/attempts.h"
#include "worker/daemon/command.h"
#include "worker/daemon/node_secret.h"

namespace ptrain {

// What this host offers as node `name`: `slots` ranks at once, `gpus` GPUs
// (-1: those the driver shows, common/gpu_inventory.h), its cores and
// memory, this daemon's version. No address: the caller's to set.
v1::NodeSpec DescribeNode(const std::string& name, int slots, int gpus);

// Asks the Daemon to stop: Run returns soon after, and an Exec in progress
// kills its command. Async-signal-safe (SIGINT and SIGTERM call it).
void RequestStop();

class Daemon final : public v1::DaemonService::Service {
 public:
  // `channel` leads to ptcoord; `token` is the cluster's join token, sent
  // with every call to ptcoord and asked of KillAttempt's callers.
  Daemon(std::shared_ptr<grpc::Channel> channel, std::string token,
         v1::NodeSpec spec, std::chrono::seconds orphan_timeout,
         NodeSecretFile secret_file);

  // Where ptrsh reaches this daemon; set before Run().
  void SetAddress(const std::string& address) { spec_.set_address(address); }
  // Says why ptcoord cannot be reached when a registration fails with
  // UNAVAILABLE ("" when it cannot tell): logged once per run of failures.
  // Set before Run().
  void SetExplainer(std::function<std::string()> explain) {
    explain_ = std::move(explain);
  }

  // Registers and heartbeats until a stop request (0) or a refusal
  // (kExitBadInput, said on stderr).
  int Run();

  grpc::Status Exec(grpc::ServerContext* ctx, const v1::ExecRequest* req,
                    grpc::ServerWriter<v1::ExecOutput>* out) override;
  grpc::Status KillAttempt(grpc::ServerContext* ctx,
                           const v1::KillAttemptRequest* req,
                           v1::KillAttemptResponse* resp) override;
  grpc::Status DumpAttempt(grpc::ServerContext* ctx,
                           const v1::DumpAttemptRequest* req,
                           v1::DumpAttemptResponse* resp) override;

 private:
  // A command Exec started, with the read ends of its stdout and stderr.
  struct Child {
    pid_t pid;
    Pipe out, err;
  };

  std::unique_ptr<grpc::ClientContext> Context();
  grpc::Status Authorize(const std::string& token_sha256,
                         v1::AuthorizeExecResponse* who);
  // Runs the command in its own process group, streaming its output; the
  // exit code is the stream's last message. A cancelled call (ptrsh gone)
  // kills the group.
  grpc::Status Execute(grpc::ServerContext* ctx, const NodeCommand& cmd,
                       const v1::AuthorizeExecResponse& who,
                       grpc::ServerWriter<v1::ExecOutput>* out);
  absl::StatusOr<Child> Start(const NodeCommand& cmd,
                              const v1::AuthorizeExecResponse& who);
  // Relays `child`'s output to `out` until both pipes close or the child
  // ends, killing its group when the call is cancelled or the daemon stops
  // (*cancelled set); its exit code when it ended meanwhile.
  std::optional<int> Relay(grpc::ServerContext* ctx, Child& child,
                           grpc::ServerWriter<v1::ExecOutput>* out,
                           bool* cancelled);
  grpc::Status Register();
  // Says (once) that ptcoord holds this node for approval, and when the
  // hold ends.
  void NoteApproval(bool pending);
  // Ranks whose orted died come to this daemon (it is a subreaper, or the
  // init of a container's PID namespace): reap them, leaving the Exec
  // children to the calls that wait for them.
  void ReapOrphans();
  // Without ptcoord for longer than the orphan timeout, nobody can stop
  // what runs here: it is killed.
  void CheckOrphans();
  // Returns when ptcoord no longer knows the session (or on stop).
  void HeartbeatUntilLost();

  std::unique_ptr<v1::NodeService::Stub> stub_;
  const std::string token_;
  v1::NodeSpec spec_;
  const std::chrono::seconds orphan_timeout_;
  const NodeSecretFile secret_file_;
  std::string secret_;  // "" until ptcoord issued one; Run's thread only
  bool pending_approval_ = false;  // as ptcoord last said; Run's thread only
  Attempts attempts_;
  absl::Mutex mu_;
  std::string session_ ABSL_GUARDED_BY(mu_);
  std::set<pid_t> exec_children_ ABSL_GUARDED_BY(mu_);
  std::chrono::milliseconds interval_{3000};
  std::chrono::steady_clock::time_point last_contact_;
  std::function<std::string()> explain_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_DAEMON_DAEMON_H_
