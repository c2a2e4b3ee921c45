#include "coordinator/auto_layout.h"

#include <algorithm>
#include <vector>

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

absl::Status NoLayoutPlanner() {
  return absl::InvalidArgumentError(
      "parallel: auto needs the hardware the planner costs layouts on, "
      "and this ptcoord has none: start it with --planner-profile "
      "(a100, h100, h200, or a file `ptworker profile` wrote), or write "
      "the layout out (`ptctl plan` proposes one)");
}

}  // namespace ptrain
