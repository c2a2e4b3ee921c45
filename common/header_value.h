// Values that go into a gRPC request header (the bearer token). Every one
// that comes from input (a flag, an environment variable, a file) is checked
// here before any call: gRPC aborts the whole process on an illegal header
// value instead of failing the call, and logs the value, a secret, on the
// way down.
#ifndef PTRAIN_COMMON_HEADER_VALUE_H_
#define PTRAIN_COMMON_HEADER_VALUE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ptrain {

// Far above any token ptrain makes (64 characters) and below what HTTP/2
// servers accept in a header block by default (8 KiB).
inline constexpr size_t kMaxHeaderValueBytes = 4096;

// OK when `value` is 1 to kMaxHeaderValueBytes bytes, each printable ASCII
// (0x20-0x7E). Else InvalidArgument led by `what` (where the value came
// from: "--token", "PTRAIN_JOB_TOKEN", "tokens.txt: line 3") with the rule
// and the first offending byte's offset and code, never the value itself.
absl::Status CheckHeaderValue(absl::string_view what, absl::string_view value);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_HEADER_VALUE_H_
