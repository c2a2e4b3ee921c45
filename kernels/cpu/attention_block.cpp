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
#include "kernels/cpu/vec_math.h"

namespace ptrain::kernels {

namespace {

// Query rows per tile: each tile's scores are one GEMM against the keys its
// last row may see, as in the whole attention (attention.cpp).
constexpr int kTile = 64;

// The global positions of a block's Tl rows (ZigzagPosition): increasing,
// chunk r before chunk 2cp−1−r.
std::vector<int> Positions(int Tl, int cp, int rank) {
  std::vector<int> pos(Tl);
  for (int t = 0; t < Tl; ++t) pos[t] = ZigzagPosition(t, Tl, cp, rank);
  return pos;
}

// How many keys of the block each query row may see: positions increase
// along a block's rows, so the visible keys are a prefix, of the length
// of those at or before the query's position.
std::vector<int> VisibleKeys(const std::vector<int>& q_pos,
                             const std::vector<int>& k_pos) {
  std::vector<int> len(q_pos.size());
  for (size_t t = 0; t < q_pos.size(); ++t) {
    len[t] = static_cast<int>(
        std::upper_bound(k_pos.begin(), k_pos.end(), q_pos[t]) - k_pos.begin());
  }
  return len;
}

}  // namespace

// out (B,Tl,C), lse (B,NH,Tl); qkv (B,Tl,C+2K): the queries' rows; kv
// rows of kv_stride: key heads in columns [0,K), value heads in [K,2K). Per
// (batch, head) and tile of query rows: the scores against the visible keys
// (one GEMM), their exponentials shifted by each row's maximum, the block's
// output (another GEMM), folded into the running output by log-sum-exp.
template <typename F>
void attention_block_forward(F* out, F* lse, const F* qkv, const F* kv,
                             int64_t kv_stride, int B, int Tl, int C, int NH,
                             int KVH, int cp, int q_rank, int k_rank,
                             bool first) {
  const math::AttentionHeads heads = math::MakeAttentionHeads(C, NH, KVH);
  const int hs = heads.hs;
  const std::vector<int> len =
      VisibleKeys(Positions(Tl, cp, q_rank), Positions(Tl, cp, k_rank));
  const int64_t C2 = kv_stride, C3 = heads.row();
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
  constexpr F kNegInf = -std::numeric_limits<F>::infinity();
#pragma omp parallel
  {
    std::vector<F> s(static_cast<size_t>(kTile) * Tl), o(kTile * hs), m(kTile),
        l(kTile);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < static_cast<int64_t>(B) * NH; ++bh) {
      const int64_t b = bh / NH;
      const int h = static_cast<int>(bh % NH);
      const F* q = qkv + b * Tl * C3 + heads.q(h);
      const F* k = kv + b * Tl * C2 + int64_t{heads.Kv(h)} * hs;
      const F* v = k + heads.K();
      F* y = out + b * Tl * C + heads.q(h);
      F* row_lse = lse + bh * Tl;
      for (int t0 = 0; t0 < Tl; t0 += kTile) {
        const int t1 = std::min(Tl, t0 + kTile), rows = t1 - t0;
        const int nk = len[t1 - 1];
        if (first) {
          for (int t = t0; t < t1; ++t) {
            std::fill(y + t * int64_t{C}, y + t * int64_t{C} + hs, F(0));
            row_lse[t] = kNegInf;
          }
        }
        if (nk == 0) continue;  // no key of this block is visible
        // s[rows, nk] = scale · q[t0:t1] k[0:nk]^T
        gemm<F>(false, true, rows, nk, hs, scale, q + t0 * C3, C3, k, C2, F(0),
                s.data(), nk);
        for (int i = 0; i < rows; ++i) {
          F* row = s.data() + int64_t{i} * nk;
          const int n = len[t0 + i];
          m[i] = internal::MaxOf(row, n);
          F sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int j = 0; j < n; ++j) {
            const F e = internal::Exp(row[j] - m[i]);
            row[j] = e;
            sum += e;
          }
          l[i] = sum;
          std::fill(row + n, row + nk, F(0));
        }
        // o[rows, hs] = p v[0:nk]
        gemm<F>(false, false, rows, hs, nk, F(1), s.data(), nk, v, C2, F(0),
                o.data(), hs);
        for (int i = 0; i < rows; ++i) {
          if (len[t0 + i] == 0) continue;
          F* yr = y + int64_t{t0 + i} * C;
          const F* orow = o.data() + int64_t{i} * hs;
          const F block_lse = m[i] + std::log(l[i]);
          F& r = row_lse[t0 + i];
          if (r == kNegInf) {
            for (int d = 0; d < hs; ++d) yr[d] = orow[d] / l[i];
            r = block_lse;
            continue;
          }
          // out·e^lse + o·e^m, renormalised over both.
          const F top = std::max(r, block_lse);
          const F w_old = std::exp(r - top);
          const F w_new = std::exp(block_lse - top);
          const F sum = w_old + w_new;
          for (int d = 0; d < hs; ++d) {
            yr[d] = (yr[d] * w_old + orow[d] / l[i] * w_new) / sum;
          }
          r = top + std::log(sum);
        }
      }
    }
  }
}

// dqkv (B,Tl,C+2K): the queries' columns accumulate; dkv (rows of
// kv_stride, as kv) accumulates; dout, out (B,Tl,C) and lse (B,NH,Tl) are
// the whole attention's. Per (batch, key/value head), its group's query
// heads in turn (each task owns its columns: no atomics), and tile of
// query rows: the probabilities exp(scores − lse) against the visible
// keys, and from them and dout the four GEMMs of the softmax attention's
// backward.
template <typename F>
void attention_block_backward(F* dqkv, F* dkv, const F* dout, const F* qkv,
                              const F* out, const F* lse, const F* kv,
                              int64_t kv_stride, int B, int Tl, int C, int NH,
                              int KVH, int cp, int q_rank, int k_rank) {
  const math::AttentionHeads heads = math::MakeAttentionHeads(C, NH, KVH);
  const int hs = heads.hs;
  const std::vector<int> len =
      VisibleKeys(Positions(Tl, cp, q_rank), Positions(Tl, cp, k_rank));
  const int64_t C2 = kv_stride, C3 = heads.row();
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
#pragma omp parallel
  {
    std::vector<F> p(static_cast<size_t>(kTile) * Tl),
        ds(static_cast<size_t>(kTile) * Tl);
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < static_cast<int64_t>(B) * KVH; ++bg) {
      for (int i = 0; i < heads.group(); ++i) {
        const int64_t b = bg / KVH;
        const int g = static_cast<int>(bg % KVH), h = g * heads.group() + i;
        const int64_t bh = b * NH + h;
        const F* q = qkv + b * Tl * C3 + heads.q(h);
        F* dq = dqkv + b * Tl * C3 + heads.q(h);
        const F* k = kv + b * Tl * C2 + int64_t{g} * hs;
        const F* v = k + heads.K();
        F* dk = dkv + b * Tl * C2 + int64_t{g} * hs;
        F* dv = dk + heads.K();
        const F* dy = dout + b * Tl * C + heads.q(h);
        const F* y = out + b * Tl * C + heads.q(h);
        const F* row_lse = lse + bh * Tl;
        for (int t0 = 0; t0 < Tl; t0 += kTile) {
          const int t1 = std::min(Tl, t0 + kTile), rows = t1 - t0;
          const int nk = len[t1 - 1];
          if (nk == 0) continue;
          const F* dy_tile = dy + int64_t{t0} * C;
          // p = exp(scale · q k^T − lse), 0 past each row's visible keys.
          gemm<F>(false, true, rows, nk, hs, scale, q + t0 * C3, C3, k, C2,
                  F(0), p.data(), nk);
          // ds = dout v^T, then the softmax backward: p·(ds − dout·out)·scale.
          gemm<F>(false, true, rows, nk, hs, F(1), dy_tile, C, v, C2, F(0),
                  ds.data(), nk);
          for (int i = 0; i < rows; ++i) {
            F* pr = p.data() + int64_t{i} * nk;
            F* dr = ds.data() + int64_t{i} * nk;
            const int n = len[t0 + i];
            const int64_t row = int64_t{t0 + i} * C;
            F d = 0;
            for (int j = 0; j < hs; ++j) d += dy[row + j] * y[row + j];
            const F r = row_lse[t0 + i];
#pragma omp simd
            for (int j = 0; j < n; ++j) {
              pr[j] = internal::Exp(pr[j] - r);
              dr[j] = pr[j] * (dr[j] - d) * scale;
            }
            std::fill(pr + n, pr + nk, F(0));
            std::fill(dr + n, dr + nk, F(0));
          }
          // dv[0:nk] += p^T dout; dq[t0:t1] += ds k; dk[0:nk] += ds^T q.
          gemm<F>(true, false, nk, hs, rows, F(1), p.data(), nk, dy_tile, C,
                  F(1), dv, C2);
          gemm<F>(false, false, rows, hs, nk, F(1), ds.data(), nk, k, C2, F(1),
                  dq + t0 * C3, C3);
          gemm<F>(true, false, nk, hs, rows, F(1), ds.data(), nk, q + t0 * C3,
                  C3, F(1), dk, C2);
        }
      }
    }
  }
}

#define PT_INSTANTIATE(F)                                                     \
  template void attention_block_forward<F>(F*, F*, const F*, const F*,        \
                                           int64_t, int, int, int, int, int,  \
                                           int, int, int, bool);              \
  template void attention_block_backward<F>(                                  \
      F*, F*, const F*, const F*, const F*, const F*, const F*, int64_t, int, \
      int, int, int, int, int, int, int);
PT_INSTANTIATE(float)
PT_INSTANTIATE(double)
#undef PT_INSTANTIATE

}  // namespace ptrain::kernels
