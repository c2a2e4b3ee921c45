#include "worker/engine/model/rng.h"

#include <xxhash.h>

#include <cmath>
#include <numbers>

namespace ptrain {

namespace {
constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;
constexpr uint32_t kWeyl1 = 0xBB67AE85u;

std::array<uint32_t, 2> KeyOf(uint64_t seed, uint64_t stream) {
  // Mix the stream into the seed so (seed, stream) pairs never collide in the
  // 64-bit key space for any small seeds.
  uint64_t k = XXH64(&stream, sizeof(stream), seed);
  return {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)};
}
}  // namespace

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> ctr,
                                   std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kMul0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(kMul1) * ctr[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32),
             lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32),
             lo1 = static_cast<uint32_t>(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return ctr;
}

uint64_t StableHash(std::string_view name) {
  return XXH64(name.data(), name.size(), 0);
}

uint64_t CounterRandom64(uint64_t seed, uint64_t stream, uint64_t index) {
  auto r = Philox4x32({static_cast<uint32_t>(index),
                       static_cast<uint32_t>(index >> 32), 0u, 0u},
                      KeyOf(seed, stream));
  return (static_cast<uint64_t>(r[1]) << 32) | r[0];
}

double CounterNormal(uint64_t seed, uint64_t stream, uint64_t index) {
  auto r = Philox4x32({static_cast<uint32_t>(index),
                       static_cast<uint32_t>(index >> 32), 1u, 0u},
                      KeyOf(seed, stream));
  // Two 53-bit uniforms; u1 in (0, 1] so the log is finite.
  uint64_t a = ((static_cast<uint64_t>(r[0]) << 32) | r[1]) >> 11;
  uint64_t b = ((static_cast<uint64_t>(r[2]) << 32) | r[3]) >> 11;
  double u1 = (static_cast<double>(a) + 1.0) * 0x1.0p-53;
  double u2 = static_cast<double>(b) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace ptrain
