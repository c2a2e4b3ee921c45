// The head tied to the token embedding (GPT-2's): logits over this rank's
// vocabulary rows from wte's rows, a column-parallel matmul whose output is
// never gathered (the loss is vocabulary-parallel). No tensor of its own:
// its matmul's FLOPs are counted with wte's, and its weight's gradient adds
// to wte's (or to the tied copy a last stage that does not embed holds).
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

class TiedHead : public HeadPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig&) const override {
    return {};
  }
  bool tied() const override { return true; }

  // Place 0: the table it reads (PartPass).
  void Forward(const PartPass& p, kernels::ConstAct in,
               kernels::Act logits) const override {
    column_linear_forward(logits, in, p.Weight(0), nullptr, p.B(), p.T(), p.C(),
                          Vl(p), p.tp(), p.scratch());
  }

  void Backward(const PartPass& p, float* din, kernels::ConstAct dlogits,
                kernels::ConstAct in) const override {
    column_linear_backward(din, p.WeightGrad(0), nullptr, dlogits, in,
                           p.Weight(0), p.B(), p.T(), p.C(), Vl(p), p.tp(),
                           p.scratch());
  }

  void BackwardWeights(const PartPass& p, kernels::ConstAct dlogits,
                       kernels::ConstAct in) const override {
    column_linear_backward(nullptr, p.Grad(0), nullptr, dlogits, in, nullptr,
                           p.B(), p.T(), p.C(), Vl(p), p.tp(), p.scratch());
  }

 private:
  static int Vl(const PartPass& p) {
    return p.config().padded_vocab / p.tp().size();
  }
};

}  // namespace

std::unique_ptr<HeadPart> TiedHeadPart() {
  return std::make_unique<TiedHead>();
}

}  // namespace ptrain
