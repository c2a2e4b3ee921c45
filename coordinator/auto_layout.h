// `parallel: auto`, resolved when a job is submitted: the layout search of
// `ptctl plan` (planner/search.h) over the nodes the coordinator's backend
// can place ranks on, with the hardware profile ptcoord was started with
// (--planner-profile). The job is stored, and runs, with the fastest
// layout that fits; the choice and its prediction stay with the job
// (Job.plan) for `ptctl get` to hold against the measured step.
#ifndef PTRAIN_COORDINATOR_AUTO_LAYOUT_H_
#define PTRAIN_COORDINATOR_AUTO_LAYOUT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "planner/profile.h"
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
// it, train.recompute) with the fastest layout that fits on `shape` as
// `profile` predicts it, and describes the choice in `plan`.
// InvalidArgument, naming what is wrong: no profile (`profile` null), a
// profile of another device than the job's, a cluster no layout fits.
absl::Status ResolveAutoLayout(const planner::HardwareProfile* profile,
                               const ClusterShape& shape, v1::JobSpec* spec,
                               v1::PlannedLayout* plan);

// The job event of the choice: "layout chosen by the planner: dp=4 tp=4
// ... (profile h100 on 2 node(s) × 8 ranks, 412 layouts): predicted 1.21 s
// a step, ...", and the plan's notes.
std::string PlannedLayoutEvent(const v1::PlannedLayout& plan);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_AUTO_LAYOUT_H_
