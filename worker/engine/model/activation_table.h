// The activation table of a GPT stage: what each microbatch keeps from
// forward to backward (StageSlot), the backward's working set
// (StageWorking), the sizes they are laid out by (StageActivationDims) and
// the one table that lays them out in one buffer (LayOutActivations), which
// the memory estimate counts (ActivationFloats).
#ifndef PTRAIN_WORKER_ENGINE_MODEL_ACTIVATION_TABLE_H_
#define PTRAIN_WORKER_ENGINE_MODEL_ACTIVATION_TABLE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "common/spec.h"
#include "kernels/ops.h"
#include "worker/engine/model/plan.h"

namespace ptrain {

// Activations a microbatch keeps from forward to backward. With full
// recomputation every per-layer slab but residual3 is one layer deep and
// shared by all slots, with selective recomputation att is (BlockActs
// gives layer b's pointers either way).
struct StageSlot {
  float* input;  // (B,Ts,C): embedding output or the received input
  // (L,B,Ts,C), fp32 or bf16 (Stored), as ln2, lnf, qkv, atty, fch
  float* ln1;
  float* ln1_mean;   // (L,B,Ts)
  float* ln1_rstd;   // (L,B,Ts)
  float* qkv;        // (L,B,T,3Cl)
  float* atty;       // (L,B,T,Cl)
  float* att;        // (L, attention_saved_floats)
  float* residual2;  // (L,B,Ts,C)
  float* ln2;        // (L,B,Ts,C)
  float* ln2_mean;   // (L,B,Ts)
  float* ln2_rstd;   // (L,B,Ts)
  float* fch;        // (L,B,T,4Cl); GELU's output is computed again
  float* gelu;       // (L, gelu_floats_): what the backend keeps of it
  float* residual3;  // (L,B,Ts,C)
  float* lnf;        // (B,Ts,C)
  float* lnf_mean;   // (B,Ts)
  float* lnf_rstd;   // (B,Ts)
  // (B,T,Vl); after a loss the probabilities, then dlogits; or dlogits
  // right away (fused: dloss below; then in the stored type, Logits()).
  float* logits;
  float* losses;  // (B,T)
  // split_backward: the output gradients of each layer's linear layers
  // from B to W (else null): of qkv (L,B,T,3Cl), of the attention's
  // projection (L,B,Ts,C), of fc (L,B,T,4Cl, stored type: fch's
  // gradient), of the MLP's projection (L,B,Ts,C). Without full
  // recomputation the last two are residual2 and residual3, the first
  // is qkv where that is fp32, and (without any recomputation) fc's is
  // att where that is as large (B is done with them).
  float *dqkv, *dattproj, *dfch, *dfcproj;
  // The microbatch's tokens and targets in the backend's memory (null on
  // the CPU, which reads the caller's).
  int32_t* tokens_staged = nullptr;
  int32_t* targets_staged = nullptr;
  int B = 0, T = 0;  // dims of its forward
  // The dloss the forward's fused classifier folded into logits (0: it
  // kept the probabilities).
  float dloss = 0.0f;
};

// The sizes a stage's activation slabs are laid out by (the backend's
// when `ops` is given, else the most any backend keeps).
struct StageActivationDims {
  int64_t C = 0, L = 0, Cl = 0, Vl = 0, BT = 0, BTs = 0;
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
  static StageActivationDims Of(const GptConfig& config, int max_B, int max_T,
                                int slots, int tp, bool sp, Recompute recompute,
                                int layers, bool last, const kernels::Ops* ops,
                                bool split, int cp);
};
// The backward's working set inside the activation buffer.
struct StageWorking {
  float *scratch_a, *scratch_b, *proj, *dresidual, *dln, *dqkv, *datt,
      *dfch_gelu, *ce_stats;
  float* ring;  // cp > 1: ring attention's blocks in transit
};
// The one table of the activation slabs, in their order in the buffer:
// calls take(count) for each (saturating sizes) and keeps what it returns
// in `slots` (d.slots of them) and `w`. GptStage's take hands out its
// buffer; ActivationFloats' counts.
void LayOutActivations(const StageActivationDims& d,
                       const std::function<float*(int64_t)>& take,
                       std::vector<StageSlot>* slots, StageWorking* w);
// The floats of every slab (INT64_MAX where that does not fit).
int64_t ActivationFloats(const StageActivationDims& d);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_ACTIVATION_TABLE_H_
