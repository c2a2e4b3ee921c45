// Bearer tokens on both ends of ptrain's RPCs: token files (ptcoord's user
// and join tokens, ptworkerd's join token), the `authorization` header's
// token, and the check of a token against those allowed. No RPC types here:
// the service edge passes the header value in. Token generation and the
// per-attempt token hashes are ptcoord's (coordinator/auth.h).
#ifndef PTRAIN_COMMON_AUTH_TOKEN_H_
#define PTRAIN_COMMON_AUTH_TOKEN_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptrain {

// A token file is a few lines; anything larger is the wrong file.
inline constexpr size_t kMaxTokenFileBytes = size_t{64} << 10;

// A token of fewer characters can be guessed in reach of a throttle on
// failed authentication; ptcoord warns of one at start.
inline constexpr size_t kMinTokenChars = 16;

// One token per line; blank lines and lines starting with '#' are skipped,
// surrounding whitespace trimmed. The file is read with ReadBoundedFile (a
// regular file of at most kMaxTokenFileBytes), and every token must pass
// CheckHeaderValue, as it is sent in a header. An empty or unreadable file
// is an error: a coordinator nobody can use is a configuration mistake.
// Messages start with `what` (the flag that named the file) and the path,
// and name the line of a bad token (never the token). `short_tokens`, when
// given, receives a line in the same form for each token shorter than
// kMinTokenChars (accepted all the same).
absl::StatusOr<std::vector<std::string>> LoadTokenFile(
    const std::string& path, absl::string_view what = "token file",
    std::vector<std::string>* short_tokens = nullptr);

// Extracts TOKEN from "Bearer TOKEN" (scheme case-insensitive). Unauthenticated
// when the header is missing or malformed.
absl::StatusOr<std::string> BearerToken(
    const std::optional<std::string>& authorization);

// OK when `authorization` carries one of `allowed`, else Unauthenticated.
// Compares in constant time per candidate so a token cannot be guessed byte
// by byte from response times.
absl::Status CheckBearer(const std::optional<std::string>& authorization,
                         const std::vector<std::string>& allowed);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_AUTH_TOKEN_H_
