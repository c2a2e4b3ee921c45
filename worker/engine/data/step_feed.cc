#include "worker/engine/data/step_feed.h"

#include <algorithm>
#include <string>

namespace ptrain {

StepFeed::StepFeed(const TokenData* data, const Shape& shape, CpGroup cp)
    : data_(data), shape_(shape), cp_(cp) {
  if (data->blend.empty()) {
    train_.emplace(&data->train, shape.T, shape.global_batch, shape.seed,
                   "train");
    vals_.emplace_back(&data->val, shape.T, shape.global_batch, shape.seed,
                       "val");
  } else {
    blend_ = std::make_unique<BlendSampler>(data, shape.T, shape.global_batch,
                                            shape.seed);
    for (const BlendPart& part : data->blend) {
      vals_.emplace_back(absl::MakeConstSpan(data->val).subspan(
                             part.val_begin, part.val_end - part.val_begin),
                         shape.T, shape.global_batch, shape.seed,
                         "val/" + part.name);
    }
  }
  const int T_local = shape.T / cp.size();
  inputs_.resize(static_cast<size_t>(shape.micro_B) * T_local *
                 shape.microbatches);
  targets_.resize(inputs_.size());
  if (cp.size() > 1) {
    whole_inputs_.resize(static_cast<size_t>(shape.micro_B) * shape.T);
    whole_targets_.resize(whole_inputs_.size());
  }
}

template <typename Sampler>
void StepFeed::Fill(const Sampler& sampler, int64_t batch, int first,
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

std::vector<StepFeed::EpochBegun> StepFeed::FillStep(int64_t step) {
  const int64_t tokens = int64_t{shape_.micro_B} * (shape_.T / cp_.size());
  const int64_t batch = step + skip_;
  // Counted before the batch's sequences are drawn: the sampler's tally
  // then only goes forward.
  std::vector<int64_t> before;
  if (blend_ != nullptr)
    before = blend_->EpochsBegun(batch * shape_.global_batch);
  for (int mb = 0; mb < shape_.microbatches; ++mb) {
    const int first =
        (shape_.dp_rank * shape_.microbatches + mb) * shape_.micro_B;
    int32_t* inputs = inputs_.data() + mb * tokens;
    int32_t* targets = targets_.data() + mb * tokens;
    if (blend_ != nullptr) {
      Fill(*blend_, batch, first, inputs, targets);
    } else {
      Fill(*train_, batch, first, inputs, targets);
    }
  }
  // What the batch read leaves resident memory (TokenStream::ReleasePages).
  for (const TokenStream& shard : data_->train) shard.ReleasePages();
  std::vector<EpochBegun> begun;
  if (blend_ == nullptr) return begun;
  const std::vector<int64_t> after =
      blend_->EpochsBegun((batch + 1) * shape_.global_batch);
  for (size_t k = 0; k < after.size(); ++k) {
    for (int64_t e = std::max<int64_t>(before[k], 1) + 1; e <= after[k]; ++e) {
      begun.push_back({static_cast<int>(k), e});
    }
  }
  return begun;
}

void StepFeed::FillEval(int source, int64_t batch, int first) {
  Fill(vals_[source], batch, first, inputs_.data(), targets_.data());
  for (const TokenStream& shard : data_->val) shard.ReleasePages();
}

double StepFeed::ValLoss(const std::vector<double>& per_source) const {
  if (data_->blend.empty()) return per_source[0];
  double loss = 0;
  for (size_t k = 0; k < per_source.size(); ++k) {
    loss += data_->blend[k].weight * per_source[k];
  }
  return loss;
}

}  // namespace ptrain
