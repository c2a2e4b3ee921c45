// FIFO gang scheduler and placement on nodes; see scheduler.h.
#include "coordinator/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/mesh.h"
#include "common/spec.h"

namespace ptrain {

absl::Status Scheduler::CheckFits(int slots) const {
  if (slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job needs at least one slot, got ", slots));
  }
  if (slots > total_slots_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.dp*tp*pp*cp=", slots, " slots exceeds the pool of ",
        total_slots_, " slots (--local-slots)"));
  }
  return absl::OkStatus();
}

std::vector<std::string> Scheduler::Pick(const std::vector<QueuedJob>& queue,
                                         int used_slots, int used_gpus) const {
  std::vector<std::string> start;
  int free_slots = total_slots_ - used_slots;
  int free_gpus = total_gpus_ - used_gpus;
  for (const QueuedJob& job : queue) {
    if (job.slots > free_slots || job.gpus > free_gpus) break;
    free_slots -= job.slots;
    free_gpus -= job.gpus;
    start.push_back(job.id);
  }
  return start;
}

bool OnGpus(const v1::JobSpec& spec) {
  return spec.resources().device() == "cuda";
}

int WorldSize(const v1::JobSpec& spec) {
  return static_cast<int>(JobWorldSize(spec));
}

int NodeGroup(const v1::JobSpec& spec) {
  return static_cast<int>(JobLayout(spec).node_local_ranks());
}

std::map<std::string, int> NodeSlotsUsed(const RunningJobs& running,
                                         bool gpus_only) {
  std::map<std::string, int> used;
  for (const v1::Job* job : running) {
    if (gpus_only && !OnGpus(job->spec())) continue;
    for (const v1::Placement& p : job->placement()) used[p.node()] += p.ranks();
  }
  return used;
}

namespace {

// What the placements of `running` hold on each node: `field` of each
// (its GPUs, its CPUs), gathered per node.
template <typename Field>
std::map<std::string, std::set<int>> HeldPerNode(const RunningJobs& running,
                                                 Field field) {
  std::map<std::string, std::set<int>> held;
  for (const v1::Job* job : running) {
    for (const v1::Placement& p : job->placement()) {
      const auto& ids = field(p);
      held[p.node()].insert(ids.begin(), ids.end());
    }
  }
  return held;
}

}  // namespace

std::map<std::string, std::set<int>> GpusHeld(const RunningJobs& running) {
  return HeldPerNode(
      running, [](const v1::Placement& p) -> const auto& { return p.gpus(); });
}

std::vector<FreeNode> FreeNodesOf(const std::vector<v1::Node>& nodes,
                                  const std::map<std::string, int>& used_slots,
                                  const std::map<std::string, int>& used_gpus,
                                  bool gpus) {
  auto used = [](const std::map<std::string, int>& m, const std::string& k) {
    auto it = m.find(k);
    return it == m.end() ? 0 : it->second;
  };
  std::vector<FreeNode> out;
  for (const v1::Node& n : nodes) {
    if (n.state() != v1::NODE_STATE_UP || n.draining() ||
        n.pending_approval()) {
      continue;
    }
    const std::string& name = n.spec().name();
    int free = n.spec().slots() - used(used_slots, name);
    if (gpus) free = std::min(free, n.spec().gpus() - used(used_gpus, name));
    if (free > 0) out.push_back({name, free});
  }
  return out;
}

std::vector<int> TakeGpus(const std::set<int>& used, int ranks) {
  std::vector<int> out;
  for (int g = 0; static_cast<int>(out.size()) < ranks; ++g) {
    if (!used.contains(g)) out.push_back(g);
  }
  return out;
}

std::vector<std::vector<int>> SlotCpus(const std::vector<int>& cpus,
                                       int slots) {
  if (slots < 1 || static_cast<int>(cpus.size()) < slots) return {};
  const size_t each = cpus.size() / slots;
  std::vector<std::vector<int>> out(slots);
  for (int s = 0; s < slots; ++s) {
    out[s].assign(cpus.begin() + s * each, cpus.begin() + (s + 1) * each);
  }
  return out;
}

std::map<std::string, std::set<int>> CpusHeld(const RunningJobs& running) {
  return HeldPerNode(
      running, [](const v1::Placement& p) -> const auto& { return p.cpus(); });
}

std::vector<int> TakeSlotCpus(const std::vector<std::vector<int>>& slot_cpus,
                              const std::set<int>& held, int ranks) {
  std::vector<int> out;
  int taken = 0;
  for (const std::vector<int>& slot : slot_cpus) {
    if (taken == ranks) break;
    if (std::any_of(slot.begin(), slot.end(),
                    [&](int c) { return held.contains(c); })) {
      continue;
    }
    out.insert(out.end(), slot.begin(), slot.end());
    ++taken;
  }
  if (taken < ranks) return {};
  return out;
}

std::vector<std::vector<int>> RankCpus(const v1::Job& job) {
  std::vector<std::vector<int>> out;
  for (const v1::Placement& p : job.placement()) {
    if (p.ranks() < 1 || p.cpus_size() == 0 || p.cpus_size() % p.ranks()) {
      return {};
    }
    const int each = p.cpus_size() / p.ranks();
    for (int rank = 0; rank < p.ranks(); ++rank) {
      out.emplace_back(p.cpus().begin() + rank * each,
                       p.cpus().begin() + (rank + 1) * each);
    }
  }
  if (static_cast<int>(out.size()) != job.world_size()) return {};
  return out;
}

std::vector<NodeRanks> PlaceRanks(const std::vector<FreeNode>& nodes, int world,
                                  int group, int ranks_per_node) {
  if (world < 1 || group < 1 || world % group != 0) return {};
  std::vector<FreeNode> order = nodes;
  std::stable_sort(
      order.begin(), order.end(), [](const FreeNode& a, const FreeNode& b) {
        return a.free != b.free ? a.free > b.free : a.name < b.name;
      });
  std::vector<NodeRanks> out;
  int left = world;
  for (const FreeNode& n : order) {
    if (left == 0) break;
    int take = std::min(left, n.free);
    if (ranks_per_node > 0) take = std::min(take, ranks_per_node);
    take -= take % group;
    if (take > 0) {
      out.push_back({n.name, take});
      left -= take;
    }
  }
  if (left > 0) return {};
  // Rank order by name, so a placement reads (and a hostfile lists) the
  // same way whatever the free counts were.
  std::sort(out.begin(), out.end(), [](const NodeRanks& a, const NodeRanks& b) {
    return a.name < b.name;
  });
  return out;
}

std::vector<v1::Placement> PlacementOf(const std::vector<NodeRanks>& nodes,
                                       const RunningJobs& running, bool gpus) {
  const std::map<std::string, std::set<int>> held =
      gpus ? GpusHeld(running) : std::map<std::string, std::set<int>>{};
  std::vector<v1::Placement> out;
  for (const NodeRanks& n : nodes) {
    v1::Placement& p = out.emplace_back();
    p.set_node(n.name);
    p.set_ranks(n.ranks);
    if (!gpus) continue;
    auto it = held.find(n.name);
    for (int g :
         TakeGpus(it == held.end() ? std::set<int>{} : it->second, n.ranks)) {
      p.add_gpus(g);
    }
  }
  return out;
}

absl::StatusOr<v1::JobSpec> ShrinkDp(const v1::JobSpec& spec, int dp) {
  const ParallelLayout p = JobLayout(spec);
  const int spec_dp = p.degree("dp");
  if (dp < 1 || dp >= spec_dp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a shrunk dp must be in 1..", spec_dp - 1, " (it is ", dp, ")"));
  }
  // Each rank keeps its microbatch size: global_batch / (dp * m).
  const int64_t sequences = int64_t{spec_dp} * p.microbatches;
  if (sequences % dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.dp=", dp, " does not divide parallel.dp*microbatches=",
        sequences, " (the microbatch size would change)"));
  }
  v1::JobSpec out =
      WithDataParallel(spec, dp, static_cast<int>(sequences / dp));
  if (absl::Status s = ValidateJobSpec(out); !s.ok()) return s;
  return out;
}

std::optional<v1::JobSpec> ShrinkToFit(
    const v1::JobSpec& spec,
    const std::function<bool(const v1::JobSpec&)>& fits) {
  for (int dp = JobLayout(spec).degree("dp") - 1; dp >= 1; --dp) {
    absl::StatusOr<v1::JobSpec> s = ShrinkDp(spec, dp);
    if (s.ok() && fits(*s)) return *s;
  }
  return std::nullopt;
}

}  // namespace ptrain
