// What an error message or a log line may show of a value a client sent (a
// job id, a node name, a command line, a spec path): at most
// kMaxEchoBytes of it, on one line. Every ptcoord and ptworkerd message that
// quotes request input goes through Echo, so a 100 KB value costs a few
// hundred bytes of answer — gRPC refuses a status message larger than its
// header limit (RESOURCE_EXHAUSTED, the real error lost) — and cannot split
// a log line. Not a sanitizer for HTML or shells: the caller's output is
// still text.
#ifndef PTRAIN_COMMON_ECHO_H_
#define PTRAIN_COMMON_ECHO_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace ptrain {

// Enough for any name, id or path a user means to type; far below the 8 KiB
// of headers gRPC's peers accept by default.
inline constexpr size_t kMaxEchoBytes = 200;

// `value` as a message may show it: its first kMaxEchoBytes bytes (cut
// before a UTF-8 character that would not fit whole), well-formed UTF-8
// characters kept, every other byte that is not printable ASCII escaped
// C-style, as are backslashes and quotes (\n, \x01, \xff, \'); when cut,
// "…" and the whole value's size follow ("… (102400 bytes)"). The result
// is valid UTF-8 of at most 4 × kMaxEchoBytes + 32 bytes.
std::string Echo(absl::string_view value);

// Echo(value) between single quotes: 'job-0001'.
std::string EchoQuoted(absl::string_view value);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_ECHO_H_
