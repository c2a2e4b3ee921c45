// Grouped-query attention with rotary positions (Llama's): n_head query
// heads share n_kv_head key and value heads (n_kv_head = n_head: multi-head
// attention; 1: multi-query). No biases. The projections q_proj (split by
// heads over tp), k_proj and v_proj (split by heads where tp divides
// n_kv_head, else held whole by every rank, each computing with the one
// head its query heads read: TpSplit::kKvHeads) in the block's first unit,
// o_proj (split by rows) in its second.
// The forward projects q, k and v into three planes of the working set and
// lays them out as the attention's grouped rows (kernels/ops.h
// attention_forward: query heads, then the key and value heads once each),
// turns the rows' query and key heads by their positions in one pass
// (RoPE; under cp the rank's zigzag positions, in generation from the
// cache's end), and runs the attention (AttentionCore, the backend's
// cached decode). The backward turns the rows' gradient back and splits it
// into the planes.
// With model.head_dim the heads are head_dim wide whatever n_embd is (Cl
// is then this rank's n_head·head_dim/tp). With model.qk_norm (Qwen3's)
// each query and key head is RMS-normalised over its channels (q_norm and
// k_norm, one weight of head_dim each shared by the heads, in the first
// unit; each tp rank's gradient of them a part, summed over tp) before it
// is turned.
// Rows: qkv (B,T,Cl+2Kl) and the attention's output (B,T,Cl), in the
// stored type; what attention keeps; with qk_norm the query and key planes
// before their norms (B,T,Cl+Kl) and the norms' rstd, per head (fp32);
// under a split backward, the planes' gradients (fp32) and the output
// projection's (B,Ts,C).
#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

// The projections, then with qk_norm the norms; o_proj last (Out).
enum Tensor { kQ, kK, kV, kQNorm, kKNorm };
int Out(const GptConfig& c) { return c.qk_norm ? 5 : 3; }
enum Row { kQkv, kAtty, kAtt, kRaw, kRstd, kDplanes, kDproj };

// This rank's heads: NHl query heads, KVl key/value heads, hs channels
// each; its key/value rows start at element kv_at of its k_proj and v_proj
// (0 where they are split by heads and it holds its own only; else, in the
// whole tensor every rank holds, its head's first row).
struct Heads {
  int NHl, KVl, hs;
  int64_t kv_at;
  int Cl() const { return NHl * hs; }
  int Kl() const { return KVl * hs; }
  int64_t Row() const { return Cl() + 2 * Kl(); }
};

Heads HeadsOf(const PartPass& p) {
  const GptConfig& c = p.config();
  const int tp = p.tp().size(), r = p.tp().rank();
  const int KVH = c.kv_heads(), NHl = c.n_head / tp;
  const int hs = c.head_size(), KVl = c.kv_heads_local(tp);
  if (KVH % tp == 0) return {NHl, KVl, hs, 0};
  const int64_t head = r * NHl / (c.n_head / KVH);
  return {NHl, KVl, hs, head * hs * c.n_embd};
}

class GroupedQueryAttention : public SublayerPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    const int64_t C = c.n_embd, A = c.attention_channels(),
                  K = int64_t{c.kv_heads()} * c.head_size();
    using Init = ParamInfo::Init;
    std::vector<PartTensor> out = {
        {"attn.q_proj.weight",
         {A, C},
         Init::kNormal,
         false,
         0,
         TpSplit::kColumn,
         false},
        {"attn.k_proj.weight",
         {K, C},
         Init::kNormal,
         false,
         0,
         TpSplit::kKvHeads,
         false},
        {"attn.v_proj.weight",
         {K, C},
         Init::kNormal,
         false,
         0,
         TpSplit::kKvHeads,
         false},
    };
    if (c.qk_norm) {
      for (const char* name : {"attn.q_norm.weight", "attn.k_norm.weight"}) {
        out.push_back({name,
                       {c.head_size()},
                       Init::kOnes,
                       false,
                       0,
                       TpSplit::kReplicated,
                       false,
                       -1,
                       /*tp_partial=*/true});
      }
    }
    out.push_back({"attn.o_proj.weight",
                   {C, A},
                   Init::kNormal,
                   true,
                   1,
                   TpSplit::kRow,
                   false});
    return out;
  }
  // Scores and mix as multi-head attention's: every query head attends
  // (the norms' weights are no matmul's).
  double FlopsPerToken(const GptConfig& c, int T) const override {
    return ModelPart::FlopsPerToken(c, T) + AttentionScoreFlops(c, T) -
           (c.qk_norm ? 6.0 * 2 * c.head_size() : 0.0);
  }

  std::vector<ActivationRow> Rows(const StageActivationDims& d) const override {
    std::vector<ActivationRow> rows = AttentionRows(d);
    const int64_t heads = d.hs > 0 ? (d.Cl + d.Kl) / d.hs : 0;
    rows.push_back({"attn.qk_raw", d.qk_norm ? SatMul(d.BT, d.Cl + d.Kl) : 0});
    rows.push_back({"attn.qk_rstd", d.qk_norm ? SatMul(d.BT, heads) : 0});
    return rows;
  }
  std::vector<SplitRow> SplitRows(const StageActivationDims& d) const override {
    return {{SatMul(d.BT, d.Cl + 2 * d.Kl), "attn.qkv"},
            {SatMul(d.BTs, d.C), "stream"}};
  }
  // hidden_a: the planes (forward); the rows' gradient and the output's
  // (within (B,T,4Cl)), then the key's and value's parts of the input
  // gradient, (B,T,C) before the group's reduction (backward).
  // hidden_b: qkv in fp32 before it is stored in bf16 (forward); the
  // planes' gradients (backward).
  int64_t HiddenFloats(const StageActivationDims& d) const override {
    return std::max(SatMul(d.BT, 4 * d.Cl), SatMul(d.BT, d.C));
  }

  void Forward(const PartPass& p, kernels::ConstAct in,
               float* out) const override {
    const int B = p.B(), T = p.T(), C = p.C();
    const Heads h = HeadsOf(p);
    const int Cl = h.Cl(), Kl = h.Kl();
    const int64_t BT = int64_t{B} * T;
    kernels::Ops& ops = p.ops();
    float* q = p.work().hidden_a;
    float* k = q + BT * Cl;
    float* v = k + BT * Kl;
    p.Begin(kQ);
    column_linears_forward({{q, p.Weight(kQ), nullptr, Cl},
                            {k, p.Weight(kK).Offset(h.kv_at), nullptr, Kl},
                            {v, p.Weight(kV).Offset(h.kv_at), nullptr, Kl}},
                           in, B, T, C, p.tp(), p.scratch());
    NormsForward(p, h, q, BT);
    p.End(kQ);
    // The grouped rows, their query and key heads turned in one pass.
    const int64_t R = h.Row();
    float* qkv = p.Row(kQkv);
    float* full = p.act_div() == 1 ? qkv : p.work().hidden_b;
    ops.CopyRows(full, R, q, Cl, BT, Cl, false);
    ops.CopyRows(full + Cl, R, k, Kl, BT, Kl, false);
    ops.CopyRows(full + Cl + Kl, R, v, Kl, BT, Kl, false);
    rope_forward(full, R, h.NHl + h.KVl, h.hs, B, T, p.decoding() ? p.pos() : 0,
                 p.config().rope, false, p.cp(), ops);
    if (full != qkv) ops.Convert(p.Stored(qkv), full, BT, R);
    float* atty = p.Row(kAtty);
    if (p.decoding()) {
      const int64_t cache = int64_t{p.cache_T()} * Kl;
      ops.attention_decode(p.Stored(atty), p.cache(), p.cache() + cache,
                           p.Stored(qkv), T, p.pos(), Cl, h.NHl, h.KVl,
                           p.cache_T());
    } else {
      p.work().attention->Forward(atty, p.Row(kAtt), qkv, B, T);
    }
    const int o = Out(p.config());
    p.Begin(o);
    row_linear_forward(out, p.Stored(atty), p.Weight(o), nullptr, B, T, Cl, C,
                       p.tp(), p.scratch());
    p.End(o);
  }

  void Backward(const PartPass& p, float* din, const float* dout,
                kernels::ConstAct in) const override {
    const int B = p.B(), T = p.T(), C = p.C();
    const Heads h = HeadsOf(p);
    const int Cl = h.Cl(), Kl = h.Kl();
    const int64_t BT = int64_t{B} * T;
    const BlockWork& w = p.work();
    kernels::Ops& ops = p.ops();
    float* qkv = p.Row(kQkv);
    float* atty = p.Row(kAtty);
    float* att = p.Row(kAtt);
    float* dfull = w.hidden_a;
    float* datty = w.hidden_a + w.max_BT * 3 * Cl;
    float* dq =
        p.split() && p.Row(kDplanes) != qkv ? p.Row(kDplanes) : w.hidden_b;
    float* dk = dq + BT * Cl;
    float* dv = dk + BT * Kl;
    const int o = Out(p.config());
    p.Begin(o);
    if (p.split()) {
      ops.Copy(p.Row(kDproj), dout, static_cast<int64_t>(B) * p.Ts() * C);
    }
    row_linear_backward(datty, p.WeightGrad(o), nullptr, dout, p.Stored(atty),
                        p.Weight(o), B, T, Cl, C, p.tp(), p.scratch());
    p.End(o);
    if (p.selective()) w.attention->Forward(atty, att, qkv, B, T);
    w.attention->Backward(dfull, w.datt, datty, qkv, atty, att, B, T);
    // The rows' gradient turned back, into the planes.
    const int64_t R = h.Row();
    rope_forward(dfull, R, h.NHl + h.KVl, h.hs, B, T, 0, p.config().rope, true,
                 p.cp(), ops);
    ops.CopyRows(dq, Cl, dfull, R, BT, Cl, false);
    ops.CopyRows(dk, Kl, dfull + Cl, R, BT, Kl, false);
    ops.CopyRows(dv, Kl, dfull + Cl + Kl, R, BT, Kl, false);
    p.Begin(kQ);
    NormsBackward(p, h, dq, BT, w.hidden_a);
    if (p.split() && dq != p.Row(kDplanes)) {
      ops.Copy(p.Row(kDplanes), dq, BT * (Cl + 2 * Kl));
    }
    p.Poll();
    const int64_t kv_at = h.kv_at;
    float* dw_k = p.WeightGrad(kK);
    float* dw_v = p.WeightGrad(kV);
    // The key's and value's input gradients beside the query's (hidden_a
    // is free once the planes hold the gradients).
    column_linears_backward(
        din, w.hidden_a,
        {{dq, p.Weight(kQ), p.WeightGrad(kQ), nullptr, Cl},
         {dk, p.Weight(kK).Offset(kv_at),
          dw_k != nullptr ? dw_k + kv_at : nullptr, nullptr, Kl},
         {dv, p.Weight(kV).Offset(kv_at),
          dw_v != nullptr ? dw_v + kv_at : nullptr, nullptr, Kl}},
        in, B, T, C, p.tp(), p.scratch());
    p.Poll();
    p.End(kQ);
  }

  void BackwardWeights(const PartPass& p, kernels::ConstAct in) const override {
    const int B = p.B(), T = p.T(), C = p.C();
    const Heads h = HeadsOf(p);
    const int Cl = h.Cl(), Kl = h.Kl();
    const int64_t BT = int64_t{B} * T;
    const kernels::Act no_dinp(static_cast<float*>(nullptr));
    const int o = Out(p.config());
    row_linear_backward(no_dinp, p.Grad(o), nullptr, p.Row(kDproj),
                        p.Stored(p.Row(kAtty)), nullptr, B, T, Cl, C, p.tp(),
                        p.scratch());
    p.End(o);
    const float* dq = p.Row(kDplanes);
    const int64_t kv_at = h.kv_at;
    column_linears_backward(
        nullptr, nullptr,
        {{dq, nullptr, p.Grad(kQ), nullptr, Cl},
         {dq + BT * Cl, nullptr, p.Grad(kK) + kv_at, nullptr, Kl},
         {dq + BT * (Cl + Kl), nullptr, p.Grad(kV) + kv_at, nullptr, Kl}},
        in, B, T, C, p.tp(), p.scratch());
    p.End(kQ);
    p.Poll();
  }

 private:
  // With qk_norm: the query and key planes (q, then k: contiguous) kept
  // in the raw row, each head normalised from it into its plane, its rstd
  // kept.
  static void NormsForward(const PartPass& p, const Heads& h, float* q,
                           int64_t BT) {
    if (!p.config().qk_norm) return;
    kernels::Ops& ops = p.ops();
    const float eps = p.config().norm_eps;
    float* raw = p.Row(kRaw);
    float* rstd = p.Row(kRstd);
    ops.Copy(raw, q, BT * (h.Cl() + h.Kl()));
    ops.rmsnorm_forward(kernels::Act(q), rstd, raw, p.Param(kQNorm), eps, 1,
                        static_cast<int>(BT * h.NHl), h.hs);
    ops.rmsnorm_forward(kernels::Act(q + BT * h.Cl()), rstd + BT * h.NHl,
                        raw + BT * h.Cl(), p.Param(kKNorm), eps, 1,
                        static_cast<int>(BT * h.KVl), h.hs);
  }
  // The query and key planes' gradients (dq, then dk) through the norms,
  // in place (through `scratch`, BT·(Cl+Kl) floats), and the norms' weight
  // gradients (in B too under a split backward: W only ends the unit).
  static void NormsBackward(const PartPass& p, const Heads& h, float* dq,
                            int64_t BT, float* scratch) {
    if (!p.config().qk_norm) return;
    kernels::Ops& ops = p.ops();
    const float* raw = p.Row(kRaw);
    const float* rstd = p.Row(kRstd);
    const int64_t n = BT * (h.Cl() + h.Kl());
    ops.Zero(scratch, n);
    ops.rmsnorm_backward(scratch, p.Grad(kQNorm), dq, raw, p.Param(kQNorm),
                         rstd, 1, static_cast<int>(BT * h.NHl), h.hs);
    ops.rmsnorm_backward(scratch + BT * h.Cl(), p.Grad(kKNorm),
                         dq + BT * h.Cl(), raw + BT * h.Cl(), p.Param(kKNorm),
                         rstd + BT * h.NHl, 1, static_cast<int>(BT * h.KVl),
                         h.hs);
    ops.Copy(dq, scratch, n);
  }
};

}  // namespace

std::unique_ptr<SublayerPart> GroupedQueryAttentionPart() {
  return std::make_unique<GroupedQueryAttention>();
}

}  // namespace ptrain
