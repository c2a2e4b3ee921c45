// Counter-based random numbers (Philox4x32-10): a value is a pure function of
// (key, counter), so any rank can draw element i of any stream without drawing
// the elements before it. This is what makes initialisation and data order
// independent of the parallel layout.
#ifndef PTRAIN_WORKER_ENGINE_MODEL_RNG_H_
#define PTRAIN_WORKER_ENGINE_MODEL_RNG_H_

#include <array>
#include <cstdint>
#include <string_view>

namespace ptrain {

// Philox4x32 with 10 rounds (Salmon et al., SC'11).
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter,
                                   std::array<uint32_t, 2> key);

// A stable 64-bit hash of a name (xxHash64), used to give every parameter and
// every data stream its own key.
uint64_t StableHash(std::string_view name);

// Uniform in [0, 2^64) for (seed, stream, index).
uint64_t CounterRandom64(uint64_t seed, uint64_t stream, uint64_t index);

// Standard normal sample for (seed, stream, index), Box-Muller on one Philox
// block. Identical on every machine (computed in double).
double CounterNormal(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_RNG_H_
