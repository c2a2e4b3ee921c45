// A Hugging Face model folder's config.json as ptrain's model fields
// (model.init_from: hf:DIR, and what `ptworker export --hf` writes back):
// GPT2LMHeadModel (model_type gpt2) as arch gpt, LlamaForCausalLM
// (model_type llama) as arch llama, MixtralForCausalLM (model_type
// mixtral) as arch llama with model.moe (softmax router, no shared
// experts), Qwen3ForCausalLM (qwen3) as arch llama with model.qk_norm and
// model.head_dim, Qwen3MoeForCausalLM (qwen3_moe) as that with model.moe
// (every decoder_sparse_step-th block). What ptrain does not implement is
// refused naming the key: another architecture, an activation other than
// GPT-2's tanh GELU or Llama's SiLU, biases in Llama's attention or MLP, an
// odd head_dim, a sliding window, a rope_scaling other than Llama 3's,
// experts in a Llama, Mixtral's router jitter or one expert a token,
// Qwen3-MoE's unnormalised scores or mlp_only_layers, and GPT-2's
// layer-scaled or upcast attention.
#ifndef PTRAIN_COMMON_HF_CONFIG_H_
#define PTRAIN_COMMON_HF_CONFIG_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/hf_tokenizer_export.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

struct HfConfig {
  // arch, n_layer, n_head, n_embd, vocab_size, tie_embeddings; for llama
  // n_kv_head, norm_eps, rope_theta, rope_scaling, ffn_hidden. Not
  // block_size (the job's sequence length), nor init_from.
  v1::ModelSpec model;
  int max_positions = 0;  // n_positions, max_position_embeddings
};

// config.json's text (`where` names it in errors): InvalidArgument naming
// the key and the rule.
absl::StatusOr<HfConfig> ParseHfConfig(std::string_view json,
                                       absl::string_view where);

// The Hugging Face architecture a model is written as: GPT2LMHeadModel
// (not llama), else Qwen3 with query/key norms, Llama without (each
// Mixture-of-Experts with experts: Qwen3MoeForCausalLM,
// MixtralForCausalLM).
const char* HfArchitecture(bool llama, bool experts, bool qk_norm);

// The config.json of `model` (arch gpt or llama, with experts Mixtral's;
// with query/key norms Qwen3's or Qwen3-MoE's;
// block_size as the maximum positions), as `ptworker export --hf` writes it;
// `torch_dtype` names the weights' type ("float32", "bfloat16"); `tokens` the
// tokenizer's special ids, where it has them.
std::string HfConfigJson(const v1::ModelSpec& model,
                         absl::string_view torch_dtype = "float32",
                         HfTokenIds tokens = {});

// The spec's model fields against config.json's: each field the config
// gives must be the spec's, and block_size at most its positions.
// InvalidArgument naming the field, both values and `where`.
absl::Status CheckSpecAgainstHf(const v1::ModelSpec& spec,
                                const HfConfig& config,
                                absl::string_view where);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_HF_CONFIG_H_
