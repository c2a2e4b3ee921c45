// The one conversion from YAML to JobSpec fields, through protobuf
// reflection, that both the spec file (spec_yaml.cc) and --set overrides use,
// so the two accept exactly the same values; a field added to job.proto is
// readable and overridable without code here.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/echo.h"
#include "common/spec_internal.h"

namespace ptrain::spec_internal {

using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

std::string JoinPath(absl::string_view parent, absl::string_view name) {
  return parent.empty() ? std::string(name) : absl::StrCat(parent, ".", name);
}

namespace {

absl::Status FieldError(const Origin& origin, absl::string_view path,
                        absl::string_view rule, const YAML::Mark& mark) {
  std::string where;
  // yaml-cpp counts lines and columns from 0; editors count from 1.
  if (origin.has_marks && !mark.is_null()) {
    where = absl::StrFormat(" (line %d, column %d)", mark.line + 1,
                            mark.column + 1);
  }
  // `path` holds the user's keys: an unknown one is shown bounded.
  return absl::InvalidArgumentError(
      absl::StrCat(origin.prefix, Echo(path), ": ", rule, where));
}

std::string FieldNames(const Descriptor* desc) {
  std::vector<std::string> names;
  for (int i = 0; i < desc->field_count(); ++i) {
    names.push_back(desc->field(i)->name());
  }
  return absl::StrJoin(names, ", ");
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

// Sets the integer field from `text` after checking the field's range;
// int32 and uint32 fields must not silently wrap a value that fits 64 bits.
absl::Status SetInteger(const FieldDescriptor* field, Message* msg,
                        absl::string_view text, absl::string_view path,
                        const Origin& origin, const YAML::Mark& mark) {
  ParsedInt v;
  IntParse parsed = ParseInteger(text, &v);
  if (parsed == IntParse::kNotAnInteger) {
    return FieldError(
        origin, path,
        absl::StrCat("expected an integer, got ", EchoQuoted(text)), mark);
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

}  // namespace

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return EchoQuoted(node.Scalar());
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

// Edit distance between a and b: insertions, deletions, substitutions and
// swaps of two neighbouring characters cost 1 each (the optimal string
// alignment distance, what typing slips are made of).
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1,
                                     std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The field of `desc` whose name is nearest to `key`, when near enough to
// be a slip of the keyboard (at most a third of its letters apart, and at
// least one); "" otherwise.
std::string NearestFieldName(absl::string_view key, const Descriptor* desc) {
  std::string best;
  size_t best_distance = std::max<size_t>(1, key.size() / 3) + 1;
  for (int i = 0; i < desc->field_count(); ++i) {
    const std::string& name = desc->field(i)->name();
    const size_t d = EditDistance(key, name);
    if (d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  return best;
}

absl::Status UnknownKey(const Origin& origin, absl::string_view path,
                        const Descriptor* desc, const YAML::Mark& mark) {
  const size_t dot = path.rfind('.');
  const std::string near = NearestFieldName(
      dot == absl::string_view::npos ? path : path.substr(dot + 1), desc);
  return FieldError(
      origin, path,
      absl::StrCat(
          "unknown key",
          near.empty() ? "" : absl::StrCat(" (did you mean ", near, "?)"),
          "; expected one of ", FieldNames(desc)),
      mark);
}

// The one conversion from a YAML node to a field, used by both the file
// mapping and --set overrides so the two accept exactly the same values.
absl::Status AssignNode(const YAML::Node& node, const FieldDescriptor* field,
                        Message* msg, absl::string_view path,
                        const Origin& origin) {
  const Reflection* refl = msg->GetReflection();
  const YAML::Mark mark = node.Mark();
  if (field->is_repeated()) {
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
      return FieldError(origin, path, "list fields are not supported", mark);
    }
    // A list of sections (data.blend): the whole list, replacing any
    // earlier one, entry i named PATH[i] in errors.
    if (!node.IsSequence()) {
      return FieldError(origin, path,
                        absl::StrCat("expected a list of maps of fields, got ",
                                     Describe(node)),
                        mark);
    }
    refl->ClearField(msg, field);
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node entry = node[i];
      const std::string at = absl::StrCat(path, "[", i, "]");
      if (!entry.IsMap()) {
        return FieldError(
            origin, at,
            absl::StrCat("expected a map of fields, got ", Describe(entry)),
            entry.Mark());
      }
      if (absl::Status s =
              MapOntoMessage(entry, refl->AddMessage(msg, field), at, origin);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  const std::string expected = ExpectedKind(field);
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    // A section with a `layout` field (parallel) may be written as one
    // word: `parallel: auto` is `parallel: {layout: auto}`.
    const FieldDescriptor* layout =
        field->message_type()->FindFieldByName("layout");
    if (layout != nullptr && node.IsScalar() && node.Scalar() == "auto") {
      Message* section = refl->MutableMessage(msg, field);
      section->GetReflection()->SetString(section, layout, "auto");
      return absl::OkStatus();
    }
    if (!node.IsMap()) {
      return FieldError(origin, path,
                        absl::StrCat("expected ", expected,
                                     layout != nullptr ? " or auto" : "",
                                     ", got ", Describe(node)),
                        mark);
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
    return FieldError(
        origin, path,
        absl::StrCat("expected ", expected, ", got the quoted string ",
                     EchoQuoted(text)),
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
  return FieldError(
      origin, path,
      absl::StrCat("expected ", expected, ", got ", EchoQuoted(text)), mark);
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

}  // namespace ptrain::spec_internal
