// Bearer-token checks for ptcoord: user tokens (JobService) from a file and
// per-job tokens (RankService) generated at launch. No RPC types here; the
// service edge passes the `authorization` header value in.
#ifndef PTRAIN_COORDINATOR_AUTH_H_
#define PTRAIN_COORDINATOR_AUTH_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ptrain {

// One token per line; blank lines and lines starting with '#' are skipped,
// surrounding whitespace trimmed. An empty or unreadable file is an error:
// a coordinator nobody can use is a configuration mistake.
absl::StatusOr<std::vector<std::string>> LoadTokenFile(const std::string& path);

// Extracts TOKEN from "Bearer TOKEN" (scheme case-insensitive). Unauthenticated
// when the header is missing or malformed.
absl::StatusOr<std::string> BearerToken(
    const std::optional<std::string>& authorization);

// OK when `authorization` carries one of `allowed`, else Unauthenticated.
// Compares in constant time per candidate so a token cannot be guessed byte
// by byte from response times.
absl::Status CheckBearer(const std::optional<std::string>& authorization,
                         const std::vector<std::string>& allowed);

// 32 random bytes from /dev/urandom as 64 hex characters.
std::string GenerateToken();

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_AUTH_H_
