// Bearer-token checks for ptcoord: user tokens (JobService) from a file and
// per-attempt tokens (RankService) generated at launch, of which only the
// SHA-256 is kept. No RPC types here; the service edge passes the
// `authorization` header value in.
#ifndef PTRAIN_COORDINATOR_AUTH_H_
#define PTRAIN_COORDINATOR_AUTH_H_

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

// One token per line; blank lines and lines starting with '#' are skipped,
// surrounding whitespace trimmed. The file is read with ReadBoundedFile (a
// regular file of at most kMaxTokenFileBytes), and every token must pass
// CheckHeaderValue, as it is sent in a header. An empty or unreadable file
// is an error: a coordinator nobody can use is a configuration mistake.
// Messages start with `what` (the flag that named the file) and the path,
// and name the line of a bad token (never the token).
absl::StatusOr<std::vector<std::string>> LoadTokenFile(
    const std::string& path, absl::string_view what = "token file");

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

// `n` random bytes as 2n lowercase hex characters (non-secret ids too).
std::string RandomHex(int n);

// SHA-256 of `text` as 64 lowercase hex characters (OpenSSL's libcrypto).
// What ptcoord stores instead of a rank token.
std::string Sha256Hex(absl::string_view text);

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
