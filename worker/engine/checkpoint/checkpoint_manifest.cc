// CheckpointReader::Open (checkpoint.h): reads manifest.json, verifies it
// against manifest.sha256, then Load checks every number in it before any
// shard is read (docs/checkpoints.md lists the rules). Here the steps on
// what it records of the run (format, progress, model, vocabulary, owner,
// layout) and the check that its tensors are its model's; the index of
// files and tensors is checkpoint_index.cc's. Not the reads (checkpoint.cc)
// nor the writing (checkpoint_writer.cc).
#include <algorithm>
#include <filesystem>
#include <memory>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/mesh.h"
#include "common/spec.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_internal.h"
#include "worker/engine/checkpoint/checkpoint_json.h"
#include "worker/engine/data/data.h"
#include "worker/engine/model/model_parts.h"

namespace ptrain {

namespace fs = std::filesystem;
using json = nlohmann::json;
using manifest_json::Bool;
using manifest_json::Hex64;
using manifest_json::Int;
using manifest_json::Int32;
using manifest_json::kMaxJsonDepth;
using manifest_json::Number;
using manifest_json::ObjectAt;
using manifest_json::ParseJson;
using manifest_json::String;
using manifest_json::Uint64;

namespace {

// What a reader accepts of the run's record (docs/checkpoints.md; the
// index's limits are in checkpoint_index.cc). Far above any real model, far
// below where int64 arithmetic on them could overflow.
constexpr int64_t kMaxTokens = int64_t{1} << 62;
constexpr int64_t kMaxModelDim = 1 << 24;  // n_head, n_embd, block_size, V
constexpr int64_t kMaxLayers = 1 << 16;
// dp, tp, pp: at most kMaxDegree, the spec's bound (common/spec.h), and the
// spec's text at most kMaxSpecBytes.
// A character is at most four bytes of UTF-8.
constexpr int64_t kMaxVocabBytes = int64_t{4} * CharTokenizer::kMaxSize;

// A manifest's model.moe into `e`: the first field that is wrong.
absl::Status ReadMoe(const json& moe, GptConfig::Moe* e) {
  absl::Status s = absl::OkStatus();
  auto check = [&](absl::Status next) {
    if (s.ok()) s = std::move(next);
  };
  std::string router;
  double capacity = 0, aux = 0, z = 0;
  check(Int32(moe, "model.moe", "experts", 1, 1 << 10, &e->experts));
  check(Int32(moe, "model.moe", "top_k", 1, e->experts, &e->top_k));
  check(Int32(moe, "model.moe", "shared_experts", 0, 64, &e->shared));
  check(Int32(moe, "model.moe", "expert_hidden", 1, kMaxModelDim, &e->hidden));
  // every (absent: 1, every block).
  if (moe.contains("every")) {
    check(Int32(moe, "model.moe", "every", 1, 1 << 12, &e->every));
  }
  check(String(moe, "model.moe", "router", 16, &router));
  check(Number(moe, "model.moe", "capacity_factor", 0, 1e3, &capacity));
  check(Number(moe, "model.moe", "aux_loss_coef", 0, 1e3, &aux));
  check(Number(moe, "model.moe", "z_loss_coef", 0, 1e3, &z));
  if (!s.ok()) return s;
  const auto named = RouterNamed(router);
  if (!named.has_value()) {
    return absl::InvalidArgumentError("model.moe.router=\"" + router +
                                      "\" is neither softmax nor sigmoid");
  }
  e->router = *named;
  e->capacity_factor = static_cast<float>(capacity);
  e->aux_coef = static_cast<float>(aux);
  e->z_coef = static_cast<float>(z);
  // balance: bias (absent: aux).
  if (moe.contains("bias_update_rate")) {
    double rate = 0;
    check(Number(moe, "model.moe", "bias_update_rate", 0, 1, &rate));
    e->bias = true;
    e->bias_rate = static_cast<float>(rate);
  }
  return s;
}

}  // namespace

absl::Status CheckpointReader::Damaged(const std::string& what) const {
  return absl::DataLossError(
      absl::StrCat("checkpoint ", dir_, " is damaged: ", what));
}

absl::Status CheckpointReader::Damaged(const absl::Status& field_error) const {
  return Damaged(std::string(field_error.message()));
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& dir, const ConfinedFs& fs, const std::string& field) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->dir_ = dir;
  r->fs_ = fs;
  r->field_ = field;
  auto has_manifest = fs.Exists(Join(dir, kManifest), field);
  if (!has_manifest.ok()) return has_manifest.status();
  if (!*has_manifest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", dir, "' is not a committed checkpoint (no manifest.json)"));
  }
  // The digest first: it says whether the manifest is the one written.
  auto digest = fs.ReadFile(Join(dir, kDigestFile), field, 4096);
  if (!digest.ok()) {
    switch (digest.status().code()) {
      case absl::StatusCode::kNotFound:
        return r->Damaged(
            "it has no manifest.sha256 (the digest of manifest.json)");
      case absl::StatusCode::kResourceExhausted:
      case absl::StatusCode::kInvalidArgument:
        return r->Damaged("manifest.sha256 is not a SHA-256 line");
      default:
        return digest.status();
    }
  }
  auto text = fs.ReadFile(Join(dir, kManifest), field, kMaxManifestBytes);
  if (!text.ok()) {
    if (text.status().code() == absl::StatusCode::kResourceExhausted ||
        text.status().code() == absl::StatusCode::kInvalidArgument) {
      return r->Damaged(std::string(text.status().message()));
    }
    return text.status();
  }
  if (const std::string bad = CheckManifestDigest(*digest, *text);
      !bad.empty()) {
    return r->Damaged(bad);
  }
  const std::optional<json> m = ParseJson(*text);
  if (!m.has_value()) {
    return r->Damaged(
        absl::StrCat("manifest.json is not JSON (or nests more than ",
                     kMaxJsonDepth, " levels)"));
  }
  if (auto s = r->Load(*m); !s.ok()) return s;
  return r;
}

absl::Status CheckpointReader::Verify(const std::string& dir,
                                      const std::string& manifest_text,
                                      const ConfinedFs& fs,
                                      const std::string& field) {
  CheckpointReader r;
  r.dir_ = dir;
  r.fs_ = fs;
  r.field_ = field;
  const std::optional<json> m = ParseJson(manifest_text);
  if (!m.has_value()) {
    return r.Damaged(
        absl::StrCat("manifest.json is not JSON (or nests more than ",
                     kMaxJsonDepth, " levels)"));
  }
  return r.Load(*m);
}

absl::Status CheckpointReader::Load(const json& m) {
  // Every number is checked here, before anything is read from a shard
  // (docs/checkpoints.md has the rules), in the manifest's order: what it
  // says of the run, then its files, then its tensors.
  auto byte_vocab = CheckFormat(m);
  if (!byte_vocab.ok()) return byte_vocab.status();
  if (auto s = LoadProgressAndModel(m); !s.ok()) return s;
  if (auto s = LoadVocabAndSpec(m, *byte_vocab); !s.ok()) return s;
  if (auto s = LoadOwnerAndDataDigest(m); !s.ok()) return s;
  if (auto s = LoadLayout(m); !s.ok()) return s;
  if (auto s = LoadFiles(m); !s.ok()) return s;
  if (auto s = LoadTensors(m); !s.ok()) return s;
  if (auto s = CheckFilesTiled(); !s.ok()) return s;
  if (auto s = CheckOwnModel(); !s.ok()) return s;
  // Only now the files.
  return OpenShardFiles();
}

absl::StatusOr<bool> CheckpointReader::CheckFormat(const json& m) const {
  std::string format;
  if (auto s = String(m, "", "format", 64, &format); !s.ok()) {
    return Damaged(s);
  }
  const bool byte_vocab = format == kByteVocabFormat;
  if (format != kFormat && !byte_vocab) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", dir_, " has format ", Quote(format),
        "; this ptworker reads ", kFormat, " and ", kByteVocabFormat));
  }
  return byte_vocab;
}

absl::Status CheckpointReader::LoadProgressAndModel(const json& m) {
  CheckpointMeta& meta = meta_;
  absl::Status s = absl::OkStatus();
  auto check = [&](absl::Status next) {
    if (s.ok()) s = std::move(next);
  };
  check(Int(m, "", "step", 0, kMaxStep, &meta.step));
  check(Int(m, "", "tokens_seen", 0, kMaxTokens, &meta.tokens_seen));
  if (s.ok()) {
    check(Int(m, "", "optimizer_step", 0, meta.step, &meta.optimizer_step));
  }
  if (!s.ok()) return Damaged(s);

  auto sampler = ObjectAt(m, "", "sampler");
  if (!sampler.ok()) return Damaged(sampler.status());
  check(Uint64(**sampler, "sampler", "seed", &meta.seed));
  if ((*sampler)->contains("skipped_steps")) {
    check(Int(**sampler, "sampler", "skipped_steps", 0, kMaxStep,
              &meta.skipped_steps));
  }
  auto model = ObjectAt(m, "", "model");
  if (!model.ok()) return Damaged(model.status());
  GptConfig& c = meta.model;
  check(Int32(**model, "model", "n_layer", 1, kMaxLayers, &c.n_layer));
  check(Int32(**model, "model", "n_head", 1, kMaxModelDim, &c.n_head));
  check(Int32(**model, "model", "n_embd", 1, kMaxModelDim, &c.n_embd));
  check(Int32(**model, "model", "block_size", 1, kMaxModelDim, &c.block_size));
  check(Int32(**model, "model", "vocab_size", 1, kMaxModelDim, &c.vocab_size));
  // Absent in checkpoints written before the field: GPT-2's tied head.
  if ((*model)->contains("tie_embeddings")) {
    check(Bool(**model, "model", "tie_embeddings", &c.tie_embeddings));
  }
  if (!s.ok()) return Damaged(s);
  if (c.n_embd % c.n_head != 0) {
    return Damaged(absl::StrCat("model.n_head=", c.n_head,
                                " does not divide model.n_embd=", c.n_embd));
  }
  // Absent in checkpoints written before the field, and for GPT-2.
  if ((*model)->contains("arch")) {
    check(String(**model, "model", "arch", 16, &c.arch));
    if (s.ok() && c.arch != "gpt" && c.arch != "llama") {
      return Damaged("model.arch=\"" + c.arch + "\" is neither gpt nor llama");
    }
  }
  if (s.ok() && c.arch == "llama") {
    check(Int32(**model, "model", "n_kv_head", 1, c.n_head, &c.n_kv_head));
    check(
        Int32(**model, "model", "ffn_hidden", 1, kMaxModelDim, &c.ffn_hidden));
    // Absent: heads of the width, no query/key norms.
    if ((*model)->contains("head_dim")) {
      check(Int32(**model, "model", "head_dim", 2, kMaxModelDim, &c.head_dim));
    }
    if ((*model)->contains("qk_norm")) {
      check(Bool(**model, "model", "qk_norm", &c.qk_norm));
    }
    double eps = 0, theta = 0, factor = 0, low = 0, high = 0;
    check(Number(**model, "model", "norm_eps", 0, 1, &eps));
    auto rope = ObjectAt(**model, "model", "rope");
    if (!rope.ok()) return Damaged(rope.status());
    check(Number(**rope, "model.rope", "theta", 1, 1e12, &theta));
    check(Number(**rope, "model.rope", "factor", 0, 1e6, &factor));
    check(Number(**rope, "model.rope", "low_freq_factor", 0, 1e6, &low));
    check(Number(**rope, "model.rope", "high_freq_factor", 0, 1e6, &high));
    check(Int32(**rope, "model.rope", "original_context", 0, kMaxModelDim,
                &c.rope.original_context));
    if (!s.ok()) return Damaged(s);
    if (c.n_head % c.n_kv_head != 0) {
      return Damaged(absl::StrCat("model.n_kv_head=", c.n_kv_head,
                                  " does not divide model.n_head=", c.n_head));
    }
    c.norm_eps = static_cast<float>(eps);
    c.rope.theta = static_cast<float>(theta);
    c.rope.factor = static_cast<float>(factor);
    c.rope.low_freq_factor = static_cast<float>(low);
    c.rope.high_freq_factor = static_cast<float>(high);
  }
  // Absent where the model has no experts.
  if (s.ok() && (*model)->contains("moe")) {
    auto moe = ObjectAt(**model, "model", "moe");
    if (!moe.ok()) return Damaged(moe.status());
    check(ReadMoe(**moe, &c.moe));
  }
  if (!s.ok()) return Damaged(s);
  return absl::OkStatus();
}

absl::Status CheckpointReader::LoadVocabAndSpec(const json& m,
                                                bool byte_vocab) {
  CheckpointMeta& meta = meta_;
  const GptConfig& c = meta.model;
  absl::Status s = absl::OkStatus();
  auto check = [&](absl::Status next) {
    if (s.ok()) s = std::move(next);
  };
  check(String(m, "", "vocab", byte_vocab ? 256 : kMaxVocabBytes, &meta.vocab));
  check(String(m, "", "spec", static_cast<int64_t>(kMaxSpecBytes),
               &meta.spec_yaml));
  if (!s.ok()) return Damaged(s);
  if (meta.vocab.empty()) return absl::OkStatus();
  if (byte_vocab) {
    // One byte a character, in byte order: as code points U+0000..U+00FF
    // (the same text for the ASCII vocabularies such checkpoints hold).
    std::string utf8;
    for (unsigned char b : meta.vocab) AppendChar(b, &utf8);
    meta.vocab = std::move(utf8);
  }
  auto vocab = CharTokenizer::FromVocab(meta.vocab);
  if (!vocab.ok()) {
    return Damaged("vocab: " + std::string(vocab.status().message()));
  }
  if (vocab->size() != c.vocab_size) {
    return Damaged(
        absl::StrCat("vocab has ", vocab->size(),
                     " characters but model.vocab_size=", c.vocab_size));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::LoadOwnerAndDataDigest(const json& m) {
  CheckpointMeta& meta = meta_;
  if (m.contains("job_uid")) {
    if (auto st = String(m, "", "job_uid", kMaxUidLength, &meta.job_uid);
        !st.ok()) {
      return Damaged(st);
    }
  }
  // Absent (format 3, or a writer that did not know the data): unknown.
  if (auto it = m.find("data_digest"); it != m.end()) {
    uint64_t d = 0;
    if (!Hex64(*it, &d)) {
      return Damaged("data_digest is not 16 lowercase hex digits");
    }
    meta.data_digest = d;
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::LoadLayout(const json& m) {
  CheckpointMeta& meta = meta_;
  absl::Status s = absl::OkStatus();
  auto check = [&](absl::Status next) {
    if (s.ok()) s = std::move(next);
  };
  auto layout = ObjectAt(m, "", "layout");
  if (!layout.ok()) return Damaged(layout.status());
  // The dimensions every checkpoint names first, then zero and world, then
  // those newer checkpoints add (absent: degree 1).
  meta.degrees.clear();
  const auto& dims = MeshDimensions();
  ParallelLayout recorded;
  recorded.degrees.assign(dims.size(), 1);
  auto degree = [&](size_t i) {
    const std::string name(dims[i].name);
    int& d = meta.degrees[name];
    d = 1;
    if (!dims[i].named_at_one && !(*layout)->contains(name)) return;
    check(Int32(**layout, "layout", name, 1, kMaxDegree, &d));
    recorded.degrees[i] = d;
  };
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].named_at_one) degree(i);
  }
  check(Int32(**layout, "layout", "zero", 0, 3, &meta.zero));
  check(Int32(**layout, "layout", "world", 1, kMaxWorld, &meta.world));
  for (size_t i = 0; i < dims.size(); ++i) {
    if (!dims[i].named_at_one) degree(i);
  }
  if (!s.ok()) return Damaged(s);
  if (recorded.world_size() != meta.world) {
    return Damaged(absl::StrCat("layout.world=", meta.world, " is not ",
                                recorded.FactorsSpelt("layout.", "", true)));
  }
  // The folder's name, when it is a step folder, is the manifest's step.
  std::string base = dir_;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const int64_t named = StepNumber(fs::path(base).filename().string());
  if (named >= 0 && named != meta.step) {
    return Damaged(absl::StrCat("it is folder ", StepName(named),
                                " but its manifest has step=", meta.step));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::CheckOwnModel() const {
  // The tensors are the model's: weights and both moments of every tensor
  // GptTensors(model) has, with its shapes. (Counted first, so that the
  // table built for the comparison is no larger than the manifest.)
  const GptConfig& c = meta_.model;
  const ModelParts& parts = ModelPartsOf(c);
  int64_t count = 0;
  for (const auto* list : {&parts.before, &parts.after}) {
    for (const auto& part : *list) count += part->Tensors(c).size();
  }
  for (int l = 0; l < c.n_layer; ++l) {
    for (const auto& part : parts.block) count += part->TensorsAt(c, l).size();
  }
  const int64_t needed = 3 * count;
  if (static_cast<int64_t>(shapes_.size()) < needed) {
    return Damaged(absl::StrCat("model.n_layer=", c.n_layer, " needs ", needed,
                                " tensors but the manifest has ",
                                shapes_.size()));
  }
  if (auto own = CheckCompatible(c, GptTensors(c)); !own.ok()) {
    return Damaged(absl::StrCat("its tensors do not match its own model: ",
                                own.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::CheckCompatible(
    const GptConfig& model, const std::vector<ParamInfo>& layout) const {
  // The experts first: their tensors' names say less.
  const GptConfig::Moe &theirs = meta_.model.moe, &ours = model.moe;
  if (theirs.experts != ours.experts || theirs.shared != ours.shared ||
      theirs.hidden != ours.hidden || theirs.every != ours.every) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", dir_, "' does not fit the model: model.moe.experts=",
        theirs.experts, ", shared_experts=", theirs.shared,
        ", expert_hidden=", theirs.hidden, " and every=", theirs.every,
        " in the checkpoint but ", ours.experts, ", ", ours.shared, ", ",
        ours.hidden, " and ", ours.every, " in the model"));
  }
  // The attention's heads and norms (Qwen3's), before the tensors they
  // shape and name.
  const GptConfig& their = meta_.model;
  // Heads apart from the width only: a width or head count that differs
  // is left to the checks below, which name it.
  auto apart = [](const GptConfig& c) {
    return c.head_dim > 0 && c.head_dim != c.n_embd / c.n_head ? c.head_dim : 0;
  };
  if (apart(their) != apart(model) || their.qk_norm != model.qk_norm) {
    auto name = [](bool b) { return b ? "true" : "false"; };
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", dir_, "' does not fit the model: heads of ",
        their.head_size(), " channels (model.head_dim) and model.qk_norm=",
        name(their.qk_norm), " in the checkpoint but ", model.head_size(),
        " and ", name(model.qk_norm), " in the model"));
  }
  for (const ParamInfo& p : layout) {
    for (const std::string& n :
         {p.name, ExpAvgName(p.name), ExpAvgSqName(p.name)}) {
      auto it = shapes_.find(n);
      if (it == shapes_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint '", dir_,
                         "' does not fit the model: it has no tensor ", n));
      }
      if (it->second != p.global_shape) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint '", dir_, "' does not fit the model: tensor ", n,
            " has shape ", ShapeString(it->second), " in the checkpoint but ",
            ShapeString(p.global_shape), " in the model"));
      }
    }
  }
  const GptConfig& c = meta_.model;
  for (auto [field, theirs, ours] :
       {std::tuple<const char*, int, int>{"n_layer", c.n_layer, model.n_layer},
        {"n_head", c.n_head, model.n_head},
        {"n_embd", c.n_embd, model.n_embd},
        {"block_size", c.block_size, model.block_size},
        {"vocab_size", c.vocab_size, model.vocab_size}}) {
    if (theirs != ours) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint '", dir_, "' does not fit the model: model.", field, "=",
          theirs, " in the checkpoint but ", ours, " in the model"));
    }
  }
  if (c.arch != model.arch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", dir_, "' does not fit the model: model.arch=", c.arch,
        " in the checkpoint but ", model.arch, " in the model"));
  }
  if (c.kv_heads() != model.kv_heads() || c.hidden() != model.hidden()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", dir_,
        "' does not fit the model: model.n_kv_head=", c.kv_heads(),
        " and the MLP's hidden width ", c.hidden(), " in the checkpoint but ",
        model.kv_heads(), " and ", model.hidden(), " in the model"));
  }
  if (c.tie_embeddings != model.tie_embeddings) {
    auto name = [](bool b) { return b ? "true" : "false"; };
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", dir_, "' does not fit the model: model.tie_embeddings=",
        name(c.tie_embeddings), " in the checkpoint but ",
        name(model.tie_embeddings), " in the model"));
  }
  return absl::OkStatus();
}

}  // namespace ptrain
