#include "coordinator/auto_layout.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/spec.h"
#include "planner/search.h"

namespace ptrain {

ClusterShape ShapeOf(const std::vector<int>& ranks_each, int ranks_per_node) {
  ClusterShape shape;
  for (int r : ranks_each) {
    if (r < 1) continue;
    ++shape.nodes;
    shape.ranks_per_node =
        shape.nodes == 1 ? r : std::min(shape.ranks_per_node, r);
  }
  if (ranks_per_node > 0) {
    shape.ranks_per_node = std::min(shape.ranks_per_node, ranks_per_node);
  }
  return shape;
}

absl::Status ResolveAutoLayout(const planner::HardwareProfile* profile,
                               const ClusterShape& shape, v1::JobSpec* spec,
                               v1::PlannedLayout* plan) {
  if (profile == nullptr) {
    return absl::InvalidArgumentError(
        "parallel: auto needs the hardware the planner costs layouts on, "
        "and this ptcoord has none: start it with --planner-profile "
        "(a100, h100, h200, or a file `ptworker profile` wrote), or write "
        "the layout out (`ptctl plan` proposes one)");
  }
  const std::string device =
      spec->resources().device().empty() ? "cpu" : spec->resources().device();
  if (device != profile->device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel: auto: the job runs on resources.device=", device,
        ", and ptcoord's planner profile ", profile->name, " describes ",
        profile->device, " (--planner-profile)"));
  }
  if (shape.nodes < 1 || shape.ranks_per_node < 1) {
    return absl::InvalidArgumentError(
        "parallel: auto: this coordinator has no node to place ranks on now "
        "(none is up); submit again when one is, or write the layout out");
  }
  planner::Cluster cluster;
  cluster.nodes = shape.nodes;
  cluster.ranks_per_node = shape.ranks_per_node;
  cluster.threads_per_rank = spec->resources().threads_per_rank();
  const planner::PlanInput input = planner::PlanInputOf(*spec, *profile);
  absl::StatusOr<planner::PlanResult> result = planner::PlanLayouts(
      input, cluster, *profile, planner::AutoLayoutOptions(*spec));
  if (!result.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel: auto on ", shape.nodes, " node(s) × ", shape.ranks_per_node,
        " ranks: ", result.status().message()));
  }
  const planner::RankedLayout& best = result->best.front();
  planner::AdoptLayout(best.spec, spec);
  if (absl::Status s = ValidateJobSpec(*spec); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("parallel: auto chose a layout the spec's rules refuse: ",
                     s.message()));
  }
  const planner::Prediction& p = best.prediction;
  plan->Clear();
  plan->set_layout(planner::LayoutWords(*spec));
  plan->set_profile(profile->name);
  plan->set_nodes(shape.nodes);
  plan->set_ranks_per_node(shape.ranks_per_node);
  plan->set_layouts_considered(result->layouts);
  plan->set_step_s(p.step_s);
  plan->set_tokens_per_s(p.tokens_per_s);
  plan->set_mfu(p.mfu);
  plan->set_memory_bytes(p.memory_need);
  for (const std::string& note : result->notes) plan->add_notes(note);
  return absl::OkStatus();
}

std::string PlannedLayoutEvent(const v1::PlannedLayout& plan) {
  std::string event = absl::StrCat("layout chosen by the planner: ",
                                   planner::PlannedLayoutWords(plan));
  for (const std::string& note : plan.notes()) {
    absl::StrAppend(&event, "; ", note);
  }
  return event;
}

}  // namespace ptrain
