// RankStep: what a rank tells TrainerOptions::on_rank_step of each step it
// completes. Plain data with no engine types, so that whoever reads it (the
// progress reporter) needs nothing of the engine.
#ifndef PTRAIN_WORKER_ENGINE_REPORT_RANK_STEP_H_
#define PTRAIN_WORKER_ENGINE_REPORT_RANK_STEP_H_

#include <cstdint>
#include <map>
#include <string>

namespace ptrain {

struct RankStep {
  int64_t step = 0;           // steps completed, >= 1
  double seconds = 0.0;       // the step's wall time (StepResult::seconds)
  double comm_exposed = 0.0;  // of it, seconds waiting for communication
                              // meant to be hidden (StepResult::comm_exposed)
  // This rank's seconds in communication by group ("dp", "tp", "pp", "cp",
  // "embedding", "world"), summed over ops, since its mesh was made: running
  // totals, not this step's, so that a reader takes the difference over the
  // steps it covers (evaluation and checkpoints between them included).
  std::map<std::string, double> comm_seconds;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_REPORT_RANK_STEP_H_
