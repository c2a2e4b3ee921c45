// Causal attention between one block of queries and one block of keys and
// values whose positions are given globally: the pieces ring attention
// (context parallelism) is made of. A forward folds each block's softmax
// into the running output with the log-sum-exp rule; a backward takes the
// whole attention's output and log-sum-exp, so that each block's share of
// the gradients needs nothing of the other blocks (FlashAttention-2's
// backward, one block of keys at a time).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/kernels.h"

namespace ptrain::kernels {

namespace {

// The global positions of a block's Tl rows (ZigzagPosition).
std::vector<int> Positions(int Tl, int cp, int rank) {
  std::vector<int> pos(Tl);
  for (int t = 0; t < Tl; ++t) pos[t] = ZigzagPosition(t, Tl, cp, rank);
  return pos;
}

}  // namespace

// out (B,Tl,C), lse (B,NH,Tl); qkv (B,Tl,3C): the queries' rows; kv rows
// of kv_stride: keys in columns [0,C), values in [C,2C).
template <typename F>
void attention_block_forward(F* out, F* lse, const F* qkv, const F* kv,
                             int64_t kv_stride, int B, int Tl, int C, int NH,
                             int cp, int q_rank, int k_rank, bool first) {
  const int hs = C / NH, Tq = Tl, Tk = Tl;
  const std::vector<int> q_pos = Positions(Tl, cp, q_rank);
  const std::vector<int> k_pos = Positions(Tl, cp, k_rank);
  const int64_t C2 = kv_stride, C3 = 3 * int64_t{C};
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
  constexpr F kNegInf = -std::numeric_limits<F>::infinity();
#pragma omp parallel
  {
    std::vector<F> p(Tk), o(hs);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < static_cast<int64_t>(B) * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      for (int t = 0; t < Tq; ++t) {
        const F* q = qkv + (b * Tq + t) * C3 + h * hs;
        F* y = out + (b * Tq + t) * C + h * hs;
        F& row_lse = lse[bh * Tq + t];
        if (first) {
          std::fill(y, y + hs, F(0));
          row_lse = kNegInf;
        }
        // This block's scores of the keys the query may see, and their
        // maximum.
        F m = kNegInf;
        for (int j = 0; j < Tk; ++j) {
          if (k_pos[j] > q_pos[t]) {
            p[j] = kNegInf;
            continue;
          }
          const F* k = kv + (b * Tk + j) * C2 + h * hs;
          F s = 0;
#pragma omp simd reduction(+ : s)
          for (int i = 0; i < hs; ++i) s += q[i] * k[i];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        if (m == kNegInf) continue;  // no key of this block is visible
        F l = 0;
        std::fill(o.begin(), o.end(), F(0));
        for (int j = 0; j < Tk; ++j) {
          if (p[j] == kNegInf) continue;
          const F e = std::exp(p[j] - m);
          l += e;
          const F* v = kv + (b * Tk + j) * C2 + C + h * hs;
#pragma omp simd
          for (int i = 0; i < hs; ++i) o[i] += e * v[i];
        }
        const F block_lse = m + std::log(l);
        if (row_lse == kNegInf) {
          for (int i = 0; i < hs; ++i) y[i] = o[i] / l;
          row_lse = block_lse;
          continue;
        }
        // out·e^lse + o·e^m, renormalised over both.
        const F top = std::max(row_lse, block_lse);
        const F w_old = std::exp(row_lse - top);
        const F w_new = std::exp(block_lse - top);
        const F sum = w_old + w_new;
        for (int i = 0; i < hs; ++i) {
          y[i] = (y[i] * w_old + o[i] / l * w_new) / sum;
        }
        row_lse = top + std::log(sum);
      }
    }
  }
}

// dqkv (B,Tl,3C): the queries' thirds accumulate; dkv (rows of
// kv_stride, as kv) accumulates; dout, out (B,Tl,C) and lse (B,NH,Tl) are
// the whole attention's.
template <typename F>
void attention_block_backward(F* dqkv, F* dkv, const F* dout, const F* qkv,
                              const F* out, const F* lse, const F* kv,
                              int64_t kv_stride, int B, int Tl, int C, int NH,
                              int cp, int q_rank, int k_rank) {
  const int hs = C / NH, Tq = Tl, Tk = Tl;
  const std::vector<int> q_pos = Positions(Tl, cp, q_rank);
  const std::vector<int> k_pos = Positions(Tl, cp, k_rank);
  const int64_t C2 = kv_stride, C3 = 3 * int64_t{C};
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < static_cast<int64_t>(B) * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    for (int t = 0; t < Tq; ++t) {
      const int64_t row = (b * Tq + t) * C + h * hs;
      const F* q = qkv + (b * Tq + t) * C3 + h * hs;
      F* dq = dqkv + (b * Tq + t) * C3 + h * hs;
      const F* dy = dout + row;
      // D = dout · out: the softmax backward's row term.
      F d = 0;
      for (int i = 0; i < hs; ++i) d += dy[i] * out[row + i];
      const F row_lse = lse[bh * Tq + t];
      for (int j = 0; j < Tk; ++j) {
        if (k_pos[j] > q_pos[t]) continue;
        const F* k = kv + (b * Tk + j) * C2 + h * hs;
        const F* v = k + C;
        F* dk = dkv + (b * Tk + j) * C2 + h * hs;
        F* dv = dk + C;
        F s = 0, dp = 0;
#pragma omp simd reduction(+ : s, dp)
        for (int i = 0; i < hs; ++i) {
          s += q[i] * k[i];
          dp += dy[i] * v[i];
        }
        const F pj = std::exp(s * scale - row_lse);
        const F ds = pj * (dp - d) * scale;
#pragma omp simd
        for (int i = 0; i < hs; ++i) {
          dv[i] += pj * dy[i];
          dq[i] += ds * k[i];
          dk[i] += ds * q[i];
        }
      }
    }
  }
}

#define PT_INSTANTIATE(F)                                                     \
  template void attention_block_forward<F>(F*, F*, const F*, const F*,        \
                                           int64_t, int, int, int, int, int,  \
                                           int, int, bool);                   \
  template void attention_block_backward<F>(                                  \
      F*, F*, const F*, const F*, const F*, const F*, const F*, int64_t, int, \
      int, int, int, int, int, int);
PT_INSTANTIATE(float)
PT_INSTANTIATE(double)
#undef PT_INSTANTIATE

}  // namespace ptrain::kernels
