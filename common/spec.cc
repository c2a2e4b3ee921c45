// The job spec: YAML <-> ptrain.v1.JobSpec through protobuf reflection, so a
// field added to job.proto is readable, overridable and printable without code
// here. Only the defaults and the validation rules name fields one by one.
#include "common/spec.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/bounded_file.h"

namespace ptrain {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Debian's abseil keeps its own string_view type; the header speaks std.
absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }

// Where the YAML being mapped came from, so errors point back at it.
struct Origin {
  std::string prefix;  // "job.yaml: " or "override 'train.steps=x': "
  bool has_marks;      // line/column refer to the user's text
};

// Quotes user text for a message; control characters are escaped so an
// error stays on one line, and long values are cut.
std::string Quote(absl::string_view text) {
  constexpr size_t kMaxShown = 60;
  std::string shown = absl::CHexEscape(text.substr(0, kMaxShown));
  if (text.size() > kMaxShown) absl::StrAppend(&shown, "...");
  return absl::StrCat("'", shown, "'");
}

absl::Status FieldError(const Origin& origin, absl::string_view path,
                        absl::string_view rule, const YAML::Mark& mark) {
  std::string where;
  // yaml-cpp counts lines and columns from 0; editors count from 1.
  if (origin.has_marks && !mark.is_null()) {
    where = absl::StrFormat(" (line %d, column %d)", mark.line + 1,
                            mark.column + 1);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(origin.prefix, path, ": ", rule, where));
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return Quote(node.Scalar());
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      break;
  }
  return "an empty value";
}

std::string FieldNames(const Descriptor* desc) {
  std::vector<std::string> names;
  for (int i = 0; i < desc->field_count(); ++i) {
    names.push_back(desc->field(i)->name());
  }
  return absl::StrJoin(names, ", ");
}

std::string JoinPath(absl::string_view parent, absl::string_view name) {
  return parent.empty() ? std::string(name) : absl::StrCat(parent, ".", name);
}

absl::Status UnknownKey(const Origin& origin, absl::string_view path,
                        const Descriptor* desc, const YAML::Mark& mark) {
  return FieldError(
      origin, path,
      absl::StrCat("unknown key; expected one of ", FieldNames(desc)), mark);
}

std::string ExpectedKind(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return "an integer";
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return "a number";
    case FieldDescriptor::CPPTYPE_BOOL:
      return "true or false";
    case FieldDescriptor::CPPTYPE_STRING:
      return "a string";
    case FieldDescriptor::CPPTYPE_ENUM:
      return absl::StrCat("one of ", [field] {
        std::vector<std::string> names;
        const auto* type = field->enum_type();
        for (int i = 0; i < type->value_count(); ++i) {
          names.push_back(type->value(i)->name());
        }
        return absl::StrJoin(names, ", ");
      }());
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return "a map of fields";
  }
  return "a value";
}

// An integer as written, before the field's range is known: negative values
// are held in `negative`, the rest in `positive` so uint64 keeps its top bit.
struct ParsedInt {
  bool negative = false;
  int64_t negative_value = 0;
  uint64_t positive = 0;
};

enum class IntParse { kOk, kNotAnInteger, kOutOfRange };

IntParse ParseInteger(absl::string_view text, ParsedInt* out) {
  if (text.empty()) return IntParse::kNotAnInteger;
  const char* end = text.data() + text.size();
  std::from_chars_result result;
  if (text[0] == '-') {
    out->negative = true;
    result = std::from_chars(text.data(), end, out->negative_value);
  } else {
    const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
    if (begin == end || *begin == '-') return IntParse::kNotAnInteger;
    result = std::from_chars(begin, end, out->positive);
  }
  if (result.ec == std::errc::invalid_argument || result.ptr != end) {
    return IntParse::kNotAnInteger;
  }
  if (result.ec == std::errc::result_out_of_range) return IntParse::kOutOfRange;
  return IntParse::kOk;
}

// YAML 1.2 core-schema floats, which std::from_chars does not know in full.
bool ParseDouble(absl::string_view text, double* out) {
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  for (auto [spelling, value] :
       std::initializer_list<std::pair<const char*, double>>{
           {".inf", kInf},
           {".Inf", kInf},
           {".INF", kInf},
           {"+.inf", kInf},
           {"+.Inf", kInf},
           {"+.INF", kInf},
           {"-.inf", -kInf},
           {"-.Inf", -kInf},
           {"-.INF", -kInf},
           {".nan", std::nan("")},
           {".NaN", std::nan("")},
           {".NAN", std::nan("")}}) {
    if (text == spelling) {
      *out = value;
      return true;
    }
  }
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  if (text.empty() || text[0] == '+') return false;
  const char* end = text.data() + text.size();
  auto result = std::from_chars(text.data(), end, *out);
  return result.ec == std::errc() && result.ptr == end;
}

bool ParseBool(absl::string_view text, bool* out) {
  if (text == "true" || text == "True" || text == "TRUE") {
    *out = true;
    return true;
  }
  if (text == "false" || text == "False" || text == "FALSE") {
    *out = false;
    return true;
  }
  return false;
}

absl::Status MapOntoMessage(const YAML::Node& node, Message* msg,
                            absl::string_view path, const Origin& origin);

// Sets the integer field from `text` after checking the field's range;
// int32 and uint32 fields must not silently wrap a value that fits 64 bits.
absl::Status SetInteger(const FieldDescriptor* field, Message* msg,
                        absl::string_view text, absl::string_view path,
                        const Origin& origin, const YAML::Mark& mark) {
  ParsedInt v;
  IntParse parsed = ParseInteger(text, &v);
  if (parsed == IntParse::kNotAnInteger) {
    return FieldError(origin, path,
                      absl::StrCat("expected an integer, got ", Quote(text)),
                      mark);
  }
  int64_t min = 0;
  uint64_t max = 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      min = std::numeric_limits<int32_t>::min();
      max = std::numeric_limits<int32_t>::max();
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      min = std::numeric_limits<int64_t>::min();
      max = std::numeric_limits<int64_t>::max();
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      max = std::numeric_limits<uint32_t>::max();
      break;
    default:
      max = std::numeric_limits<uint64_t>::max();
      break;
  }
  bool fits = parsed == IntParse::kOk &&
              (v.negative ? v.negative_value >= min : v.positive <= max);
  if (!fits) {
    return FieldError(
        origin, path,
        absl::StrCat(text, " is out of range for ", field->cpp_type_name(),
                     " [", min, ", ", max, "]"),
        mark);
  }
  const Reflection* refl = msg->GetReflection();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      refl->SetInt32(
          msg, field,
          static_cast<int32_t>(v.negative ? v.negative_value : v.positive));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      refl->SetInt64(
          msg, field,
          v.negative ? v.negative_value : static_cast<int64_t>(v.positive));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      refl->SetUInt32(msg, field, static_cast<uint32_t>(v.positive));
      break;
    default:
      refl->SetUInt64(msg, field, v.positive);
      break;
  }
  return absl::OkStatus();
}

// The one conversion from a YAML node to a field, used by both the file
// mapping and --set overrides so the two accept exactly the same values.
absl::Status AssignNode(const YAML::Node& node, const FieldDescriptor* field,
                        Message* msg, absl::string_view path,
                        const Origin& origin) {
  const Reflection* refl = msg->GetReflection();
  const YAML::Mark mark = node.Mark();
  if (field->is_repeated()) {
    return FieldError(origin, path, "list fields are not supported", mark);
  }
  const std::string expected = ExpectedKind(field);
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    if (!node.IsMap()) {
      return FieldError(
          origin, path,
          absl::StrCat("expected ", expected, ", got ", Describe(node)), mark);
    }
    return MapOntoMessage(node, refl->MutableMessage(msg, field), path, origin);
  }
  if (!node.IsScalar()) {
    std::string rule =
        absl::StrCat("expected ", expected, ", got ", Describe(node));
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING && node.IsNull()) {
      absl::StrAppend(&rule, "; write '' for an empty string");
    }
    return FieldError(origin, path, rule, mark);
  }
  const std::string& text = node.Scalar();
  // A quoted scalar is a string in YAML; reading "200" as a number would
  // hide a mistake the user made on purpose or by accident.
  if (field->cpp_type() != FieldDescriptor::CPPTYPE_STRING &&
      node.Tag() == "!") {
    return FieldError(origin, path,
                      absl::StrCat("expected ", expected,
                                   ", got the quoted string ", Quote(text)),
                      mark);
  }
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return SetInteger(field, msg, text, path, origin, mark);
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      double value = 0;
      if (!ParseDouble(text, &value)) break;
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
        refl->SetDouble(msg, field, value);
      } else {
        refl->SetFloat(msg, field, static_cast<float>(value));
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool value = false;
      if (!ParseBool(text, &value)) break;
      refl->SetBool(msg, field, value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_STRING:
      refl->SetString(msg, field, text);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_ENUM: {
      const EnumValueDescriptor* value =
          field->enum_type()->FindValueByName(text);
      if (value == nullptr) break;
      refl->SetEnum(msg, field, value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return FieldError(origin, path,
                    absl::StrCat("expected ", expected, ", got ", Quote(text)),
                    mark);
}

absl::Status MapOntoMessage(const YAML::Node& node, Message* msg,
                            absl::string_view path, const Origin& origin) {
  const Descriptor* desc = msg->GetDescriptor();
  std::set<const FieldDescriptor*> seen;
  // Copies, not references: yaml-cpp's iterator hands out temporaries.
  for (const auto& entry : node) {
    const YAML::Node key = entry.first;
    if (!key.IsScalar()) {
      return FieldError(
          origin, path.empty() ? "(top level)" : path,
          absl::StrCat("keys must be field names, got ", Describe(key)),
          key.Mark());
    }
    const std::string child = JoinPath(path, key.Scalar());
    const FieldDescriptor* field = desc->FindFieldByName(key.Scalar());
    if (field == nullptr) return UnknownKey(origin, child, desc, key.Mark());
    // yaml-cpp keeps both copies of a repeated key; the last silently
    // winning would make the file say two things.
    if (!seen.insert(field).second) {
      return FieldError(origin, child, "duplicate key", key.Mark());
    }
    if (absl::Status s = AssignNode(entry.second, field, msg, child, origin);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Validation. Messages name each field as `section.field=value` so the user
// can find it in the file or in a --set.

// Counts the documents of `text`, stopping at two. yaml-cpp 0.7's LoadAll
// loops forever, allocating, on input such as a leading ',': its parser
// keeps reporting an empty document without consuming anything. Here a
// document that starts where the previous one did is that case, and the
// text is malformed.
absl::StatusOr<int> CountDocuments(const std::string& text) {
  struct Starts : YAML::EventHandler {
    std::vector<YAML::Mark> marks;
    void OnDocumentStart(const YAML::Mark& m) override { marks.push_back(m); }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  } starts;
  std::istringstream in(text);
  YAML::Parser parser(in);
  int n = 0;
  while (n < 2 && parser.HandleNextDocument(starts)) {
    ++n;
    if (n == 2 && starts.marks.size() == 2 &&
        starts.marks[0].pos == starts.marks[1].pos) {
      const YAML::Mark& at = starts.marks[1];
      const char c = at.pos >= 0 && static_cast<size_t>(at.pos) < text.size()
                         ? text[at.pos]
                         : ' ';
      return absl::InvalidArgumentError(absl::StrFormat(
          "malformed YAML at line %d, column %d: unexpected %s", at.line + 1,
          at.column + 1, Quote(absl::string_view(&c, 1))));
    }
  }
  return n;
}

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
  return Error(field, "=", Quote(value), " must be one of ",
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
absl::Status CheckFinite(const Message& msg, absl::string_view section) {
  const Descriptor* desc = msg.GetDescriptor();
  const Reflection* refl = msg.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const FieldDescriptor* f = desc->field(i);
    if (f->is_repeated()) continue;
    double v = 0;
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
      v = refl->GetDouble(msg, f);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
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
absl::Status CheckStrings(const Message& msg, absl::string_view section) {
  constexpr size_t kMaxStringBytes = 64 << 10;
  const Descriptor* desc = msg.GetDescriptor();
  const Reflection* refl = msg.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const FieldDescriptor* f = desc->field(i);
    const std::string field = JoinPath(section, f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE &&
        !f->is_repeated()) {
      if (absl::Status s = CheckStrings(refl->GetMessage(msg, f), field);
          !s.ok()) {
        return s;
      }
      continue;
    }
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_STRING || f->is_repeated()) {
      continue;
    }
    const std::string value = refl->GetString(msg, f);
    if (const int64_t bad = FirstInvalidUtf8(value); bad >= 0) {
      return Error(field, " is not UTF-8 (byte ", bad, ")");
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
    return Error("name=", Quote(name), " is ", name.size(),
                 " characters long; at most ", kMaxNameLength);
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return Error("name=", Quote(name), " contains ",
                   Quote(absl::string_view(&c, 1)),
                   "; only A-Z a-z 0-9 . _ - are allowed");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const v1::JobSpec& spec) {
  const v1::ModelSpec& m = spec.model();
  if (absl::Status s = First({
          CheckFinite(m, "model"),
          OneOf("model.arch", m.arch(), {"gpt"}),
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
  constexpr absl::string_view kLlmc = "llmc:";
  if (!m.init_from().empty()) {
    if (!absl::StartsWith(m.init_from(), kLlmc)) {
      return Error("model.init_from=", Quote(m.init_from()),
                   " must be empty or 'llmc:PATH' (an llm.c checkpoint)");
    }
    if (m.init_from().size() == kLlmc.size()) {
      return Error("model.init_from=", Quote(m.init_from()),
                   " names no file after 'llmc:'");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::JobSpec& spec) {
  const v1::DataSpec& d = spec.data();
  if (absl::Status s = CheckFinite(d, "data"); !s.ok()) return s;
  const bool has_path = !d.path().empty();
  const bool has_train_bin = !d.train_bin().empty();
  const bool has_val_bin = !d.val_bin().empty();
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
  if (absl::Status s = OneOf("data.tokenizer", d.tokenizer(), {"char"});
      !s.ok()) {
    return s;
  }
  if (!(d.val_fraction() > 0 && d.val_fraction() < 1)) {
    return Error("data.val_fraction=", d.val_fraction(),
                 " must be > 0 and < 1");
  }
  return absl::OkStatus();
}

absl::Status ValidateParallel(const v1::JobSpec& spec) {
  const v1::ParallelSpec& p = spec.parallel();
  const v1::ModelSpec& m = spec.model();
  if (absl::Status s = First({
          CheckFinite(p, "parallel"),
          InRange<int64_t>("parallel.dp", p.dp(), 1, kMaxDegree),
          InRange<int64_t>("parallel.tp", p.tp(), 1, kMaxDegree),
          InRange<int64_t>("parallel.pp", p.pp(), 1, kMaxDegree),
      });
      !s.ok()) {
    return s;
  }
  if (const int64_t world = JobWorldSize(spec); world > kMaxWorldSize) {
    return Error("parallel.dp × parallel.tp × parallel.pp = ", p.dp(), " × ",
                 p.tp(), " × ", p.pp(), " = ", world, " ranks; at most ",
                 kMaxWorldSize);
  }
  if (p.zero() < 0 || p.zero() > 3) {
    return Error("parallel.zero=", p.zero(),
                 " must be between 0 and 3 (a ZeRO stage)");
  }
  if (absl::Status s = First({
          InRange("parallel.microbatches", p.microbatches(), 1, 1 << 20),
          OneOf("parallel.schedule", p.schedule(),
                {"1f1b", "gpipe", "interleaved"}),
          InRange("parallel.virtual_stages", p.virtual_stages(), 1, 1 << 12),
          InRange<int64_t>("parallel.bucket_bytes", p.bucket_bytes(), 1,
                           int64_t{1} << 40),
      });
      !s.ok()) {
    return s;
  }
  // Each tensor-parallel rank owns whole heads, each stage whole layers.
  if (m.n_head() % p.tp() != 0) {
    return Error("parallel.tp=", p.tp(),
                 " does not divide model.n_head=", m.n_head());
  }
  // Interleaving gives each pipeline rank v chunks of whole layers and
  // sends microbatches through them in groups of pp.
  const bool interleaved = p.schedule() == "interleaved";
  if (interleaved && p.virtual_stages() < 2) {
    return Error(
        "parallel.schedule=interleaved requires "
        "parallel.virtual_stages >= 2 (parallel.virtual_stages=",
        p.virtual_stages(), ")");
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
  if (absl::StatusOr<std::vector<int>> layers =
          PipelineStageLayers(p, m.n_layer());
      !layers.ok()) {
    return layers.status();
  }
  if (p.sequence_parallel()) {
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
  }
  return absl::OkStatus();
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
      Positive("train.sample_temperature", t.sample_temperature()),
      InRange("train.sample_top_k", t.sample_top_k(), 0, 1 << 24),
      OneOf("train.precision", t.precision(), {"auto", "fp32", "bf16"}),
      OneOf("train.recompute", t.recompute(), {"none", "selective", "full"}),
      AtLeast("train.log_every", t.log_every(), 1),
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
  return First({
      CheckFinite(r, "restart"),
      InRange("restart.max_restarts", r.max_restarts(), 0, 1 << 16),
      InRange("restart.hang_timeout_s", r.hang_timeout_s(), 1, 30 * 24 * 3600),
  });
}

void EmitMessage(const Message& msg, YAML::Emitter* out) {
  const Descriptor* desc = msg.GetDescriptor();
  const Reflection* refl = msg.GetReflection();
  *out << YAML::BeginMap;
  for (int i = 0; i < desc->field_count(); ++i) {
    const FieldDescriptor* f = desc->field(i);
    if (f->is_repeated()) continue;  // none in JobSpec; AssignNode refuses them
    *out << YAML::Key << f->name() << YAML::Value;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        EmitMessage(refl->GetMessage(msg, f), out);
        break;
      case FieldDescriptor::CPPTYPE_INT32:
        *out << refl->GetInt32(msg, f);
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        *out << refl->GetInt64(msg, f);
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        *out << refl->GetUInt32(msg, f);
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        *out << refl->GetUInt64(msg, f);
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        const double v = f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE
                             ? refl->GetDouble(msg, f)
                             : refl->GetFloat(msg, f);
        if (std::isnan(v)) {
          *out << ".nan";
        } else if (std::isinf(v)) {
          *out << (v > 0 ? ".inf" : "-.inf");
        } else {
          // Shortest text that reads back to the same double; the
          // emitter's fixed precision would print 0.1 as 0.10000000000000001.
          char buf[64];
          auto result = std::to_chars(buf, buf + sizeof(buf), v);
          *out << std::string(buf, result.ptr);
        }
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL:
        *out << refl->GetBool(msg, f);
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        // The emitter quotes and escapes whatever would not read back as the
        // same plain scalar (newlines, ':', '#', "null", "").
        *out << refl->GetString(msg, f);
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        *out << refl->GetEnum(msg, f)->name();
        break;
    }
  }
  *out << YAML::EndMap;
}

// The pipeline stages without a set layer count (parallel.first_stage_layers
// and last_stage_layers, 0: unset) and the layers left for them, which
// they share evenly.
struct OtherStages {
  int64_t count = 0;  // stages without a set count
  int64_t rest = 0;   // the layers left for them
  // Whether they can share `rest` evenly, at least one layer each.
  bool fit() const {
    return count == 0 ? rest == 0 : rest >= count && rest % count == 0;
  }
  int share() const { return count > 0 ? static_cast<int>(rest / count) : 0; }
};
OtherStages OtherStagesOf(int n_layer, int64_t stages, int first, int last) {
  return {stages - (first > 0) - (last > 0), int64_t{n_layer} - first - last};
}

}  // namespace

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

int64_t ParallelWorldSize(const v1::ParallelSpec& p) {
  return int64_t{p.dp()} * p.tp() * p.pp();
}

int64_t JobWorldSize(const v1::JobSpec& spec) {
  return ParallelWorldSize(spec.parallel());
}

ScheduleKind ScheduleKindOf(std::string_view name) {
  if (name == "gpipe") return ScheduleKind::kGpipe;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  return ScheduleKind::k1F1B;
}

const char* ScheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGpipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
  }
  return "?";
}

Recompute RecomputeOf(std::string_view name) {
  if (name == "full") return Recompute::kFull;
  return name == "selective" ? Recompute::kSelective : Recompute::kNone;
}

Device SpecDevice(const v1::JobSpec& spec) {
  return spec.resources().device() == "cuda" ? Device::kCuda : Device::kCpu;
}

Precision SpecPrecision(const v1::JobSpec& spec) {
  const std::string& p = spec.train().precision();
  if (p == "auto") {
    return SpecDevice(spec) == Device::kCuda ? Precision::kBf16
                                             : Precision::kFp32;
  }
  return p == "bf16" ? Precision::kBf16 : Precision::kFp32;
}

int64_t FirstInvalidUtf8(std::string_view text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = b[i];
    size_t len = 0;
    uint32_t min = 0, cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, min = 0x80, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, min = 0x800, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, min = 0x10000, cp = c & 0x07;
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t k = 1; k < len; ++k) {
      if ((b[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (b[i + k] & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are
    // not UTF-8.
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return static_cast<int64_t>(i);
    }
    i += len;
  }
  return -1;
}

v1::JobSpec DefaultJobSpec() {
  v1::JobSpec spec;

  v1::ModelSpec* model = spec.mutable_model();
  model->set_arch("gpt");
  model->set_n_layer(4);
  model->set_n_head(4);
  model->set_n_embd(128);
  model->set_block_size(64);
  model->set_vocab_size(0);
  model->set_init_from("");

  v1::DataSpec* data = spec.mutable_data();
  data->set_path("");
  data->set_tokenizer("char");
  data->set_val_fraction(0.1);
  data->set_train_bin("");
  data->set_val_bin("");

  v1::ParallelSpec* parallel = spec.mutable_parallel();
  parallel->set_dp(1);
  parallel->set_tp(1);
  parallel->set_pp(1);
  parallel->set_zero(0);
  parallel->set_sequence_parallel(false);
  parallel->set_microbatches(1);
  parallel->set_schedule("1f1b");
  parallel->set_bucket_bytes(int64_t{25} << 20);
  parallel->set_virtual_stages(1);

  v1::TrainSpec* train = spec.mutable_train();
  train->set_steps(1000);
  train->set_global_batch(32);
  train->set_lr(1e-3);
  train->set_min_lr(1e-4);
  train->set_warmup_steps(100);
  train->set_weight_decay(0.1);
  train->set_grad_clip(1.0);
  train->set_seed(1337);
  train->set_eval_every(100);
  train->set_eval_batches(20);
  train->set_sample_every(0);
  train->set_beta1(0.9);
  train->set_beta2(0.95);
  train->set_eps(1e-8);
  train->set_sample_prompt("\n");
  train->set_sample_tokens(200);
  train->set_sample_temperature(1.0);
  train->set_sample_top_k(0);
  train->set_log_every(10);
  train->set_precision("auto");
  train->set_recompute("none");

  v1::CheckpointSpec* checkpoint = spec.mutable_checkpoint();
  checkpoint->set_every(0);
  checkpoint->set_keep_last(3);
  checkpoint->set_dir("");

  v1::ResourcesSpec* resources = spec.mutable_resources();
  resources->set_device("cpu");
  resources->set_ranks_per_node(0);
  resources->set_threads_per_rank(0);

  v1::RestartSpec* restart = spec.mutable_restart();
  restart->set_max_restarts(3);
  restart->set_hang_timeout_s(300);
  restart->set_allow_shrink(false);
  restart->set_allow_grow(false);
  return spec;
}

absl::StatusOr<v1::JobSpec> ParseJobSpec(
    std::string_view yaml_text, const std::vector<std::string>& overrides,
    std::string_view source_name) {
  const absl::string_view source = ToAbsl(source_name);
  const Origin origin{absl::StrCat(source, ": "), /*has_marks=*/true};
  if (yaml_text.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": is ", yaml_text.size(), " bytes; a job spec ",
                     "is at most ", kMaxSpecBytes, " bytes (1 MiB)"));
  }
  if (const int64_t bad = FirstInvalidUtf8(yaml_text); bad >= 0) {
    const std::string_view before = yaml_text.substr(0, bad);
    const size_t line_start = before.rfind('\n');
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not UTF-8: byte 0x%02x at offset %d (line %d, column %d); a job "
        "spec is UTF-8 text",
        source, static_cast<unsigned char>(yaml_text[bad]), bad,
        std::count(before.begin(), before.end(), '\n') + 1,
        bad -
            (line_start == std::string_view::npos ? -1 : int64_t(line_start))));
  }
  for (const std::string& assignment : overrides) {
    if (const int64_t bad = FirstInvalidUtf8(assignment); bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "override ", Quote(assignment), ": not UTF-8 (byte ", bad, ")"));
    }
  }
  v1::JobSpec spec = DefaultJobSpec();
  try {
    const std::string text(yaml_text);
    absl::StatusOr<int> documents = CountDocuments(text);
    if (!documents.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", documents.status().message()));
    }
    if (*documents > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": holds more than one YAML document; a job ",
                       "spec is one"));
    }
    std::vector<YAML::Node> docs;
    if (*documents == 1) docs.push_back(YAML::Load(text));
    if (docs.empty() || !docs[0].IsMap()) {
      std::string got = docs.empty() ? "an empty document" : Describe(docs[0]);
      std::string where;
      if (!docs.empty() && !docs[0].Mark().is_null()) {
        where =
            absl::StrFormat(" (line %d, column %d)", docs[0].Mark().line + 1,
                            docs[0].Mark().column + 1);
      }
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": expected a map of fields (name, model, ",
                       "data, ...) at the top level, got ", got, where));
    }
    if (absl::Status s = MapOntoMessage(docs[0], &spec, "", origin); !s.ok()) {
      return s;
    }
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": malformed YAML: ", e.msg));
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: malformed YAML at line %d, column %d: %s", source,
                        e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  for (const std::string& assignment : overrides) {
    if (absl::Status s = ApplyOverride(&spec, assignment); !s.ok()) {
      return s;
    }
  }
  // Overrides must not be a way around the size limit of the file.
  if (const size_t bytes = spec.ByteSizeLong(); bytes > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the spec after overrides is ", bytes,
        " bytes; a job spec is at most ", kMaxSpecBytes, " bytes (1 MiB)"));
  }
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return s;
  return spec;
}

absl::StatusOr<std::string> ReadJobSpecFile(const std::string& path,
                                            std::string_view what) {
  return ReadBoundedFile(ToAbsl(what), path, kMaxSpecBytes);
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(
    const std::string& path, const std::vector<std::string>& overrides,
    std::string_view what) {
  absl::StatusOr<std::string> text = ReadJobSpecFile(path, what);
  if (!text.ok()) return text.status();
  return ParseJobSpec(*text, overrides, path);
}

absl::Status ApplyOverride(v1::JobSpec* spec,
                           std::string_view assignment_text) {
  const absl::string_view assignment = ToAbsl(assignment_text);
  const Origin origin{absl::StrCat("override ", Quote(assignment), ": "),
                      /*has_marks=*/false};
  const size_t eq = assignment.find('=');
  if (eq == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin.prefix, "expected path=value, e.g. train.steps=200"));
  }
  const absl::string_view path =
      absl::StripAsciiWhitespace(assignment.substr(0, eq));
  const std::string value(assignment.substr(eq + 1));

  Message* msg = spec;
  const FieldDescriptor* field = nullptr;
  std::string walked;
  const std::vector<absl::string_view> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          origin.prefix, "path ", Quote(path), " has an empty component"));
    }
    if (i > 0) {
      if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE ||
          field->is_repeated()) {
        return absl::InvalidArgumentError(
            absl::StrCat(origin.prefix, walked, " is not a section; it has no ",
                         "field '", parts[i], "'"));
      }
      msg = msg->GetReflection()->MutableMessage(msg, field);
    }
    walked = JoinPath(walked, parts[i]);
    field = msg->GetDescriptor()->FindFieldByName(std::string(parts[i]));
    if (field == nullptr) {
      return UnknownKey(origin, walked, msg->GetDescriptor(),
                        YAML::Mark::null_mark());
    }
  }

  YAML::Node node;
  try {
    node = YAML::Load(value);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin.prefix, walked, ": value is not valid YAML (",
                     e.msg, "); quote it"));
  }
  return AssignNode(node, field, msg, walked, origin);
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  // Sections in job.proto order, so the first error reported is stable.
  if (absl::Status s = CheckStrings(spec, ""); !s.ok()) return s;
  for (auto* validate : {&ValidateName, &ValidateModel, &ValidateData,
                         &ValidateParallel, &ValidateTrain, &ValidateCheckpoint,
                         &ValidateResources, &ValidateRestart}) {
    if (absl::Status s = validate(spec); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string JobSpecToYaml(const v1::JobSpec& spec) {
  YAML::Emitter out;
  EmitMessage(spec, &out);
  return std::string(out.c_str()) + "\n";
}

namespace {

// A pipeline whose stages split the layers evenly while the LM head, on the
// last stage, costs a block or more: the split of the first and last
// stages' layers that makes the slowest stage fastest, when it is at least
// a tenth faster than the even one; "" otherwise. Only where the spec tells
// the vocabulary (model.vocab_size, or GPT-2's for token files).
std::string UnevenStagesAdvice(const v1::JobSpec& spec) {
  const v1::ParallelSpec& p = spec.parallel();
  const v1::ModelSpec& m = spec.model();
  const int vocab = m.vocab_size() > 0                 ? m.vocab_size()
                    : !spec.data().train_bin().empty() ? kGpt2VocabSize
                                                       : 0;
  const int64_t stages = int64_t{p.pp()} * p.virtual_stages();
  if (stages < 2 || vocab == 0 || p.first_stage_layers() != 0 ||
      p.last_stage_layers() != 0) {
    return "";
  }
  const int L = m.n_layer();
  // Forward multiply-adds a token: the head C·V, a block 12·C² + T·C
  // (its matmuls, then attention's scores and mixing at full length).
  const double C = m.n_embd(), T = m.block_size();
  const double head = C * vocab / (12 * C * C + T * C);  // in blocks
  const int even = static_cast<int>(L / stages);
  const double even_slowest = even + head;
  if (head < 1) return "";
  // The cost of the slowest stage with `first` and `last` layers (0: the
  // even share of what is left) at the ends, or -1 where that is no split.
  auto slowest = [&](int first, int last) -> double {
    const OtherStages others = OtherStagesOf(L, stages, first, last);
    if (!others.fit()) return -1;
    const double share = others.share();
    return std::max(
        {first > 0 ? first : share, share, (last > 0 ? last : share) + head});
  };
  // Of equal splits the one with the fewest layers first: the first stage
  // keeps the most microbatches in flight under 1F1B.
  int best_first = 0, best_last = 0;
  double best = even_slowest;
  for (int first = 0; first <= L; ++first) {
    for (int last = 0; last + first <= L; ++last) {
      const double c = slowest(first, last);
      if (c >= 0 && c < best - 1e-9)
        best = c, best_first = first, best_last = last;
    }
  }
  if (best > 0.9 * even_slowest) return "";
  std::string set;
  if (best_first > 0) {
    absl::StrAppend(&set, "parallel.first_stage_layers=", best_first);
  }
  if (best_last > 0) {
    absl::StrAppend(&set, set.empty() ? "" : " and ",
                    "parallel.last_stage_layers=", best_last);
  }
  return absl::StrFormat(
      "the LM head on the last pipeline stage costs about %.1f blocks "
      "(model.n_embd=%d × a vocabulary of %d), so with %d layers on every "
      "one of the parallel.pp × parallel.virtual_stages = %d stages the "
      "others wait for the last at every microbatch; %s would make the "
      "slowest stage %.1f blocks' worth instead of %.1f",
      head, m.n_embd(), vocab, even, stages, set, best, even_slowest);
}

}  // namespace

std::vector<std::string> JobSpecWarnings(const v1::JobSpec& spec) {
  std::vector<std::string> out;
  const v1::ParallelSpec& p = spec.parallel();
  if (std::string advice = UnevenStagesAdvice(spec); !advice.empty()) {
    out.push_back(std::move(advice));
  }
  if (p.pp() > 1 && p.microbatches() < p.pp()) {
    const double bubble =
        static_cast<double>(p.pp() - 1) / (p.microbatches() + p.pp() - 1);
    out.push_back(absl::StrCat(
        "parallel.microbatches=", p.microbatches(),
        " is fewer than parallel.pp=", p.pp(), ": the pipeline idles ",
        static_cast<int>(bubble * 100 + 0.5),
        "% of each step (the bubble, (pp-1)/(m+pp-1)); use at least ", p.pp(),
        " microbatches, better 4x that"));
  }
  const v1::CheckpointSpec& c = spec.checkpoint();
  if (c.async_save() && (c.dir().empty() || c.every() == 0)) {
    out.push_back(
        "checkpoint.async_save has no effect without checkpoint.dir and "
        "checkpoint.every > 0: only periodic checkpoints are written in the "
        "background (the last step's is always written before the run ends)");
  }
  return out;
}

}  // namespace ptrain
