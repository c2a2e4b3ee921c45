// Where one (batch, head) pair's rows lie in attention's tensors, for the
// CPU attention kernels (internal header).
#ifndef PTRAIN_KERNELS_CPU_ATTENTION_HEAD_H_
#define PTRAIN_KERNELS_CPU_ATTENTION_HEAD_H_

#include <cstdint>

namespace ptrain::kernels::internal {

// Pair bh = b·NH + h: `qkv` is the offset of its query row 0 in a (B,T,3C)
// input (its keys C and its values 2C further; row stride 3C), `y` that of
// its columns of a (B,T,C) tensor (row stride C).
struct AttentionHead {
  int64_t qkv, y;
};

inline AttentionHead HeadAt(int64_t bh, int NH, int T, int C) {
  const int64_t b = bh / NH, h = bh % NH, hs = C / NH;
  return {b * T * 3 * C + h * hs, b * T * C + h * hs};
}

}  // namespace ptrain::kernels::internal

#endif  // PTRAIN_KERNELS_CPU_ATTENTION_HEAD_H_
