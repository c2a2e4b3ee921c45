// See hf_checkpoint.h.
#include "worker/engine/checkpoint/hf_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hf_config.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/checkpoint_internal.h"

namespace ptrain {
namespace {

using json = nlohmann::json;

constexpr char kIndex[] = "model.safetensors.index.json";
constexpr char kSingle[] = "model.safetensors";
constexpr int64_t kMaxIndexBytes = int64_t{64} << 20;

// Buffers some published GPT-2 files hold beside the weights.
bool IsBuffer(const std::string& name) {
  return absl::EndsWith(name, ".attn.bias") ||
         absl::EndsWith(name, ".attn.masked_bias") ||
         absl::EndsWith(name, ".rotary_emb.inv_freq");
}

// A float field as the decimal it was written as (1e-5, not
// 9.99999974e-06).
double Decimal(float x) { return std::stod(absl::StrCat(x)); }

// The model fields config.json says for `c` (common/hf_config.h).
v1::ModelSpec ModelFields(const GptConfig& c) {
  v1::ModelSpec m;
  m.set_arch(c.arch);
  m.set_n_layer(c.n_layer);
  m.set_n_head(c.n_head);
  m.set_n_embd(c.n_embd);
  m.set_block_size(c.block_size);
  m.set_vocab_size(c.vocab_size);
  m.set_tie_embeddings(c.tie_embeddings);
  if (c.arch == "llama") {
    m.set_n_kv_head(c.kv_heads());
    m.set_ffn_hidden(c.hidden());
    m.set_norm_eps(Decimal(c.norm_eps));
    m.set_rope_theta(Decimal(c.rope.theta));
    if (c.head_dim > 0) m.set_head_dim(c.head_dim);
    m.set_qk_norm(c.qk_norm);
    if (c.rope.factor > 0) {
      v1::RopeScalingSpec* r = m.mutable_rope_scaling();
      r->set_factor(Decimal(c.rope.factor));
      r->set_low_freq_factor(Decimal(c.rope.low_freq_factor));
      r->set_high_freq_factor(Decimal(c.rope.high_freq_factor));
      r->set_original_context(c.rope.original_context);
    }
  }
  if (c.has_moe()) {
    v1::MoeSpec* moe = m.mutable_moe();
    moe->set_experts(c.moe.experts);
    moe->set_top_k(c.moe.top_k);
    moe->set_shared_experts(c.moe.shared);
    moe->set_expert_hidden(c.moe.hidden);
    moe->set_router(RouterName(c.moe.router));
    moe->set_aux_loss_coef(Decimal(c.moe.aux_coef));
    moe->set_every(c.moe.every);
  }
  return m;
}

// Reads box `box` of `name` in `file` into dst (the box's row-major
// order); with `transpose`, `file` holds the tensor transposed: its box
// (columns, rows) is read and turned (GPT-2's linear weights, either way).
absl::Status ReadPiece(TensorSource& file, const std::string& name,
                       const Box& box, bool transpose, float* dst) {
  if (!transpose) return file.Read(name, box, dst);
  Box t{{box.lo[1], box.lo[0]}, {box.hi[1], box.hi[0]}};
  std::vector<float> buf(t.numel());
  if (absl::Status s = file.Read(name, t, buf.data()); !s.ok()) return s;
  const int64_t rows = box.hi[0] - box.lo[0], cols = box.hi[1] - box.lo[1];
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = buf[j * rows + i];
  }
  return absl::OkStatus();
}

// Experts are written as Mixtral's (Qwen3-MoE's, with query/key norms),
// which has what Llama has and a router of softmax scores, the chosen ones
// normalised: no shared experts, no sigmoid router, more than one expert a
// token; Mixtral's experts in every block and no rope scaling (its config
// has none), Qwen3-MoE's in every decoder_sparse_step-th.
absl::Status MixtralCanHold(const GptConfig& c, const std::string& field) {
  if (!c.has_moe()) return absl::OkStatus();
  const std::string f = c.qk_norm ? "Qwen3-MoE" : "Mixtral";
  const std::string why =
      c.arch != "llama"  ? "Hugging Face has no GPT-2 with experts"
      : c.moe.shared > 0 ? f + " has no shared experts"
      : c.moe.router != kernels::math::RouterScore::kSoftmax
          ? f + "'s router is a softmax"
      : c.moe.top_k < 2   ? f + " weighs one expert a token by 1"
      : c.moe.bias        ? f + "'s router has no selection bias"
      : c.qk_norm         ? ""
      : c.moe.every > 1   ? "every " + f + " block has experts"
      : c.rope.factor > 0 ? f + "'s config has no rope scaling"
                          : "";
  if (why.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field,
      ": the model's experts (model.moe) have no Hugging Face layout: ", why));
}

}  // namespace

std::vector<HfTensorName> HfTensorNames(const GptConfig& c,
                                        const std::string& prefix) {
  std::vector<HfTensorName> out;
  const bool llama = c.arch == "llama";
  for (const ParamInfo& p : GptTensors(c)) {
    const std::vector<int64_t>& g = p.global_shape;
    HfTensorName n{"", p.name, g};
    std::string rest = p.name;
    if (p.name == "lm_head.weight") {
      n.hf = "lm_head.weight";
    } else if (!llama) {
      n.hf = prefix + p.name +
             (p.name == "wte" || p.name == "wpe" ? ".weight" : "");
      // GPT-2's Conv1D layers: (in, out).
      if (g.size() == 2 && absl::StartsWith(p.name, "h.") &&
          absl::EndsWith(p.name, ".weight") &&
          !absl::StrContains(p.name, ".ln_")) {
        n.transpose = true;
        n.hf_shape = {g[1], g[0]};
      }
    } else if (p.name == "wte") {
      n.hf = "model.embed_tokens.weight";
    } else if (p.name == "ln_f.weight") {
      n.hf = "model.norm.weight";
    } else {
      // h.<l>.<part>: model.layers.<l>.<its name>.
      const size_t dot = p.name.find('.', 2);
      const std::string layer = p.name.substr(2, dot - 2);
      const std::string part = p.name.substr(dot + 1);
      const std::string at = absl::StrCat("model.layers.", layer, ".");
      if (part == "mlp.gate_up_proj.weight") {
        const int64_t H = g[0] / 2;
        out.push_back({at + "mlp.gate_proj.weight", p.name, {H, g[1]}, 0});
        out.push_back({at + "mlp.up_proj.weight", p.name, {H, g[1]}, H});
        continue;
      }
      // Mixtral's experts: w1 the gate, w3 the up projection, w2 down;
      // Qwen3-MoE's: gate_proj, up_proj, down_proj under mlp.
      const bool qwen3 = c.qk_norm;
      if (absl::StartsWith(part, "mlp.experts.")) {
        const std::string expert = absl::StrCat(
            at, qwen3 ? "mlp.experts." : "block_sparse_moe.experts.",
            part.substr(12, part.find('.', 12) - 12), ".");
        if (absl::EndsWith(part, ".gate_up_proj.weight")) {
          const int64_t H = g[0] / 2;
          out.push_back({expert + (qwen3 ? "gate_proj.weight" : "w1.weight"),
                         p.name,
                         {H, g[1]},
                         0});
          out.push_back({expert + (qwen3 ? "up_proj.weight" : "w3.weight"),
                         p.name,
                         {H, g[1]},
                         H});
          continue;
        }
        n.hf = expert + (qwen3 ? "down_proj.weight" : "w2.weight");
        out.push_back(std::move(n));
        continue;
      }
      if (part == "mlp.router.weight") {
        n.hf =
            at + (qwen3 ? "mlp.gate.weight" : "block_sparse_moe.gate.weight");
        out.push_back(std::move(n));
        continue;
      }
      n.hf = at + (part == "ln_1.weight"   ? "input_layernorm.weight"
                   : part == "ln_2.weight" ? "post_attention_layernorm.weight"
                   : absl::StartsWith(part, "attn.")
                       ? "self_attn." + part.substr(5)
                       : part);
    }
    out.push_back(std::move(n));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<HfSource>> HfSource::Open(
    const std::string& dir, const GptConfig& config, const ConfinedFs& fs,
    const std::string& field) {
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", parts...));
  };
  std::unique_ptr<HfSource> src(new HfSource());
  // The files, and which holds each tensor.
  std::map<std::string, SafetensorsSource*> holder;
  auto open = [&](const std::string& file) -> absl::Status {
    auto f = SafetensorsSource::Open(dir + "/" + file, fs, field);
    if (!f.ok()) return f.status();
    src->files_.push_back(std::move(*f));
    return absl::OkStatus();
  };
  const std::string index_path = dir + "/" + kIndex;
  absl::StatusOr<bool> indexed = fs.Exists(index_path, field);
  if (!indexed.ok()) return indexed.status();
  if (*indexed) {
    auto text = fs.ReadFile(index_path, field, kMaxIndexBytes);
    if (!text.ok()) return text.status();
    const json j = json::parse(*text, nullptr, false);
    const json* map =
        j.is_object() && j.contains("weight_map") ? &j["weight_map"] : nullptr;
    if (map == nullptr || !map->is_object()) {
      return bad(index_path, ": no 'weight_map' object");
    }
    std::map<std::string, SafetensorsSource*> by_file;
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string()) {
        return bad(index_path, ": weight_map['", name, "'] is not a file name");
      }
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." ||
          f == "..") {
        return bad(index_path, ": weight_map['", name, "']='", f,
                   "' is not a file of the folder");
      }
      if (by_file.count(f) == 0) {
        if (absl::Status s = open(f); !s.ok()) return s;
        by_file[f] = src->files_.back().get();
      }
      if (by_file[f]->Find(name) == nullptr) {
        return bad(index_path, ": tensor '", name, "' is not in ", f);
      }
      holder[name] = by_file[f];
    }
    // A tensor of a shard the index leaves out is one the model lacks.
    for (const auto& [f, file] : by_file) {
      for (const SafetensorsEntry& e : file->header().tensors) {
        if (holder.count(e.name) == 0) {
          return bad(dir, "/", f, ": tensor '", e.name,
                     "' is not in the index's weight_map");
        }
      }
    }
  } else {
    if (absl::Status s = open(kSingle); !s.ok()) return s;
    for (const SafetensorsEntry& e : src->files_[0]->header().tensors) {
      holder[e.name] = src->files_[0].get();
    }
  }
  // GPT-2's names with or without "transformer.".
  const std::string prefix =
      config.arch == "gpt" && holder.count("transformer.wte.weight") > 0
          ? "transformer."
          : "";
  std::set<std::string> used;
  for (HfTensorName& n : HfTensorNames(config, prefix)) {
    auto it = holder.find(n.hf);
    if (it == holder.end()) {
      return bad(dir, " has no tensor '", n.hf, "' (", n.ours,
                 " of the model)");
    }
    const std::vector<int64_t>& shape = it->second->Find(n.hf)->shape;
    const bool positions = n.ours == "wpe" && shape.size() == 2 &&
                           shape[1] == n.hf_shape[1] &&
                           shape[0] >= n.hf_shape[0];
    if (shape != n.hf_shape && !positions) {
      return bad(dir, ": tensor '", n.hf, "' has shape ", ShapeString(shape),
                 "; the model needs ", ShapeString(n.hf_shape));
    }
    used.insert(n.hf);
    src->pieces_[n.ours].push_back({std::move(n), it->second});
  }
  for (const auto& [name, file] : holder) {
    if (used.count(name) > 0 || IsBuffer(name)) continue;
    if (name == "lm_head.weight" && config.tie_embeddings) continue;
    return bad(dir, " holds tensor '", name, "', which the model (",
               config.arch, ", ", config.n_layer, " layers",
               config.tie_embeddings ? ", tied head" : "", ") does not have");
  }
  return src;
}

absl::Status HfSource::Read(const std::string& name, const Box& box,
                            float* dst) {
  auto it = pieces_.find(name);
  if (it == pieces_.end()) {
    return absl::NotFoundError(absl::StrCat("no tensor ", name));
  }
  const int64_t width =
      box.numel() / std::max<int64_t>(1, box.hi[0] - box.lo[0]);
  for (const Piece& p : it->second) {
    // Its rows of the box, in its own coordinates.
    Box part = box;
    part.lo[0] = std::max(box.lo[0], p.name.row0);
    const int64_t rows =
        p.name.transpose ? p.name.hf_shape[1] : p.name.hf_shape[0];
    part.hi[0] = std::min(box.hi[0], p.name.row0 + rows);
    if (part.lo[0] >= part.hi[0]) continue;
    float* at = dst + (part.lo[0] - box.lo[0]) * width;
    part.lo[0] -= p.name.row0;
    part.hi[0] -= p.name.row0;
    if (absl::Status s =
            ReadPiece(*p.file, p.name.hf, part, p.name.transpose, at);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

namespace {

// ptrain's tensors (`source`) under their Hugging Face names.
class HfView : public TensorSource {
 public:
  HfView(TensorSource& source, const std::vector<HfTensorName>& names)
      : source_(source) {
    for (const HfTensorName& n : names) names_[n.hf] = n;
  }
  absl::Status Read(const std::string& name, const Box& box,
                    float* dst) override {
    const HfTensorName& n = names_.at(name);
    if (!n.transpose) {
      Box ours = box;
      ours.lo[0] += n.row0;
      ours.hi[0] += n.row0;
      return source_.Read(n.ours, ours, dst);
    }
    // The file's (in, out) box is ours transposed.
    return ReadPiece(source_, n.ours, box, /*transpose=*/true, dst);
  }

 private:
  TensorSource& source_;
  std::map<std::string, HfTensorName> names_;
};

absl::Status WriteText(const ConfinedFs& fs, const std::string& path,
                       const std::string& field, const std::string& text) {
  return WriteReplacing(fs, path, field, [&](ChunkedWriter& w) {
    return w.Write(text.data(), static_cast<int64_t>(text.size()));
  });
}

}  // namespace

absl::Status ExportHf(TensorSource& source, const GptConfig& config,
                      const std::string& out,
                      const std::vector<HfFile>& tokenizer_files,
                      const ConfinedFs& fs, const std::string& field,
                      SafetensorsDtype dtype, int64_t shard_bytes,
                      HfTokenIds tokens) {
  if (dtype != SafetensorsDtype::kF32 && dtype != SafetensorsDtype::kBf16) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the weights are written in F32 or BF16"));
  }
  if (absl::Status s = MixtralCanHold(config, field); !s.ok()) return s;
  const std::vector<HfTensorName> names =
      HfTensorNames(config, config.arch == "gpt" ? "transformer." : "");
  // Shards in the tensors' order, each at most shard_bytes (a larger
  // tensor alone).
  std::vector<std::vector<SafetensorsTensorOut>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const HfTensorName& n : names) {
    const int64_t bytes = ShapeNumel(n.hf_shape) * SafetensorsDtypeBytes(dtype);
    if (in_shard > 0 && in_shard + bytes > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back({n.hf, n.hf_shape, dtype});
    in_shard += bytes;
    total += bytes;
  }
  if (absl::Status s = fs.MakeDirs(out, field); !s.ok()) return s;
  HfView view(source, names);
  const int n = static_cast<int>(shards.size());
  json weight_map = json::object();
  for (int i = 0; i < n; ++i) {
    const std::string file =
        n == 1 ? kSingle
               : absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
    if (absl::Status s =
            WriteSafetensors(absl::StrCat(out, "/", file), shards[i], view,
                             {{"format", "pt"}}, fs, field);
        !s.ok()) {
      return s;
    }
    for (const SafetensorsTensorOut& t : shards[i]) weight_map[t.name] = file;
  }
  if (n > 1) {
    const json index = {{"metadata", {{"total_size", total}}},
                        {"weight_map", weight_map}};
    if (absl::Status s = WriteText(fs, absl::StrCat(out, "/", kIndex), field,
                                   index.dump(2) + "\n");
        !s.ok()) {
      return s;
    }
  }
  for (const HfFile& f : tokenizer_files) {
    if (absl::Status s =
            WriteText(fs, absl::StrCat(out, "/", f.name), field, f.bytes);
        !s.ok()) {
      return s;
    }
  }
  return WriteText(
      fs, absl::StrCat(out, "/config.json"), field,
      HfConfigJson(ModelFields(config),
                   dtype == SafetensorsDtype::kBf16 ? "bfloat16" : "float32",
                   tokens));
}

}  // namespace ptrain
