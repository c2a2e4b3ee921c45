// The tokens of each step of one rank: the train and validation samplers
// over a job's TokenData (a blend's: its BlendSampler and one validation
// sampler per source), a step's microbatches filled into one buffer (under
// context parallelism this rank's zigzag positions of each sequence), and
// the steps of data skipped by rollbacks.
#ifndef PTRAIN_WORKER_ENGINE_DATA_STEP_FEED_H_
#define PTRAIN_WORKER_ENGINE_DATA_STEP_FEED_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "worker/engine/data/blend.h"
#include "worker/engine/data/data.h"
#include "worker/engine/model/layers.h"

namespace ptrain {

class StepFeed {
 public:
  // How the global batch is split over this rank.
  struct Shape {
    int T = 0;             // a sequence's tokens (targets: one more)
    int global_batch = 0;  // sequences of a step
    int micro_B = 1;       // sequences of a microbatch
    int microbatches = 1;  // a step's on each dp rank
    int dp = 1, dp_rank = 0;
    uint64_t seed = 0;  // train.seed
  };
  // `data` is not owned and outlives the feed; `cp` splits each sequence
  // (size 1: none).
  StepFeed(const TokenData* data, const Shape& shape, CpGroup cp);

  // A blend source that began another epoch (2, 3, ...): it ran out.
  struct EpochBegun {
    int source = 0;
    int64_t epoch = 0;
  };
  // Every microbatch of optimizer step `step` (0-based) of this dp rank: dp
  // rank r takes the r-th block of microbatches·micro_B sequences of the
  // batch of step + skipped_steps(). Microbatch mb at mb·micro_B·T_local.
  // Returns the blend sources whose next epoch began in that batch.
  std::vector<EpochBegun> FillStep(int64_t step);
  // The validation splits: a blend's sources (data.blend's order), else 1.
  int eval_sources() const { return static_cast<int>(vals_.size()); }
  // Sequences first.. (micro_B of them) of validation batch `batch` of
  // split `source` into the first microbatch's room.
  void FillEval(int source, int64_t batch, int first);
  // The validation loss of the whole data from each split's: a blend's
  // weighted by the sources' shares (a source of weight 0 counts for none).
  double ValLoss(const std::vector<double>& per_source) const;
  const int32_t* inputs() const { return inputs_.data(); }
  const int32_t* targets() const { return targets_.data(); }

  // Steps of data skipped (rollbacks): step s trains on the batch of
  // s + skipped_steps().
  int64_t skipped_steps() const { return skip_; }
  void set_skipped_steps(int64_t steps) { skip_ = steps; }
  void SkipData(int64_t steps) { skip_ += steps; }

 private:
  template <typename Sampler>
  void Fill(const Sampler& sampler, int64_t batch, int first, int32_t* inputs,
            int32_t* targets);

  const TokenData* data_;
  const Shape shape_;
  const CpGroup cp_;
  std::optional<BatchSampler> train_;    // one source
  std::unique_ptr<BlendSampler> blend_;  // data.blend
  std::vector<BatchSampler> vals_;
  int64_t skip_ = 0;
  std::vector<int32_t> inputs_, targets_;
  // cp > 1: one microbatch's whole sequences, before this rank's positions
  // are taken.
  std::vector<int32_t> whole_inputs_, whole_targets_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_DATA_STEP_FEED_H_
