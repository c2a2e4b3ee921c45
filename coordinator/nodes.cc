// See nodes.h.
#include "coordinator/nodes.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/auth_token.h"
#include "common/digest.h"
#include "common/echo.h"
#include "coordinator/auth.h"
#include "coordinator/reports.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace {
int64_t UnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

// The rule a node waiting for approval is held to, and what ends the wait.
std::string WaitsForApproval(const std::string& name) {
  return absl::StrCat(
      "node ", EchoQuoted(name),
      " waits for approval (ptcoord --require-node-approval): no attempt is "
      "placed on it until an operator runs 'ptctl nodes approve ",
      Echo(name), "'");
}

absl::Status SessionNotFound(const std::string& name) {
  return absl::NotFoundError(
      absl::StrCat("node ", EchoQuoted(name),
                   " is not registered with this session: register again"));
}
}  // namespace

std::string CheckNodeSpec(const v1::NodeSpec& spec) {
  const std::string& name = spec.name();
  if (name.empty() || name.size() > 63) {
    return absl::StrCat("node.name must be 1 to 63 characters (it has ",
                        name.size(), ")");
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = absl::ascii_islower(c) || absl::ascii_isdigit(c) ||
                    (i > 0 && (c == '-' || c == '.'));
    if (!ok) {
      return absl::StrCat(
          "node.name may hold only a-z, 0-9, '-' and '.', and starts with a "
          "letter or digit (character ",
          i + 1, " is not allowed)");
    }
  }
  // What ptrsh dials with an attempt's token: the rule of every address
  // others must reach (no wildcard, a real port).
  if (absl::Status a = ValidateHostPort("node.address", spec.address());
      !a.ok()) {
    return std::string(a.message());
  }
  if (spec.slots() < 1 || spec.slots() > 4096) {
    return absl::StrCat("node.slots must be in 1..4096 (it is ", spec.slots(),
                        ")");
  }
  if (spec.cores() < 1 || spec.cores() > 65536) {
    return absl::StrCat("node.cores must be in 1..65536 (it is ", spec.cores(),
                        ")");
  }
  if (spec.cpus_size() > 65536) {
    return absl::StrCat("node.cpus may list at most 65536 CPUs (it lists ",
                        spec.cpus_size(), ")");
  }
  for (int i = 0; i < spec.cpus_size(); ++i) {
    if (spec.cpus(i) < 0 || spec.cpus(i) > 1048575 ||
        (i > 0 && spec.cpus(i) <= spec.cpus(i - 1))) {
      return absl::StrCat(
          "node.cpus must be strictly ascending CPU numbers in 0..1048575 "
          "(entry ",
          i + 1, " is ", spec.cpus(i), ")");
    }
  }
  if (spec.gpus() < 0 || spec.gpus() > 1024) {
    return absl::StrCat("node.gpus must be in 0..1024 (it is ", spec.gpus(),
                        ")");
  }
  if (spec.memory_bytes() < 0) {
    return absl::StrCat("node.memory_bytes must not be negative (it is ",
                        spec.memory_bytes(), ")");
  }
  if (spec.version().size() > 64) {
    return "node.version must be at most 64 bytes";
  }
  return "";
}

absl::StatusOr<std::unique_ptr<NodeRegistry>> NodeRegistry::Create(
    Store* store, NodeRegistryOptions options) {
  absl::StatusOr<std::vector<StoredNode>> stored = store->ListNodes();
  if (!stored.ok()) return stored.status();
  std::unique_ptr<NodeRegistry> r(new NodeRegistry(store, std::move(options)));
  absl::MutexLock lock(&r->mu_);
  for (StoredNode& n : *stored) {
    Entry& e = r->nodes_[n.node.spec().name()];
    e.node = std::move(n.node);
    e.secret_sha256 = std::move(n.secret_sha256);
  }
  return r;
}

absl::Status NodeRegistry::AuthenticateNode(
    const std::optional<std::string>& authorization) const {
  if (options_.join_tokens.empty()) {
    return absl::UnauthenticatedError(
        "this coordinator takes no nodes (start ptcoord with "
        "--join-token-file)");
  }
  absl::Status s = CheckBearer(authorization, options_.join_tokens);
  if (!s.ok()) {
    return absl::UnauthenticatedError(
        "join token refused (ptworkerd --join-token-file must hold one of "
        "ptcoord's --join-token-file tokens)");
  }
  return s;
}

absl::StatusOr<v1::RegisterNodeResponse> NodeRegistry::Register(
    const v1::RegisterNodeRequest& request, absl::Time now,
    const std::string& peer) {
  if (const std::string bad = CheckNodeSpec(request.node()); !bad.empty()) {
    return absl::InvalidArgumentError(bad);
  }
  if (request.node_secret().size() > 256) {
    return absl::InvalidArgumentError("node_secret must be at most 256 bytes");
  }
  if (options_.check_address) {
    if (absl::Status s = options_.check_address(request.node().address());
        !s.ok()) {
      return absl::Status(
          s.code(),
          absl::StrCat("node ", request.node().name(), " advertises ",
                       request.node().address(), ", which ptcoord cannot ",
                       s.code() == absl::StatusCode::kInvalidArgument
                           ? "resolve"
                           : "reach",
                       " (", s.message(),
                       "); ptcoord's ptrsh dials that address to start ranks "
                       "there: start ptworkerd with --advertise HOST:PORT, "
                       "an address of this node that ptcoord and the other "
                       "nodes reach"));
    }
  }
  const std::string& name = request.node().name();
  // Held through the store write: two registrations of one name are
  // decided one after the other.
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(name);
  std::string secret_sha256, issued;
  // Only a name ptcoord never knew waits: nodes registered before (by an
  // older ptcoord, or before approval was required) keep their standing.
  const bool pending = it == nodes_.end() ? options_.require_approval
                                          : it->second.node.pending_approval();
  if (it != nodes_.end() && !it->second.secret_sha256.empty()) {
    if (request.node_secret().empty()) {
      return RefuseLocked(it->second, name, "carries no node secret", peer,
                          now);
    }
    if (!SecretMatches(request.node_secret(), it->second.secret_sha256)) {
      return RefuseLocked(it->second, name, "carries another node secret", peer,
                          now);
    }
    secret_sha256 = it->second.secret_sha256;
  } else {
    // Unknown, or stored by a ptcoord that issued no secrets (such a node
    // is down until it registers, and its first registration binds it).
    issued = GenerateToken();
    secret_sha256 = Sha256Hex(issued);
  }
  // Stored first: a registration the disk does not have did not happen.
  if (absl::Status s = store_->UpsertNode(request.node(), UnixMs(now),
                                          secret_sha256, pending);
      !s.ok()) {
    return s;
  }
  Entry& e = nodes_[name];
  const v1::Node before = e.node;
  e.node = v1::Node();
  e.node.set_draining(before.draining());
  e.node.set_refused_registrations(before.refused_registrations());
  e.node.set_last_refused_unix_ms(before.last_refused_unix_ms());
  e.node.set_last_refused_peer(before.last_refused_peer());
  e.node.set_pending_approval(pending);
  *e.node.mutable_spec() = request.node();
  e.node.set_registered_unix_ms(UnixMs(now));
  e.secret_sha256 = secret_sha256;
  e.session = RandomHex(16);
  e.last_heartbeat = now;  // registering is a sign of life
  e.silent_since = now;
  if (!issued.empty()) {
    const std::string event =
        absl::StrCat("registered for the first time from ",
                     peer.empty() ? request.node().address() : peer,
                     ": bound to a new node secret",
                     pending ? absl::StrCat("; ", WaitsForApproval(name)) : "");
    spdlog::info("node {}: {}", name, event);
    // A node that waits is kept in the record an operator reads later.
    if (pending) {
      store_->AddEvent(absl::StrCat("node:", name), UnixMs(now), event)
          .IgnoreError();
    }
  }
  v1::RegisterNodeResponse out;
  out.set_session(e.session);
  out.set_heartbeat_interval_ms(static_cast<int32_t>(
      absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  out.set_node_secret(issued);
  out.set_pending_approval(pending);
  return out;
}

absl::Status NodeRegistry::RefuseLocked(Entry& e, const std::string& name,
                                        const std::string& why,
                                        const std::string& peer,
                                        absl::Time now) {
  const bool up = UpLocked(e, now);
  const std::string shown_peer = peer.empty() ? "an unknown peer" : peer;
  const std::string event =
      absl::StrCat("registration refused: it came from ", shown_peer, " and ",
                   why, " (the node is ", up ? "up" : "down", " at ",
                   e.node.spec().address(), ")");
  e.node.set_refused_registrations(e.node.refused_registrations() + 1);
  e.node.set_last_refused_unix_ms(UnixMs(now));
  e.node.set_last_refused_peer(shown_peer.substr(0, 128));
  spdlog::warn("node {}: {}", name, event);
  // Best effort: the refusal stands whether or not the disk takes it.
  store_->AddEvent(absl::StrCat("node:", name), UnixMs(now), event)
      .IgnoreError();
  return absl::PermissionDeniedError(absl::StrCat(
      "node '", name, "' is registered (", up ? "up" : "down", " at ",
      e.node.spec().address(), ") and this registration ", why,
      ": a node's name is bound to the daemon that first registered it, "
      "which keeps its node secret in ptworkerd --state-dir. A reinstalled "
      "node joins again after 'ptctl forget-node ",
      name, "' (once it is down)."));
}

absl::Status NodeRegistry::Heartbeat(const v1::NodeHeartbeatRequest& request,
                                     absl::Time now, bool* pending_approval) {
  if (!std::isfinite(request.load1()) || request.load1() < 0) {
    return absl::InvalidArgumentError(
        "load1 must be a finite number, not negative");
  }
  if (request.processes() < 0) {
    return absl::InvalidArgumentError("processes must not be negative");
  }
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(request.name());
  if (it == nodes_.end() || it->second.session.empty() ||
      it->second.session != request.session()) {
    return SessionNotFound(request.name());
  }
  Entry& e = it->second;
  e.last_heartbeat = now;
  e.silent_since = now;
  e.node.set_load1(request.load1());
  e.node.set_processes(request.processes());
  if (pending_approval != nullptr) {
    *pending_approval = e.node.pending_approval();
  }
  return absl::OkStatus();
}

absl::Status NodeRegistry::CheckSession(const std::string& name,
                                        const std::string& session) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end() || it->second.session.empty() ||
      it->second.session != session) {
    return SessionNotFound(name);
  }
  if (it->second.node.pending_approval()) {
    return absl::PermissionDeniedError(WaitsForApproval(name));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Node> NodeRegistry::Approve(const std::string& name,
                                               absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("no node ", EchoQuoted(name)));
  }
  if (it->second.node.pending_approval()) {
    // Stored first: an approval the disk does not have did not happen.
    if (absl::Status s = store_->ApproveNode(name); !s.ok()) return s;
    it->second.node.set_pending_approval(false);
    const std::string event = "approved: jobs may be placed on it";
    spdlog::info("node {}: {}", name, event);
    store_->AddEvent(absl::StrCat("node:", name), UnixMs(now), event)
        .IgnoreError();
  }
  for (const v1::Node& n : ListLocked(now)) {
    if (n.spec().name() == name) return n;
  }
  return absl::NotFoundError(absl::StrCat("no node ", EchoQuoted(name)));
}

absl::StatusOr<v1::Node> NodeRegistry::SetDraining(const std::string& name,
                                                   bool draining,
                                                   absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (!nodes_.count(name)) {
      return absl::NotFoundError(absl::StrCat("no node ", EchoQuoted(name)));
    }
  }
  if (absl::Status s = store_->SetNodeDraining(name, draining); !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  nodes_[name].node.set_draining(draining);
  for (const v1::Node& n : ListLocked(now)) {
    if (n.spec().name() == name) return n;
  }
  return absl::NotFoundError(absl::StrCat("no node ", EchoQuoted(name)));
}

absl::Status NodeRegistry::Forget(const std::string& name, bool busy,
                                  absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("no node ", EchoQuoted(name)));
  }
  if (UpLocked(it->second, now)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node '", name,
        "' is up (its daemon heartbeats): stop its ptworkerd first; only a "
        "node that is down can be forgotten"));
  }
  if (busy) {
    return absl::FailedPreconditionError(
        absl::StrCat("an attempt is placed on node '", name,
                     "': it can be forgotten once that attempt has ended"));
  }
  if (absl::Status s = store_->DeleteNode(name); !s.ok()) return s;
  nodes_.erase(it);
  const std::string event =
      "forgotten: its name may register afresh (a new node secret)";
  spdlog::warn("node {}: {}", name, event);
  store_->AddEvent(absl::StrCat("node:", name), UnixMs(now), event)
      .IgnoreError();
  return absl::OkStatus();
}

std::vector<v1::Node> NodeRegistry::List(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return ListLocked(now);
}

void NodeRegistry::LeaveOut(absl::Duration gap) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, e] : nodes_) e.silent_since += gap;
}

bool NodeRegistry::UpLocked(const Entry& e, absl::Time now) const {
  return !e.session.empty() && now - e.silent_since <= options_.timeout;
}

std::vector<v1::Node> NodeRegistry::ListLocked(absl::Time now) const {
  std::vector<v1::Node> out;
  for (const auto& [name, e] : nodes_) {
    v1::Node& n = out.emplace_back(e.node);
    n.set_state(UpLocked(e, now) ? v1::NODE_STATE_UP : v1::NODE_STATE_DOWN);
    n.set_last_heartbeat_unix_ms(e.session.empty() ? 0
                                                   : UnixMs(e.last_heartbeat));
  }
  return out;
}

}  // namespace ptrain
