#include "worker/engine/data/step_feed.h"

namespace ptrain {

StepFeed::StepFeed(const TokenData* data, const Shape& shape, CpGroup cp)
    : shape_(shape),
      cp_(cp),
      train_(&data->train, shape.T, shape.global_batch, shape.seed, "train"),
      val_(&data->val, shape.T, shape.global_batch, shape.seed, "val") {
  const int T_local = shape.T / cp.size();
  inputs_.resize(static_cast<size_t>(shape.micro_B) * T_local *
                 shape.microbatches);
  targets_.resize(inputs_.size());
  if (cp.size() > 1) {
    whole_inputs_.resize(static_cast<size_t>(shape.micro_B) * shape.T);
    whole_targets_.resize(whole_inputs_.size());
  }
}

void StepFeed::Fill(const BatchSampler& sampler, int64_t batch, int first,
                    int32_t* inputs, int32_t* targets) {
  if (cp_.size() == 1) {
    sampler.Fill(batch, first, shape_.micro_B, inputs, targets);
    return;
  }
  sampler.Fill(batch, first, shape_.micro_B, whole_inputs_.data(),
               whole_targets_.data());
  cp_.TakeLocal(whole_inputs_.data(), shape_.micro_B, shape_.T, inputs);
  cp_.TakeLocal(whole_targets_.data(), shape_.micro_B, shape_.T, targets);
}

void StepFeed::FillStep(int64_t step) {
  const int64_t tokens = int64_t{shape_.micro_B} * (shape_.T / cp_.size());
  for (int mb = 0; mb < shape_.microbatches; ++mb) {
    const int first =
        (shape_.dp_rank * shape_.microbatches + mb) * shape_.micro_B;
    Fill(train_, step + skip_, first, inputs_.data() + mb * tokens,
         targets_.data() + mb * tokens);
  }
}

void StepFeed::FillEval(int64_t batch, int first) {
  Fill(val_, batch, first, inputs_.data(), targets_.data());
}

}  // namespace ptrain
