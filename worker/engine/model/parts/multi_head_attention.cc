// Multi-head attention (GPT-2's): the qkv projection, sliced by heads over
// tp, in the block's first unit; causal attention over the heads this
// rank holds (AttentionCore in training: ring attention under cp; the
// backend's cached decode in generation); the output projection, sliced by
// rows, in the block's second unit.
// Rows: qkv (B,T,3Cl) and the attention's output (B,T,Cl), both in the
// stored type; what attention keeps for its backward; under a split
// backward, the output gradients of the two projections (qkv's, and the
// output projection's (B,Ts,C)).
#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

enum Tensor { kQkvW, kQkvB, kProjW, kProjB };
enum Row { kQkv, kAtty, kAtt, kDqkv, kDproj };

class MultiHeadAttention : public SublayerPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    const int64_t C = c.n_embd;
    using Init = ParamInfo::Init;
    return {
        {"attn.c_attn.weight",
         {3 * C, C},
         Init::kNormal,
         false,
         0,
         TpSplit::kQkv,
         false},
        {"attn.c_attn.bias",
         {3 * C},
         Init::kZeros,
         false,
         0,
         TpSplit::kQkv,
         false},
        {"attn.c_proj.weight",
         {C, C},
         Init::kNormal,
         true,
         1,
         TpSplit::kRow,
         false},
        {"attn.c_proj.bias",
         {C},
         Init::kZeros,
         false,
         1,
         TpSplit::kReplicated,
         false},
    };
  }
  // Scores and mix: 2·C·T multiply-adds each a token forward, twice that
  // backward.
  double FlopsPerToken(const GptConfig& c, int T) const override {
    return ModelPart::FlopsPerToken(c, T) + AttentionScoreFlops(c, T);
  }

  std::vector<ActivationRow> Rows(const StageActivationDims& d) const override {
    return AttentionRows(d);
  }
  // qkv's gradient (fp32) in qkv's place where that is fp32; the output
  // projection's in the residual stream it added to.
  std::vector<SplitRow> SplitRows(const StageActivationDims& d) const override {
    return {{SatMul(d.BT, 3 * d.Cl), "attn.qkv"},
            {SatMul(d.BTs, d.C), "stream"}};
  }

  // Backward: qkv's and the output's gradients, (B,T,3Cl) and (B,T,Cl), in
  // one buffer; under cp with bf16 rows, ring attention's fp32 operands in
  // the other.
  int64_t HiddenFloats(const StageActivationDims& d) const override {
    return SatMul(d.BT, 4 * d.Cl);
  }

  void Forward(const PartPass& p, kernels::ConstAct in,
               float* out) const override {
    const int B = p.B(), T = p.T(), C = p.C(), Cl = p.Cl();
    float* qkv = p.Row(kQkv);
    float* atty = p.Row(kAtty);
    p.Begin(kQkvW);
    column_linear_forward(p.Stored(qkv), in, p.Weight(kQkvW), p.Param(kQkvB), B,
                          T, C, 3 * Cl, p.tp(), p.scratch());
    p.End(kQkvW);
    if (p.decoding()) {
      const int64_t cache = int64_t{p.cache_T()} * Cl;
      p.ops().attention_decode(p.Stored(atty), p.cache(), p.cache() + cache,
                               p.Stored(qkv), T, p.pos(), Cl, p.NHl(), p.NHl(),
                               p.cache_T());
    } else {
      p.work().attention->Forward(atty, p.Row(kAtt), qkv, B, T);
    }
    p.Begin(kProjW);
    row_linear_forward(out, p.Stored(atty), p.Weight(kProjW), p.Param(kProjB),
                       B, T, Cl, C, p.tp(), p.scratch());
    p.End(kProjW);
  }

  void Backward(const PartPass& p, float* din, const float* dout,
                kernels::ConstAct in) const override {
    const int B = p.B(), T = p.T(), C = p.C(), Cl = p.Cl();
    const BlockWork& w = p.work();
    float* qkv = p.Row(kQkv);
    float* atty = p.Row(kAtty);
    float* att = p.Row(kAtt);
    // qkv's and the output's gradients share one (B,T,4Cl) buffer; B of a
    // split backward writes qkv's straight into its row unless that row is
    // qkv itself (which attention's backward reads).
    float* datty = w.hidden_a + w.max_BT * 3 * Cl;
    float* dqkv = p.split() && p.Row(kDqkv) != qkv ? p.Row(kDqkv) : w.hidden_a;
    p.Begin(kProjW);
    if (p.split()) {
      p.ops().Copy(p.Row(kDproj), dout, static_cast<int64_t>(B) * p.Ts() * C);
    }
    row_linear_backward(datty, p.WeightGrad(kProjW), p.WeightGrad(kProjB), dout,
                        p.Stored(atty), p.Weight(kProjW), B, T, Cl, C, p.tp(),
                        p.scratch());
    p.End(kProjW);
    if (p.selective()) {
      // What attention keeps, again (its output comes out the same, bit for
      // bit, over the kept one).
      w.attention->Forward(atty, att, qkv, B, T);
    }
    w.attention->Backward(dqkv, w.datt, datty, qkv, atty, att, B, T);
    if (p.split() && dqkv != p.Row(kDqkv)) {
      p.ops().Copy(p.Row(kDqkv), dqkv, static_cast<int64_t>(B) * T * 3 * Cl);
    }
    p.Poll();
    p.Begin(kQkvW);
    column_linear_backward(din, p.WeightGrad(kQkvW), p.WeightGrad(kQkvB), dqkv,
                           in, p.Weight(kQkvW), B, T, C, 3 * Cl, p.tp(),
                           p.scratch());
    p.Poll();
    p.End(kQkvW);
  }

  void BackwardWeights(const PartPass& p, kernels::ConstAct in) const override {
    const int B = p.B(), T = p.T(), C = p.C(), Cl = p.Cl();
    const kernels::Act no_dinp(static_cast<float*>(nullptr));
    row_linear_backward(no_dinp, p.Grad(kProjW), p.Grad(kProjB), p.Row(kDproj),
                        p.Stored(p.Row(kAtty)), nullptr, B, T, Cl, C, p.tp(),
                        p.scratch());
    p.End(kProjW);
    column_linear_backward(nullptr, p.Grad(kQkvW), p.Grad(kQkvB), p.Row(kDqkv),
                           in, nullptr, B, T, C, 3 * Cl, p.tp(), p.scratch());
    p.End(kQkvW);
    p.Poll();
  }
};

}  // namespace

std::unique_ptr<SublayerPart> MultiHeadAttentionPart() {
  return std::make_unique<MultiHeadAttention>();
}

}  // namespace ptrain
