#include "common/planned_layout.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ptrain {

std::string PlannedLayoutWords(const v1::PlannedLayout& plan) {
  return absl::StrFormat(
      "%s (profile %s on %d node(s) × %d ranks, %d layouts): predicted %.4g s "
      "a step, %.4g tokens/s, %.3g GiB a rank",
      plan.layout(), plan.profile(), plan.nodes(), plan.ranks_per_node(),
      plan.layouts_considered(), plan.step_s(), plan.tokens_per_s(),
      static_cast<double>(plan.memory_bytes()) / (int64_t{1} << 30));
}

std::string PlannedLayoutEvent(const v1::PlannedLayout& plan) {
  std::string event =
      absl::StrCat("layout chosen by the planner: ", PlannedLayoutWords(plan));
  for (const std::string& note : plan.notes()) {
    absl::StrAppend(&event, "; ", note);
  }
  return event;
}

}  // namespace ptrain
