// FIFO gang scheduling over a pool of identical slots: a job starts only when
// all of its dp*tp*pp*cp slots (and, for a GPU job, as many GPUs) are free at
// once. Pure logic, no clock, no I/O.
#ifndef PTRAIN_COORDINATOR_SCHEDULER_H_
#define PTRAIN_COORDINATOR_SCHEDULER_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ptrain/v1/coordinator.pb.h"
#include "ptrain/v1/job.pb.h"
#include "ptrain/v1/node.pb.h"

namespace ptrain {

// The jobs whose attempts run now: their placements hold slots and GPUs.
using RunningJobs = std::vector<const v1::Job*>;

// A job that runs one rank per GPU (resources.device=cuda).
bool OnGpus(const v1::JobSpec& spec);

// The job's number of ranks (a validated spec's fits an int).
int WorldSize(const v1::JobSpec& spec);

// The consecutive ranks a placement keeps on one node: a tensor-parallel
// group and the context-parallel ring around it, tp·cp ranks (tp is the
// fastest coordinate, cp the next).
int NodeGroup(const v1::JobSpec& spec);

// Slots of each node that the attempts of `running` take; with
// `gpus_only`, only the ranks of GPU jobs (one GPU each).
std::map<std::string, int> NodeSlotsUsed(const RunningJobs& running,
                                         bool gpus_only = false);

// The GPUs the attempts of `running` hold on each node.
std::map<std::string, std::set<int>> GpusHeld(const RunningJobs& running);

struct QueuedJob {
  std::string id;
  int slots = 1;
  int gpus = 0;  // one per rank for a GPU job
};

class Scheduler {
 public:
  explicit Scheduler(int total_slots, int total_gpus = 0)
      : total_slots_(total_slots), total_gpus_(total_gpus) {}

  int total_slots() const { return total_slots_; }
  int total_gpus() const { return total_gpus_; }

  // A job that can never fit is refused at submit rather than queued forever.
  absl::Status CheckFits(int slots) const;

  // The jobs to start now, in queue order, given `used_slots` and
  // `used_gpus` already taken. Strict FIFO: the first job that does not fit
  // blocks every job behind it (no backfill), so a big job cannot be starved
  // by a stream of small ones.
  std::vector<std::string> Pick(const std::vector<QueuedJob>& queue,
                                int used_slots, int used_gpus = 0) const;

 private:
  const int total_slots_;
  const int total_gpus_;
};

// A node that may take ranks now: up, not draining, approved, `free` slots
// unused.
struct FreeNode {
  std::string name;
  int free = 0;
};

// The nodes of `nodes` a job may take ranks on now, with how many: up, not
// draining, not waiting for approval, slots unused (`used_slots` per node). A
// job with `gpus` (one GPU per rank, resources.device=cuda) takes only nodes
// with unused GPUs
// (`used_gpus`), at most one rank per free GPU.
std::vector<FreeNode> FreeNodesOf(const std::vector<v1::Node>& nodes,
                                  const std::map<std::string, int>& used_slots,
                                  const std::map<std::string, int>& used_gpus,
                                  bool gpus);

// The GPUs `ranks` new ranks on a node take: the lowest indices not in
// `used` (those running jobs hold there).
std::vector<int> TakeGpus(const std::set<int>& used, int ranks);

// The CPUs of each of a host's `slots` slots: `cpus` (the CPUs the host
// lets ptcoord use, ascending) cut in order into runs of cpus.size() /
// slots, one a slot (a remainder stays unused). Empty when there are more
// slots than CPUs: slots then share CPUs and no job is bound.
std::vector<std::vector<int>> SlotCpus(const std::vector<int>& cpus, int slots);

// The CPUs the attempts of `running` are bound to on each node.
std::map<std::string, std::set<int>> CpusHeld(const RunningJobs& running);

// The CPUs of the first `ranks` slots of `slot_cpus` (SlotCpus) that hold
// none of `held`, slot after slot; empty when fewer slots are free.
std::vector<int> TakeSlotCpus(const std::vector<std::vector<int>>& slot_cpus,
                              const std::set<int>& held, int ranks);

// Each rank's CPUs, in rank order, from the job's placement (Placement.cpus
// cut into cpus_size() / ranks a rank); empty unless every rank of the
// world has some.
std::vector<std::vector<int>> RankCpus(const v1::Job& job);

// Consecutive ranks on one node (ranks are numbered node after node).
struct NodeRanks {
  std::string name;
  int ranks = 0;
  bool operator==(const NodeRanks& o) const {
    return name == o.name && ranks == o.ranks;
  }
};

// Places `world` ranks on `nodes` (gang: all or nothing). Each node gets a
// multiple of `group` ranks, so such a group of consecutive ranks (a
// tensor-parallel group, or tp·cp ranks: its context-parallel group too)
// never spans two nodes, and at most `ranks_per_node` (0: no limit). Uses as
// few nodes as it can: the freest first, ties by name. Empty when they do
// not fit.
std::vector<NodeRanks> PlaceRanks(const std::vector<FreeNode>& nodes, int world,
                                  int group, int ranks_per_node);

// What a job's `placement` shows for ranks on `nodes`: with `gpus`, each
// node's ranks take the lowest GPUs no job of `running` holds there
// (TakeGpus).
std::vector<v1::Placement> PlacementOf(const std::vector<NodeRanks>& nodes,
                                       const RunningJobs& running, bool gpus);

// `spec` with parallel.dp = `dp` (< the spec's), train.global_batch kept and
// parallel.microbatches grown to keep each rank's microbatch size. An error
// naming the rule when no such layout is valid (the global batch or the
// pipeline's microbatch rule does not divide).
absl::StatusOr<v1::JobSpec> ShrinkDp(const v1::JobSpec& spec, int dp);

// `spec` shrunk (ShrinkDp) to the largest dp below its own that `fits`;
// nullopt when none does.
std::optional<v1::JobSpec> ShrinkToFit(
    const v1::JobSpec& spec,
    const std::function<bool(const v1::JobSpec&)>& fits);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_SCHEDULER_H_
