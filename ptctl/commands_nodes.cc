// See commands_nodes.h.
#include "ptctl/commands_nodes.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/proto_json.h"
#include "ptctl/format.h"

namespace ptrain::ptctl {

int Nodes(Client& client) {
  v1::ListNodesResponse resp;
  auto ctx = client.Context();
  const grpc::Status s =
      client.stub().ListNodes(ctx.get(), v1::ListNodesRequest(), &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp, true).c_str());
    return 0;
  }
  const int64_t now = absl::ToUnixMillis(absl::Now());
  std::printf("%-20s %-24s %9s %6s %5s %-14s %14s %6s\n", "NAME", "ADDRESS",
              "SLOTS", "CORES", "GPUS", "STATE", "HEARTBEAT", "LOAD");
  for (const auto& n : resp.nodes()) {
    const std::string beat =
        n.last_heartbeat_unix_ms() == 0
            ? "never"
            : absl::StrFormat("%.1f s ago",
                              (now - n.last_heartbeat_unix_ms()) / 1e3);
    const std::string slots =
        absl::StrCat(n.slots_used(), "/", n.spec().slots());
    const std::string state =
        absl::StrCat(NodeStateName(n.state()), n.draining() ? ",DRAINING" : "",
                     n.pending_approval() ? ",UNAPPROVED" : "");
    std::printf("%-20s %-24s %9s %6d %5d %-14s %14s %6.2f\n",
                n.spec().name().c_str(), n.spec().address().c_str(),
                slots.c_str(), n.spec().cores(), n.spec().gpus(), state.c_str(),
                beat.c_str(), n.load1());
  }
  // A registration refused for a node's name is someone else claiming it
  // (or the node itself, reinstalled without its secret): say so.
  for (const auto& n : resp.nodes()) {
    if (n.refused_registrations() == 0) continue;
    std::printf(
        "note: %s: %d registration(s) refused for its name (no or a wrong "
        "node secret), the last %s ago from %s\n",
        n.spec().name().c_str(), n.refused_registrations(),
        absl::FormatDuration(
            absl::Trunc(absl::Milliseconds(now - n.last_refused_unix_ms()),
                        absl::Seconds(1)))
            .c_str(),
        n.last_refused_peer().c_str());
  }
  for (const auto& n : resp.nodes()) {
    if (!n.pending_approval()) continue;
    std::printf(
        "note: %s waits for approval (ptcoord --require-node-approval): no "
        "job runs on it until 'ptctl nodes approve %s'\n",
        n.spec().name().c_str(), n.spec().name().c_str());
  }
  return 0;
}

int ApproveNode(Client& client, const std::string& node) {
  v1::ApproveNodeRequest req;
  req.set_name(node);
  v1::ApproveNodeResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().ApproveNode(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp.node(), true).c_str());
    return 0;
  }
  std::printf("%s approved: jobs may run on it\n", node.c_str());
  return 0;
}

int ForgetNode(Client& client, const std::string& node) {
  v1::ForgetNodeRequest req;
  req.set_name(node);
  v1::ForgetNodeResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().ForgetNode(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  std::printf(
      "%s forgotten: the next daemon that registers this name is bound to it "
      "with a new node secret\n",
      node.c_str());
  return 0;
}

int Drain(Client& client, const std::string& node, bool drain) {
  v1::DrainNodeRequest req;
  req.set_name(node);
  req.set_drain(drain);
  v1::DrainNodeResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().DrainNode(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp.node(), true).c_str());
    return 0;
  }
  std::printf("%s %s\n", node.c_str(),
              drain ? "drained: no new attempts start on it"
                    : "uncordoned: attempts may start on it");
  return 0;
}

}  // namespace ptrain::ptctl
