// Checking and mending UTF-8, which every entry point takes and every
// message, log line and protobuf string must be.
#ifndef PTRAIN_COMMON_UTF8_H_
#define PTRAIN_COMMON_UTF8_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace ptrain {

// The offset of the first byte of `text` that is not part of well-formed
// UTF-8, or -1 when all of it is. Every entry point takes only UTF-8.
int64_t FirstInvalidUtf8(std::string_view text);

// `bytes` as UTF-8: each byte that does not belong to a UTF-8 character
// becomes U+FFFD (what a log line, a protobuf string and a terminal take).
std::string ToValidUtf8(std::string_view bytes);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_UTF8_H_
