// The SwiGLU MLP (Llama's): C -> [gate; up], 2H rows stacked in one
// tensor, each half sliced by columns over tp (TpSplit::kStacked2), in the
// block's third unit; silu(gate)·up; H -> C, sliced by rows, in its fourth.
// No biases. silu(gate)·up is not kept: the projection's backward computes
// it again from gate_up.
// Rows: gate_up (B,T,2Hl) in the stored type; under a split backward, the
// output gradients of the two linear layers (gate_up's, fp32, and the
// projection's (B,Ts,C)).
#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

enum Tensor { kGateUp, kDown };
enum Row { kGu, kDgu, kDproj };

class SwigluMlp : public SublayerPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    const int64_t C = c.n_embd, H = c.hidden();
    using Init = ParamInfo::Init;
    return {
        {"mlp.gate_up_proj.weight",
         {2 * H, C},
         Init::kNormal,
         false,
         2,
         TpSplit::kStacked2,
         false},
        {"mlp.down_proj.weight",
         {C, H},
         Init::kNormal,
         true,
         3,
         TpSplit::kRow,
         false},
    };
  }

  std::vector<ActivationRow> Rows(const StageActivationDims& d) const override {
    return {{"mlp.gate_up", d.Stored(d.BT, 2 * d.Hl)}};
  }
  std::vector<SplitRow> SplitRows(const StageActivationDims& d) const override {
    return {{SatMul(d.BT, 2 * d.Hl), ""}, {SatMul(d.BTs, d.C), "stream"}};
  }
  // silu(gate)·up (forward, and again in backward) in one buffer, then
  // gate_up's gradient there; the hidden layer's gradient in the other.
  int64_t HiddenFloats(const StageActivationDims& d) const override {
    return SatMul(d.BT, 2 * d.Hl);
  }

  void Forward(const PartPass& p, kernels::ConstAct in,
               float* out) const override {
    const int B = p.B(), T = p.T(), C = p.C(), H = Hl(p);
    const kernels::Act gate_up = p.Stored(p.Row(kGu));
    p.Begin(kGateUp);
    column_linear_forward(gate_up, in, p.Weight(kGateUp), nullptr, B, T, C,
                          2 * H, p.tp(), p.scratch());
    p.End(kGateUp);
    if (p.recomputing()) return;  // the backward starts from gate_up
    float* hidden = p.work().hidden_a;
    p.ops().swiglu_forward(hidden, gate_up, int64_t{B} * T, H);
    p.Begin(kDown);
    row_linear_forward(out, hidden, p.Weight(kDown), nullptr, B, T, H, C,
                       p.tp(), p.scratch());
    p.End(kDown);
  }

  void Backward(const PartPass& p, float* din, const float* dout,
                kernels::ConstAct in) const override {
    const int B = p.B(), T = p.T(), C = p.C(), H = Hl(p);
    const int64_t BT = int64_t{B} * T;
    const BlockWork& w = p.work();
    const kernels::ConstAct gate_up = p.Stored(p.Row(kGu));
    float* hidden = w.hidden_a;
    float* dhidden = w.hidden_b;
    p.Begin(kDown);
    if (p.split()) {
      p.ops().Copy(p.Row(kDproj), dout, static_cast<int64_t>(B) * p.Ts() * C);
    }
    p.ops().swiglu_forward(hidden, gate_up, BT, H);
    row_linear_backward(dhidden, p.WeightGrad(kDown), nullptr, dout, hidden,
                        p.Weight(kDown), B, T, H, C, p.tp(), p.scratch());
    p.End(kDown);
    float* dgate_up = p.split() ? p.Row(kDgu) : w.hidden_a;
    p.ops().swiglu_backward(dgate_up, dhidden, gate_up, BT, H);
    p.Begin(kGateUp);
    column_linear_backward(din, p.WeightGrad(kGateUp), nullptr, dgate_up, in,
                           p.Weight(kGateUp), B, T, C, 2 * H, p.tp(),
                           p.scratch());
    p.Poll();
    p.End(kGateUp);
  }

  void BackwardWeights(const PartPass& p, kernels::ConstAct in) const override {
    const int B = p.B(), T = p.T(), C = p.C(), H = Hl(p);
    const kernels::Act no_dinp(static_cast<float*>(nullptr));
    float* hidden = p.work().hidden_a;
    p.ops().swiglu_forward(hidden, p.Stored(p.Row(kGu)), int64_t{B} * T, H);
    row_linear_backward(no_dinp, p.Grad(kDown), nullptr, p.Row(kDproj), hidden,
                        nullptr, B, T, H, C, p.tp(), p.scratch());
    p.End(kDown);
    column_linear_backward(nullptr, p.Grad(kGateUp), nullptr, p.Row(kDgu), in,
                           nullptr, B, T, C, 2 * H, p.tp(), p.scratch());
    p.End(kGateUp);
    p.Poll();
  }

 private:
  static int Hl(const PartPass& p) {
    return p.config().hidden() / p.tp().size();
  }
};

}  // namespace

std::unique_ptr<SublayerPart> SwigluMlpPart() {
  return std::make_unique<SwigluMlp>();
}

}  // namespace ptrain
