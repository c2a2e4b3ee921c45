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

std::unique_ptr<ModelPart> TiedHeadPart() {
  return std::make_unique<TiedHead>();
}

void ModelParts::AddEmbedding(std::unique_ptr<EmbeddingPart> part) {
  embeddings.push_back(part.get());
  before.push_back(std::move(part));
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
    p->AddEmbedding(TokenEmbeddingPart());
    p->AddEmbedding(PositionEmbeddingPart());
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
