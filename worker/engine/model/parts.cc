#include "worker/engine/model/parts.h"

#include <utility>

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

class LayerNorm : public ModelPart {
 public:
  LayerNorm(std::string prefix, int unit)
      : prefix_(std::move(prefix)), unit_(unit) {}
  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    return {{prefix_ + ".weight",
             {c.n_embd},
             Init::kOnes,
             false,
             unit_,
             TpSplit::kReplicated,
             true},
            {prefix_ + ".bias",
             {c.n_embd},
             Init::kZeros,
             false,
             unit_,
             TpSplit::kReplicated,
             true}};
  }

 private:
  std::string prefix_;
  int unit_;
};

// Multi-head attention: the qkv projection (sliced by heads over tp) in
// the block's first unit, the output projection (sliced by rows) in its
// second.
class MultiHeadAttention : public ModelPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    const int64_t C = c.n_embd;
    return {
        {"attn.c_attn.weight",
         {3 * C, C},
         Init::kNormal,
         false,
         0,
         TpSplit::kQkv,
         false},
        {"attn.c_attn.bias",
         {3 * C},
         Init::kZeros,
         false,
         0,
         TpSplit::kQkv,
         false},
        {"attn.c_proj.weight",
         {C, C},
         Init::kNormal,
         true,
         1,
         TpSplit::kRow,
         false},
        {"attn.c_proj.bias",
         {C},
         Init::kZeros,
         false,
         1,
         TpSplit::kReplicated,
         false},
    };
  }
  // Scores and mix: 2·C·T multiply-adds each a token forward, twice that
  // backward.
  double FlopsPerToken(const GptConfig& c, int T) const override {
    return ModelPart::FlopsPerToken(c, T) +
           12.0 * c.n_embd * static_cast<double>(T);
  }
};

// The MLP: C -> 4C (sliced by columns over tp), GELU, 4C -> C (by rows),
// in the block's third and fourth units.
class GeluMlp : public ModelPart {
 public:
  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    const int64_t C = c.n_embd;
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
std::unique_ptr<ModelPart> LayerNormPart(std::string prefix, int unit) {
  return std::make_unique<LayerNorm>(std::move(prefix), unit);
}
std::unique_ptr<ModelPart> MultiHeadAttentionPart() {
  return std::make_unique<MultiHeadAttention>();
}
std::unique_ptr<ModelPart> GeluMlpPart() { return std::make_unique<GeluMlp>(); }
std::unique_ptr<ModelPart> TiedHeadPart() {
  return std::make_unique<TiedHead>();
}

const ModelParts& Gpt2Parts() {
  static const ModelParts* parts = [] {
    auto* p = new ModelParts();
    p->before.push_back(TokenEmbeddingPart());
    p->before.push_back(PositionEmbeddingPart());
    p->block.push_back(LayerNormPart("ln_1", 0));
    p->block.push_back(MultiHeadAttentionPart());
    p->block.push_back(LayerNormPart("ln_2", 2));
    p->block.push_back(GeluMlpPart());
    p->after.push_back(LayerNormPart("ln_f", 0));
    p->after.push_back(TiedHeadPart());
    return p;
  }();
  return *parts;
}

}  // namespace ptrain
