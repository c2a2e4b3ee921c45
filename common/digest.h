// SHA-256 digests as hex text and the constant-time comparison of secrets:
// what ptcoord stores instead of a token, what ptworkerd sends to have an
// attempt's token checked, and what covers a checkpoint's manifest. Not
// token parsing (common/auth_token.h) nor token generation (ptcoord's).
#ifndef PTRAIN_COMMON_DIGEST_H_
#define PTRAIN_COMMON_DIGEST_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ptrain {

// `bytes` as 2 lowercase hex characters each.
std::string HexString(absl::string_view bytes);

// SHA-256 of `text` as 64 lowercase hex characters (OpenSSL's libcrypto).
std::string Sha256Hex(absl::string_view text);

// True when `a` and `b` are equal, in a time that depends on their lengths
// only, so a secret cannot be guessed byte by byte from response times.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_DIGEST_H_
