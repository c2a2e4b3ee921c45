// RMSNorm (Llama's): a weight over the channels and no bias, replicated
// over tp, its gradient summed over tp under sequence parallelism; eps is
// config.norm_eps. Rows: its output (stored type), each position's 1/rms.
#include <string>
#include <utility>

#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

enum Tensor { kWeight };
enum Row { kOut, kRstd };

class RmsNorm : public NormPart {
 public:
  RmsNorm(std::string prefix, int unit)
      : prefix_(std::move(prefix)), unit_(unit) {}

  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    return {
        ChannelVector(prefix_ + ".weight", c, ParamInfo::Init::kOnes, unit_)};
  }

  std::vector<ActivationRow> Rows(const StageActivationDims& d) const override {
    return {{prefix_ + ".out", d.Stored(d.BTs, d.C)},
            {prefix_ + ".rstd", d.BTs}};
  }

  void Forward(const PartPass& p, const float* x, const float* branch,
               float* sum) const override {
    const float eps = p.config().norm_eps;
    p.Begin(kWeight);
    if (branch != nullptr) {
      p.ops().residual_rmsnorm_forward(sum, p.Stored(p.Row(kOut)), p.Row(kRstd),
                                       x, branch, p.Param(kWeight), eps, p.B(),
                                       p.Ts(), p.C());
    } else {
      p.ops().rmsnorm_forward(p.Stored(p.Row(kOut)), p.Row(kRstd), x,
                              p.Param(kWeight), eps, p.B(), p.Ts(), p.C());
    }
    p.End(kWeight);
  }

  void Backward(const PartPass& p, float* dx, const float* dout,
                const float* x) const override {
    p.Begin(kWeight);
    p.ops().rmsnorm_backward(dx, p.Grad(kWeight), dout, x, p.Param(kWeight),
                             p.Row(kRstd), p.B(), p.Ts(), p.C());
    p.End(kWeight);
  }

 private:
  std::string prefix_;
  int unit_;
};

}  // namespace

std::unique_ptr<NormPart> RmsNormPart(std::string prefix, int unit) {
  return std::make_unique<RmsNorm>(std::move(prefix), unit);
}

}  // namespace ptrain
