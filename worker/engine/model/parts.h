// The parts a transformer is made of, as its model config chooses them.
// Each part is one unit that names its parameters (names, shapes for a
// config, how each is initialised and which ZeRO unit of its block holds
// it), their entries in the tensor-parallel plan, and its FLOPs per token.
// GPT-2 (Gpt2Parts) is learned token and position embeddings, then per
// block LayerNorm, multi-head attention, LayerNorm and a GELU MLP, then a
// final LayerNorm and a head tied to the token embedding. The plan
// (plan.cc) builds every tensor of a model, and its tensor-parallel
// slices, from its parts; the FLOP count (GptFlopsPerToken) sums theirs.
// The forward and backward of the block parts are GptStage's; attention's
// core is AttentionCore (attention_core.h).
#ifndef PTRAIN_WORKER_ENGINE_MODEL_PARTS_H_
#define PTRAIN_WORKER_ENGINE_MODEL_PARTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/engine/model/plan.h"

namespace ptrain {

// One parameter of a part.
struct PartTensor {
  std::string name;            // "attn.c_attn.weight"; "h.<l>." goes before
                               // a block part's
  std::vector<int64_t> shape;  // for the config asked
  ParamInfo::Init init = ParamInfo::Init::kZeros;
  // Normal init scaled by 1/sqrt(2L): a projection onto the residual
  // stream (GPT-2's two per block).
  bool residual_projection = false;
  int unit = 0;  // its ZeRO unit within its block (a block's are 0..3)
  // Its tensor-parallel plan entry: how tp slices it, and whether its
  // gradient is summed over tp under sequence parallelism.
  TpSplit split = TpSplit::kReplicated;
  bool sequence_partial = false;
};

class ModelPart {
 public:
  virtual ~ModelPart() = default;
  virtual std::vector<PartTensor> Tensors(const GptConfig& config) const = 0;
  // FLOPs of one token's forward and backward through the part at
  // sequence length T: 6 per weight its matmuls multiply by, plus what it
  // computes between activations (attention's scores and mix).
  virtual double FlopsPerToken(const GptConfig& config, int T) const;
};

// A model's parts in the order its tensors are laid out: those before the
// blocks (stage 0), each block's, those after them (the last stage).
struct ModelParts {
  std::vector<std::unique_ptr<ModelPart>> before, block, after;
};
const ModelParts& Gpt2Parts();

// GPT-2's parts, one by one (the model config chooses among such).
std::unique_ptr<ModelPart> TokenEmbeddingPart();     // wte, vocab-split
std::unique_ptr<ModelPart> PositionEmbeddingPart();  // wpe, learned
std::unique_ptr<ModelPart> LayerNormPart(std::string prefix, int unit);
std::unique_ptr<ModelPart> MultiHeadAttentionPart();  // attn.c_attn, c_proj
std::unique_ptr<ModelPart> GeluMlpPart();             // mlp.c_fc, c_proj
std::unique_ptr<ModelPart> TiedHeadPart();            // reads wte

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_PARTS_H_
