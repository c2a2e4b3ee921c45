// What the units of the job spec (spec_fields.cc, spec_yaml.cc,
// spec_validate.cc, spec_warnings.cc) share with each other; not for
// callers, whose one header is common/spec.h.
#ifndef PTRAIN_COMMON_SPEC_INTERNAL_H_
#define PTRAIN_COMMON_SPEC_INTERNAL_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ptrain::spec_internal {

// Where the YAML being mapped came from, so errors point back at it.
struct Origin {
  std::string prefix;  // "job.yaml: " or "override 'train.steps=x': "
  bool has_marks;      // line/column refer to the user's text
};

// `parent.name`, or `name` at the top level.
std::string JoinPath(absl::string_view parent, absl::string_view name);

// What a node is, for a message: its quoted text, "a map", "a list" or "an
// empty value".
std::string Describe(const YAML::Node& node);

// `path` names no field of `desc`: the error lists the fields it has.
absl::Status UnknownKey(const Origin& origin, absl::string_view path,
                        const google::protobuf::Descriptor* desc,
                        const YAML::Mark& mark);

// The one conversion from a YAML node to a field, used by both the file
// mapping and --set overrides so the two accept exactly the same values.
absl::Status AssignNode(const YAML::Node& node,
                        const google::protobuf::FieldDescriptor* field,
                        google::protobuf::Message* msg, absl::string_view path,
                        const Origin& origin);

// Assigns each key of the map `node` to the field of `msg` it names, through
// AssignNode; unknown and repeated keys are errors.
absl::Status MapOntoMessage(const YAML::Node& node,
                            google::protobuf::Message* msg,
                            absl::string_view path, const Origin& origin);

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
inline OtherStages OtherStagesOf(int n_layer, int64_t stages, int first,
                                 int last) {
  return {stages - (first > 0) - (last > 0), int64_t{n_layer} - first - last};
}

}  // namespace ptrain::spec_internal

#endif  // PTRAIN_COMMON_SPEC_INTERNAL_H_
