// The rules of a valid job spec (ValidateJobSpec) and the split of the
// layers over pipeline stages that one of them checks. Messages name each
// field as `section.field=value` so the user can find it in the file or in
// a --set.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/echo.h"
#include "common/mesh.h"
#include "common/spec.h"
#include "common/spec_internal.h"
#include "common/utf8.h"

namespace ptrain {
namespace {

namespace pb = google::protobuf;
using spec_internal::JoinPath;
using spec_internal::OtherStages;
using spec_internal::OtherStagesOf;

absl::Status Error(auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

template <typename T>
absl::Status AtLeast(absl::string_view field, T value, T min) {
  if (value >= min) return absl::OkStatus();
  return Error(field, "=", value, " must be >= ", min);
}

// Upper bounds keep every product the engine forms from these fields (bytes
// of a tensor, tokens of a run) inside 64 bits; what fits the machine's
// memory is checked where the machine is known (the ranks).
template <typename T>
absl::Status InRange(absl::string_view field, T value, T min, T max) {
  if (value >= min && value <= max) return absl::OkStatus();
  return Error(field, "=", value, " must be between ", min, " and ", max);
}

absl::Status Positive(absl::string_view field, double value) {
  if (value > 0) return absl::OkStatus();
  return Error(field, "=", value, " must be > 0");
}

absl::Status OneOf(absl::string_view field, const std::string& value,
                   std::initializer_list<absl::string_view> allowed) {
  for (absl::string_view a : allowed) {
    if (value == a) return absl::OkStatus();
  }
  return Error(field, "=", EchoQuoted(value), " must be one of ",
               absl::StrJoin(allowed, ", "));
}

// Returns the first failed check; the checks are cheap and free of side
// effects, so evaluating all of them keeps each rule on one line.
absl::Status First(std::initializer_list<absl::Status> checks) {
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// NaN slips through every `x > 0` style rule the wrong way, so non-finite
// numbers are refused before a section's own rules run.
absl::Status CheckFinite(const pb::Message& msg, absl::string_view section) {
  const pb::Descriptor* desc = msg.GetDescriptor();
  const pb::Reflection* refl = msg.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const pb::FieldDescriptor* f = desc->field(i);
    if (f->is_repeated()) continue;
    double v = 0;
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_DOUBLE) {
      v = refl->GetDouble(msg, f);
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_FLOAT) {
      v = refl->GetFloat(msg, f);
    } else {
      continue;
    }
    if (!std::isfinite(v)) {
      return Error(section, ".", f->name(), "=", v, " must be a finite number");
    }
  }
  return absl::OkStatus();
}

// Every text field, in every section: UTF-8 (protobuf's wire format and
// every client expect it) and of a length a path or a prompt can have.
absl::Status CheckStrings(const pb::Message& msg, absl::string_view section) {
  constexpr size_t kMaxStringBytes = 64 << 10;
  const pb::Descriptor* desc = msg.GetDescriptor();
  const pb::Reflection* refl = msg.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const pb::FieldDescriptor* f = desc->field(i);
    const std::string field = JoinPath(section, f->name());
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      // A section, or each of a list of sections (data.blend[j]).
      const int n = f->is_repeated() ? refl->FieldSize(msg, f) : 1;
      for (int j = 0; j < n; ++j) {
        absl::Status s = f->is_repeated()
                             ? CheckStrings(refl->GetRepeatedMessage(msg, f, j),
                                            absl::StrCat(field, "[", j, "]"))
                             : CheckStrings(refl->GetMessage(msg, f), field);
        if (!s.ok()) return s;
      }
      continue;
    }
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING ||
        f->is_repeated()) {
      continue;
    }
    const std::string value = refl->GetString(msg, f);
    if (const int64_t bad = FirstInvalidUtf8(value); bad >= 0) {
      return Error(field, " is not UTF-8 (byte ", bad, ")");
    }
    // A NUL cannot pass through the spec's YAML (ptctl to ptcoord, the
    // checkpoint's copy of the spec) or a file name.
    if (const size_t nul = value.find('\0'); nul != std::string::npos) {
      return Error(field, " holds a NUL character (byte ", nul, ")");
    }
    if (value.size() > kMaxStringBytes) {
      return Error(field, " is ", value.size(), " bytes long; at most ",
                   kMaxStringBytes);
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateName(const v1::JobSpec& spec) {
  constexpr size_t kMaxNameLength = 63;  // fits a DNS label and a file name
  const std::string& name = spec.name();
  if (name.empty()) return Error("name is empty; give the job a name");
  if (name.size() > kMaxNameLength) {
    return Error("name=", EchoQuoted(name), " is ", name.size(),
                 " characters long; at most ", kMaxNameLength);
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return Error("name=", EchoQuoted(name), " contains ",
                   EchoQuoted(absl::string_view(&c, 1)),
                   "; only A-Z a-z 0-9 . _ - are allowed");
    }
  }
  return absl::OkStatus();
}

// arch llama's fields: each in range, and none given to arch gpt.
absl::Status ValidateLlamaFields(const v1::ModelSpec& m) {
  const v1::RopeScalingSpec& r = m.rope_scaling();
  if (m.arch() != "llama") {
    const std::pair<const char*, bool> given[] = {
        {"n_kv_head", m.n_kv_head() != 0},
        {"norm_eps", m.norm_eps() != 0},
        {"rope_theta", m.rope_theta() != 0},
        {"rope_scaling", r.factor() != 0 || r.low_freq_factor() != 0 ||
                             r.high_freq_factor() != 0 ||
                             r.original_context() != 0},
        {"ffn_hidden", m.ffn_hidden() != 0},
        {"multiple_of", m.multiple_of() != 0},
        {"ffn_dim_multiplier", m.ffn_dim_multiplier() != 0},
        {"head_dim", m.head_dim() != 0},
        {"qk_norm", m.qk_norm()},
    };
    for (const auto& [field, set] : given) {
      if (set) {
        return Error("model.", field, " applies to model.arch=llama, not ",
                     EchoQuoted(m.arch()));
      }
    }
    return absl::OkStatus();
  }
  if (absl::Status s = First({
          CheckFinite(r, "model.rope_scaling"),
          InRange("model.n_kv_head", m.n_kv_head(), 0, m.n_head()),
          InRange("model.norm_eps", m.norm_eps(), 0.0, 1.0),
          InRange("model.rope_theta", m.rope_theta(), 0.0, 1e12),
          InRange("model.ffn_hidden", m.ffn_hidden(), 0, 1 << 20),
          InRange("model.multiple_of", m.multiple_of(), 0, 1 << 16),
          InRange("model.ffn_dim_multiplier", m.ffn_dim_multiplier(), 0.0,
                  64.0),
          InRange("model.head_dim", m.head_dim(), 0, 1 << 12),
          InRange("model.rope_scaling.factor", r.factor(), 0.0, 1e6),
          InRange("model.rope_scaling.low_freq_factor", r.low_freq_factor(),
                  0.0, 1e6),
          InRange("model.rope_scaling.high_freq_factor", r.high_freq_factor(),
                  0.0, 1e6),
          InRange("model.rope_scaling.original_context", r.original_context(),
                  0, 1 << 24),
      });
      !s.ok()) {
    return s;
  }
  if (m.n_kv_head() > 0 && m.n_head() % m.n_kv_head() != 0) {
    return Error("model.n_kv_head=", m.n_kv_head(),
                 " does not divide model.n_head=", m.n_head());
  }
  if (m.head_dim() > 0 && m.head_dim() % 2 != 0) {
    return Error("model.head_dim=", m.head_dim(),
                 " is odd; rotary positions turn channel pairs of each head");
  }
  if (m.head_dim() == 0 && (m.n_embd() / m.n_head()) % 2 != 0) {
    return Error("model.n_embd / model.n_head = ", m.n_embd() / m.n_head(),
                 " is odd; rotary positions turn channel pairs of each head");
  }
  const double low = RopeScaling(m).low_freq_factor();
  const double high = RopeScaling(m).high_freq_factor();
  if (r.factor() > 0 && high <= low) {
    return Error("model.rope_scaling.high_freq_factor=", high,
                 " must be greater than low_freq_factor=", low);
  }
  if (m.rope_theta() != 0 && m.rope_theta() <= 1) {
    return Error("model.rope_theta=", m.rope_theta(), " must be > 1");
  }
  if (FfnHidden(m) < 1 || FfnHidden(m) > (1 << 20)) {
    return Error(
        "model.ffn_hidden: the rule from model.multiple_of and "
        "model.ffn_dim_multiplier gives ",
        FfnHidden(m), "; it must be between 1 and ", 1 << 20);
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const v1::JobSpec& spec) {
  const v1::ModelSpec& m = spec.model();
  if (absl::Status s = First({
          CheckFinite(m, "model"),
          OneOf("model.arch", m.arch(), {"gpt", "llama"}),
          InRange("model.n_layer", m.n_layer(), 1, 1 << 12),
          InRange("model.n_head", m.n_head(), 1, 1 << 12),
          InRange("model.n_embd", m.n_embd(), 1, 1 << 17),
          InRange("model.block_size", m.block_size(), 1, 1 << 20),
          InRange("model.vocab_size", m.vocab_size(), 0, 1 << 24),
      });
      !s.ok()) {
    return s;
  }
  if (m.n_embd() % m.n_head() != 0) {
    return Error("model.n_head=", m.n_head(),
                 " does not divide model.n_embd=", m.n_embd());
  }
  if (absl::Status s = ValidateLlamaFields(m); !s.ok()) return s;
  constexpr absl::string_view kLlmc = "llmc:";
  const std::string& init = m.init_from();
  if (!init.empty()) {
    const bool llmc = absl::StartsWith(init, kLlmc);
    if (!llmc && !absl::StartsWith(init, kHfPrefix)) {
      return Error("model.init_from=", EchoQuoted(init),
                   " must be empty, 'llmc:PATH' (an llm.c checkpoint) or "
                   "'hf:DIR' (a Hugging Face model folder)");
    }
    if (init.size() == (llmc ? kLlmc.size() : kHfPrefix.size())) {
      return Error("model.init_from=", EchoQuoted(init), " names no ",
                   llmc ? "file after 'llmc:'" : "folder after 'hf:'");
    }
    if (llmc && !TiesEmbeddings(m)) {
      return Error("model.init_from=", EchoQuoted(init),
                   " needs model.tie_embeddings=true: an llm.c checkpoint "
                   "ties the head to the token embedding");
    }
    if (llmc && m.arch() != "gpt") {
      return Error("model.init_from=", EchoQuoted(init),
                   " needs model.arch=gpt: an llm.c checkpoint is GPT-2's");
    }
  }
  return absl::OkStatus();
}

// data.tokenizer: auto (or empty), char, gpt2, spm:MODEL_PATH or
// hf:TOKENIZER_JSON.
absl::Status ValidateTokenizer(const v1::DataSpec& d) {
  const std::string& t = d.tokenizer();
  if (t.empty() || t == "auto" || t == "char" || t == "gpt2") {
    return absl::OkStatus();
  }
  if (absl::StartsWith(t, "spm:")) {
    if (t.size() == 4) {
      return Error("data.tokenizer=", EchoQuoted(t),
                   " names no SentencePiece model after 'spm:'");
    }
    return absl::OkStatus();
  }
  if (absl::StartsWith(t, "hf:")) {
    if (t.size() == 3) {
      return Error("data.tokenizer=", EchoQuoted(t),
                   " names no tokenizer.json (or its folder) after 'hf:'");
    }
    return absl::OkStatus();
  }
  return Error("data.tokenizer=", EchoQuoted(t),
               " must be one of auto, char, gpt2, spm:MODEL_PATH, "
               "hf:TOKENIZER_JSON");
}

// data.blend: token files only, each source both splits, weights finite,
// not negative and not all zero, names unique.
absl::Status ValidateBlend(const v1::DataSpec& d) {
  if (!d.path().empty() || !d.train_bin().empty() || !d.val_bin().empty()) {
    return Error(
        "data.blend replaces data.path and data.train_bin/data.val_bin; "
        "give the sources' files in data.blend only");
  }
  if (d.blend_size() > kMaxBlendSources) {
    return Error("data.blend: ", d.blend_size(), " sources; at most ",
                 kMaxBlendSources);
  }
  double total = 0;
  std::set<std::string> names;
  for (int i = 0; i < d.blend_size(); ++i) {
    const v1::BlendSource& b = d.blend(i);
    const std::string at = absl::StrCat("data.blend[", i, "]");
    if (b.train_bin().empty() || b.val_bin().empty()) {
      return Error(at,
                   ": give both train_bin and val_bin (llm.c token "
                   "files or patterns of shards)");
    }
    if (!std::isfinite(b.weight()) || b.weight() < 0) {
      return Error(at, ".weight=", b.weight(), " must be a finite number >= 0");
    }
    total += b.weight();
    const std::string name = BlendSourceName(b);
    if (name.empty()) {
      return Error(at, ": give it a name (its train_bin ",
                   EchoQuoted(b.train_bin()),
                   " has no file name up to \"_train\" to take one from)");
    }
    if (!IsBlendSourceName(name)) {
      return Error(at, ": the name ", EchoQuoted(name), " must be at most ",
                   kMaxBlendNameBytes,
                   " bytes without control characters (it labels the "
                   "source's metrics)");
    }
    if (!names.insert(name).second) {
      return Error(at, ": the name ", EchoQuoted(name),
                   " is another source's too; names tell sources apart in "
                   "the run log and metrics");
    }
  }
  if (!(total > 0)) {
    return Error(
        "data.blend: the weights are all 0; give at least one "
        "source a weight > 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::JobSpec& spec) {
  const v1::DataSpec& d = spec.data();
  if (absl::Status s = CheckFinite(d, "data"); !s.ok()) return s;
  if (absl::Status s = ValidateTokenizer(d); !s.ok()) return s;
  const bool has_path = !d.path().empty();
  const bool has_train_bin = !d.train_bin().empty();
  const bool has_val_bin = !d.val_bin().empty();
  if (d.blend_size() > 0) return ValidateBlend(d);
  if (has_path && (has_train_bin || has_val_bin)) {
    return Error(
        "data.path and data.train_bin/data.val_bin are mutually exclusive; "
        "give either data.path (a text file) or both data.train_bin and "
        "data.val_bin (llm.c token files)");
  }
  if (!has_path) {
    if (!has_train_bin && !has_val_bin) {
      return Error(
          "data: give either data.path (a text file) or both data.train_bin "
          "and data.val_bin (llm.c token files)");
    }
    if (has_train_bin != has_val_bin) {
      return Error("data.train_bin and data.val_bin go together; ",
                   has_train_bin ? "data.val_bin" : "data.train_bin",
                   " is empty");
    }
    return absl::OkStatus();
  }
  if (!(d.val_fraction() > 0 && d.val_fraction() < 1)) {
    return Error("data.val_fraction=", d.val_fraction(),
                 " must be > 0 and < 1");
  }
  return absl::OkStatus();
}

// Context parallelism cuts every sequence into 2·cp chunks (zigzag: rank r
// holds chunks r and 2cp−1−r) and runs attention as ring attention, not
// yet verified on a GPU.
absl::Status ValidateContextParallel(const v1::JobSpec& spec) {
  const v1::ParallelSpec& p = spec.parallel();
  if (p.cp() == 1) return absl::OkStatus();
  const int64_t T = spec.model().block_size();
  if (T % (2 * int64_t{p.cp()}) != 0) {
    return Error("parallel.cp=", p.cp(),
                 " needs model.block_size divisible by 2 × parallel.cp = ",
                 2 * int64_t{p.cp()}, " (model.block_size=", T,
                 "): zigzag sharding cuts each sequence into 2·cp chunks");
  }
  if (p.sequence_parallel() && (T / p.cp()) % p.tp() != 0) {
    return Error("parallel.tp=", p.tp(), " does not divide the ", T / p.cp(),
                 " positions each parallel.cp rank holds (model.block_size=", T,
                 " / parallel.cp=", p.cp(),
                 "; required by parallel.sequence_parallel=true)");
  }
  if (SpecDevice(spec) == Device::kCuda) {
    return Error("parallel.cp=", p.cp(),
                 " with resources.device=cuda: the GPU's ring attention has "
                 "not been verified on a GPU yet; use resources.device=cpu or "
                 "parallel.cp=1");
  }
  return absl::OkStatus();
}

// `parallel: auto` leaves the layout to the planner (ptcoord resolves it
// at submit): no degree or option it chooses may be set beside it. Only
// bucket_bytes and offload are the spec's own; a field at its default is
// taken as unset.
absl::Status ValidateAutoLayout(const v1::JobSpec& spec) {
  const v1::ParallelSpec& p = spec.parallel();
  if (p.layout().empty()) return absl::OkStatus();
  if (p.layout() != "auto") {
    return Error("parallel.layout=", EchoQuoted(p.layout()),
                 ": expected auto (the planner chooses the layout) or no "
                 "value (the layout is the other fields)");
  }
  const v1::ParallelSpec defaults = DefaultJobSpec().parallel();
  const pb::Descriptor* d = v1::ParallelSpec::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->name() == "layout" || f->name() == "bucket_bytes" ||
        f->name() == "offload") {
      continue;
    }
    std::string set, unset;
    pb::TextFormat::PrintFieldValueToString(p, f, -1, &set);
    pb::TextFormat::PrintFieldValueToString(defaults, f, -1, &unset);
    if (set == unset) continue;
    return Error("parallel: auto chooses parallel.", f->name(),
                 " itself: remove parallel.", f->name(), " (", set,
                 "), or write the whole layout out instead of auto");
  }
  return absl::OkStatus();
}

// The degrees of parallelism, the world they make, and the ZeRO stage.
absl::Status ValidateDegrees(const v1::JobSpec& spec) {
  const v1::ParallelSpec& p = spec.parallel();
  if (absl::Status s = CheckFinite(p, "parallel"); !s.ok()) return s;
  for (const MeshDimension& d : MeshDimensions()) {
    if (absl::Status s =
            InRange<int64_t>(absl::StrCat("parallel.", std::string(d.name)),
                             d.degree(p), 1, kMaxDegree);
        !s.ok()) {
      return s;
    }
  }
  if (const int64_t world = JobWorldSize(spec); world > kMaxWorldSize) {
    return Error(ParallelWorldFactors(p), " = ", world, " ranks; at most ",
                 kMaxWorldSize);
  }
  if (p.zero() < 0 || p.zero() > 3) {
    return Error("parallel.zero=", p.zero(),
                 " must be between 0 and 3 (a ZeRO stage)");
  }
  return absl::OkStatus();
}

// The pipeline schedule with the virtual stages, stages and microbatches
// it needs.
absl::Status ValidateSchedule(const v1::ParallelSpec& p) {
  // Interleaving gives each pipeline rank v chunks of whole layers and
  // sends microbatches through them in groups of pp.
  const bool interleaved = p.schedule() == "interleaved";
  if (interleaved && p.virtual_stages() < 2) {
    return Error(
        "parallel.schedule=interleaved requires "
        "parallel.virtual_stages >= 2 (parallel.virtual_stages=",
        p.virtual_stages(), ")");
  }
  // ZB-H1 splits each backward of one chunk per rank into B and W and
  // fills a pipeline's bubble with the W.
  if (p.schedule() == "zb1p") {
    if (p.pp() < 2) {
      return Error(
          "parallel.schedule=zb1p requires parallel.pp >= 2 "
          "(parallel.pp=",
          p.pp(), "): without a pipeline there is no bubble to fill");
    }
    if (p.virtual_stages() != 1) {
      return Error(
          "parallel.schedule=zb1p requires parallel.virtual_stages=1 "
          "(parallel.virtual_stages=",
          p.virtual_stages(), "): ZB-H1 runs one model chunk per rank");
    }
  }
  if (!interleaved && p.virtual_stages() != 1) {
    return Error("parallel.virtual_stages=", p.virtual_stages(),
                 " requires parallel.schedule=interleaved (parallel.schedule=",
                 p.schedule(), ")");
  }
  if (interleaved) {
    if (p.pp() < 2) {
      return Error(
          "parallel.schedule=interleaved requires parallel.pp >= 2 "
          "(parallel.pp=",
          p.pp(), ")");
    }
    if (p.microbatches() % p.pp() != 0) {
      return Error("parallel.microbatches=", p.microbatches(),
                   " is not a multiple of parallel.pp=", p.pp(),
                   " (required by parallel.schedule=interleaved)");
    }
  }
  return absl::OkStatus();
}

// Sequence parallelism splits the positions of a sequence over the
// tensor-parallel ranks.
absl::Status ValidateSequenceParallel(const v1::ParallelSpec& p,
                                      const v1::ModelSpec& m) {
  if (!p.sequence_parallel()) return absl::OkStatus();
  if (p.tp() <= 1) {
    return Error(
        "parallel.sequence_parallel=true requires parallel.tp > 1 "
        "(parallel.tp=",
        p.tp(), ")");
  }
  if (m.block_size() % p.tp() != 0) {
    return Error("parallel.tp=", p.tp(),
                 " does not divide model.block_size=", m.block_size(),
                 " (required by parallel.sequence_parallel=true)");
  }
  return absl::OkStatus();
}

absl::Status ValidateParallel(const v1::JobSpec& spec) {
  const v1::ParallelSpec& p = spec.parallel();
  const v1::ModelSpec& m = spec.model();
  if (absl::Status s = ValidateAutoLayout(spec); !s.ok()) return s;
  if (absl::Status s = ValidateDegrees(spec); !s.ok()) return s;
  if (absl::Status s = First({
          InRange("parallel.microbatches", p.microbatches(), 1, 1 << 20),
          OneOf("parallel.schedule", p.schedule(),
                {"1f1b", "gpipe", "interleaved", "zb1p"}),
          InRange("parallel.virtual_stages", p.virtual_stages(), 1, 1 << 12),
          InRange<int64_t>("parallel.bucket_bytes", p.bucket_bytes(), 1,
                           int64_t{1} << 40),
          OneOf("parallel.offload", p.offload(), {"none", "optimizer"}),
      });
      !s.ok()) {
    return s;
  }
  if (p.offload() == "optimizer" && SpecDevice(spec) != Device::kCuda) {
    return Error(
        "parallel.offload=optimizer needs resources.device=cuda: it "
        "moves the optimizer's state from the GPU to host memory, "
        "where a CPU job's already is");
  }
  // Each tensor-parallel rank owns whole heads, each stage whole layers.
  if (m.n_head() % p.tp() != 0) {
    return Error("parallel.tp=", p.tp(),
                 " does not divide model.n_head=", m.n_head());
  }
  // Key and value heads are split over tp, or each held by tp / n_kv_head
  // ranks (replicated).
  if (KvHeads(m) % p.tp() != 0 && p.tp() % KvHeads(m) != 0) {
    return Error("parallel.tp=", p.tp(), " and model.n_kv_head=", KvHeads(m),
                 ": one must divide the other (key and value heads are "
                 "split over tp, or replicated on tp / n_kv_head ranks each)");
  }
  if (FfnHidden(m) % p.tp() != 0) {
    return Error("parallel.tp=", p.tp(),
                 " does not divide the MLP's hidden width ", FfnHidden(m),
                 " (model.ffn_hidden or its rule)");
  }
  if (absl::Status s = ValidateSchedule(p); !s.ok()) return s;
  if (absl::StatusOr<std::vector<int>> layers =
          PipelineStageLayers(p, m.n_layer());
      !layers.ok()) {
    return layers.status();
  }
  if (absl::Status s = ValidateSequenceParallel(p, m); !s.ok()) return s;
  return ValidateContextParallel(spec);
}

// train.cuda_graphs=on where the job's passes cannot be recorded is
// refused, with why; auto then runs op by op.
absl::Status CudaGraphsPossible(const v1::JobSpec& spec) {
  if (absl::Status s = OneOf("train.cuda_graphs", spec.train().cuda_graphs(),
                             {"auto", "on", "off"});
      !s.ok()) {
    return s;
  }
  if (CudaGraphsOf(spec) != CudaGraphs::kOn) return absl::OkStatus();
  const std::string why = CudaGraphsUnsupported(spec);
  if (why.empty()) return absl::OkStatus();
  return Error("train.cuda_graphs=on cannot record this job's passes: ", why,
               " (auto records only where it can)");
}

absl::Status ValidateTrain(const v1::JobSpec& spec) {
  const v1::TrainSpec& t = spec.train();
  const v1::ParallelSpec& p = spec.parallel();
  if (absl::Status s = First({
          CheckFinite(t, "train"),
          InRange<int64_t>("train.steps", t.steps(), 1, int64_t{1} << 40),
          InRange("train.global_batch", t.global_batch(), 1, 1 << 24),
      });
      !s.ok()) {
    return s;
  }
  // Token counters (tokens seen, the sampler's positions) are int64.
  constexpr double kMaxRunTokens = 0x1p62;
  const double run_tokens =
      double(t.steps()) * t.global_batch() * spec.model().block_size();
  if (run_tokens > kMaxRunTokens) {
    return Error(
        "train.steps × train.global_batch × model.block_size = ", t.steps(),
        " × ", t.global_batch(), " × ", spec.model().block_size(),
        " tokens is more than a run can count (2^62)");
  }
  // Every dp rank runs the same number of whole microbatches per step.
  const int64_t per_step = int64_t{p.dp()} * p.microbatches();
  if (t.global_batch() % per_step != 0) {
    return Error("train.global_batch=", t.global_batch(),
                 " is not divisible by parallel.dp × parallel.microbatches = ",
                 p.dp(), " × ", p.microbatches(), " = ", per_step);
  }
  if (absl::Status s = Positive("train.lr", t.lr()); !s.ok()) return s;
  if (!(t.min_lr() >= 0 && t.min_lr() <= t.lr())) {
    return Error("train.min_lr=", t.min_lr(),
                 " must be >= 0 and <= train.lr=", t.lr());
  }
  if (absl::Status s = First({
          AtLeast<int64_t>("train.warmup_steps", t.warmup_steps(), 0),
          AtLeast("train.weight_decay", t.weight_decay(), 0.0),
          AtLeast("train.grad_clip", t.grad_clip(), 0.0),
          AtLeast<int64_t>("train.eval_every", t.eval_every(), 0),
          InRange("train.eval_batches", t.eval_batches(), 1, 1 << 20),
          AtLeast<int64_t>("train.sample_every", t.sample_every(), 0),
      });
      !s.ok()) {
    return s;
  }
  if (!(t.decay_fraction() > 0 && t.decay_fraction() <= 1)) {
    return Error("train.decay_fraction=", t.decay_fraction(),
                 " must be > 0 and <= 1 (the share of train.steps that "
                 "train.lr_schedule=wsd decays over)");
  }
  for (auto [field, value] :
       {std::pair<const char*, double>{"train.beta1", t.beta1()},
        {"train.beta2", t.beta2()}}) {
    if (!(value >= 0 && value < 1)) {
      return Error(field, "=", value, " must be >= 0 and < 1");
    }
  }
  return First({
      Positive("train.eps", t.eps()),
      InRange("train.sample_tokens", t.sample_tokens(), 0, 1 << 20),
      // 0: greedy, the likeliest token (as Hugging Face's do_sample=False).
      AtLeast<double>("train.sample_temperature", t.sample_temperature(), 0),
      InRange("train.sample_top_k", t.sample_top_k(), 0, 1 << 24),
      OneOf("train.precision", t.precision(), {"auto", "fp32", "bf16"}),
      OneOf("train.recompute", t.recompute(), {"none", "selective", "full"}),
      OneOf("train.lr_schedule", t.lr_schedule(),
            {"cosine", "linear", "constant", "wsd"}),
      AtLeast("train.log_every", t.log_every(), 1),
      CudaGraphsPossible(spec),
  });
}

absl::Status ValidateCheckpoint(const v1::JobSpec& spec) {
  const v1::CheckpointSpec& c = spec.checkpoint();
  if (absl::Status s = First({
          CheckFinite(c, "checkpoint"),
          AtLeast<int64_t>("checkpoint.every", c.every(), 0),
          InRange("checkpoint.keep_last", c.keep_last(), 1, 1 << 20),
      });
      !s.ok()) {
    return s;
  }
  if (c.every() > 0 && c.dir().empty()) {
    return Error("checkpoint.every=", c.every(),
                 " requires checkpoint.dir (where step folders go)");
  }
  return absl::OkStatus();
}

absl::Status ValidateAnomaly(const v1::JobSpec& spec) {
  const v1::AnomalySpec& a = spec.train().anomaly();
  if (absl::Status s = First({
          CheckFinite(a, "train.anomaly"),
          OneOf("train.anomaly.nan", a.nan(), {"rollback", "stop", "ignore"}),
          InRange("train.anomaly.window", a.window(), 1, 1 << 20),
          InRange("train.anomaly.max_rollbacks", a.max_rollbacks(), 0, 1 << 16),
      });
      !s.ok()) {
    return s;
  }
  if (!(a.spike_factor() == 0 || a.spike_factor() > 1)) {
    return Error("train.anomaly.spike_factor=", a.spike_factor(),
                 " must be 0 (off) or > 1 (a multiple of the median loss)");
  }
  if (a.nan() == "rollback" && spec.checkpoint().dir().empty()) {
    return Error(
        "train.anomaly.nan=rollback needs checkpoint.dir (the checkpoints it "
        "rolls back to)");
  }
  return absl::OkStatus();
}

absl::Status ValidateResources(const v1::JobSpec& spec) {
  const v1::ResourcesSpec& r = spec.resources();
  const int tp = spec.parallel().tp();
  if (r.ranks_per_node() > 0 && tp > 1 && r.ranks_per_node() % tp != 0) {
    return Error("resources.ranks_per_node=", r.ranks_per_node(),
                 " must be a multiple of parallel.tp=", tp,
                 " (a tensor-parallel group stays inside one node)");
  }
  return First({
      CheckFinite(r, "resources"),
      OneOf("resources.device", r.device(), {"cpu", "cuda"}),
      InRange<int64_t>("resources.ranks_per_node", r.ranks_per_node(), 0,
                       kMaxDegree),
      InRange("resources.threads_per_rank", r.threads_per_rank(), 0, 1 << 12),
  });
}

absl::Status ValidateRestart(const v1::JobSpec& spec) {
  const v1::RestartSpec& r = spec.restart();
  if (absl::StatusOr<int> p = PriorityValue(spec.priority()); !p.ok()) {
    return p.status();
  }
  return First({
      CheckFinite(r, "restart"),
      InRange("restart.max_restarts", r.max_restarts(), 0, 1 << 16),
      InRange("restart.hang_timeout_s", r.hang_timeout_s(), 1, 30 * 24 * 3600),
  });
}

}  // namespace

absl::StatusOr<int> PriorityValue(std::string_view text) {
  if (text.empty() || text == "normal") return kPriorityNormal;
  if (text == "low") return kPriorityLow;
  if (text == "high") return kPriorityHigh;
  int v = -1;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || v < 0 || v > kMaxPriority) {
    return absl::InvalidArgumentError(absl::StrCat(
        "priority: ", EchoQuoted(absl::string_view(text.data(), text.size())),
        " is not low, normal, high or a whole number in [0, ", kMaxPriority,
        "]"));
  }
  return v;
}

std::string PriorityWords(int priority) {
  switch (priority) {
    case kPriorityLow:
      return "low (200)";
    case kPriorityNormal:
      return "normal (500)";
    case kPriorityHigh:
      return "high (800)";
    default:
      return absl::StrCat(priority);
  }
}

absl::StatusOr<std::vector<int>> PipelineStageLayers(const v1::ParallelSpec& p,
                                                     int n_layer) {
  const int pp = p.pp(), v = p.virtual_stages();
  const int first = p.first_stage_layers(), last = p.last_stage_layers();
  if (first < 0 || last < 0) {
    return Error(first < 0 ? "parallel.first_stage_layers="
                           : "parallel.last_stage_layers=",
                 first < 0 ? first : last, " must be >= 0 (0: an even share)");
  }
  if (first == 0 && last == 0) {
    // Whole layers, the same number on every stage.
    if (n_layer % pp != 0) {
      return Error("parallel.pp=", pp,
                   " does not divide model.n_layer=", n_layer);
    }
    if ((n_layer / pp) % v != 0) {
      return Error("parallel.virtual_stages=", v,
                   " does not divide the layers per stage, model.n_layer / "
                   "parallel.pp = ",
                   n_layer, " / ", pp, " = ", n_layer / pp);
    }
    return std::vector<int>(static_cast<size_t>(pp) * v, n_layer / (pp * v));
  }
  const int64_t stages = int64_t{pp} * v;
  if (stages < 2) {
    return Error(first > 0 ? "parallel.first_stage_layers="
                           : "parallel.last_stage_layers=",
                 first > 0 ? first : last,
                 " requires more than one pipeline stage (parallel.pp=", pp,
                 ")");
  }
  const OtherStages others = OtherStagesOf(n_layer, stages, first, last);
  if (!others.fit()) {
    const std::string left = absl::StrCat(
        "model.n_layer - parallel.first_stage_layers - "
        "parallel.last_stage_layers = ",
        n_layer, " - ", first, " - ", last, " = ", others.rest);
    if (others.count == 0) {
      return Error(left, ": with two pipeline stages the two must add up to ",
                   "model.n_layer");
    }
    const std::string over = absl::StrCat(
        " pipeline stages (parallel.pp × parallel.virtual_stages = ", stages,
        " in all)");
    if (others.rest < others.count) {
      return Error(left, " layers for the other ", others.count, over,
                   ": each stage needs at least one layer");
    }
    return Error(left, " layers do not split evenly over the other ",
                 others.count, over);
  }
  std::vector<int> layers(static_cast<size_t>(stages), others.share());
  if (first > 0) layers.front() = first;
  if (last > 0) layers.back() = last;
  return layers;
}

// model.moe: each field in range, none without experts; and what the
// engine does not run yet with experts, refused naming the field.
absl::Status ValidateMoe(const v1::JobSpec& spec) {
  const v1::MoeSpec& given = spec.model().moe();
  const v1::ParallelSpec& p = spec.parallel();
  if (given.experts() == 0) {
    if (p.ep() > 1) {
      return Error("parallel.ep=", p.ep(),
                   " needs model.moe.experts (the experts ep splits)");
    }
    if (p.expert_tp() != 0) {
      return Error("parallel.expert_tp=", p.expert_tp(),
                   " needs model.moe.experts (the experts it splits)");
    }
    if (given.top_k() != 0 || given.every() != 0 ||
        given.shared_experts() != 0 || given.expert_hidden() != 0 ||
        !given.router().empty() || given.capacity_factor() != 0 ||
        given.aux_loss_coef() != 0 || given.z_loss_coef() != 0 ||
        !given.balance().empty() || given.has_bias_update_rate()) {
      return Error(
          "model.moe needs model.moe.experts >= 1 (every other "
          "model.moe field applies to experts)");
    }
    return absl::OkStatus();
  }
  if (absl::Status s = First({
          CheckFinite(given, "model.moe"),
          InRange("model.moe.experts", given.experts(), 1, 1 << 10),
          InRange("model.moe.top_k", given.top_k(), 0, 1 << 10),
          InRange("model.moe.every", given.every(), 0, 1 << 12),
          InRange("model.moe.shared_experts", given.shared_experts(), 0, 64),
          InRange("model.moe.expert_hidden", given.expert_hidden(), 0, 1 << 20),
          InRange("model.moe.capacity_factor", given.capacity_factor(), 0.0,
                  1e3),
          InRange("model.moe.aux_loss_coef", given.aux_loss_coef(), 0.0, 1e3),
          InRange("model.moe.z_loss_coef", given.z_loss_coef(), 0.0, 1e3),
          InRange("model.moe.bias_update_rate", given.bias_update_rate(), 0.0,
                  1.0),
      });
      !s.ok()) {
    return s;
  }
  const v1::MoeSpec moe = MoeOf(spec.model());
  if (absl::Status s = First({
          OneOf("model.moe.router", moe.router(), {"softmax", "sigmoid"}),
          OneOf("model.moe.balance", moe.balance(), {"aux", "bias"}),
      });
      !s.ok()) {
    return s;
  }
  if (moe.top_k() > moe.experts()) {
    return Error("model.moe.top_k=", moe.top_k(),
                 " is more than model.moe.experts=", moe.experts());
  }
  if (const int64_t group = int64_t{p.dp()} * p.cp(); group % p.ep() != 0) {
    return Error("parallel.ep=", p.ep(),
                 " does not divide parallel.dp=", p.dp(),
                 " × parallel.cp=", p.cp(), " = ", group,
                 " (the experts' ranks are carved out of the data-parallel "
                 "ones)");
  }
  if (moe.experts() % p.ep() != 0) {
    return Error("parallel.ep=", p.ep(),
                 " does not divide model.moe.experts=", moe.experts(),
                 " (each ep rank holds as many experts)");
  }
  const int tp = p.tp();
  if (absl::Status s = InRange("parallel.expert_tp", p.expert_tp(), 0, tp);
      !s.ok()) {
    return s;
  }
  if (p.expert_tp() > 0 && tp % p.expert_tp() != 0) {
    return Error("parallel.expert_tp=", p.expert_tp(),
                 " does not divide parallel.tp=", tp,
                 " (the tp group is cut into runs of expert_tp ranks, each "
                 "holding its own experts)");
  }
  const int etp = p.expert_tp() > 0 ? p.expert_tp() : tp;
  if (const int64_t split = int64_t{p.ep()} * (tp / etp);
      moe.experts() % split != 0) {
    return Error("parallel.ep=", p.ep(),
                 " × parallel.tp/parallel.expert_tp=", tp / etp, " = ", split,
                 " does not divide model.moe.experts=", moe.experts(),
                 " (each rank holds as many experts)");
  }
  if (moe.expert_hidden() % etp != 0) {
    return Error(
        p.expert_tp() > 0 ? "parallel.expert_tp=" : "parallel.tp=", etp,
        " does not divide model.moe.expert_hidden=", moe.expert_hidden(),
        " (each expert is split over ", p.expert_tp() > 0 ? "expert_tp" : "tp",
        ")");
  }
  if (moe.every() > spec.model().n_layer()) {
    return Error("model.moe.every=", moe.every(),
                 " is more than model.n_layer=", spec.model().n_layer(),
                 ": no block would have experts (the MoE MLP is in blocks "
                 "every−1, 2·every−1, ...)");
  }
  if (given.has_bias_update_rate() && moe.balance() != "bias") {
    return Error(
        "model.moe.bias_update_rate applies to "
        "model.moe.balance=bias, not '",
        moe.balance(), "'");
  }
  if (SpecDevice(spec) == Device::kCuda) {
    // Refused until the MoE ops' GPU tests (cuda_ops_test) have passed on
    // a GPU.
    return Error(
        "model.moe with resources.device=cuda: the experts' CUDA "
        "kernels have not been verified on a GPU yet; use "
        "resources.device=cpu");
  }
  return absl::OkStatus();
}

bool IsAutoLayout(const v1::JobSpec& spec) {
  return spec.parallel().layout() == "auto";
}

absl::Status CheckLayoutResolved(const v1::JobSpec& spec) {
  if (!IsAutoLayout(spec)) return absl::OkStatus();
  return Error(
      "parallel: auto: ranks run a layout, and the planner chooses one when "
      "the job is submitted to ptcoord (started with --planner-profile); "
      "submit it with ptctl submit, or write the layout out (ptctl plan "
      "proposes one)");
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  // Sections in job.proto order, so the first error reported is stable.
  if (absl::Status s = CheckStrings(spec, ""); !s.ok()) return s;
  for (auto* validate :
       {&ValidateName, &ValidateModel, &ValidateData, &ValidateParallel,
        &ValidateTrain, &ValidateCheckpoint, &ValidateAnomaly,
        &ValidateResources, &ValidateRestart, &ValidateMoe}) {
    if (absl::Status s = validate(spec); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace ptrain
