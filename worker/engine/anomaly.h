// AnomalyGuard: tells a bad training step (train.anomaly): a NaN or Inf
// loss or gradient norm, or a loss spike above spike_factor × the median
// of the last `window` good losses. Pure: what the trainer does about it
// (roll back, stop, go on) is the trainer's.
#ifndef PTRAIN_WORKER_ENGINE_ANOMALY_H_
#define PTRAIN_WORKER_ENGINE_ANOMALY_H_

#include <deque>
#include <string>

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

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_ANOMALY_H_
