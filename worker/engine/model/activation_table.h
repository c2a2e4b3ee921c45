// The activation table of a GPT stage: what each microbatch keeps from
// forward to backward (StageSlot: each block part's rows, the residual
// stream, the head's), the backward's working set (StageWorking), the sizes
// they are laid out by (StageActivationDims) and the one table that lays
// them out in one buffer (LayOutActivations), which the memory estimate
// counts (ActivationFloats).
#ifndef PTRAIN_WORKER_ENGINE_MODEL_ACTIVATION_TABLE_H_
#define PTRAIN_WORKER_ENGINE_MODEL_ACTIVATION_TABLE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "common/spec.h"
#include "kernels/footprint.h"
#include "kernels/ops.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/plan.h"

namespace ptrain {

// Activations a microbatch keeps from forward to backward. A block's are
// its parts' rows (ModelPart::Rows, SplitRows) and its residual stream;
// the stage reads them through StageRows. With full recomputation every
// block row but the block's output is one layer deep and shared by all
// slots; with selective recomputation the rows a part recomputes are.
struct StageSlot {
  float* input;  // (B,Ts,C): embedding output or the received input
  // By StageRows::rows: the slab of each block row (L layers, or one).
  std::vector<float*> rows;
  // The residual stream inside a block: after each pair but the last,
  // (L,B,Ts,C) (or one layer under full recomputation).
  std::vector<float*> stream;
  float* residual3;  // (L,B,Ts,C): each block's output
  // The last stage's: the final norm's rows (its Rows; row 0 its output,
  // (B,Ts,C), which the head reads).
  std::vector<float*> final_rows;
  // (B,T,Vl); after a loss the probabilities, then dlogits; or dlogits
  // right away (fused: dloss below; then in the stored type, Logits()).
  float* logits;
  float* losses;  // (B,T)
  // The microbatch's tokens and targets in the backend's memory (null on
  // the CPU, which reads the caller's).
  int32_t* tokens_staged = nullptr;
  int32_t* targets_staged = nullptr;
  int B = 0, T = 0;  // dims of its forward
  // The dloss the forward's fused classifier folded into logits (0: it
  // kept the probabilities).
  float dloss = 0.0f;
};

// The sizes a stage's activation slabs are laid out by (what the backend
// keeps when `ops` is given, else the most any backend keeps).
struct StageActivationDims {
  int64_t C = 0, L = 0, Cl = 0, Vl = 0, BT = 0, BTs = 0;
  int64_t T = 0;  // a microbatch sequence's positions on this rank
  // Channels of the key (and of the value) heads on this rank, and of the
  // MLP's hidden layer (GPT-2's: Cl and 4Cl).
  int64_t Kl = 0, Hl = 0;
  // Per layer and microbatch: what attention keeps, what is kept of
  // GELU(fch); attention's backward scratch.
  int64_t att = 0, gelu = 0, datt = 0;
  // 2 where the stored activations (LayerNorm outputs, qkv, atty, fch)
  // are kept in bf16 (Ops::activation_type, even widths): their slabs'
  // elements per float; else 1.
  int64_t act_div = 1;
  int slots = 1;
  Recompute recompute = Recompute::kNone;
  bool last = false;
  bool split = false;  // StageOptions::split_backward
  int cp = 1;          // StageOptions::cp's size: the ring's buffers
  int tp = 1;
  GptConfig::Moe moe;  // the model's experts (the MoE MLP's rows)
  // An attention head's channels, and whether its query and key heads are
  // normalised (GptConfig::qk_norm: the norms' rows).
  int64_t hs = 0;
  bool qk_norm = false;
  // Elements of `rows` × `width` in the stored type, as floats.
  int64_t Stored(int64_t rows, int64_t width) const;
  static StageActivationDims Of(const GptConfig& config, int max_B, int max_T,
                                int slots, int tp, bool sp, Recompute recompute,
                                int layers, bool last,
                                const kernels::ActivationFootprint* ops,
                                bool split, int cp);
};
// The backward's working set inside the activation buffer.
struct StageWorking {
  // dqkv and dfch_gelu: the block parts' two hidden buffers (BlockWork).
  float *scratch_a, *scratch_b, *proj, *dresidual, *dln, *dqkv, *datt,
      *dfch_gelu, *ce_stats;
  float* ring;  // cp > 1: ring attention's blocks in transit
};
// Where each block row lives in a slot (the same in every slot).
struct StageRows {
  struct Row {
    int part = 0;            // its part, in block order
    int64_t floats = 0;      // per layer; 0: not kept (a null row)
    bool one_layer = false;  // one layer shared by every slot
    bool split = false;      // one of its part's SplitRows
    // A split backward's row that takes the place of another, which B is
    // done with by the time it is written: that row (index in `rows`),
    // or the stream after its part's pair (kStream); else kOwn.
    int in_place_of = kOwn;
  };
  static constexpr int kOwn = -1, kStream = -2;
  std::vector<Row> rows;   // by part, each part's Rows then its SplitRows
  std::vector<int> first;  // by part: its first row's index in `rows`
  // By part: past its last row's index.
  int end(int q) const {
    return q + 1 < static_cast<int>(first.size())
               ? first[q + 1]
               : static_cast<int>(rows.size());
  }
};

// The one table of the activation slabs, in their order in the buffer:
// calls take(count) for each (saturating sizes) and keeps what it returns
// in `slots` (d.slots of them) and `w`; `rows` says where each block row
// of `parts` is. GptStage's take hands out its buffer; ActivationFloats'
// counts.
void LayOutActivations(const ModelParts& parts, const StageActivationDims& d,
                       const std::function<float*(int64_t)>& take,
                       std::vector<StageSlot>* slots, StageWorking* w,
                       StageRows* rows);
// The floats of every slab (INT64_MAX where that does not fit).
int64_t ActivationFloats(const ModelParts& parts, const StageActivationDims& d);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_ACTIVATION_TABLE_H_
