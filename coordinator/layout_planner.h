// ptcoord's LayoutPlanner (auto_layout.h): the layout search of `ptctl
// plan` (planner/search.h) with one hardware profile. A library of its own
// so that the coordinator's (and what links it, the UI's fuzz target) needs
// neither the planner nor the engine's memory estimate under it.
#ifndef PTRAIN_COORDINATOR_LAYOUT_PLANNER_H_
#define PTRAIN_COORDINATOR_LAYOUT_PLANNER_H_

#include <memory>

#include "absl/status/status.h"
#include "coordinator/auto_layout.h"
#include "planner/profile.h"
#include "ptrain/v1/coordinator.pb.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

// The fastest layout of `spec` on `shape` as `profile` predicts it
// (LayoutPlanner's contract). InvalidArgument, naming what is wrong: a
// profile of another device than the job's, no node, a cluster no layout
// fits.
absl::Status ResolveAutoLayout(const planner::HardwareProfile& profile,
                               const ClusterShape& shape, v1::JobSpec* spec,
                               v1::PlannedLayout* plan);

// ResolveAutoLayout with `profile`, as CoordinatorOptions::plan_layout.
LayoutPlanner PlannerWith(
    std::shared_ptr<const planner::HardwareProfile> profile);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_LAYOUT_PLANNER_H_
