// See nodes.h.
#include "coordinator/nodes.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "coordinator/auth.h"

namespace ptrain {

namespace {
int64_t UnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

absl::Status SessionNotFound(const std::string& name) {
  return absl::NotFoundError(
      absl::StrCat("node '", name.substr(0, 63),
                   "' is not registered with this session: register again"));
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
  const std::string& address = spec.address();
  const size_t colon = address.rfind(':');
  if (address.size() > 255 || colon == std::string::npos || colon == 0 ||
      colon + 1 == address.size()) {
    return "node.address must be HOST:PORT (at most 255 characters)";
  }
  for (size_t i = colon + 1; i < address.size(); ++i) {
    if (!absl::ascii_isdigit(address[i])) {
      return "node.address must be HOST:PORT with a numeric port";
    }
  }
  if (spec.slots() < 1 || spec.slots() > 4096) {
    return absl::StrCat("node.slots must be in 1..4096 (it is ", spec.slots(),
                        ")");
  }
  if (spec.cores() < 1 || spec.cores() > 65536) {
    return absl::StrCat("node.cores must be in 1..65536 (it is ", spec.cores(),
                        ")");
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
  absl::StatusOr<std::vector<v1::Node>> stored = store->ListNodes();
  if (!stored.ok()) return stored.status();
  std::unique_ptr<NodeRegistry> r(new NodeRegistry(store, std::move(options)));
  absl::MutexLock lock(&r->mu_);
  for (v1::Node& n : *stored) {
    const std::string name = n.spec().name();
    r->nodes_[name].node = std::move(n);
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
    const v1::RegisterNodeRequest& request, absl::Time now) {
  if (const std::string bad = CheckNodeSpec(request.node()); !bad.empty()) {
    return absl::InvalidArgumentError(bad);
  }
  // Stored first: a registration the disk does not have did not happen.
  if (absl::Status s = store_->UpsertNode(request.node(), UnixMs(now));
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  Entry& e = nodes_[request.node().name()];
  const bool draining = e.node.draining();
  e.node = v1::Node();
  e.node.set_draining(draining);
  *e.node.mutable_spec() = request.node();
  e.node.set_registered_unix_ms(UnixMs(now));
  e.session = RandomHex(16);
  e.last_heartbeat = now;  // registering is a sign of life
  e.silent_since = now;
  v1::RegisterNodeResponse out;
  out.set_session(e.session);
  out.set_heartbeat_interval_ms(static_cast<int32_t>(
      absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  return out;
}

absl::Status NodeRegistry::Heartbeat(const v1::NodeHeartbeatRequest& request,
                                     absl::Time now) {
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
  return absl::OkStatus();
}

absl::StatusOr<v1::Node> NodeRegistry::SetDraining(const std::string& name,
                                                   bool draining,
                                                   absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (!nodes_.count(name)) {
      return absl::NotFoundError(
          absl::StrCat("no node '", name.substr(0, 63), "'"));
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
  return absl::NotFoundError(absl::StrCat("no node '", name, "'"));
}

std::vector<v1::Node> NodeRegistry::List(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return ListLocked(now);
}

void NodeRegistry::LeaveOut(absl::Duration gap) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, e] : nodes_) e.silent_since += gap;
}

std::vector<v1::Node> NodeRegistry::ListLocked(absl::Time now) const {
  std::vector<v1::Node> out;
  for (const auto& [name, e] : nodes_) {
    v1::Node& n = out.emplace_back(e.node);
    const bool up =
        !e.session.empty() && now - e.silent_since <= options_.timeout;
    n.set_state(up ? v1::NODE_STATE_UP : v1::NODE_STATE_DOWN);
    n.set_last_heartbeat_unix_ms(e.session.empty() ? 0
                                                   : UnixMs(e.last_heartbeat));
  }
  return out;
}

}  // namespace ptrain
