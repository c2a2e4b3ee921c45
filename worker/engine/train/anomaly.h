// AnomalyGuard: tells a bad training step (train.anomaly): a NaN or Inf
// loss or gradient norm, or a loss spike above spike_factor × the median
// of the last `window` good losses; and CheckpointLineage, the checkpoints
// a rollback may return to. Pure: what the trainer does about them (roll
// back, stop, go on) is the trainer's.
#ifndef PTRAIN_WORKER_ENGINE_TRAIN_ANOMALY_H_
#define PTRAIN_WORKER_ENGINE_TRAIN_ANOMALY_H_

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "ptrain/v1/job.pb.h"

namespace ptrain {

class AnomalyGuard {
 public:
  explicit AnomalyGuard(const v1::AnomalySpec& spec) : spec_(spec) {}

  struct Verdict {
    std::string kind;    // "nan" or "spike"; "" for a good step
    std::string reason;  // "NaN loss at step 30", "loss 9.1 at step 30 ..."
  };
  // The step's verdict; a good step's loss joins the window.
  Verdict Check(int64_t step, double loss, double grad_norm);

 private:
  const v1::AnomalySpec spec_;
  std::deque<double> window_;  // the newest good losses, oldest first
};

// The checkpoints a run's own history leads through: the one it resumed
// from and each it committed since. A rollback returns only to one of
// these, and never to one after the step it is at: the folder may hold
// newer checkpoints of an earlier run of the job (this run resumed from an
// older one), which lie in another history; going "back" to one of them
// would go forward, with a negative skip of data.
class CheckpointLineage {
 public:
  // `dir` holds the run's state after `step` steps (a later entry of the
  // same folder replaces an earlier one).
  void Add(int64_t step, const std::string& dir);
  // The folders a rollback at step `step` may return to, newest first:
  // those of steps at most `step`.
  std::vector<std::string> At(int64_t step) const;
  // After a rollback to step `step`: the entries past it belong to the
  // abandoned stretch of history and are forgotten.
  void DropAfter(int64_t step);

 private:
  std::vector<std::pair<int64_t, std::string>> entries_;  // in step order
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_TRAIN_ANOMALY_H_
