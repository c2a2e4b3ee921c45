// The job spec as text: YAML files and --set overrides read onto
// DefaultJobSpec() (field by field in spec_fields.cc) and a JobSpec written
// back as YAML, through protobuf reflection, so a field added to job.proto
// needs no code here.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/bounded_file.h"
#include "common/echo.h"
#include "common/hf_config.h"
#include "common/spec.h"
#include "common/spec_internal.h"
#include "common/utf8.h"

namespace ptrain {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using spec_internal::AssignNode;
using spec_internal::Describe;
using spec_internal::JoinPath;
using spec_internal::MapOntoMessage;
using spec_internal::Origin;
using spec_internal::UnknownKey;

// Debian's abseil keeps its own string_view type; the header speaks std.
absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }

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
          at.column + 1, EchoQuoted(absl::string_view(&c, 1))));
    }
  }
  return n;
}

// A control character anywhere, or a blank at either end.
bool NeedsDoubleQuotes(const std::string& v) {
  if (!v.empty() &&
      (absl::ascii_isspace(static_cast<unsigned char>(v.front())) ||
       absl::ascii_isspace(static_cast<unsigned char>(v.back())))) {
    return true;
  }
  for (unsigned char c : v) {
    if (c < 0x20 || c == 0x7f) return true;
  }
  return false;
}

void EmitMessage(const Message& msg, YAML::Emitter* out) {
  const Descriptor* desc = msg.GetDescriptor();
  const Reflection* refl = msg.GetReflection();
  *out << YAML::BeginMap;
  for (int i = 0; i < desc->field_count(); ++i) {
    const FieldDescriptor* f = desc->field(i);
    if (f->is_repeated()) {
      // Lists of sections (data.blend); an empty one as [].
      if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
      *out << YAML::Key << f->name() << YAML::Value;
      if (refl->FieldSize(msg, f) == 0) {
        *out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        continue;
      }
      *out << YAML::BeginSeq;
      for (int j = 0; j < refl->FieldSize(msg, f); ++j) {
        EmitMessage(refl->GetRepeatedMessage(msg, f, j), out);
      }
      *out << YAML::EndSeq;
      continue;
    }
    // An optional scalar left out stays out: its absence means a default
    // of its own (model.moe.aux_loss_coef), not 0.
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE &&
        f->has_presence() && !refl->HasField(msg, f)) {
      continue;
    }
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
      case FieldDescriptor::CPPTYPE_STRING: {
        // The emitter quotes and escapes whatever would not read back as the
        // same plain scalar (newlines, ':', '#', "null", ""), but not a
        // control character or blank at either end (a trailing "\r" was
        // read back without it): those are double-quoted, escaped.
        const std::string v = refl->GetString(msg, f);
        if (NeedsDoubleQuotes(v)) *out << YAML::DoubleQuoted;
        *out << v;
        break;
      }
      case FieldDescriptor::CPPTYPE_ENUM:
        *out << refl->GetEnum(msg, f)->name();
        break;
    }
  }
  *out << YAML::EndMap;
}

}  // namespace

namespace {

// ParseJobSpec onto `spec` (the defaults, or those a model's config
// fills in); validated when `validate`.
absl::StatusOr<v1::JobSpec> ParseOnto(v1::JobSpec spec,
                                      std::string_view yaml_text,
                                      const std::vector<std::string>& overrides,
                                      std::string_view source_name,
                                      bool validate) {
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
          "override ", EchoQuoted(assignment), ": not UTF-8 (byte ", bad, ")"));
    }
  }
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
  if (!validate) return spec;
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return s;
  return spec;
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpec(
    std::string_view yaml_text, const std::vector<std::string>& overrides,
    std::string_view source_name, const SpecFileReader& read_file) {
  if (read_file == nullptr) {
    return ParseOnto(DefaultJobSpec(), yaml_text, overrides, source_name,
                     /*validate=*/true);
  }
  // A model from a Hugging Face folder: its config's fields under the
  // spec's, then the two checked against each other.
  absl::StatusOr<v1::JobSpec> first = ParseOnto(
      DefaultJobSpec(), yaml_text, overrides, source_name, /*validate=*/false);
  if (!first.ok()) return first.status();
  const std::string& init = first->model().init_from();
  if (!absl::StartsWith(init, kHfPrefix) || init.size() == kHfPrefix.size()) {
    if (absl::Status s = ValidateJobSpec(*first); !s.ok()) return s;
    return first;
  }
  const std::string config_path =
      absl::StrCat(init.substr(kHfPrefix.size()), "/config.json");
  const std::string where = absl::StrCat("model.init_from: ", config_path);
  absl::StatusOr<std::string> text = read_file(config_path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", text.status().message()));
  }
  absl::StatusOr<HfConfig> config = ParseHfConfig(*text, where);
  if (!config.ok()) return config.status();
  v1::JobSpec base = DefaultJobSpec();
  v1::ModelSpec* model = base.mutable_model();
  model->MergeFrom(config->model);
  model->set_block_size(std::min(model->block_size(), config->max_positions));
  absl::StatusOr<v1::JobSpec> spec =
      ParseOnto(base, yaml_text, overrides, source_name, /*validate=*/false);
  if (!spec.ok()) return spec.status();
  // Disagreement first: it explains what validation would refuse next.
  if (absl::Status s = CheckSpecAgainstHf(spec->model(), *config, where);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateJobSpec(*spec); !s.ok()) return s;
  return spec;
}

absl::StatusOr<std::string> ReadJobSpecFile(const std::string& path,
                                            std::string_view what) {
  return ReadBoundedFile(ToAbsl(what), path, kMaxSpecBytes);
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(
    const std::string& path, const std::vector<std::string>& overrides,
    std::string_view what, const SpecFileReader& read_file) {
  absl::StatusOr<std::string> text = ReadJobSpecFile(path, what);
  if (!text.ok()) return text.status();
  return ParseJobSpec(*text, overrides, path, read_file);
}

absl::Status ApplyOverride(v1::JobSpec* spec,
                           std::string_view assignment_text) {
  const absl::string_view assignment = ToAbsl(assignment_text);
  const Origin origin{absl::StrCat("override ", EchoQuoted(assignment), ": "),
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
          origin.prefix, "path ", EchoQuoted(path), " has an empty component"));
    }
    if (i > 0) {
      if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE ||
          field->is_repeated()) {
        return absl::InvalidArgumentError(
            absl::StrCat(origin.prefix, walked, " is not a section; it has no ",
                         "field ", EchoQuoted(parts[i])));
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

std::string JobSpecToYaml(const v1::JobSpec& spec) {
  YAML::Emitter out;
  EmitMessage(spec, &out);
  return std::string(out.c_str()) + "\n";
}

}  // namespace ptrain
