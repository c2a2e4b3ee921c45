// LayerNorm (GPT-2's): a weight and a bias over the channels, replicated
// over tp, their gradients summed over tp under sequence parallelism.
// Rows: its output (stored type), each position's mean and 1/std.
#include <string>
#include <utility>

#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

enum Tensor { kWeight, kBias };
enum Row { kOut, kMean, kRstd };

class LayerNorm : public NormPart {
 public:
  LayerNorm(std::string prefix, int unit)
      : prefix_(std::move(prefix)), unit_(unit) {}

  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    return {
        ChannelVector(prefix_ + ".weight", c, ParamInfo::Init::kOnes, unit_),
        ChannelVector(prefix_ + ".bias", c, ParamInfo::Init::kZeros, unit_)};
  }

  std::vector<ActivationRow> Rows(const StageActivationDims& d) const override {
    return {{prefix_ + ".out", d.Stored(d.BTs, d.C)},
            {prefix_ + ".mean", d.BTs},
            {prefix_ + ".rstd", d.BTs}};
  }

  void Forward(const PartPass& p, const float* x, const float* branch,
               float* sum) const override {
    p.Begin(kWeight);
    if (branch != nullptr) {
      p.ops().residual_layernorm_forward(
          sum, p.Stored(p.Row(kOut)), p.Row(kMean), p.Row(kRstd), x, branch,
          p.Param(kWeight), p.Param(kBias), p.B(), p.Ts(), p.C());
    } else {
      p.ops().layernorm_forward(p.Stored(p.Row(kOut)), p.Row(kMean),
                                p.Row(kRstd), x, p.Param(kWeight),
                                p.Param(kBias), p.B(), p.Ts(), p.C());
    }
    p.End(kWeight);
  }

  void Backward(const PartPass& p, float* dx, const float* dout,
                const float* x) const override {
    p.Begin(kWeight);
    p.ops().layernorm_backward(dx, p.Grad(kWeight), p.Grad(kBias), dout, x,
                               p.Param(kWeight), p.Row(kMean), p.Row(kRstd),
                               p.B(), p.Ts(), p.C());
    p.End(kWeight);
  }

 private:
  std::string prefix_;
  int unit_;
};

}  // namespace

std::unique_ptr<NormPart> LayerNormPart(std::string prefix, int unit) {
  return std::make_unique<LayerNorm>(std::move(prefix), unit);
}

}  // namespace ptrain
