// `parallel: auto`, resolved when a job is submitted: the coordinator asks
// its LayoutPlanner (CoordinatorOptions::plan_layout; ptcoord's comes from
// layout_planner.h, with the hardware of --planner-profile) for the fastest
// layout over the nodes its backend can place ranks on. The job is stored,
// and runs, with that layout; the choice and its prediction stay with the
// job (Job.plan) for `ptctl get` to hold against the measured step.
#ifndef PTRAIN_COORDINATOR_AUTO_LAYOUT_H_
#define PTRAIN_COORDINATOR_AUTO_LAYOUT_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "ptrain/v1/coordinator.pb.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

// The nodes a job may run on, busy or not, and the ranks each takes (a GPU
// each for a GPU job).
struct ClusterShape {
  int nodes = 0;
  int ranks_per_node = 0;
};

// The shape of nodes that hold `ranks_each` ranks (a node holding none is
// left out): as many ranks on each as the smallest holds, and at most
// `ranks_per_node` (resources.ranks_per_node; 0: no limit).
ClusterShape ShapeOf(const std::vector<int>& ranks_each, int ranks_per_node);

// Replaces the auto layout of `spec` (parallel and, unless the spec sets
// it, train.recompute) with the fastest layout that fits on the shape, and
// describes the choice in `plan`; InvalidArgument, naming what is wrong,
// where none can be chosen.
using LayoutPlanner = std::function<absl::Status(
    const ClusterShape& shape, v1::JobSpec* spec, v1::PlannedLayout* plan)>;

// What a coordinator without a planner says to a `parallel: auto` job.
absl::Status NoLayoutPlanner();

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_AUTO_LAYOUT_H_
