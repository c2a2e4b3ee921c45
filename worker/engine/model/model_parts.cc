#include "worker/engine/model/model_parts.h"

#include <utility>

#include "common/check.h"
#include "worker/engine/model/activation_table.h"

namespace ptrain {
double ModelPart::FlopsPerToken(const GptConfig& config, int) const {
  double n = 0;
  for (const PartTensor& t : Tensors(config)) {
    n += static_cast<double>(ShapeNumel(t.shape));
  }
  return 6.0 * n;
}

PartTensor ChannelVector(std::string name, const GptConfig& config,
                         ParamInfo::Init init, int unit) {
  return {std::move(name),
          {config.n_embd},
          init,
          false,
          unit,
          TpSplit::kReplicated,
          true};
}

std::vector<ActivationRow> AttentionRows(const StageActivationDims& d) {
  return {{"attn.qkv", d.Stored(d.BT, d.Cl + 2 * d.Kl)},
          {"attn.out", d.Stored(d.BT, d.Cl)},
          {"attn.saved", d.att, /*selective=*/true}};
}

double AttentionScoreFlops(const GptConfig& config, int T) {
  return 12.0 * static_cast<double>(config.attention_channels()) *
         static_cast<double>(T);
}

void ModelParts::AddEmbedding(std::unique_ptr<EmbeddingPart> part) {
  embeddings.push_back(part.get());
  before.push_back(std::move(part));
}

void ModelParts::SetOutput(std::unique_ptr<NormPart> norm,
                           std::unique_ptr<HeadPart> head_part) {
  final_norm = norm.get();
  head = head_part.get();
  after.push_back(std::move(norm));
  after.push_back(std::move(head_part));
}

void ModelParts::AddPair(std::unique_ptr<NormPart> norm,
                         std::unique_ptr<SublayerPart> sublayer) {
  pairs.emplace_back(norm.get(), sublayer.get());
  block.push_back(std::move(norm));
  block.push_back(std::move(sublayer));
}

namespace {

const ModelParts* Gpt2(bool tied, bool moe) {
  auto* p = new ModelParts();
  p->AddEmbedding(TokenEmbeddingPart());
  p->AddEmbedding(PositionEmbeddingPart());
  p->AddPair(LayerNormPart("ln_1", 0), MultiHeadAttentionPart());
  p->AddPair(LayerNormPart("ln_2", 2),
             moe ? InterleavedMlpPart(GeluMlpPart(), MoeMlpPart(false))
                 : GeluMlpPart());
  p->SetOutput(LayerNormPart("ln_f", 0),
               tied ? TiedHeadPart() : UntiedHeadPart());
  return p;
}

// Llama: the token embedding (positions are rotary, inside attention);
// per block RMSNorm, grouped-query attention, RMSNorm, a SwiGLU MLP; a
// final RMSNorm and the head.
const ModelParts* Llama(bool tied, bool moe) {
  auto* p = new ModelParts();
  p->AddEmbedding(TokenEmbeddingPart());
  p->AddPair(RmsNormPart("ln_1", 0), GroupedQueryAttentionPart());
  p->AddPair(RmsNormPart("ln_2", 2),
             moe ? InterleavedMlpPart(SwigluMlpPart(), MoeMlpPart(true))
                 : SwigluMlpPart());
  p->SetOutput(RmsNormPart("ln_f", 0),
               tied ? TiedHeadPart() : UntiedHeadPart());
  return p;
}

}  // namespace

const ModelParts& Gpt2Parts() {
  static const ModelParts* parts = Gpt2(/*tied=*/true, /*moe=*/false);
  return *parts;
}

const ModelParts& ModelPartsOf(const GptConfig& config) {
  PT_CHECK(config.arch == "gpt" || config.arch == "llama",
           "a model.arch without parts");
  // By arch (gpt, llama), tied head, MoE MLP.
  static const ModelParts* const all[2][2][2] = {
      {{Gpt2(false, false), Gpt2(false, true)},
       {&Gpt2Parts(), Gpt2(true, true)}},
      {{Llama(false, false), Llama(false, true)},
       {Llama(true, false), Llama(true, true)}}};
  return *all[config.arch == "llama"][config.tie_embeddings][config.has_moe()];
}

}  // namespace ptrain
