#include "worker/engine/model/activation_table.h"

#include <algorithm>
#include <climits>
#include <map>
#include <string>

#include "common/check.h"

namespace ptrain {

StageActivationDims StageActivationDims::Of(
    const GptConfig& config, int max_B, int max_T, int slots, int tp, bool sp,
    Recompute recompute, int layers, bool last,
    const kernels::ActivationFootprint* ops, bool split, int cp) {
  StageActivationDims d;
  d.C = config.n_embd;
  d.L = layers;
  d.Cl = config.attention_channels() / tp;
  const int64_t NHl = config.n_head / tp;
  d.Kl = int64_t{config.kv_heads_local(tp)} * config.head_size();
  d.Hl = config.hidden() / tp;
  d.hs = config.head_size();
  d.qk_norm = config.qk_norm;
  d.tp = tp;
  d.moe = config.moe;
  d.Vl = config.padded_vocab / tp;
  d.T = max_T;
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

int64_t StageActivationDims::Stored(int64_t rows, int64_t width) const {
  const int64_t n = SatMul(rows, width);
  return n == INT64_MAX ? n : n / act_div;
}

namespace {

// The block rows of `parts` for a stage of sizes `d`: each part's Rows,
// then its SplitRows (none kept without a split backward), with the place
// each split row takes where it can take one.
StageRows BlockRows(const ModelParts& parts, const StageActivationDims& d) {
  const bool full = d.recompute == Recompute::kFull;
  const bool selective = d.recompute == Recompute::kSelective;
  StageRows t;
  std::map<std::string, int> by_name;
  for (size_t q = 0; q < parts.block.size(); ++q) {
    const ModelPart& part = *parts.block[q];
    t.first.push_back(static_cast<int>(t.rows.size()));
    for (const ActivationRow& r : part.Rows(d)) {
      by_name[r.name] = static_cast<int>(t.rows.size());
      t.rows.push_back(
          {static_cast<int>(q), r.floats, full || (selective && r.selective)});
    }
    for (const SplitRow& r : part.SplitRows(d)) {
      StageRows::Row row{static_cast<int>(q), d.split ? r.floats : 0};
      row.split = true;
      if (d.split && !full && r.in_place_of == "stream") {
        if (SatMul(d.BTs, d.C) >= r.floats)
          row.in_place_of = StageRows::kStream;
      } else if (d.split && !full && by_name.count(r.in_place_of) > 0) {
        const StageRows::Row& other = t.rows[by_name[r.in_place_of]];
        if (!other.one_layer && other.floats >= r.floats) {
          row.in_place_of = by_name[r.in_place_of];
        }
      }
      t.rows.push_back(row);
    }
    PT_CHECK(static_cast<int>(t.rows.size()) - t.first.back() <= kMaxPartRows,
             "a block part with more than kMaxPartRows rows");
  }
  return t;
}

}  // namespace

void LayOutActivations(const ModelParts& parts, const StageActivationDims& d,
                       const std::function<float*(int64_t)>& take,
                       std::vector<StageSlot>* slots, StageWorking* w,
                       StageRows* rows) {
  const int64_t C = d.C, BT = d.BT, BTs = d.BTs;
  const bool full = d.recompute == Recompute::kFull;
  const StageRows t = BlockRows(parts, d);
  const int pairs = static_cast<int>(parts.pairs.size());
  const int n = static_cast<int>(t.rows.size());
  const int n_parts = static_cast<int>(parts.block.size());
  // The block rows, part by part, with the residual stream after each
  // pair but the last between one pair and the next: either those one
  // layer deep, shared by the slots, or every layer's of one slot.
  auto take_blocks = [&](StageSlot& slot, bool one_layer) {
    const int64_t layers = one_layer ? 1 : d.L;
    for (int q = 0; q < n_parts; ++q) {
      for (int i = t.first[q]; i < t.end(q); ++i) {
        if (t.rows[i].split || t.rows[i].one_layer != one_layer) continue;
        slot.rows[i] = take(SatMul(layers, t.rows[i].floats));
      }
      const int pair = q / 2;
      if (q % 2 == 1 && pair + 1 < pairs && full == one_layer) {
        slot.stream[pair] = take(SatMul(layers, SatMul(BTs, C)));
      }
    }
  };
  StageSlot shared{};
  shared.rows.assign(n, nullptr);
  shared.stream.assign(pairs - 1, nullptr);
  take_blocks(shared, /*one_layer=*/true);
  for (int s = 0; s < d.slots; ++s) {
    StageSlot slot = shared;
    slot.input = take(SatMul(BTs, C));
    take_blocks(slot, /*one_layer=*/false);
    // The block's output is kept even when the rest is recomputed.
    slot.residual3 = take(SatMul(d.L, SatMul(BTs, C)));
    if (d.last) {
      for (const ActivationRow& r : parts.final_norm->Rows(d)) {
        slot.final_rows.push_back(take(r.floats));
      }
      slot.logits = take(SatMul(BT, d.Vl));
      slot.losses = take(BT);
    } else {
      slot.logits = slot.losses = nullptr;
    }
    // A split backward's output gradients stay from B to W: every layer's,
    // recomputing or not, in their own slabs or in the place of rows B is
    // done with (W reads neither).
    for (int q = 0; q < n_parts; ++q) {
      for (int i = t.first[q]; i < t.end(q); ++i) {
        const StageRows::Row& r = t.rows[i];
        if (!r.split) continue;
        const int pair = q / 2;
        if (r.floats == 0) {
          slot.rows[i] = nullptr;
        } else if (r.in_place_of == StageRows::kStream) {
          slot.rows[i] = pair + 1 < pairs ? slot.stream[pair] : slot.residual3;
        } else if (r.in_place_of >= 0) {
          slot.rows[i] = slot.rows[r.in_place_of];
        } else {
          slot.rows[i] = take(SatMul(d.L, r.floats));
        }
      }
    }
    slots->push_back(slot);
  }
  // The backward's working set: two (B,T,C) scratch, proj, dresidual, dln;
  // the two hidden buffers, as large as the block part that needs the most
  // (HiddenFloats); attention's scratch between them.
  int64_t hidden = 0;
  for (const auto& part : parts.block) {
    hidden = std::max(hidden, part->HiddenFloats(d));
  }
  w->scratch_a = take(SatMul(BT, C));
  w->scratch_b = take(SatMul(BT, C));
  w->proj = take(SatMul(BTs, C));
  w->dresidual = take(SatMul(BTs, C));
  w->dln = take(SatMul(BTs, C));
  w->dqkv = take(hidden);
  w->datt = take(d.datt);
  w->dfch_gelu = take(hidden);
  w->ce_stats = d.last ? take(SatMul(3, BT)) : nullptr;
  w->ring = d.cp > 1 ? take(SatMul(4, SatMul(BT, 2 * d.Kl))) : nullptr;
  if (rows != nullptr) *rows = t;
}

int64_t ActivationFloats(const ModelParts& parts,
                         const StageActivationDims& d) {
  int64_t total = 0;
  std::vector<StageSlot> slots;
  StageWorking w;
  LayOutActivations(
      parts, d,
      [&](int64_t count) -> float* {
        total = SatAdd(total, count);
        return nullptr;
      },
      &slots, &w, nullptr);
  return total;
}

}  // namespace ptrain
