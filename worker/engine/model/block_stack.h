// BlockStack: a stage's transformer blocks as their parts (model_parts.h). A
// block is a pre-norm residual stream of (norm, sublayer) pairs: pair i
// normalises the stream (adding pair i−1's output to it first, fused into
// the norm), its sublayer reads the norm's output, and the last pair's
// output is added at the block's end. BlockStack finds each part's tensors
// in the stage's layout, decides which part begins and ends each unit in
// each pass (the first and the last part to use it, in the pass's order),
// and runs a block's forward, backward and weight pass part by part.
#ifndef PTRAIN_WORKER_ENGINE_MODEL_BLOCK_STACK_H_
#define PTRAIN_WORKER_ENGINE_MODEL_BLOCK_STACK_H_

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"
#include "worker/engine/model/plan.h"

namespace ptrain {

class BlockStack {
 public:
  static constexpr int kMaxParts = 8, kMaxRows = kMaxPartRows;
  // One block's activations: each part's rows (block order, its Rows
  // order; null where a row is not kept) and the residual stream: x[0] the
  // block's input, x[i] after pair i's sublayer is added, x[pairs] its
  // output.
  struct Rows {
    std::array<std::array<float*, kMaxRows>, kMaxParts> part{};
    std::array<float*, kMaxParts / 2 + 1> x{};
  };

  // The blocks of `layout` (BuildPlan's for this rank): layers
  // first_layer .. first_layer + n_blocks − 1, made of `parts`' block.
  BlockStack(const ModelParts& parts, const GptConfig& config,
             const std::vector<ParamInfo>& layout, int first_layer,
             int n_blocks);

  // Local block b's forward from rows.x[0]. `recomputing`: again before
  // its backward (full recomputation), stopping before the last
  // sublayer's output (the block's output is kept). `s.kind` is set here.
  void Forward(PartPass::Shared s, const Rows& rows, int b,
               bool recomputing) const;
  // Local block b's backward: s.work->dresidual from the gradient of the
  // block's output to its input's. `recompute`: the forward again first.
  void Backward(PartPass::Shared s, const Rows& rows, int b,
                bool recompute) const;
  // A split backward's W for local block b.
  void BackwardWeights(PartPass::Shared s, const Rows& rows, int b,
                       bool recompute) const;
  // What the parts counted over the passes (PartStats), until cleared.
  PartStats& stats() const { return stats_; }

 private:
  // Which of the pass's Begin/End calls reach the store.
  enum Variant { kForward, kBackward, kBackwardSplit, kWeights, kVariants };
  size_t Index(Variant v, int b, int part) const {
    return ((static_cast<size_t>(v) * n_blocks_ + b) * parts_ + part) *
           max_tensors_;
  }
  const PartPass::Place* Places(Variant v, int b, int part) const {
    return &places_[Index(v, b, part)];
  }
  // The rows of part q that share memory with a row a part after it in
  // the backward still reads (PartPass::Deferred).
  std::array<bool, kMaxRows> Deferred(const Rows& rows, int q) const;

  const ModelParts& parts_list_;
  const int first_layer_, n_blocks_;
  mutable PartStats stats_;
  int parts_ = 0, max_tensors_ = 0;
  std::vector<int> tensor_counts_;  // by block part
  std::vector<PartPass::Place> places_;
};

// The places of `part`'s tensors in `layout`, named `prefix` and their
// names, none beginning or ending its unit (the caller brackets them).
// PT_CHECKs that the layout holds each but the routed experts other ep
// ranks hold (unit -1).
std::vector<PartPass::Place> PlacesOf(const ModelPart& part,
                                      const GptConfig& config,
                                      const std::vector<ParamInfo>& layout,
                                      const std::string& prefix);
// The same for a block part's `tensors` in one block (its TensorsAt).
std::vector<PartPass::Place> PlacesOf(const std::vector<PartTensor>& tensors,
                                      const std::vector<ParamInfo>& layout,
                                      const std::string& prefix);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_BLOCK_STACK_H_
