// Bearer-token checks only ptcoord makes: per-attempt tokens (RankService)
// generated at launch, of which only the SHA-256 is kept, node secrets, and
// the random ids ptcoord hands out. No RPC types here; the service edge
// passes the `authorization` header value in. Token files and the check
// against a list of tokens, which ptworkerd makes too, are in
// common/auth_token.h; digests in common/digest.h.
#ifndef PTRAIN_COORDINATOR_AUTH_H_
#define PTRAIN_COORDINATOR_AUTH_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ptrain {

// 32 random bytes from /dev/urandom as 64 hex characters.
std::string GenerateToken();

// `n` random bytes as 2n lowercase hex characters (non-secret ids too).
std::string RandomHex(int n);

// OK when `authorization` carries a token whose Sha256Hex is `sha256_hex`
// (compared in constant time), else Unauthenticated. An empty `sha256_hex`
// (no attempt running) matches nothing.
absl::Status CheckBearerHash(const std::optional<std::string>& authorization,
                             const std::string& sha256_hex);

// True when Sha256Hex(`secret`) is `sha256_hex`, compared in constant time;
// false for an empty `sha256_hex`.
bool SecretMatches(absl::string_view secret, const std::string& sha256_hex);

// A universally unique, time-ordered id: a ULID (48-bit milliseconds since
// the epoch, then 80 random bits, 26 characters of Crockford base32).
std::string NewUlid();

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_AUTH_H_
