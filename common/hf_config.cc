// See hf_config.h.
#include "common/hf_config.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "nlohmann/json.hpp"

namespace ptrain {
namespace {

using json = nlohmann::json;

constexpr char kGpt2[] = "GPT2LMHeadModel";
constexpr char kLlama[] = "LlamaForCausalLM";
constexpr char kMixtral[] = "MixtralForCausalLM";
constexpr char kQwen3[] = "Qwen3ForCausalLM";
constexpr char kQwen3Moe[] = "Qwen3MoeForCausalLM";

// Each architecture read and written here with its config's model_type:
// a config without `architectures` is read by its model_type, and a config
// written names both.
struct HfModel {
  const char* arch;
  const char* type;
};
constexpr HfModel kHfModels[] = {{kGpt2, "gpt2"},
                                 {kLlama, "llama"},
                                 {kMixtral, "mixtral"},
                                 {kQwen3, "qwen3"},
                                 {kQwen3Moe, "qwen3_moe"}};

// The model_type of `arch` (one of kHfModels).
const char* ModelTypeOf(absl::string_view arch) {
  for (const HfModel& m : kHfModels) {
    if (arch == m.arch) return m.type;
  }
  return "";
}

absl::Status Bad(absl::string_view where, auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", parts...));
}

// The config's key `key`, or null where it is absent (or JSON null).
const json* Get(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

// A string value as it is, anything else as its JSON (for messages and
// comparisons with names).
std::string Text(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// An integer in [lo, hi] under `key`; `fallback` where absent (-1: the key
// is required).
absl::Status Int(const json& j, const char* key, int64_t lo, int64_t hi,
                 int64_t fallback, absl::string_view where, int64_t* out) {
  const json* v = Get(j, key);
  if (v == nullptr) {
    if (fallback < 0) return Bad(where, "'", key, "' is missing");
    *out = fallback;
    return absl::OkStatus();
  }
  if (!v->is_number_integer()) {
    return Bad(where, "'", key, "' is ", v->type_name(), ", not an integer");
  }
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX
                        ? INT64_MAX
                        : v->get<int64_t>();
  if (x < lo || x > hi) {
    return Bad(where, "'", key, "'=", x, " is outside [", lo, ", ", hi, "]");
  }
  *out = x;
  return absl::OkStatus();
}

absl::Status Number(const json& j, const char* key, double lo, double hi,
                    double fallback, absl::string_view where, double* out) {
  const json* v = Get(j, key);
  if (v == nullptr) {
    *out = fallback;
    return absl::OkStatus();
  }
  if (!v->is_number()) {
    return Bad(where, "'", key, "' is ", v->type_name(), ", not a number");
  }
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    return Bad(where, "'", key, "'=", x, " is outside [", lo, ", ", hi, "]");
  }
  *out = x;
  return absl::OkStatus();
}

absl::Status Flag(const json& j, const char* key, bool fallback,
                  absl::string_view where, bool* out) {
  const json* v = Get(j, key);
  if (v == nullptr) {
    *out = fallback;
    return absl::OkStatus();
  }
  if (!v->is_boolean()) {
    return Bad(where, "'", key, "' is ", v->type_name(), ", not true or false");
  }
  *out = v->get<bool>();
  return absl::OkStatus();
}

// `key` is absent, null, or `allowed` (false, 0, 1, ...).
absl::Status Unsupported(const json& j, const char* key, const json& allowed,
                         absl::string_view what, absl::string_view where) {
  const json* v = Get(j, key);
  if (v == nullptr || *v == allowed) return absl::OkStatus();
  return Bad(where, "'", key, "'=", v->dump(), ": ", what,
             " is not implemented");
}

absl::Status First(std::initializer_list<absl::Status> checks) {
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<HfConfig> Gpt2Config(const json& j, absl::string_view where) {
  int64_t L = 0, NH = 0, C = 0, P = 0, V = 0, inner = 0;
  double eps = 0;
  bool tie = true;
  const json* a = Get(j, "activation_function");
  const std::string act = a != nullptr ? Text(*a) : "gelu_new";
  if (absl::Status s = First({
          Int(j, "n_layer", 1, 1 << 12, -1, where, &L),
          Int(j, "n_head", 1, 1 << 12, -1, where, &NH),
          Int(j, "n_embd", 1, 1 << 17, -1, where, &C),
          Int(j, "n_positions", 1, 1 << 20, -1, where, &P),
          Int(j, "vocab_size", 1, 1 << 24, -1, where, &V),
          Number(j, "layer_norm_epsilon", 0, 1, 1e-5, where, &eps),
          Flag(j, "tie_word_embeddings", true, where, &tie),
          Int(j, "n_inner", 1, 1 << 20, 4 * C, where, &inner),
          Unsupported(j, "scale_attn_by_inverse_layer_idx", false,
                      "attention scaled by layer", where),
          Unsupported(j, "reorder_and_upcast_attn", false, "upcast attention",
                      where),
          Unsupported(j, "scale_attn_weights", true,
                      "attention without the 1/sqrt(head size) scale", where),
      });
      !s.ok()) {
    return s;
  }
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    return Bad(where, "'activation_function'=", act,
               ": only GELU's tanh approximation (gelu_new) is implemented");
  }
  if (std::fabs(eps - 1e-5) > 1e-12) {
    return Bad(where, "'layer_norm_epsilon'=", eps,
               ": GPT-2's LayerNorm here uses 1e-5");
  }
  if (inner != 4 * C) {
    return Bad(where, "'n_inner'=", inner,
               ": GPT-2's MLP here is 4·n_embd = ", 4 * C, " wide");
  }
  HfConfig c;
  v1::ModelSpec& m = c.model;
  m.set_arch("gpt");
  m.set_n_layer(static_cast<int>(L));
  m.set_n_head(static_cast<int>(NH));
  m.set_n_embd(static_cast<int>(C));
  m.set_vocab_size(static_cast<int>(V));
  m.set_tie_embeddings(tie);
  c.max_positions = static_cast<int>(P);
  return c;
}

// Llama 3's rope_scaling, where config.json has one, into m.
absl::Status ReadRopeScaling(const json& j, absl::string_view where,
                             v1::ModelSpec* m) {
  const json* r = Get(j, "rope_scaling");
  if (r == nullptr) return absl::OkStatus();
  if (!r->is_object()) {
    return Bad(where, "'rope_scaling' is ", r->type_name(),
               ", not an object or null");
  }
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (const json* t = Get(*r, key); t != nullptr && type.empty()) {
      type = Text(*t);
    }
  }
  if (type != "llama3") {
    return Bad(where, "'rope_scaling.rope_type'=", type,
               ": only Llama 3's scaling (llama3) is implemented");
  }
  double factor = 0, low = 0, high = 0;
  int64_t original = 0;
  const std::string at = absl::StrCat(where, ": rope_scaling");
  if (absl::Status s = First({
          Number(*r, "factor", 1e-6, 1e6, -1, at, &factor),
          Number(*r, "low_freq_factor", 1e-6, 1e6, 1, at, &low),
          Number(*r, "high_freq_factor", 1e-6, 1e6, 4, at, &high),
          Int(*r, "original_max_position_embeddings", 1, 1 << 24, -1, at,
              &original),
      });
      !s.ok()) {
    return s;
  }
  if (factor <= 0) return Bad(at, "'factor' is missing");
  if (high <= low) {
    return Bad(at, "'high_freq_factor'=", high,
               " must be greater than low_freq_factor=", low);
  }
  v1::RopeScalingSpec* rs = m->mutable_rope_scaling();
  rs->set_factor(factor);
  rs->set_low_freq_factor(low);
  rs->set_high_freq_factor(high);
  rs->set_original_context(static_cast<int>(original));
  return absl::OkStatus();
}

// What Llama, Mixtral and Qwen3 share: the embedding, the attention, the
// norms and rotary positions, the activation. The MLP's width is the
// caller's. Qwen3's attention normalises its query and key heads
// (model.qk_norm); its sliding window is off unless use_sliding_window.
absl::StatusOr<HfConfig> LlamaBody(const json& j, absl::string_view where,
                                   bool qwen3 = false) {
  int64_t L = 0, NH = 0, KVH = 0, C = 0, P = 0, V = 0, head_dim = 0, ptp = 0;
  double eps = 0, theta = 0;
  bool tie = false, attention_bias = false;
  const json* a = Get(j, "hidden_act");
  const std::string act = a != nullptr ? Text(*a) : "silu";
  if (absl::Status s = First({
          Int(j, "num_hidden_layers", 1, 1 << 12, -1, where, &L),
          Int(j, "num_attention_heads", 1, 1 << 12, -1, where, &NH),
          Int(j, "hidden_size", 1, 1 << 17, -1, where, &C),
          Int(j, "max_position_embeddings", 1, 1 << 24, 2048, where, &P),
          Int(j, "vocab_size", 1, 1 << 24, 32000, where, &V),
          Number(j, "rms_norm_eps", 0, 1, 1e-6, where, &eps),
          Number(j, "rope_theta", 1, 1e12, 10000, where, &theta),
          Flag(j, "tie_word_embeddings", false, where, &tie),
          Flag(j, "attention_bias", false, where, &attention_bias),
          Int(j, "pretraining_tp", 1, 1 << 12, 1, where, &ptp),
          qwen3 ? Unsupported(j, "use_sliding_window", false,
                              "sliding-window attention", where)
                : Unsupported(j, "sliding_window", json(),
                              "sliding-window attention", where),
          Unsupported(j, "qk_norm", false, "query/key normalization", where),
      });
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Int(j, "num_key_value_heads", 1, NH, NH, where, &KVH);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          Int(j, "head_dim", 1, 1 << 17, NH > 0 ? C / NH : 0, where, &head_dim);
      !s.ok()) {
    return s;
  }
  if (act != "silu") {
    return Bad(where, "'hidden_act'=", act,
               ": only SwiGLU's SiLU (silu) is implemented");
  }
  if (attention_bias) {
    return Bad(where,
               "'attention_bias'=true: biases in Llama's layers are not "
               "implemented");
  }
  if (ptp != 1) {
    return Bad(where, "'pretraining_tp'=", ptp,
               ": sliced projections are not implemented");
  }
  if (C % NH != 0) {
    return Bad(where, "'num_attention_heads'=", NH,
               " does not divide hidden_size=", C);
  }
  if (head_dim % 2 != 0) {
    return Bad(where, "'head_dim'=", head_dim,
               " is odd; rotary positions turn channel pairs of each head");
  }
  if (NH % KVH != 0) {
    return Bad(where, "'num_key_value_heads'=", KVH,
               " does not divide num_attention_heads=", NH);
  }
  HfConfig c;
  v1::ModelSpec& m = c.model;
  m.set_arch("llama");
  m.set_n_layer(static_cast<int>(L));
  m.set_n_head(static_cast<int>(NH));
  m.set_n_kv_head(static_cast<int>(KVH));
  m.set_n_embd(static_cast<int>(C));
  if (head_dim != C / NH) m.set_head_dim(static_cast<int>(head_dim));
  m.set_vocab_size(static_cast<int>(V));
  m.set_tie_embeddings(tie);
  m.set_norm_eps(eps);
  m.set_rope_theta(theta);
  m.set_qk_norm(qwen3);
  if (absl::Status s = ReadRopeScaling(j, where, &m); !s.ok()) return s;
  c.max_positions = static_cast<int>(P);
  return c;
}

absl::StatusOr<HfConfig> LlamaConfig(const json& j, absl::string_view where,
                                     bool qwen3 = false) {
  absl::StatusOr<HfConfig> c = LlamaBody(j, where, qwen3);
  if (!c.ok()) return c;
  int64_t H = 0;
  bool mlp_bias = false;
  if (absl::Status s = First({
          Int(j, "intermediate_size", 1, 1 << 20, -1, where, &H),
          Flag(j, "mlp_bias", false, where, &mlp_bias),
          Unsupported(j, "num_local_experts", json(), "a mixture of experts",
                      where),
          Unsupported(j, "num_experts", json(), "a mixture of experts", where),
      });
      !s.ok()) {
    return s;
  }
  if (mlp_bias) {
    return Bad(where,
               "'mlp_bias'=true: biases in Llama's layers are not implemented");
  }
  c->model.set_ffn_hidden(static_cast<int>(H));
  return c;
}

// Mixtral: Llama's body with a Mixture-of-Experts MLP (softmax router, the
// chosen scores normalised, no shared experts) of SwiGLU experts
// intermediate_size wide.
absl::StatusOr<HfConfig> MixtralConfig(const json& j, absl::string_view where) {
  absl::StatusOr<HfConfig> c = LlamaBody(j, where);
  if (!c.ok()) return c;
  int64_t H = 0, E = 0, k = 0;
  double aux = 0, jitter = 0;
  if (absl::Status s = First({
          Int(j, "intermediate_size", 1, 1 << 20, -1, where, &H),
          Int(j, "num_local_experts", 1, 1 << 10, 8, where, &E),
          Int(j, "num_experts_per_tok", 1, 1 << 10, 2, where, &k),
          Number(j, "router_aux_loss_coef", 0, 1e3, 0.001, where, &aux),
          Number(j, "router_jitter_noise", 0, 1e3, 0, where, &jitter),
      });
      !s.ok()) {
    return s;
  }
  if (k > E) {
    return Bad(where, "'num_experts_per_tok'=", k,
               " is more than num_local_experts=", E);
  }
  if (k == 1) {
    return Bad(where,
               "'num_experts_per_tok'=1: one expert a token is weighted by "
               "its score here, by 1 in Mixtral");
  }
  if (jitter != 0) {
    return Bad(where, "'router_jitter_noise'=", jitter,
               ": router jitter is not implemented");
  }
  c->model.set_ffn_hidden(static_cast<int>(H));
  v1::MoeSpec* moe = c->model.mutable_moe();
  moe->set_experts(static_cast<int>(E));
  moe->set_top_k(static_cast<int>(k));
  moe->set_expert_hidden(static_cast<int>(H));
  moe->set_aux_loss_coef(aux);
  return c;
}

// Qwen3-MoE: Qwen3's body with experts (softmax router, the chosen scores
// normalised: norm_topk_prob) moe_intermediate_size wide in every
// decoder_sparse_step-th block (model.moe.every), the dense MLP
// intermediate_size wide in the others.
absl::StatusOr<HfConfig> Qwen3MoeConfig(const json& j,
                                        absl::string_view where) {
  absl::StatusOr<HfConfig> c = LlamaBody(j, where, /*qwen3=*/true);
  if (!c.ok()) return c;
  int64_t H = 0, EH = 0, E = 0, k = 0, step = 0;
  double aux = 0;
  bool normalize = true;
  if (absl::Status s = First({
          Int(j, "intermediate_size", 1, 1 << 20, -1, where, &H),
          Int(j, "moe_intermediate_size", 1, 1 << 20, -1, where, &EH),
          Int(j, "num_experts", 1, 1 << 10, -1, where, &E),
          Int(j, "num_experts_per_tok", 1, 1 << 10, 8, where, &k),
          Int(j, "decoder_sparse_step", 1, 1 << 12, 1, where, &step),
          Number(j, "router_aux_loss_coef", 0, 1e3, 0.001, where, &aux),
          Flag(j, "norm_topk_prob", false, where, &normalize),
      });
      !s.ok()) {
    return s;
  }
  if (const json* only = Get(j, "mlp_only_layers");
      only != nullptr && !(only->is_array() && only->empty())) {
    return Bad(where, "'mlp_only_layers'=", only->dump(),
               ": dense blocks other than decoder_sparse_step's are not "
               "implemented");
  }
  if (k > E) {
    return Bad(where, "'num_experts_per_tok'=", k,
               " is more than num_experts=", E);
  }
  if (!normalize || k == 1) {
    return Bad(where, "'norm_topk_prob'=", normalize ? "true" : "false",
               " with num_experts_per_tok=", k,
               ": only the chosen scores normalised to sum 1, of 2 or more "
               "experts, are implemented");
  }
  if (step > c->model.n_layer()) {
    return Bad(where, "'decoder_sparse_step'=", step,
               " is more than num_hidden_layers=", c->model.n_layer());
  }
  c->model.set_ffn_hidden(static_cast<int>(H));
  v1::MoeSpec* moe = c->model.mutable_moe();
  moe->set_experts(static_cast<int>(E));
  moe->set_top_k(static_cast<int>(k));
  moe->set_expert_hidden(static_cast<int>(EH));
  moe->set_every(static_cast<int>(step));
  moe->set_aux_loss_coef(aux);
  return c;
}

}  // namespace

absl::StatusOr<HfConfig> ParseHfConfig(std::string_view text,
                                       absl::string_view where) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Bad(where, "not a JSON object");
  }
  std::string arch;
  if (const json* a = Get(j, "architectures")) {
    if (!a->is_array() || a->size() != 1 || !(*a)[0].is_string()) {
      return Bad(where, "'architectures' must list one name");
    }
    arch = (*a)[0].get<std::string>();
  } else if (const json* t = Get(j, "model_type"); t && t->is_string()) {
    arch = t->get<std::string>();
    for (const HfModel& m : kHfModels) {
      if (arch == m.type) arch = m.arch;
    }
  }
  if (arch == kGpt2) return Gpt2Config(j, where);
  if (arch == kLlama) return LlamaConfig(j, where);
  if (arch == kMixtral) return MixtralConfig(j, where);
  if (arch == kQwen3) return LlamaConfig(j, where, /*qwen3=*/true);
  if (arch == kQwen3Moe) return Qwen3MoeConfig(j, where);
  return Bad(where, "'architectures'=", arch.empty() ? "(none)" : arch,
             ": only ", kGpt2, ", ", kLlama, ", ", kMixtral, ", ", kQwen3,
             " and ", kQwen3Moe, " are implemented");
}

const char* HfArchitecture(bool llama, bool experts, bool qk_norm) {
  if (!llama) return kGpt2;
  if (qk_norm) return experts ? kQwen3Moe : kQwen3;
  return experts ? kMixtral : kLlama;
}

std::string HfConfigJson(const v1::ModelSpec& m, absl::string_view torch_dtype,
                         HfTokenIds tokens) {
  json j;
  if (m.arch() == "llama") {
    const v1::RopeScalingSpec r = RopeScaling(m);
    const v1::MoeSpec moe = MoeOf(m);
    // Query/key norms make the model a Qwen3 (with experts Qwen3-MoE);
    // else a Llama (with experts Mixtral).
    const bool experts = moe.experts() > 0, qwen3 = m.qk_norm();
    const char* arch = HfArchitecture(true, experts, qwen3);
    const char* type = ModelTypeOf(arch);
    const bool mixtral = experts && !qwen3;
    j = {{"architectures", {arch}},
         {"model_type", type},
         {"hidden_size", m.n_embd()},
         {"intermediate_size", FfnHidden(m)},
         {"num_hidden_layers", m.n_layer()},
         {"num_attention_heads", m.n_head()},
         {"num_key_value_heads", KvHeads(m)},
         {"head_dim", HeadDim(m)},
         {"max_position_embeddings", m.block_size()},
         {"vocab_size", m.vocab_size()},
         {"rms_norm_eps", NormEps(m)},
         {"rope_theta", RopeTheta(m)},
         {"rope_scaling", nullptr},
         {"hidden_act", "silu"},
         {"attention_bias", false},
         {"mlp_bias", false},
         {"tie_word_embeddings", TiesEmbeddings(m)},
         {"torch_dtype", std::string(torch_dtype)}};
    if (mixtral) {
      j["intermediate_size"] = moe.expert_hidden();
      j["num_local_experts"] = moe.experts();
      j["num_experts_per_tok"] = moe.top_k();
      j["router_aux_loss_coef"] = moe.aux_loss_coef();
      j["sliding_window"] = nullptr;
      j.erase("mlp_bias");
    }
    if (qwen3) {
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      j.erase("mlp_bias");
    }
    if (qwen3 && experts) {
      j["moe_intermediate_size"] = moe.expert_hidden();
      j["num_experts"] = moe.experts();
      j["num_experts_per_tok"] = moe.top_k();
      j["norm_topk_prob"] = true;
      j["decoder_sparse_step"] = moe.every();
      j["mlp_only_layers"] = json::array();
      j["router_aux_loss_coef"] = moe.aux_loss_coef();
    }
    if (r.factor() > 0) {
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", r.factor()},
          {"low_freq_factor", r.low_freq_factor()},
          {"high_freq_factor", r.high_freq_factor()},
          {"original_max_position_embeddings", r.original_context()}};
    }
  } else {
    j = {{"architectures", {kGpt2}},
         {"model_type", ModelTypeOf(kGpt2)},
         {"n_layer", m.n_layer()},
         {"n_head", m.n_head()},
         {"n_embd", m.n_embd()},
         {"n_positions", m.block_size()},
         {"n_ctx", m.block_size()},
         {"vocab_size", m.vocab_size()},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", 1e-5},
         {"tie_word_embeddings", TiesEmbeddings(m)},
         {"torch_dtype", std::string(torch_dtype)}};
  }
  if (tokens.bos >= 0) j["bos_token_id"] = tokens.bos;
  if (tokens.eos >= 0) j["eos_token_id"] = tokens.eos;
  return j.dump(2) + "\n";
}

absl::Status CheckSpecAgainstHf(const v1::ModelSpec& spec,
                                const HfConfig& config,
                                absl::string_view where) {
  const v1::ModelSpec& hf = config.model;
  auto differ = [&](const char* field, auto ours, auto theirs) {
    return Bad(where, "model.", field, "=", ours, " in the spec but ", theirs,
               " in the Hugging Face config; leave it out to take the "
               "config's, or give the same");
  };
  if (spec.arch() != hf.arch()) return differ("arch", spec.arch(), hf.arch());
  for (auto [field, ours, theirs] :
       {std::tuple<const char*, int, int>{"n_layer", spec.n_layer(),
                                          hf.n_layer()},
        {"n_head", spec.n_head(), hf.n_head()},
        {"n_embd", spec.n_embd(), hf.n_embd()},
        {"n_kv_head", KvHeads(spec), KvHeads(hf)},
        {"ffn_hidden", FfnHidden(spec), FfnHidden(hf)},
        {"head_dim", HeadDim(spec), HeadDim(hf)}}) {
    if (ours != theirs) return differ(field, ours, theirs);
  }
  const v1::MoeSpec e = MoeOf(spec), f = MoeOf(hf);
  for (auto [field, ours, theirs] :
       {std::tuple<const char*, int, int>{"moe.experts", e.experts(),
                                          f.experts()},
        {"moe.top_k", e.top_k(), f.top_k()},
        {"moe.shared_experts", e.shared_experts(), f.shared_experts()},
        {"moe.expert_hidden", e.expert_hidden(), f.expert_hidden()},
        {"moe.every", e.every(), f.every()}}) {
    if (ours != theirs) return differ(field, ours, theirs);
  }
  if (f.experts() > 0 && e.router() != f.router()) {
    return differ("moe.router", e.router(), f.router());
  }
  if (spec.vocab_size() != 0 && spec.vocab_size() != hf.vocab_size()) {
    return differ("vocab_size", spec.vocab_size(), hf.vocab_size());
  }
  if (spec.qk_norm() != hf.qk_norm()) {
    return differ("qk_norm", spec.qk_norm() ? "true" : "false",
                  hf.qk_norm() ? "true" : "false");
  }
  if (TiesEmbeddings(spec) != TiesEmbeddings(hf)) {
    return differ("tie_embeddings", TiesEmbeddings(spec) ? "true" : "false",
                  TiesEmbeddings(hf) ? "true" : "false");
  }
  if (spec.arch() == "llama") {
    const v1::RopeScalingSpec a = RopeScaling(spec), b = RopeScaling(hf);
    for (auto [field, ours, theirs] :
         {std::tuple<const char*, double, double>{"norm_eps", NormEps(spec),
                                                  NormEps(hf)},
          {"rope_theta", RopeTheta(spec), RopeTheta(hf)},
          {"rope_scaling.factor", a.factor(), b.factor()},
          {"rope_scaling.low_freq_factor", a.low_freq_factor(),
           b.low_freq_factor()},
          {"rope_scaling.high_freq_factor", a.high_freq_factor(),
           b.high_freq_factor()},
          {"rope_scaling.original_context",
           static_cast<double>(a.original_context()),
           static_cast<double>(b.original_context())}}) {
      if (ours != theirs) return differ(field, ours, theirs);
    }
  }
  if (spec.block_size() > config.max_positions) {
    return Bad(where, "model.block_size=", spec.block_size(),
               " is more positions than the model's ", config.max_positions);
  }
  return absl::OkStatus();
}

}  // namespace ptrain
