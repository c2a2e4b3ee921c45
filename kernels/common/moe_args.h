// The Mixture-of-Experts ops' arguments, checked alike by every backend
// (host code: the CPU kernels and the CUDA backend's launchers).
#ifndef PTRAIN_KERNELS_COMMON_MOE_ARGS_H_
#define PTRAIN_KERNELS_COMMON_MOE_ARGS_H_

#include <climits>
#include <cstdint>

#include "common/check.h"

namespace ptrain::kernels {

// The router's top-k: 1 to E experts a token.
inline void CheckRouterChoices(int k, int E) {
  PT_CHECK(k >= 1 && k <= E, "the router chooses 1 to E experts per token");
}

// moe_dispatch_plan's: N·k pairs within int32, a capacity of 0 (none) or
// more, and capacity segments (0: the whole N) tiling the tokens; returns
// the segment.
inline int DispatchSegment(int N, int k, int capacity, int segment) {
  PT_CHECK(int64_t{N} * k <= INT32_MAX, "the dispatch plan's N·k fits int32");
  PT_CHECK(capacity >= 0, "an expert capacity is 0 (none) or positive");
  if (segment <= 0) segment = N;
  PT_CHECK(N % segment == 0, "capacity segments tile the tokens");
  return segment;
}

}  // namespace ptrain::kernels

#endif  // PTRAIN_KERNELS_COMMON_MOE_ARGS_H_
