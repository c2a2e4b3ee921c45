// A `parallel: auto` choice (v1::PlannedLayout, kept with the job) in words,
// as ptcoord's event and `ptctl get` / `ptctl submit --dry-run` say it. Here
// rather than in planner/ so that what prints a choice needs no planner.
#ifndef PTRAIN_COMMON_PLANNED_LAYOUT_H_
#define PTRAIN_COMMON_PLANNED_LAYOUT_H_

#include <string>

#include "ptrain/v1/coordinator.pb.h"

namespace ptrain {

// "dp=2 tp=2 ... (profile h100 on 2 node(s) × 8 ranks, 412 layouts):
// predicted 1.21 s a step, 2.71e+04 tokens/s, 21.3 GiB a rank".
std::string PlannedLayoutWords(const v1::PlannedLayout& plan);

// The job event of the choice: "layout chosen by the planner: " and the
// words above, then the plan's notes.
std::string PlannedLayoutEvent(const v1::PlannedLayout& plan);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_PLANNED_LAYOUT_H_
