// Learned positions (GPT-2's wpe): a row per position up to block_size,
// replicated over tp (its gradient summed over tp under sequence
// parallelism), added to the token embedding. A lookup: no FLOPs.
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

class PositionEmbedding : public EmbeddingPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    return {{"wpe",
             {c.block_size, c.n_embd},
             ParamInfo::Init::kNormal,
             false,
             0,
             TpSplit::kReplicated,
             true}};
  }
  double FlopsPerToken(const GptConfig&, int) const override { return 0; }

  void Forward(const PartPass& p, float* out, const int32_t*,
               int t0) const override {
    position_embedding_forward(out, p.Param(0), p.B(), p.T(), t0, p.C(), p.tp(),
                               p.scratch(), p.cp());
  }

  void Backward(const PartPass& p, const float* dout,
                const int32_t*) const override {
    position_embedding_backward(p.Grad(0), dout, p.B(), p.T(), p.C(), p.tp(),
                                p.scratch(), p.cp());
  }
};

}  // namespace

std::unique_ptr<EmbeddingPart> PositionEmbeddingPart() {
  return std::make_unique<PositionEmbedding>();
}

}  // namespace ptrain
