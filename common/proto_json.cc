// See proto_json.h.
#include "common/proto_json.h"

#include "google/protobuf/util/json_util.h"

namespace ptrain {

std::string ProtoJson(const google::protobuf::Message& m, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(m, &out, options).ok()) {
    return "";
  }
  return out;
}

}  // namespace ptrain
