// The MLP (GPT-2's): C -> 4C, sliced by columns over tp, in the block's
// third unit; GELU; 4C -> C, sliced by rows, in its fourth. GELU's output
// is not kept in fp32: the projection computes it from fch as it reads it,
// in forward and again in backward (or reads what the backend keeps).
// Rows: fch (B,T,4Cl, stored type); what the backend keeps of GELU(fch)
// (null where nothing); under a split backward, the output gradients of
// the two linear layers (fch's, stored type, and the projection's
// (B,Ts,C)).
#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

enum Tensor { kFcW, kFcB, kProjW, kProjB };
enum Row { kFch, kGelu, kDfch, kDproj };

class GeluMlp : public SublayerPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    const int64_t C = c.n_embd;
    using Init = ParamInfo::Init;
    return {
        {"mlp.c_fc.weight",
         {4 * C, C},
         Init::kNormal,
         false,
         2,
         TpSplit::kColumn,
         false},
        {"mlp.c_fc.bias",
         {4 * C},
         Init::kZeros,
         false,
         2,
         TpSplit::kColumn,
         false},
        {"mlp.c_proj.weight",
         {C, 4 * C},
         Init::kNormal,
         true,
         3,
         TpSplit::kRow,
         false},
        {"mlp.c_proj.bias",
         {C},
         Init::kZeros,
         false,
         3,
         TpSplit::kReplicated,
         false},
    };
  }

  // What the backend keeps of GELU(fch): nothing under full recomputation,
  // whose forward again stops before the projection.
  std::vector<ActivationRow> Rows(const StageActivationDims& d) const override {
    return {{"mlp.fch", d.Stored(d.BT, 4 * d.Cl)}, {"mlp.gelu", d.gelu}};
  }
  // fch's gradient in what attention keeps, where that is as large (B is
  // done with it once attention's backward has read it: PartPass::
  // Deferred); the projection's in the residual stream it added to.
  std::vector<SplitRow> SplitRows(const StageActivationDims& d) const override {
    return {{d.Stored(d.BT, 4 * d.Cl), "attn.saved"},
            {SatMul(d.BTs, d.C), "stream"}};
  }

  // GELU(fch) (forward) and then fch's gradient (backward) in one buffer,
  // GELU(fch) again (backward) in the other: (B,T,4Cl) each.
  int64_t HiddenFloats(const StageActivationDims& d) const override {
    return SatMul(d.BT, 4 * d.Cl);
  }

  void Forward(const PartPass& p, kernels::ConstAct in,
               float* out) const override {
    const int B = p.B(), T = p.T(), C = p.C(), H = 4 * p.Cl();
    p.Begin(kFcW);
    column_linear_forward(p.Stored(p.Row(kFch)), in, p.Weight(kFcW),
                          p.Param(kFcB), B, T, C, H, p.tp(), p.scratch());
    p.End(kFcW);
    if (p.recomputing()) return;  // the backward starts from fch
    p.Begin(kProjW);
    row_linear_forward(out, p.Stored(p.Row(kFch)), p.Weight(kProjW),
                       p.Param(kProjB), B, T, H, C, p.tp(), p.scratch(),
                       /*gelu_hidden=*/p.work().hidden_b,
                       /*gelu_saved=*/p.Row(kGelu));
    p.End(kProjW);
  }

  void Backward(const PartPass& p, float* din, const float* dout,
                kernels::ConstAct in) const override {
    const int B = p.B(), T = p.T(), C = p.C(), H = 4 * p.Cl();
    const BlockWork& w = p.work();
    // fch's gradient: into its row for W, or the working set (then copied
    // to the row once the block's backward no longer reads what the row
    // shares memory with).
    float* dfch = p.split() && !p.Deferred(kDfch) ? p.Row(kDfch) : w.hidden_b;
    p.Begin(kProjW);
    if (p.split()) {
      p.ops().Copy(p.Row(kDproj), dout, static_cast<int64_t>(B) * p.Ts() * C);
    }
    // Through GELU: the gradient of fch, in fch's stored type (it feeds
    // only the fc matmul's backward).
    row_linear_backward(p.Stored(dfch), p.WeightGrad(kProjW),
                        p.WeightGrad(kProjB), dout, p.Stored(p.Row(kFch)),
                        p.Weight(kProjW), B, T, H, C, p.tp(), p.scratch(),
                        /*gelu_hidden=*/w.hidden_a,
                        /*gelu_saved=*/p.Row(kGelu));
    p.End(kProjW);
    p.Begin(kFcW);
    column_linear_backward(din, p.WeightGrad(kFcW), p.WeightGrad(kFcB),
                           p.Stored(dfch), in, p.Weight(kFcW), B, T, C, H,
                           p.tp(), p.scratch());
    p.Poll();
    p.End(kFcW);
    if (p.split() && dfch != p.Row(kDfch)) {
      float* row = p.Row(kDfch);
      kernels::Ops* ops = &p.ops();
      const int64_t n = static_cast<int64_t>(B) * T * H / p.act_div();
      p.AfterBlock([ops, row, dfch, n] { ops->Copy(row, dfch, n); });
    }
  }

  void BackwardWeights(const PartPass& p, kernels::ConstAct in) const override {
    const int B = p.B(), T = p.T(), C = p.C(), H = 4 * p.Cl();
    const kernels::Act no_dinp(static_cast<float*>(nullptr));
    row_linear_backward(no_dinp, p.Grad(kProjW), p.Grad(kProjB), p.Row(kDproj),
                        p.Stored(p.Row(kFch)), nullptr, B, T, H, C, p.tp(),
                        p.scratch(),
                        /*gelu_hidden=*/p.work().hidden_a,
                        /*gelu_saved=*/p.Row(kGelu));
    p.End(kProjW);
    column_linear_backward(nullptr, p.Grad(kFcW), p.Grad(kFcB),
                           p.Stored(p.Row(kDfch)), in, nullptr, B, T, C, H,
                           p.tp(), p.scratch());
    p.End(kFcW);
    p.Poll();
  }
};

}  // namespace

std::unique_ptr<SublayerPart> GeluMlpPart() {
  return std::make_unique<GeluMlp>();
}

}  // namespace ptrain
