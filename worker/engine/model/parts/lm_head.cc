// The output head: logits over this rank's vocabulary rows, a
// column-parallel matmul whose output is never gathered (the loss is
// vocabulary-parallel).
// Tied (GPT-2's): it reads the token embedding's table and has no tensor
// of its own; its matmul's FLOPs are counted with wte's, and its weight's
// gradient adds to wte's (or to the tied copy a last stage that does not
// embed holds). Untied: lm_head.weight (V, C), split by vocabulary rows
// over tp as wte is, in the final unit.
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

class LmHead : public HeadPart {
 public:
  explicit LmHead(bool tied) : tied_(tied) {}

  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    if (tied_) return {};
    return {{"lm_head.weight",
             {c.vocab_size, c.n_embd},
             ParamInfo::Init::kNormal,
             false,
             0,
             TpSplit::kVocab,
             false}};
  }
  bool tied() const override { return tied_; }

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
  const bool tied_;
};

}  // namespace

std::unique_ptr<HeadPart> TiedHeadPart() {
  return std::make_unique<LmHead>(true);
}

std::unique_ptr<HeadPart> UntiedHeadPart() {
  return std::make_unique<LmHead>(false);
}

}  // namespace ptrain
