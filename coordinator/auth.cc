// Bearer-token parsing and checking for ptcoord; see auth.h. Token storage
// and transport security (TLS) live elsewhere.
#include "coordinator/auth.h"

#include <cstdio>
#include <fstream>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ptrain {

absl::StatusOr<std::vector<std::string>> LoadTokenFile(
    const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot read token file ", path));
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(in, line)) {
    std::string t(absl::StripAsciiWhitespace(line));
    if (t.empty() || t[0] == '#') continue;
    tokens.push_back(std::move(t));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, " holds no token"));
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

std::string GenerateToken() {
  unsigned char bytes[32];
  bool filled = false;
  if (FILE* f = std::fopen("/dev/urandom", "rb")) {
    filled = std::fread(bytes, 1, sizeof(bytes), f) == sizeof(bytes);
    std::fclose(f);
  }
  if (!filled) {
    std::random_device rd;
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(rd());
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

}  // namespace ptrain
