// The nodes backend (ptcoord --launcher nodes, docs/multinode.md): mpirun on
// ptcoord's host with ptrsh as its launch agent, the ranks on the registered
// nodes (NodeRegistry) that are up and not draining, tp groups inside a node,
// shrunk when slots are missing. A node whose heartbeats stop ends the
// attempts placed on it.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/backend_mpirun.h"
#include "coordinator/coordinator.h"
#include "coordinator/nodes.h"
#include "coordinator/scheduler.h"
#include "grpcpp/grpcpp.h"
#include "ptrain/v1/node.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace {

namespace fs = std::filesystem;

// Node `name` of `nodes`, or null.
const v1::Node* FindNode(const std::vector<v1::Node>& nodes,
                         const std::string& name) {
  for (const v1::Node& n : nodes) {
    if (n.spec().name() == name) return &n;
  }
  return nullptr;
}

class NodesBackend : public MpirunBackend {
 public:
  NodesBackend(const CoordinatorOptions& o, NodeRegistry* nodes)
      : MpirunBackend(o), nodes_(nodes), started_(absl::Now()) {}

  std::string Name() const override { return "nodes"; }

  std::optional<AttemptPlace> Place(const v1::Job& job,
                                    const RunningJobs& running) override {
    const v1::JobSpec& spec = job.spec();
    const std::vector<FreeNode> free = FreeNodes(running, OnGpus(spec));
    AttemptPlace place;
    place.nodes = PlaceOn(free, spec);
    // Only a job that ran and lost slots shrinks; a new one waits.
    if (place.nodes.empty() && spec.restart().allow_shrink() &&
        job.attempts() > 0) {
      place.shrunk = ShrinkToFit(spec, [&](const v1::JobSpec& s) {
        return !PlaceOn(free, s).empty();
      });
      if (place.shrunk.has_value()) place.nodes = PlaceOn(free, *place.shrunk);
    }
    if (place.nodes.empty()) return std::nullopt;
    place.placement = PlacementOf(place.nodes, running, OnGpus(spec));
    BindToSlotCpus(running, &place.placement);
    return place;
  }

  // Every up node, with all its slots (a GPU job: GPUs), busy or not.
  ClusterShape Shape(const v1::JobSpec& spec) override {
    std::vector<int> ranks;
    for (const FreeNode& n : FreeNodes({}, OnGpus(spec)))
      ranks.push_back(n.free);
    return ShapeOf(ranks, spec.resources().ranks_per_node());
  }

  bool FitsFullSize(const v1::Job& job, const RunningJobs& others) override {
    return !PlaceOn(FreeNodes(others, OnGpus(job.spec())), job.spec()).empty();
  }

  absl::StatusOr<std::unique_ptr<AttemptHandle>> Start(
      LaunchRequest request, const v1::JobSpec& spec) override {
    // Where ptrsh finds each node's daemon, and the threads every rank
    // gets: the fewest cores per rank over the placement.
    std::string text;
    int min_threads = 0;
    for (const v1::Node& n : nodes_->List(absl::Now())) {
      // Only a node whose daemon proved its session (registered with its
      // secret, heartbeating) gets an attempt's token: a node that went
      // down since it was placed is left out, and ptrsh refuses to reach it.
      // Nor does one waiting for approval (never placed; this only keeps it
      // so).
      if (n.state() != v1::NODE_STATE_UP || n.pending_approval()) continue;
      for (const NodeRanks& p : request.placement) {
        if (p.name != n.spec().name()) continue;
        absl::StrAppend(&text, p.name, " ", n.spec().address(), "\n");
        const int t = std::max(1, n.spec().cores() / p.ranks);
        min_threads = min_threads == 0 ? t : std::min(min_threads, t);
      }
    }
    // Bound ranks run as many threads as their CPUs (AttemptEnvironment).
    if (request.threads == 0 && request.rank_cpus.empty()) {
      request.threads = min_threads;
    }
    request.nodes_file = (fs::path(request.job_dir) / "nodes").string();
    if (absl::Status s = ReplacePrivateFile(request.nodes_file, text);
        !s.ok()) {
      return s;
    }
    request.rsh_agent = options_.ptrsh;
    request.cluster_network = options_.cluster_network;
    return MpirunBackend::Start(std::move(request), spec);
  }

  AttemptStatus Poll(AttemptHandle& handle, absl::Time now,
                     bool ending) override {
    AttemptStatus status = MpirunBackend::Poll(handle, now, ending);
    // mpirun notices a dead node (about 1 s) long before its heartbeats
    // time out: any failure may be one.
    status.may_be_node_loss =
        status.state == AttemptStatus::kEnded && status.exit_code != 0;
    return status;
  }

  bool AskToDump(AttemptHandle& handle, const v1::Job& job,
                 const std::string& attempt_uid, ProcessStates* seen) override {
    // Each node's daemon signals its ranks and says how their processes
    // are (a stopped one shows there); mpirun's forwarding where none
    // answers.
    bool asked = false;
    const std::vector<v1::Node> nodes = nodes_->List(absl::Now());
    for (const v1::Placement& p : job.placement()) {
      const v1::Node* n = FindNode(nodes, p.node());
      if (n == nullptr || n->state() != v1::NODE_STATE_UP) continue;
      asked = AskDaemon(n->spec().address(), attempt_uid, seen) || asked;
    }
    return asked || MpirunBackend::AskToDump(handle, job, attempt_uid, seen);
  }

  std::string LostNode(const v1::Job& job, absl::Time now) override {
    // Right after a restart every node is down until it registers again:
    // re-adopted attempts are not ended for that.
    if (now - started_ <= options_.nodes.timeout) return "";
    // A frozen node would hold the attempt forever, a cut link for minutes.
    const std::vector<v1::Node> nodes = nodes_->List(now);
    for (const v1::Placement& p : job.placement()) {
      const v1::Node* n = FindNode(nodes, p.node());
      if (n == nullptr || n->state() != v1::NODE_STATE_UP) {
        return absl::StrCat("attempt ", job.attempts(), " lost node ", p.node(),
                            " (no heartbeat for ",
                            absl::FormatDuration(options_.nodes.timeout), ")");
      }
    }
    return "";
  }

  NodeVerdict CheckNodes(AttemptHandle& /*handle*/, const v1::Job& job,
                         absl::Time ended_at, absl::Time now) override {
    // Decided once every node of the placement has heartbeated since the
    // attempt ended (the job's own failure) or one is down (not the job's
    // fault).
    const std::vector<v1::Node> nodes = nodes_->List(now);
    NodeVerdict verdict;
    verdict.all_heard = true;
    for (const v1::Placement& p : job.placement()) {
      const v1::Node* n = FindNode(nodes, p.node());
      if (n == nullptr || n->state() != v1::NODE_STATE_UP) {
        verdict.lost =
            absl::StrCat("attempt ", job.attempts(), " lost node ", p.node(),
                         " (no heartbeat; its processes are gone)");
        return verdict;
      }
      if (absl::FromUnixMillis(n->last_heartbeat_unix_ms()) <= ended_at) {
        verdict.all_heard = false;
      }
    }
    return verdict;
  }

  // DumpAttempt of the daemon at `address` (host:port), with the join
  // token; its ranks' states into *seen. False when it did not answer
  // within two seconds (the caller holds the coordinator's lock).
  bool AskDaemon(const std::string& address, const std::string& attempt_uid,
                 ProcessStates* seen) const {
    if (options_.nodes.join_tokens.empty()) return false;
    auto stub = v1::DaemonService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization",
                    "Bearer " + options_.nodes.join_tokens.front());
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
    v1::DumpAttemptRequest req;
    req.set_attempt_uid(attempt_uid);
    v1::DumpAttemptResponse resp;
    if (const grpc::Status s = stub->DumpAttempt(&ctx, req, &resp); !s.ok()) {
      spdlog::warn("DumpAttempt at {}: {}", address, s.error_message());
      return false;
    }
    for (const v1::RankProcess& r : resp.ranks()) {
      if (seen != nullptr) (*seen)[{resp.host(), r.pid()}] = r.state();
    }
    return true;
  }

  absl::Duration NodeGrace() const override {
    return options_.nodes.timeout + absl::Seconds(2);
  }

  int FreeSlotCount(const RunningJobs& running) const override {
    int free = 0;
    for (const FreeNode& n : FreeNodes(running, /*gpus=*/false)) free += n.free;
    return free;
  }

  std::string FreeSlots(const RunningJobs& running) const override {
    int free = 0;
    std::vector<std::string> each;
    for (const FreeNode& n : FreeNodes(running, /*gpus=*/false)) {
      free += n.free;
      each.push_back(absl::StrCat(n.name, " ", n.free));
    }
    return absl::StrCat(
        "more slots than the ", free, " free on ", each.size(),
        " up, undrained nodes", each.empty() ? "" : " (",
        absl::StrJoin(each, ", "), each.empty() ? "" : ")",
        ", each node taking whole tp×cp groups (and, on "
        "resources.device=cuda, one unused GPU a rank); see ptctl nodes");
  }

 private:
  // Each rank of `placement` on its own slot's CPUs (NodeSpec.cpus cut by
  // SlotCpus) that no running attempt holds there; every node's or none:
  // where one node cannot bind (more slots than CPUs, an older daemon), no
  // rank of the attempt is bound.
  void BindToSlotCpus(const RunningJobs& running,
                      std::vector<v1::Placement>* placement) const {
    const std::vector<v1::Node> nodes = nodes_->List(absl::Now());
    const std::map<std::string, std::set<int>> held = CpusHeld(running);
    for (v1::Placement& p : *placement) {
      const v1::Node* n = FindNode(nodes, p.node());
      std::vector<int> cpus;
      if (n != nullptr) {
        const auto it = held.find(p.node());
        cpus = TakeSlotCpus(
            SlotCpus({n->spec().cpus().begin(), n->spec().cpus().end()},
                     n->spec().slots()),
            it == held.end() ? std::set<int>{} : it->second, p.ranks());
      }
      if (cpus.empty()) {
        for (v1::Placement& q : *placement) q.clear_cpus();
        return;
      }
      p.mutable_cpus()->Add(cpus.begin(), cpus.end());
    }
  }

  // The up, undrained nodes and their free slots beside `running`; for a
  // job on `gpus`, only GPUs left unused.
  std::vector<FreeNode> FreeNodes(const RunningJobs& running, bool gpus) const {
    return FreeNodesOf(nodes_->List(absl::Now()), NodeSlotsUsed(running),
                       gpus ? NodeSlotsUsed(running, /*gpus_only=*/true)
                            : std::map<std::string, int>{},
                       gpus);
  }

  static std::vector<NodeRanks> PlaceOn(const std::vector<FreeNode>& free,
                                        const v1::JobSpec& spec) {
    return PlaceRanks(free, WorldSize(spec), NodeGroup(spec),
                      spec.resources().ranks_per_node());
  }

  NodeRegistry* const nodes_;
  const absl::Time started_;
};

}  // namespace

std::unique_ptr<AttemptBackend> NewNodesBackend(
    const CoordinatorOptions& options, NodeRegistry* nodes) {
  return std::make_unique<NodesBackend>(options, nodes);
}

}  // namespace ptrain
