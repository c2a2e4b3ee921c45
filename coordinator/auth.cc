// ptcoord's own token checks and ids; see auth.h. Token storage and
// transport security (TLS) live elsewhere.
#include "coordinator/auth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "common/auth_token.h"
#include "common/digest.h"

namespace ptrain {

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

}  // namespace

std::string GenerateToken() { return RandomHex(32); }

std::string RandomHex(int n) {
  std::vector<unsigned char> bytes(std::max(0, n));
  RandomBytes(bytes.data(), bytes.size());
  return HexString(absl::string_view(
      reinterpret_cast<const char*>(bytes.data()), bytes.size()));
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
