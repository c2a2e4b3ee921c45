#include "worker/engine/model/parts.h"

#include <utility>

#include "common/check.h"

namespace ptrain {
namespace {

using Init = ParamInfo::Init;

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

class TokenEmbedding : public ModelPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    return {{"wte",
             {c.vocab_size, c.n_embd},
             Init::kNormal,
             false,
             0,
             TpSplit::kVocab,
             false}};
  }
};

// Learned positions, added to the token embedding; a lookup, no FLOPs.
class PositionEmbedding : public ModelPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    return {{"wpe",
             {c.block_size, c.n_embd},
             Init::kNormal,
             false,
             0,
             TpSplit::kReplicated,
             true}};
  }
  double FlopsPerToken(const GptConfig&, int) const override { return 0; }
};

// The head tied to the token embedding: no tensor of its own (its matmul
// is counted with wte's).
class TiedHead : public ModelPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig&) const override {
    return {};
  }
};

}  // namespace

double ModelPart::FlopsPerToken(const GptConfig& config, int) const {
  double n = 0;
  for (const PartTensor& t : Tensors(config)) {
    n += static_cast<double>(Numel(t.shape));
  }
  return 6.0 * n;
}

std::unique_ptr<ModelPart> TokenEmbeddingPart() {
  return std::make_unique<TokenEmbedding>();
}
std::unique_ptr<ModelPart> PositionEmbeddingPart() {
  return std::make_unique<PositionEmbedding>();
}
std::unique_ptr<ModelPart> TiedHeadPart() {
  return std::make_unique<TiedHead>();
}

void ModelParts::AddPair(std::unique_ptr<NormPart> norm,
                         std::unique_ptr<SublayerPart> sublayer) {
  pairs.emplace_back(norm.get(), sublayer.get());
  block.push_back(std::move(norm));
  block.push_back(std::move(sublayer));
}

const ModelParts& Gpt2Parts() {
  static const ModelParts* parts = [] {
    auto* p = new ModelParts();
    p->before.push_back(TokenEmbeddingPart());
    p->before.push_back(PositionEmbeddingPart());
    p->AddPair(LayerNormPart("ln_1", 0), MultiHeadAttentionPart());
    p->AddPair(LayerNormPart("ln_2", 2), GeluMlpPart());
    p->after.push_back(LayerNormPart("ln_f", 0));
    p->after.push_back(TiedHeadPart());
    return p;
  }();
  return *parts;
}

const ModelParts& ModelPartsOf(const GptConfig& config) {
  PT_CHECK(config.arch == "gpt", "a model.arch without parts");
  return Gpt2Parts();
}

}  // namespace ptrain
