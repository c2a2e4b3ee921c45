#include "coordinator/layout_planner.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "planner/search.h"

namespace ptrain {

absl::Status ResolveAutoLayout(const planner::HardwareProfile& profile,
                               const ClusterShape& shape, v1::JobSpec* spec,
                               v1::PlannedLayout* plan) {
  const std::string device =
      spec->resources().device().empty() ? "cpu" : spec->resources().device();
  if (device != profile.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel: auto: the job runs on resources.device=", device,
        ", and ptcoord's planner profile ", profile.name, " describes ",
        profile.device, " (--planner-profile)"));
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
  const planner::PlanInput input = planner::PlanInputOf(*spec, profile);
  absl::StatusOr<planner::PlanResult> result = planner::PlanLayouts(
      input, cluster, profile, planner::AutoLayoutOptions(*spec));
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
  plan->set_profile(profile.name);
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

LayoutPlanner PlannerWith(
    std::shared_ptr<const planner::HardwareProfile> profile) {
  return [profile = std::move(profile)](const ClusterShape& shape,
                                        v1::JobSpec* spec,
                                        v1::PlannedLayout* plan) {
    return ResolveAutoLayout(*profile, shape, spec, plan);
  };
}

}  // namespace ptrain
