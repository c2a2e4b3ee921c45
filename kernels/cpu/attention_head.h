// Where one (batch, head) pair's rows lie in attention's tensors, for the
// CPU attention kernels (internal header).
#ifndef PTRAIN_KERNELS_CPU_ATTENTION_HEAD_H_
#define PTRAIN_KERNELS_CPU_ATTENTION_HEAD_H_

#include <cstdint>

#include "kernels/common/math.h"

namespace ptrain::kernels::internal {

// Pair bh = b·NH + h of grouped-query rows (math::AttentionHeads, rows of
// a.row() elements): `q` is the offset of its query row 0 in a (B,T,row)
// input, `k` that of its key/value head's key row 0 (its values a.K()
// further), `y` that of its columns of a (B,T,C) tensor (row stride C).
struct AttentionHead {
  int64_t q, k, y;
};

inline AttentionHead HeadAt(int64_t bh, const math::AttentionHeads& a, int T) {
  const int64_t b = bh / a.NH;
  const int h = static_cast<int>(bh % a.NH);
  const int64_t seq = b * T * a.row();
  return {seq + a.q(h), seq + a.k(a.Kv(h)), b * T * a.C() + a.q(h)};
}

// A backward task is a (batch, key/value head) pair bg, walking its
// group's query heads: its i-th is pair bh = b·NH + h.
inline int64_t GroupHead(int64_t bg, int i, const math::AttentionHeads& a) {
  return bg / a.KVH * a.NH + bg % a.KVH * a.group() + i;
}

// A pair's query, key and value rows in an input and in its gradient
// (row stride a.row()).
template <typename F>
struct HeadRows {
  const F *q, *k, *v;
  F *dq, *dk, *dv;
};
template <typename F>
HeadRows<F> RowsAt(const AttentionHead& at, const F* inp, F* dinp,
                   const math::AttentionHeads& a) {
  return {inp + at.q,  inp + at.k,  inp + at.k + a.K(),
          dinp + at.q, dinp + at.k, dinp + at.k + a.K()};
}

}  // namespace ptrain::kernels::internal

#endif  // PTRAIN_KERNELS_CPU_ATTENTION_HEAD_H_
