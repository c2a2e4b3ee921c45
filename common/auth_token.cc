// See auth_token.h.
#include "common/auth_token.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/bounded_file.h"
#include "common/digest.h"
#include "common/header_value.h"

namespace ptrain {

absl::StatusOr<std::vector<std::string>> LoadTokenFile(
    const std::string& path, absl::string_view what,
    std::vector<std::string>* short_tokens) {
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
    if (short_tokens != nullptr && t.size() < kMinTokenChars) {
      short_tokens->push_back(absl::StrCat(
          what, " ", path, ": line ", line_number, ": the token has ", t.size(),
          " characters; one of fewer than ", kMinTokenChars,
          " can be guessed (make one with: openssl rand -hex 32)"));
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

absl::Status CheckBearer(const std::optional<std::string>& authorization,
                         const std::vector<std::string>& allowed) {
  absl::StatusOr<std::string> token = BearerToken(authorization);
  if (!token.ok()) return token.status();
  bool match = false;
  for (const std::string& t : allowed) match |= ConstantTimeEquals(*token, t);
  if (!match) return absl::UnauthenticatedError("invalid token");
  return absl::OkStatus();
}

}  // namespace ptrain
