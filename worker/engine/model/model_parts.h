// The parts a transformer is made of, as its model config chooses them.
// Each part is one unit that names its parameters (names, shapes for a
// config, how each is initialised and which ZeRO unit of its block holds
// it), their entries in the tensor-parallel plan and its FLOPs per token;
// a block's parts also run its forward and backward (NormPart,
// SublayerPart), through a PartPass (part_pass.h). A block is a pre-norm
// residual stream of (norm, sublayer) pairs, which BlockStack
// (block_stack.h) strings together.
// GPT-2 (Gpt2Parts) is learned token and position embeddings, then per
// block LayerNorm, multi-head attention, LayerNorm and a GELU MLP, then a
// final LayerNorm and a head tied to the token embedding (or, with
// model.tie_embeddings false, one of its own). The plan
// (plan.cc) builds every tensor of a model, and its tensor-parallel
// slices, from its parts; the FLOP count (GptFlopsPerToken) sums theirs.
// The block parts live in parts/, one file each.
#ifndef PTRAIN_WORKER_ENGINE_MODEL_MODEL_PARTS_H_
#define PTRAIN_WORKER_ENGINE_MODEL_MODEL_PARTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"
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
  int unit = 0;  // its ZeRO unit within its block (a block's are 0..7)
  // Its tensor-parallel plan entry: how tp slices it, and whether its
  // gradient is summed over tp under sequence parallelism.
  TpSplit split = TpSplit::kReplicated;
  bool sequence_partial = false;
  // A routed expert's index (ParamInfo::expert); -1: not an expert's.
  int expert = -1;
  // Replicated over tp, each tp rank's gradient a part of the whole,
  // summed over tp with or without sequence parallelism (ParamInfo::
  // tp_partial): a weight every rank applies to its own heads.
  bool tp_partial = false;
};

// A norm's vector over the channels (n_embd): its weight or its bias,
// replicated over tp, its gradient summed over tp under sequence
// parallelism.
PartTensor ChannelVector(std::string name, const GptConfig& config,
                         ParamInfo::Init init, int unit);

struct StageActivationDims;  // activation_table.h

// The most rows a part keeps (its Rows and SplitRows together).
constexpr int kMaxPartRows = 12;

// A row of activations a part keeps from its forward to its backward.
struct ActivationRow {
  std::string name;    // unique in a block: "attn.qkv"
  int64_t floats = 0;  // per layer and microbatch; 0: nothing kept
  // Computed again before the backward under selective recomputation: one
  // layer's slab, shared by every slot.
  bool selective = false;
};

// A row a split backward keeps from B to W: an output gradient of one of
// the part's linear layers.
struct SplitRow {
  int64_t floats = 0;  // per layer and microbatch
  // A row that B is done with when this one is written, whose place it
  // takes where that one is as large and has its own slab per layer and
  // slot (not under full recomputation): a row's name, "stream" (the
  // residual stream after the part's pair), or "" (none).
  std::string in_place_of;
};

class ModelPart {
 public:
  virtual ~ModelPart() = default;
  // Every tensor it may have: a block part's, of any layer.
  virtual std::vector<PartTensor> Tensors(const GptConfig& config) const = 0;
  // A block part's tensors in block `layer` (Tensors but where the part
  // differs by layer).
  virtual std::vector<PartTensor> TensorsAt(const GptConfig& config,
                                            int /*layer*/) const {
    return Tensors(config);
  }
  // Its rows of the activation table (PartPass::Row 0, 1, ...), then a
  // split backward's (following them), for a stage of these sizes.
  virtual std::vector<ActivationRow> Rows(const StageActivationDims&) const {
    return {};
  }
  virtual std::vector<SplitRow> SplitRows(const StageActivationDims&) const {
    return {};
  }
  // The floats it needs in each of the working set's two hidden buffers
  // (BlockWork::hidden_a, hidden_b), free between the parts' calls.
  virtual int64_t HiddenFloats(const StageActivationDims&) const { return 0; }
  // FLOPs of one token's forward and backward through the part at
  // sequence length T: 6 per weight its matmuls multiply by, plus what it
  // computes between activations (attention's scores and mix).
  virtual double FlopsPerToken(const GptConfig& config, int T) const;
};

class PartPass;

// A part before the blocks (an embedding): the residual stream's first
// value is the sum of theirs.
class EmbeddingPart : public ModelPart {
 public:
  // out (B,Ts,C): the first part before the blocks writes it, the others
  // add to it; `tokens` (B,T) at positions from t0 (0 in training; under
  // cp, the cp rank's zigzag positions).
  virtual void Forward(const PartPass& p, float* out, const int32_t* tokens,
                       int t0) const = 0;
  // Its weights' gradients from dout (B,Ts,C), the stream's first value's.
  virtual void Backward(const PartPass& p, const float* dout,
                        const int32_t* tokens) const = 0;
};

// A norm of the residual stream. Rows (PartPass::Row): 0 its output
// (B,Ts,C), in the stored type; then what its backward reads.
class NormPart : public ModelPart {
 public:
  // Row 0 = norm(x) over x (B,Ts,C); with `branch`, of sum = x + branch
  // (the residual add before the norm, fused), written to `sum`.
  virtual void Forward(const PartPass& p, const float* x, const float* branch,
                       float* sum) const = 0;
  // dx (B,Ts,C) += the gradient through the norm of dout, its output's;
  // the norm's weight gradients accumulate. x: Forward's input (its sum).
  virtual void Backward(const PartPass& p, float* dx, const float* dout,
                        const float* x) const = 0;
};

// A sublayer of a block (attention, the MLP): reads a norm's output, adds
// its own to the residual stream.
class SublayerPart : public ModelPart {
 public:
  // out (B,Ts,C) from in (B,Ts,C, the norm's output row).
  virtual void Forward(const PartPass& p, kernels::ConstAct in,
                       float* out) const = 0;
  // din (B,Ts,C, written) from dout (B,Ts,C), the output's gradient;
  // weight gradients accumulate (a split backward's B: the norm-free part
  // only; its output gradients stay in its rows for W).
  virtual void Backward(const PartPass& p, float* din, const float* dout,
                        kernels::ConstAct in) const = 0;
  // A split backward's W: the weight gradients from what B kept.
  virtual void BackwardWeights(const PartPass& p,
                               kernels::ConstAct in) const = 0;
};

// The output head: logits over this rank's vocabulary rows (Vp/tp of
// them) from the final norm's output, never gathered.
class HeadPart : public ModelPart {
 public:
  // Reads the token embedding's table (wherever the stage holds it: the
  // stage gives its place) rather than a tensor of its own.
  virtual bool tied() const = 0;
  // logits (B,T,Vl) from in (B,Ts,C).
  virtual void Forward(const PartPass& p, kernels::ConstAct in,
                       kernels::Act logits) const = 0;
  // din (B,Ts,C, written) from dlogits; its weight's gradient accumulates
  // (but in a split backward's B).
  virtual void Backward(const PartPass& p, float* din,
                        kernels::ConstAct dlogits,
                        kernels::ConstAct in) const = 0;
  // A split backward's W: its weight's gradient.
  virtual void BackwardWeights(const PartPass& p, kernels::ConstAct dlogits,
                               kernels::ConstAct in) const = 0;
};

// A model's parts in the order its tensors are laid out: those before the
// blocks (stage 0), each block's, those after them (the last stage).
struct ModelParts {
  std::vector<std::unique_ptr<ModelPart>> before, block, after;
  // `before` as embeddings, in order.
  std::vector<const EmbeddingPart*> embeddings;
  void AddEmbedding(std::unique_ptr<EmbeddingPart> part);
  // `after`: the final norm, then the head.
  const NormPart* final_norm = nullptr;
  const HeadPart* head = nullptr;
  void SetOutput(std::unique_ptr<NormPart> norm,
                 std::unique_ptr<HeadPart> head);
  // The block as its (norm, sublayer) pairs: block[2i] and block[2i + 1].
  std::vector<std::pair<const NormPart*, const SublayerPart*>> pairs;
  void AddPair(std::unique_ptr<NormPart> norm,
               std::unique_ptr<SublayerPart> sublayer);
};
const ModelParts& Gpt2Parts();
// The parts of config.arch (model.arch): "gpt" is GPT-2's (Gpt2Parts, or
// with an untied head where config.tie_embeddings is false); "llama" is
// the token embedding, blocks of RMSNorm, grouped-query attention with
// rotary positions, RMSNorm and a SwiGLU MLP, a final RMSNorm and the head
// (tied or not). With config.moe's experts, the MLP is MoeMlpPart (GELU
// experts for gpt, SwiGLU for llama) in every model.moe.every-th block and
// the dense one in the others (InterleavedMlpPart). Another name
// is a programming error (the spec was validated): PT_CHECK fails.
const ModelParts& ModelPartsOf(const GptConfig& config);

// What every attention part keeps: the attention's grouped qkv row
// (B,T,Cl+2Kl; multi-head attention's 3Cl) and its output (B,T,Cl), in the
// stored type, and what attention keeps for its backward (recomputed under
// selective recomputation); and the FLOPs of its scores and mix a token (2·C·T
// multiply-adds each forward, twice that backward).
std::vector<ActivationRow> AttentionRows(const StageActivationDims& d);
double AttentionScoreFlops(const GptConfig& config, int T);

// The parts, one by one (the model config chooses among them).
// parts/token_embedding.cc: wte, split by vocabulary rows over tp.
std::unique_ptr<EmbeddingPart> TokenEmbeddingPart();
// parts/position_embedding.cc: wpe, learned positions.
std::unique_ptr<EmbeddingPart> PositionEmbeddingPart();
// parts/lm_head.cc: the head tied to the token embedding (no tensor of its
// own), or with a table of its own (lm_head.weight).
std::unique_ptr<HeadPart> TiedHeadPart();
std::unique_ptr<HeadPart> UntiedHeadPart();
// parts/layer_norm.cc: <prefix>.weight, .bias in the block's unit `unit`.
std::unique_ptr<NormPart> LayerNormPart(std::string prefix, int unit);
// parts/rms_norm.cc: <prefix>.weight (no bias), eps config.norm_eps.
std::unique_ptr<NormPart> RmsNormPart(std::string prefix, int unit);
// parts/multi_head_attention.cc: attn.c_attn, attn.c_proj.
std::unique_ptr<SublayerPart> MultiHeadAttentionPart();
// parts/gelu_mlp.cc: mlp.c_fc, mlp.c_proj.
std::unique_ptr<SublayerPart> GeluMlpPart();
// parts/grouped_query_attention.cc: attn.q_proj, k_proj, v_proj, o_proj,
// with rotary positions (config.rope) and config.kv_heads() key and value
// heads.
std::unique_ptr<SublayerPart> GroupedQueryAttentionPart();
// parts/swiglu_mlp.cc: mlp.gate_up_proj, mlp.down_proj (config.hidden()).
std::unique_ptr<SublayerPart> SwigluMlpPart();
// parts/moe_mlp.cc: mlp.router, mlp.experts.<e>.* and mlp.shared.* (the
// dense MLP's tensors, without biases: SwiGLU's with `swiglu`, else GELU's),
// config.moe's experts.
std::unique_ptr<SublayerPart> MoeMlpPart(bool swiglu);
// parts/interleaved_mlp.cc: `moe` in the blocks config.moe.HasExperts
// names (model.moe.every), `dense` in the others.
std::unique_ptr<SublayerPart> InterleavedMlpPart(
    std::unique_ptr<SublayerPart> dense, std::unique_ptr<SublayerPart> moe);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_MODEL_PARTS_H_
