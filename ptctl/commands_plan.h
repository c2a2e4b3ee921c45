// `ptctl plan JOB.yaml --nodes N --gpus-per-node G --profile P`: the best
// layouts of the job's model on a cluster, predicted by the layout planner
// (planner/) from a hardware profile, without a coordinator. `--fixed`
// costs the spec's own layout the same way.
#ifndef PTRAIN_PTCTL_COMMANDS_PLAN_H_
#define PTRAIN_PTCTL_COMMANDS_PLAN_H_

#include <string>
#include <vector>

namespace ptrain::ptctl {

struct PlanArgs {
  std::string file;
  std::vector<std::string> sets;
  int nodes = 1;
  int gpus_per_node = 8;
  std::string profile;
  bool fixed = false;
  bool json = false;  // -o json
};

// Prints the plan (a table, or JSON); ptctl's exit code: 2 for bad input
// (an unreadable spec or profile, a cluster no layout fits).
int Plan(const PlanArgs& args);

}  // namespace ptrain::ptctl

#endif  // PTRAIN_PTCTL_COMMANDS_PLAN_H_
