// The nodes of the cluster as ptcoord knows them: each ptworkerd registers
// with the cluster's join token and then heartbeats; a node whose
// heartbeats stop for the timeout is DOWN. Registrations are stored (a
// restarted ptcoord lists the nodes it knew, DOWN until they register
// again); heartbeats are kept in memory only. Thread-safe.
//
// A node's name is bound to the daemon that first registered it: that
// registration is given a node secret (only its SHA-256 is stored), and
// every later registration of the name must carry it, up or down, same
// address or not. The join token cannot take over a node (and with it the
// attempt tokens sent to the node's address). Forget() unbinds a node that
// is down and runs nothing (reinstalled, retired).
//
// The join token does let its holder add a node of a new name, and jobs
// placed on that node hand it their attempt tokens. With
// `require_approval`, a new name registers and heartbeats but waits
// (Node.pending_approval, stored) until an operator approves it: nothing is
// placed on it and it authorizes no Exec until then.
#ifndef PTRAIN_COORDINATOR_NODES_H_
#define PTRAIN_COORDINATOR_NODES_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/store.h"
#include "ptrain/v1/node.pb.h"

namespace ptrain {

struct NodeRegistryOptions {
  // Tokens a node may join with (ptcoord --join-token-file); none: every
  // registration is refused.
  std::vector<std::string> join_tokens;
  absl::Duration heartbeat_interval = absl::Seconds(3);
  absl::Duration timeout = absl::Seconds(15);  // no heartbeat: DOWN
  // ptcoord --require-node-approval: a name registering for the first time
  // (or the first time since Forget) waits for Approve. Nodes known before
  // keep their standing, and a node waiting stays waiting whatever this
  // says after a restart: only Approve ends the wait.
  bool require_approval = false;
  // What a registration's node.address must pass before it is taken
  // (ptcoord: it resolves here and a TCP connection to it opens; ptrsh
  // dials it from here): an error is the refusal. Checked before the
  // node's name and secret, without the registry's lock. Empty: none.
  std::function<absl::Status(const std::string& address)> check_address;
};

// "" when `spec` is a valid registration, else what is wrong, naming the
// field and the rule.
std::string CheckNodeSpec(const v1::NodeSpec& spec);

class NodeRegistry {
 public:
  // Loads the stored registrations (not owned `store` outlives this).
  static absl::StatusOr<std::unique_ptr<NodeRegistry>> Create(
      Store* store, NodeRegistryOptions options);

  // OK when `authorization` carries a join token, else Unauthenticated.
  absl::Status AuthenticateNode(
      const std::optional<std::string>& authorization) const;

  // A node (re)registers: InvalidArgument naming the field for a bad spec;
  // PermissionDenied when the name is bound to a secret and the request does
  // not carry it: nothing changes but the refusal's count, which is logged
  // with `peer` (who asked) and kept as a store event "node:NAME";
  // Unavailable when it cannot be stored (nothing changes then). A first
  // registration gets a new secret in the response, and with
  // require_approval it is stored as waiting for approval in the same
  // transaction. The response says whether the node waits.
  absl::StatusOr<v1::RegisterNodeResponse> Register(
      const v1::RegisterNodeRequest& request, absl::Time now,
      const std::string& peer = "");
  // NotFound when the name's session is not the current one (register
  // again); InvalidArgument naming the field for a bad report. On success
  // *pending_approval (when not null) says whether the node still waits
  // for approval.
  absl::Status Heartbeat(const v1::NodeHeartbeatRequest& request,
                         absl::Time now, bool* pending_approval = nullptr);

  // OK when `session` is the node's current one and the node may run
  // attempts; NotFound for another session, PermissionDenied (naming the
  // rule and `ptctl nodes approve`) while it waits for approval.
  absl::Status CheckSession(const std::string& name,
                            const std::string& session) const;

  // Approves a node waiting for approval (stored first); an approved node
  // is returned unchanged. NotFound for an unknown name, Unavailable when
  // the store refuses (nothing changes then).
  absl::StatusOr<v1::Node> Approve(const std::string& name, absl::Time now);

  // Takes a node out of scheduling or puts it back (stored first).
  // NotFound for an unknown name, Unavailable when it cannot be stored.
  absl::StatusOr<v1::Node> SetDraining(const std::string& name, bool draining,
                                       absl::Time now);

  // Forgets a node (ForgetNode): its registration, secret, draining flag
  // and approval, stored first. NotFound for an unknown name,
  // FailedPrecondition while it is up (`busy`: while an attempt is placed on
  // it, the caller's knowledge), Unavailable when the store refuses.
  absl::Status Forget(const std::string& name, bool busy, absl::Time now);

  // True when nodes may join (a join token is configured): ptcoord then
  // places jobs on nodes rather than on its own host.
  bool enabled() const { return !options_.join_tokens.empty(); }

  // Every known node by name, with its state at `now` (and
  // pending_approval: such a node is never schedulable).
  std::vector<v1::Node> List(absl::Time now) const;

  // ptcoord could not run for `gap` (paused, stalled): no heartbeat could be
  // heard then, so that time does not count towards any node's timeout.
  // The last heartbeat shown stays when it came.
  void LeaveOut(absl::Duration gap);

 private:
  struct Entry {
    // spec, registered time, last report, refusals, pending_approval
    v1::Node node;
    std::string session;  // "" until it registers with this ptcoord
    // Sha256Hex of the node secret; "" for a node an older ptcoord
    // registered.
    std::string secret_sha256;
    absl::Time last_heartbeat = absl::InfinitePast();
    // The node's silence counts from here: its last heartbeat, later by
    // the time LeaveOut excused since.
    absl::Time silent_since = absl::InfinitePast();
  };
  std::vector<v1::Node> ListLocked(absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool UpLocked(const Entry& e, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Counts, logs and stores a refused registration; returns the refusal.
  absl::Status RefuseLocked(Entry& e, const std::string& name,
                            const std::string& why, const std::string& peer,
                            absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeRegistry(Store* store, NodeRegistryOptions options)
      : store_(store), options_(std::move(options)) {}

  Store* const store_;
  const NodeRegistryOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> nodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_NODES_H_
