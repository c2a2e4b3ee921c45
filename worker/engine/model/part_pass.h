// PartPass: what a block part (model_parts.h) runs one pass of one block with —
// its tensors where the UnitStore holds them, its rows of the activation
// table, the tensor-parallel group, the backend and the working set every
// block pass shares. BlockStack (block_stack.h) makes one per part and
// pass; a part begins and ends the units of the tensors it reads through
// it, and the pass decides which of those calls reach the store (a unit
// shared by two parts is begun by the first to use it and ended by the
// last).
#ifndef PTRAIN_WORKER_ENGINE_MODEL_PART_PASS_H_
#define PTRAIN_WORKER_ENGINE_MODEL_PART_PASS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "kernels/ops.h"
#include "worker/engine/model/attention_core.h"
#include "worker/engine/model/layers.h"
#include "worker/engine/model/plan.h"
#include "worker/engine/model/unit_store.h"

namespace ptrain {

// What the block parts count over the passes since the reader last cleared
// it: their own losses' values (PartPass::AddLoss) and each MoE layer's
// expert load (PartPass::AddLoad), by global layer.
struct PartStats {
  double losses = 0;
  std::map<int, std::vector<double>> tokens;  // kept per expert
  std::map<int, double> dropped;              // choices dropped
  void Clear() { *this = PartStats(); }
};

// The working set every block pass shares (activation_table.h's
// StageWorking), sized for the stage's largest microbatch.
struct BlockWork {
  LayerContext scratch;        // two (B,T,C) scratch buffers and the backend
  float* proj = nullptr;       // (B,Ts,C): a sublayer's output
  float* dresidual = nullptr;  // (B,Ts,C): the residual stream's gradient
  float* dln = nullptr;        // (B,Ts,C): a sublayer's input gradient
  // Two (B,T,4Cl) buffers free between the parts' calls.
  float* hidden_a = nullptr;
  float* hidden_b = nullptr;
  float* datt = nullptr;  // attention's backward scratch
  int64_t max_BT = 0;     // the largest microbatch's B·T
  // Training's attention (ring attention under cp), over the buffers above.
  AttentionCore* attention = nullptr;
};

class PartPass {
 public:
  enum class Kind { kForward, kBackward, kWeights };
  // What every part of one block's pass shares.
  struct Shared {
    Kind kind = Kind::kForward;
    UnitStore* store = nullptr;
    kernels::Ops* ops = nullptr;
    const GptConfig* config = nullptr;
    TpGroup tp;
    // The group splitting the sequence (none in generation).
    CpGroup cp;
    // The group the MoE layers' experts are split over (null: ep = 1).
    Communicator* ep = nullptr;
    const BlockWork* work = nullptr;
    int64_t act_div = 1;  // stored elements per float (2: bf16 rows)
    int B = 0, T = 0;     // the microbatch (T: whole positions on this rank)
    // The backward's gradient of the loss per token (what a part adds a
    // loss of its own with, as the head's cross-entropy is added).
    float dloss = 0.0f;
    // What the parts count (BlockStack's), and the block's layer.
    PartStats* stats = nullptr;
    int layer = -1;
    int C = 0, Cl = 0, NHl = 0;
    // A split backward's input-gradient pass (B): the linear layers'
    // weight gradients wait for W, their output gradients stay in the
    // part's rows, and no unit ends.
    bool split = false;
    // Selective recomputation: a part runs again before its backward what
    // it does not keep across passes (attention: what it keeps for its
    // backward, in one layer's slab shared by every slot).
    bool selective = false;
    // A Decode step at position `pos` (else -1): this block's cache of
    // keys then values, (KVHl,cache_T,hs) each (AttentionCore::Kl).
    int pos = -1;
    float* cache = nullptr;
    int cache_T = 0;
    // Run once the block's backward is done (PartPass::AfterBlock).
    std::vector<std::function<void()>>* after_block = nullptr;
  };
  // A tensor of the part: its unit in the store and its offset there.
  struct Place {
    int unit = 0;
    int64_t offset = 0;
    // Whether this part's Begin / End of the unit reach the store in this
    // pass.
    bool begins = false, ends = false;
  };

  PartPass(const Shared& shared, const Place* places, float* const* rows,
           const bool* deferred, bool recomputing)
      : s_(shared),
        places_(places),
        rows_(rows),
        deferred_(deferred),
        recomputing_(recomputing) {}

  kernels::Ops& ops() const { return *s_.ops; }
  const GptConfig& config() const { return *s_.config; }
  const TpGroup& tp() const { return s_.tp; }
  const CpGroup& cp() const { return s_.cp; }
  Communicator* ep() const { return s_.ep; }
  const BlockWork& work() const { return *s_.work; }
  const LayerContext& scratch() const { return s_.work->scratch; }
  int B() const { return s_.B; }
  int T() const { return s_.T; }
  int Ts() const { return s_.tp.SeqLocal(s_.T); }
  int C() const { return s_.C; }
  int Cl() const { return s_.Cl; }
  int NHl() const { return s_.NHl; }
  int64_t act_div() const { return s_.act_div; }
  float dloss() const { return s_.dloss; }
  // A loss of the part's own: its value, a microbatch's mean as the head's
  // cross-entropy is.
  void AddLoss(double v) const {
    if (s_.stats != nullptr) s_.stats->losses += v;
  }
  // An MoE layer's routing: `offsets` (E+1, host) of the tokens kept per
  // expert, and the choices dropped.
  void AddLoad(const int32_t* offsets, int E, int64_t dropped) const;
  int layer() const { return s_.layer; }
  bool split() const { return s_.split; }
  bool selective() const { return s_.selective; }
  bool decoding() const { return s_.pos >= 0; }
  int pos() const { return s_.pos; }
  float* cache() const { return s_.cache; }
  int cache_T() const { return s_.cache_T; }
  // The forward again before the block's backward (full recomputation) of
  // the block's last sublayer: only what its backward reads, no output.
  bool recomputing() const { return recomputing_; }

  // Row i of the part's activations (its Rows order) for this block.
  float* Row(int i) const { return rows_[i]; }
  // The same pass over other rows (a part running another's passes over
  // rows of its own order: InterleavedMlpPart).
  PartPass WithRows(float* const* rows, const bool* deferred) const {
    return PartPass(s_, places_, rows, deferred, recomputing_);
  }
  // Row i shares memory with a row that a part later in the backward still
  // reads: write it with AfterBlock.
  bool Deferred(int i) const { return deferred_[i]; }
  kernels::Act Stored(float* p) const {
    return kernels::Act(
        p, s_.act_div == 2 ? kernels::DType::kBf16 : kernels::DType::kF32);
  }

  // Tensor i of the part (its Tensors order), in its unit's buffers: valid
  // between Begin(i) and End(i).
  const float* Param(int i) const {
    return s_.store->Params(places_[i].unit) + places_[i].offset;
  }
  kernels::ConstAct Weight(int i) const {
    return s_.store->Weights(places_[i].unit).Offset(places_[i].offset);
  }
  float* Grad(int i) const {
    return s_.store->Grads(places_[i].unit) + places_[i].offset;
  }
  // A linear layer's weight gradient: null in a split backward's B (W
  // accumulates it).
  float* WeightGrad(int i) const { return s_.split ? nullptr : Grad(i); }
  void Begin(int i) const;
  void End(int i) const;
  void Poll() const { s_.store->Poll(); }
  void AfterBlock(std::function<void()> f) const {
    s_.after_block->push_back(std::move(f));
  }

 private:
  const Shared& s_;
  const Place* places_;
  float* const* rows_;
  const bool* deferred_;
  const bool recomputing_;
};

inline void PartPass::AddLoad(const int32_t* offsets, int E,
                              int64_t dropped) const {
  if (s_.stats == nullptr) return;
  std::vector<double>& tokens = s_.stats->tokens[s_.layer];
  tokens.resize(E);
  for (int e = 0; e < E; ++e) tokens[e] += offsets[e + 1] - offsets[e];
  s_.stats->dropped[s_.layer] += static_cast<double>(dropped);
}

inline void PartPass::Begin(int i) const {
  if (!places_[i].begins) return;
  if (s_.kind == Kind::kForward) {
    s_.store->BeginForward(places_[i].unit);
  } else {
    s_.store->BeginBackward(places_[i].unit);
  }
}

inline void PartPass::End(int i) const {
  if (!places_[i].ends) return;
  if (s_.kind == Kind::kForward) {
    s_.store->EndForward(places_[i].unit);
  } else {
    s_.store->EndBackward(places_[i].unit);
  }
}

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_PART_PASS_H_
