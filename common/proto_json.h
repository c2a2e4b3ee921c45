// A message as JSON the way ptrain shows one (ptctl -o json, the web UI's
// job spec): the field names of the proto, as the YAML spec writes them,
// and every primitive field printed, zero or not.
#ifndef PTRAIN_COMMON_PROTO_JSON_H_
#define PTRAIN_COMMON_PROTO_JSON_H_

#include <string>

#include "google/protobuf/message.h"

namespace ptrain {

// `pretty`: indented, one field a line. "" when the message cannot be
// printed (never for ptrain's messages).
std::string ProtoJson(const google::protobuf::Message& m, bool pretty);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_PROTO_JSON_H_
