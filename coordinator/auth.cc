// Bearer-token parsing and checking for ptcoord; see auth.h. Token storage
// and transport security (TLS) live elsewhere.
#include "coordinator/auth.h"

#include <openssl/sha.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/bounded_file.h"
#include "common/header_value.h"

namespace ptrain {

absl::StatusOr<std::vector<std::string>> LoadTokenFile(const std::string& path,
                                                       absl::string_view what) {
  absl::StatusOr<std::string> text =
      ReadBoundedFile(what, path, kMaxTokenFileBytes);
  if (!text.ok()) return text.status();
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    const absl::string_view t = absl::StripAsciiWhitespace(line);
    if (t.empty() || t[0] == '#') continue;
    // Each token goes into an `authorization` header, as is: a byte gRPC
    // refuses there would abort the process that sends it.
    if (absl::Status s = CheckHeaderValue(
            absl::StrCat(what, " ", path, ": line ", line_number, ": token"),
            t);
        !s.ok()) {
      return s;
    }
    tokens.emplace_back(t);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": holds no token"));
  }
  return tokens;
}

absl::StatusOr<std::string> BearerToken(
    const std::optional<std::string>& authorization) {
  if (!authorization.has_value() || authorization->empty()) {
    return absl::UnauthenticatedError(
        "missing authorization metadata (Bearer token)");
  }
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization->size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(*authorization, kScheme)) {
    return absl::UnauthenticatedError("authorization must be 'Bearer TOKEN'");
  }
  std::string token(absl::StripAsciiWhitespace(
      absl::string_view(*authorization).substr(kScheme.size())));
  if (token.empty()) return absl::UnauthenticatedError("empty bearer token");
  return token;
}

namespace {
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}
}  // namespace

absl::Status CheckBearer(const std::optional<std::string>& authorization,
                         const std::vector<std::string>& allowed) {
  absl::StatusOr<std::string> token = BearerToken(authorization);
  if (!token.ok()) return token.status();
  bool match = false;
  for (const std::string& t : allowed) match |= ConstantTimeEquals(*token, t);
  if (!match) return absl::UnauthenticatedError("invalid token");
  return absl::OkStatus();
}

namespace {

void RandomBytes(unsigned char* bytes, size_t n) {
  bool filled = false;
  if (FILE* f = std::fopen("/dev/urandom", "rb")) {
    filled = std::fread(bytes, 1, n, f) == n;
    std::fclose(f);
  }
  if (!filled) {
    std::random_device rd;
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(rd());
  }
}

std::string Hex(const unsigned char* bytes, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 15]);
  }
  return out;
}

}  // namespace

std::string GenerateToken() { return RandomHex(32); }

std::string RandomHex(int n) {
  std::vector<unsigned char> bytes(std::max(0, n));
  RandomBytes(bytes.data(), bytes.size());
  return Hex(bytes.data(), bytes.size());
}

std::string Sha256Hex(absl::string_view text) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(),
         digest);
  return Hex(digest, sizeof(digest));
}

absl::Status CheckBearerHash(const std::optional<std::string>& authorization,
                             const std::string& sha256_hex) {
  absl::StatusOr<std::string> token = BearerToken(authorization);
  if (!token.ok()) return token.status();
  // Both sides are 64 hex characters, so the comparison's time says nothing
  // about the stored hash.
  if (!SecretMatches(*token, sha256_hex))
    return absl::UnauthenticatedError("invalid token");
  return absl::OkStatus();
}

bool SecretMatches(absl::string_view secret, const std::string& sha256_hex) {
  return !sha256_hex.empty() &&
         ConstantTimeEquals(Sha256Hex(secret), sha256_hex);
}

std::string NewUlid() {
  static constexpr char kCrockford[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
  unsigned char bytes[16];
  const uint64_t ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  for (int i = 0; i < 6; ++i)
    bytes[i] = static_cast<unsigned char>(ms >> (8 * (5 - i)));
  RandomBytes(bytes + 6, 10);
  // 128 bits as 26 base-32 digits, most significant first (the first digit
  // carries the top 3 bits).
  std::string out;
  for (int d = 0; d < 26; ++d) {
    const int bit = 128 - 5 * (26 - d);  // index of the digit's top bit
    int v = 0;
    for (int b = 0; b < 5; ++b) {
      const int i = bit + b;
      v <<= 1;
      if (i >= 0) v |= (bytes[i / 8] >> (7 - i % 8)) & 1;
    }
    out.push_back(kCrockford[v]);
  }
  return out;
}

}  // namespace ptrain
