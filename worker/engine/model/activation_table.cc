#include "worker/engine/model/activation_table.h"

#include <climits>

namespace ptrain {

StageActivationDims StageActivationDims::Of(const GptConfig& config, int max_B,
                                            int max_T, int slots, int tp,
                                            bool sp, Recompute recompute,
                                            int layers, bool last,
                                            const kernels::Ops* ops, bool split,
                                            int cp) {
  StageActivationDims d;
  d.C = config.n_embd;
  d.L = layers;
  d.Cl = config.n_embd / tp;
  const int64_t NHl = config.n_head / tp;
  d.Vl = config.padded_vocab / tp;
  d.BT = SatMul(max_B, max_T);
  d.BTs = SatMul(max_B, sp ? max_T / tp : max_T);
  // What attention keeps: the backend says; with none, the (B,NH,T,T)
  // probabilities (the CPU's, and the most). Ring attention (cp > 1) keeps
  // each row's log-sum-exp and needs no scratch of the backend's (its
  // blocks in transit are the working set's `ring`).
  d.att = cp > 1 ? SatMul(SatMul(max_B, NHl), max_T)
          : ops != nullptr
              ? ops->attention_saved_floats(max_B, max_T, d.Cl, NHl)
              : SatMul(SatMul(SatMul(max_B, NHl), max_T), max_T);
  d.datt = cp > 1 ? 0
           : ops != nullptr
               ? ops->attention_scratch_floats(max_B, max_T, d.Cl, NHl)
               : d.att;
  // What the backend keeps of GELU(fch) (bf16: its rounded copy, half a
  // float a value; without a backend the most one keeps), not under full
  // recomputation, whose forward again stops before the MLP's projection.
  d.gelu = recompute == Recompute::kFull ? 0
           : ops != nullptr
               ? ops->gelu_saved_floats(d.BT, static_cast<int>(4 * d.Cl))
               : (SatMul(d.BT, 4 * d.Cl) + 1) / 2;
  // LayerNorm outputs, qkv, attention's output and fch in the backend's
  // activation type: bf16 (half a float each) where it keeps them so and
  // every width (C, Cl, 3Cl, 4Cl) is even.
  d.act_div = ops != nullptr &&
                      ops->activation_type() == kernels::DType::kBf16 &&
                      d.Cl % 2 == 0
                  ? 2
                  : 1;
  d.slots = slots;
  d.recompute = recompute;
  d.last = last;
  d.split = split;
  d.cp = cp;
  return d;
}

void LayOutActivations(const StageActivationDims& d,
                       const std::function<float*(int64_t)>& take,
                       std::vector<StageSlot>* slots, StageWorking* w) {
  const int64_t C = d.C, Cl = d.Cl, BT = d.BT, BTs = d.BTs;
  const bool full = d.recompute == Recompute::kFull;
  const bool selective = d.recompute == Recompute::kSelective;
  // The per-layer slabs a block's backward reads: every layer's in each
  // slot, or (recomputing) one layer's, shared by the slots.
  // A slab of a stored activation (a LayerNorm output, fch), in its type.
  auto stored = [&](int64_t layers, int64_t rows, int64_t width) {
    const int64_t n = SatMul(layers, SatMul(rows, width));
    return n == INT64_MAX ? n : n / d.act_div;
  };
  auto take_blocks = [&](StageSlot& slot, int64_t layers) {
    slot.ln1 = take(stored(layers, BTs, C));
    slot.ln1_mean = take(SatMul(layers, BTs));
    slot.ln1_rstd = take(SatMul(layers, BTs));
    slot.qkv = take(stored(layers, BT, 3 * Cl));
    slot.atty = take(stored(layers, BT, Cl));
    if (!selective) slot.att = take(SatMul(layers, d.att));
    slot.residual2 = take(SatMul(layers, SatMul(BTs, C)));
    slot.ln2 = take(stored(layers, BTs, C));
    slot.ln2_mean = take(SatMul(layers, BTs));
    slot.ln2_rstd = take(SatMul(layers, BTs));
    slot.fch = take(stored(layers, BT, 4 * Cl));
    slot.gelu = take(SatMul(layers, d.gelu));
  };
  StageSlot shared{};
  if (full) take_blocks(shared, 1);
  if (selective) shared.att = take(d.att);
  for (int s = 0; s < d.slots; ++s) {
    StageSlot slot = shared;
    slot.input = take(SatMul(BTs, C));
    if (!full) take_blocks(slot, d.L);
    // The block's output is kept even when the rest is recomputed.
    slot.residual3 = take(SatMul(d.L, SatMul(BTs, C)));
    if (d.last) {
      slot.lnf = take(stored(1, BTs, C));
      slot.lnf_mean = take(BTs);
      slot.lnf_rstd = take(BTs);
      slot.logits = take(SatMul(BT, d.Vl));
      slot.losses = take(BT);
    } else {
      slot.lnf = slot.lnf_mean = slot.lnf_rstd = slot.logits = slot.losses =
          nullptr;
    }
    // A split backward's output gradients stay from B to W: every layer's,
    // recomputing or not. Where the slot has each layer's own, they take
    // the place of what only B reads, once B is past it (W reads neither):
    // the residual stream's (B,Ts,C) slabs, qkv's where it is fp32, and
    // what attention keeps where that is as large as fch's gradient.
    if (d.split) {
      const bool reuse = !full;
      const bool in_att = reuse && !selective && d.att >= stored(1, BT, 4 * Cl);
      slot.dqkv = reuse && d.act_div == 1
                      ? slot.qkv
                      : take(SatMul(d.L, SatMul(BT, 3 * Cl)));
      slot.dattproj =
          reuse ? slot.residual2 : take(SatMul(d.L, SatMul(BTs, C)));
      slot.dfch = in_att ? slot.att : take(stored(d.L, BT, 4 * Cl));
      slot.dfcproj = reuse ? slot.residual3 : take(SatMul(d.L, SatMul(BTs, C)));
    } else {
      slot.dqkv = slot.dattproj = slot.dfch = slot.dfcproj = nullptr;
    }
    slots->push_back(slot);
  }
  // The backward's working set: two (B,T,C) scratch, proj, dresidual, dln;
  // dqkv and datty (first GELU's output, again, for the MLP projection's
  // backward); attention's scratch; one (B,T,4Cl) for the MLP's hidden layer
  // (GELU's output in forward; in backward its gradient, then fch's).
  w->scratch_a = take(SatMul(BT, C));
  w->scratch_b = take(SatMul(BT, C));
  w->proj = take(SatMul(BTs, C));
  w->dresidual = take(SatMul(BTs, C));
  w->dln = take(SatMul(BTs, C));
  w->dqkv = take(SatMul(BT, 4 * Cl));
  w->datt = take(d.datt);
  w->dfch_gelu = take(SatMul(BT, 4 * Cl));
  w->ce_stats = d.last ? take(SatMul(3, BT)) : nullptr;
  w->ring = d.cp > 1 ? take(SatMul(4, SatMul(BT, 2 * Cl))) : nullptr;
}

int64_t ActivationFloats(const StageActivationDims& d) {
  int64_t total = 0;
  std::vector<StageSlot> slots;
  StageWorking w;
  LayOutActivations(
      d,
      [&](int64_t count) -> float* {
        total = SatAdd(total, count);
        return nullptr;
      },
      &slots, &w);
  return total;
}

}  // namespace ptrain
