// GptStage: GPT-2 (pre-LayerNorm blocks, tied LM head) as one pipeline stage
// on one rank — a contiguous range of blocks, with the token and position
// embedding on the first stage and the final LayerNorm, the head and the
// loss on the last — tensor-parallel over its group (layers.h). The plan
// (plan.h) says which parameters it holds; a UnitStore says where their
// weights and gradients are while a pass uses them. Activations are kept
// per in-flight microbatch (a slot) from its forward to its backward.
// Not thread-safe.
#ifndef PTRAIN_WORKER_ENGINE_MODEL_GPT_STAGE_H_
#define PTRAIN_WORKER_ENGINE_MODEL_GPT_STAGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/spec.h"
#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/attention_core.h"
#include "worker/engine/model/block_stack.h"
#include "worker/engine/model/layers.h"
#include "worker/engine/model/pass_recorder.h"
#include "worker/engine/model/plan.h"
#include "worker/engine/model/unit_store.h"

namespace ptrain {

// Recompute (train.recompute) comes with the spec (common/spec.h).

struct MemoryBytes {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0;
};

struct StageOptions {
  int max_B = 1, max_T = 1;  // the largest microbatch
  int slots = 1;             // microbatches in flight at once
  TpGroup tp;                // tensor-parallel group (none: tp = 1)
  int stage = 0, n_stages = 1;
  // Weights and gradients, laid out by `layout` (not owned; outlives the
  // stage). Null: the stage owns flat buffers of its own.
  UnitStore* store = nullptr;
  int pad = 1;  // the layout's unit padding (PlanOptions::pad)
  // The backend that runs the stage and holds its buffers (not owned;
  // outlives the stage). Null: the CPU. A store's buffers must live in the
  // same backend's memory.
  kernels::Ops* ops = nullptr;
  // kFull: keep only each block's input (its predecessor's output) per
  // microbatch and recompute the rest of the block just before its
  // backward, in one block's worth of activations shared by every slot.
  // kSelective: keep all but what attention keeps for its backward, and run
  // the attention forward again just before the attention backward, into
  // one layer's worth shared by every slot.
  Recompute recompute = Recompute::kNone;
  // Context parallelism: the group splitting every sequence (zigzag); the
  // stage's T (max_T, and each microbatch's) are then the T/cp positions
  // this rank holds, attention is ring attention over the group, and the
  // loss a mean over those positions. The ring's block attention is fp32:
  // bf16-stored qkv and output are widened and rounded around it. Decode is
  // not split: it computes every position on every cp rank, its cache as
  // long as the whole sequence.
  CpGroup cp;
  Communicator* ep = nullptr;  // ep > 1: the MoE layers' all-to-all group
  // The backward runs as two passes (BackwardInput, then BackwardWeights):
  // each slot also keeps, per layer, the output gradients of the block's
  // four linear layers from the one to the other.
  bool split_backward = false;
  // Training's passes recorded once per shape and replayed as one unit
  // each (Ops::Capture; on a GPU a CUDA graph, one launch for the hundreds
  // of a pass): a microbatch's forward with targets and its backward, from
  // their second run at a (slot, B, T, dloss, receive buffer) on; a stage
  // before the last records every forward. Only for a stage without tp or
  // cp whose store communicates nothing inside a pass (ZeRO 0, dp 1:
  // common/spec.h CudaGraphsUnsupported), without split_backward. Where a
  // capture fails the pass runs op by op, with a warning (graph_counts()).
  bool graphs = false;
};

class GptStage : private UnitStore {
 public:
  // `config` has padded_vocab set; `layout` is BuildPlan's for this rank.
  // An inconsistent config is a programming error (the spec was
  // validated): PT_CHECK fails.
  GptStage(const GptConfig& config, std::vector<ParamInfo> layout,
           const StageOptions& options);
  GptStage(const GptStage&) = delete;
  GptStage& operator=(const GptStage&) = delete;
  ~GptStage() override;

  const GptConfig& config() const { return config_; }
  const std::vector<ParamInfo>& layout() const { return layout_; }
  const std::vector<UnitRange>& units() const { return units_; }
  bool first() const { return stage_ == 0; }
  int slots() const { return static_cast<int>(slots_.size()); }
  bool last() const { return stage_ == n_stages_ - 1; }
  int64_t buffer_size() const { return buffer_size_; }  // padded elements
  // The stage's own buffers (no external store), else null; in the
  // backend's memory.
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  kernels::Ops& ops() const { return *ops_; }

  // Fills the stage's own parameters with InitialValue(seed).
  void InitParams(uint64_t seed);
  void ZeroGrad();

  // (Tokens and targets are in host memory, floats in the backend's.) One
  // microbatch's forward into `slot`. First stage: `tokens` (B,T). Other
  // stages: `hidden` (B,Ts,C), the previous stage's output. Last stage with
  // `targets`: returns the mean loss over the B·T positions and keeps what
  // backward needs; without targets returns 0 and leaves logits() valid.
  // Other stages: output() holds (B,Ts,C) for the next stage.
  // `dloss` non-zero (training, last stage with targets): the loss's
  // gradient of the logits is computed with the loss (the fused
  // classifier), for the Backward with that dloss; 0 keeps the
  // probabilities, and Backward computes the gradient from them.
  float Forward(int slot, const int32_t* tokens, const float* hidden,
                const int32_t* targets, int B, int T, float dloss = 0.0f);
  PartStats& part_stats() const { return blocks_.stats(); }  // parts' counts
  // Backward of the microbatch in `slot` (its Forward had targets on the
  // last stage). Last stage: `dloss` is 1/(tokens of the whole optimizer
  // step), the Forward's when it had one; other stages: `dout` (B,Ts,C)
  // from the next stage. Accumulates parameter gradients; non-first stages
  // leave dinput() for the previous.
  void Backward(int slot, const int32_t* tokens, const int32_t* targets,
                float dloss, const float* dout);
  // The same backward in two passes (split_backward stages only): the
  // input-gradient pass B (arguments and dinput() as Backward's; the norm
  // and embedding gradients too), which keeps the linear layers' output
  // gradients in the slot, and later the weight pass W, which accumulates
  // the linear layers' weight gradients from them (the slot is not reused
  // in between): together what Backward does, bit for bit.
  void BackwardInput(int slot, const int32_t* tokens, const int32_t* targets,
                     float dloss, const float* dout);
  void BackwardWeights(int slot);

  // Generation with a cache of keys and values (one sequence, B = 1): the
  // forward of the n tokens at positions [pos, pos + n), attending to the
  // positions before them that earlier Decode calls cached (a Decode at pos
  // 0 starts a new sequence). First stage: `tokens` (n); others: `hidden`
  // (n,C), the previous stage's output(0). Afterwards output(0) holds (n,C)
  // for the next stage, or logits(0) the (n,Vl) logits. Uses slot 0 and a
  // cache of 2·L·max_T·cp·Cl floats, allocated at the first call (not in
  // memory()). Every rank of the tp group (with or without sequence
  // parallelism) and of the cp group (no ring) computes every position.
  void Decode(const int32_t* tokens, const float* hidden, int n, int pos);
  // The most positions one Decode takes (the slot's buffers' size).
  int decode_max() const { return max_B_ * tp_.SeqLocal(max_T_); }
  // The longest context Decode caches: the whole sequence.
  int CacheT() const { return max_T_ * cp_.size(); }

  const float* output(int slot) const;  // (B,Ts,C), non-last stages
  const float* dinput() const { return work_.dresidual; }  // (B,Ts,C)
  // (B,T,Vl): this rank's vocabulary columns of the last Forward without
  // targets (columns at or past V are padding).
  const float* logits(int slot) const { return slots_[slot].logits; }
  int vocab_begin() const { return vocab_begin_; }
  int vocab_local() const { return Vl_; }

  // StageOptions::graphs: passes recorded (captures), passes run as a
  // replay (the recording one included), and captures that failed (their
  // passes then run op by op).
  using GraphCounts = PassRecorder::Counts;
  GraphCounts graph_counts() const { return recorder_.counts(); }

  // Bytes of the stage's own buffers: params and grads when it owns them,
  // activations (every slot plus the backward working set).
  MemoryBytes memory() const;

  // The floats of activations a stage with these settings allocates (every
  // slot and the working set), without building one; INT64_MAX when that
  // does not fit in 64 bits. Attention keeps what `ops` says it keeps; with
  // no ops, the (B,NH,T,T) probabilities (the CPU's, and the most).
  // `layers`: the stage's transformer blocks; `last`: it computes the head.
  static int64_t ActivationFloats(const GptConfig& config, int max_B, int max_T,
                                  int slots, int tp, bool sp,
                                  Recompute recompute, int layers, bool last,
                                  const kernels::Ops* ops = nullptr,
                                  bool split_backward = false, int cp = 1);

 private:
  // A microbatch's activations and the backward's working set
  // (activation_table.h).
  using Slot = StageSlot;
  using Working = StageWorking;
  using ActivationDims = StageActivationDims;

  // Local block b's activations inside a slot's slabs: each part's rows
  // and the residual stream (BlockStack::Rows).
  BlockStack::Rows Acts(const Slot& S, int b) const;
  // Local block b's output (B,Ts,C) in the slot: the next one's input.
  float* BlockOutput(const Slot& S, int b) const;
  // Block row i (StageRows) of local block b in the slot; null where
  // nothing is kept.
  float* RowAt(const Slot& S, int i, int b) const;
  // The residual stream after pair `pair` of local block b.
  float* StreamAt(const Slot& S, int pair, int b) const;
  // What every part of a pass over B×T on group g shares.
  PartPass::Shared Pass(int B, int T, const TpGroup& g) const;
  // The last stage's backward from the loss to the residual stream's
  // gradient (work_.dresidual): the logits' gradient (unless the forward
  // fused it), the head, the final norm. `pass.split`: B's part (no weight
  // gradient of the head; no E(F)).
  void HeadBackward(const Slot& S, const int32_t* targets, float dloss,
                    const PartPass::Shared& pass);
  // Backward, or with `split` BackwardInput.
  void BackwardPass(int slot, const int32_t* tokens, const int32_t* targets,
                    float dloss, const float* dout, bool split);
  // Forward of `slot`; pos >= 0: a Decode at that position. dloss as
  // Forward's. The loss stays in the slot (SlotLoss).
  void ForwardPass(int slot, const int32_t* tokens, const float* hidden,
                   const int32_t* targets, int B, int T, int pos, float dloss);
  // The mean of the slot's losses (its last Forward with targets).
  float SlotLoss(const Slot& S) const;
  // What a forward tells the slot for its backward.
  void BeginSlot(Slot& S, int B, int T, bool targets, float dloss) const;

  // Runs `pass` (whose tokens are already staged) as the replay of its
  // recording (PassRecorder), the weights' copy as the matmuls read it made
  // first, outside the recording: a replay would not make it again.
  void RunRecorded(const PassRecorder::Key& key,
                   const std::function<void()>& pass) {
    store_->Settle();
    recorder_.Run(key, *ops_, pass);
  }
  const float* Params(int u) override {
    return params_.data() + units_[u].begin;
  }
  float* Grads(int u) override { return grads_.data() + units_[u].begin; }
  // Host tokens of `slot` as the backend reads them.
  const int32_t* Stage(int32_t* staged, const int32_t* host, int B, int T);
  // Finds the stage's tensors in its layout: the units and offsets of the
  // embedding, ln_f and the head's wte.
  void FindTensors();

  const GptConfig config_;
  std::vector<ParamInfo> layout_;
  std::vector<UnitRange> units_;
  // The blocks of the stage's layout (transformer layers first_layer_ ...
  // first_layer_ + n_blocks_ - 1).
  static int BlockCount(const std::vector<ParamInfo>& layout);
  static int FirstLayer(const std::vector<ParamInfo>& layout);

  const int stage_, n_stages_, n_blocks_, first_layer_;
  const int max_B_, max_T_;
  const TpGroup tp_;
  const Recompute recompute_;
  const bool split_;  // StageOptions::split_backward
  const CpGroup cp_;
  Communicator* const ep_;
  const bool graphs_;  // StageOptions::graphs
  PassRecorder recorder_;
  const int Cl_, NHl_, Vl_, vocab_begin_;
  int64_t buffer_size_ = 0;
  // Where each block row is in a slot (activation_table.h).
  StageRows rows_;
  // The stored activations' (norm outputs, qkv, atty, fch) elements per
  // float of the slabs (ActivationDims::act_div): 2 where they are bf16.
  int64_t act_div_ = 1;
  kernels::Act Stored(float* p) const {
    return kernels::Act(
        p, act_div_ == 2 ? kernels::DType::kBf16 : kernels::DType::kF32);
  }
  // A slot's logits: in the stored type where its forward fuses the
  // classifier over the whole vocabulary (loss and gradient from the stored
  // values, the gradient, which only the head's matmul backward reads,
  // written over them), else fp32 (probabilities, sampling, a vocabulary
  // split over tp).
  kernels::Act Logits(const Slot& S) const {
    return S.dloss != 0.0f && tp_.size() == 1 ? Stored(S.logits)
                                              : kernels::Act(S.logits);
  }
  UnitStore* store_;
  kernels::Ops* ops_;
  kernels::Buffer params_, grads_;
  // The tensors of each part before the blocks (the embeddings), which the
  // stage brackets with the embedding unit's Begin and End.
  std::vector<std::vector<PartPass::Place>> embed_places_;
  // Units: the embedding's, the final; the head's wte's (emb_unit_ where
  // the stage embeds, else the final). The head's and final norm's places.
  int emb_unit_ = -1, final_unit_ = -1, head_unit_ = -1;
  std::vector<PartPass::Place> head_places_, final_places_;
  // The blocks, part by part.
  BlockStack blocks_;

  kernels::Buffer acts_, kv_;  // kv_: generation's key/value cache
  int64_t acts_used_ = 0;
  std::vector<Slot> slots_;
  // Backward working set, shared by every slot and layer (the blocks'
  // BlockWork and the head's).
  BlockWork work_;
  float* ce_stats_;  // (3,B,T)
  // Training's attention of every block over the whole sequence (ring
  // attention under cp), with the ring's buffers.
  AttentionCore attention_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_GPT_STAGE_H_
