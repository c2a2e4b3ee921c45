// AdamW over a slice of the flat parameter buffer, the learning-rate schedule
// and global-norm clipping. A slice (not the whole model) so that ZeRO ranks
// update only their shard with the same code.
#ifndef PTRAIN_WORKER_ENGINE_OPTIMIZER_H_
#define PTRAIN_WORKER_ENGINE_OPTIMIZER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "ptrain/v1/job.pb.h"
#include "worker/engine/gpt.h"

namespace ptrain {

// Learning rate of 0-based step `step`: linear warmup to train.lr over
// warmup_steps, then cosine decay to train.min_lr at the last step.
double LearningRate(const v1::TrainSpec& train, int64_t step);

// Factor that brings a gradient of global L2 norm `norm` down to `max_norm`
// (1 when it is already within, or when clipping is off: max_norm <= 0).
float ClipScale(double norm, double max_norm);

class AdamW {
 public:
  // Owns the moments of elements [begin, end) of a buffer laid out by
  // `layout`; decay applies to tensors with ParamInfo::decay.
  AdamW(const std::vector<ParamInfo>& layout, int64_t begin, int64_t end,
        const v1::TrainSpec& train);
  // Owns the moments of a shard made of `pieces`: [begin, end) ranges of the
  // buffer, concatenated in order. Elements outside every tensor (padding)
  // are never updated.
  AdamW(const std::vector<ParamInfo>& layout,
        const std::vector<std::pair<int64_t, int64_t>>& pieces,
        const v1::TrainSpec& train);

  // One update of params[begin,end) from grads[begin,end) (pointers to the
  // start of the slice), gradients multiplied by grad_scale first.
  void Step(float* params, const float* grads, float lr, float grad_scale);

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }  // resuming from a checkpoint
  int64_t bytes() const {
    return static_cast<int64_t>((m_.size() + v_.size()) * sizeof(float));
  }
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }

 private:
  struct Run {  // a stretch of the slice with one decay setting
    int64_t begin, count;
    bool decay;
  };
  std::vector<Run> runs_;
  std::vector<float> m_, v_;
  const float beta1_, beta2_, eps_, weight_decay_;
  int64_t t_ = 0;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_OPTIMIZER_H_
