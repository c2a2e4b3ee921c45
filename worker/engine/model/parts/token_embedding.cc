// The token embedding (GPT-2's wte): a row per vocabulary entry, the rows
// split over tp (each rank holds Vp/tp of them, the padding rows zero and
// never read); the lookup of the rows a rank holds, summed over the group.
// The head may read the same table (TiedHeadPart): its FLOPs are then the
// head's matmul's; a lookup alone counts none.
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

class TokenEmbedding : public EmbeddingPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    return {{"wte",
             {c.vocab_size, c.n_embd},
             ParamInfo::Init::kNormal,
             false,
             0,
             TpSplit::kVocab,
             false}};
  }

  double FlopsPerToken(const GptConfig& c, int T) const override {
    return c.tie_embeddings ? ModelPart::FlopsPerToken(c, T) : 0.0;
  }

  void Forward(const PartPass& p, float* out, const int32_t* tokens,
               int) const override {
    const int Vl = p.config().padded_vocab / p.tp().size();
    token_embedding_forward(out, tokens, p.Param(0), p.B(), p.T(), p.C(),
                            p.tp().rank() * Vl, Vl, p.tp(), p.scratch());
  }

  void Backward(const PartPass& p, const float* dout,
                const int32_t* tokens) const override {
    const int Vl = p.config().padded_vocab / p.tp().size();
    token_embedding_backward(p.Grad(0), dout, tokens, p.B(), p.T(), p.C(),
                             p.tp().rank() * Vl, Vl, p.tp(), p.scratch());
  }
};

}  // namespace

std::unique_ptr<EmbeddingPart> TokenEmbeddingPart() {
  return std::make_unique<TokenEmbedding>();
}

}  // namespace ptrain
