// Causal attention on CPU without the (T,T) probabilities: FlashAttention-2's
// scheme over tiles of 64 queries × up to 512 keys per (batch, head). The
// forward keeps a running maximum and sum per query row (online softmax) and
// saves only their log-sum-exp; the backward recomputes each tile's
// probabilities from it. Each tile product is one gemm; memory is O(T) per
// head.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_head.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"

namespace ptrain::kernels {

namespace {

// Query rows and key columns per tile. The key tile is a multiple of the
// query tile, so that every key tile a query tile visits starts at or
// before its first query (each row has a key); it is wide, so that up to
// 512 positions a query tile's scores take one gemm, as large as the
// causal mask allows.
constexpr int kQ = 64;
constexpr int kK = 512;

}  // namespace

// out is (B,T,C), lse is (B,NH,T), inp is (B,T,C+2K).
template <typename F>
void flash_attention_forward(F* out, F* lse, const F* inp, int B, int T, int C,
                             int NH, int KVH) {
  const math::AttentionHeads heads = math::MakeAttentionHeads(C, NH, KVH);
  const int hs = heads.hs;
  const int64_t C3 = heads.row();
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
#pragma omp parallel
  {
    std::vector<F> s(kQ * kK), m(kQ), l(kQ);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < static_cast<int64_t>(B) * NH; bh++) {
      const internal::AttentionHead at = internal::HeadAt(bh, heads, T);
      const F* q = inp + at.q;
      const F* k = inp + at.k;
      const F* v = k + heads.K();
      F* o = out + at.y;
      F* lse_bh = lse + bh * T;
      for (int t0 = 0; t0 < T; t0 += kQ) {
        const int t1 = std::min(T, t0 + kQ), nq = t1 - t0;
        std::fill(m.begin(), m.end(), -std::numeric_limits<F>::infinity());
        std::fill(l.begin(), l.end(), F(0));
        for (int i = 0; i < nq; i++) {
          std::fill(o + (t0 + i) * int64_t{C}, o + (t0 + i) * int64_t{C} + hs,
                    F(0));
        }
        for (int k0 = 0; k0 < t1; k0 += kK) {
          const int nk = std::min(t1, k0 + kK) - k0;
          // s = scale q[t0:t1] k[k0:k0+nk]^T
          gemm<F>(false, true, nq, nk, hs, scale, q + t0 * C3, C3, k + k0 * C3,
                  C3, F(0), s.data(), kK);
          for (int i = 0; i < nq; i++) {
            F* row = s.data() + i * kK;
            const int valid = std::min(nk, t0 + i - k0 + 1);  // causal
            const F mnew = std::max(m[i], internal::MaxOf(row, valid));
            const F alpha = internal::Exp(m[i] - mnew);
            F sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < valid; j++) {
              const F e = internal::Exp(row[j] - mnew);
              row[j] = e;
              sum += e;
            }
            for (int j = valid; j < nk; j++) row[j] = 0;
            l[i] = l[i] * alpha + sum;
            m[i] = mnew;
            F* orow = o + (t0 + i) * int64_t{C};
#pragma omp simd
            for (int d = 0; d < hs; d++) orow[d] *= alpha;
          }
          // o[t0:t1] += p v[k0:k0+nk]
          gemm<F>(false, false, nq, hs, nk, F(1), s.data(), kK, v + k0 * C3, C3,
                  F(1), o + t0 * int64_t{C}, C);
        }
        for (int i = 0; i < nq; i++) {
          F* orow = o + (t0 + i) * int64_t{C};
          const F inv = F(1) / l[i];
#pragma omp simd
          for (int d = 0; d < hs; d++) orow[d] *= inv;
          lse_bh[t0 + i] = m[i] + std::log(l[i]);
        }
      }
    }
  }
}

// dinp is (B,T,C+2K), accumulated; dout, out are (B,T,C); inp is
// (B,T,C+2K); lse is (B,NH,T) from the forward. A task is a (b,
// key/value head) pair walking its group's query heads in turn: each owns
// its columns of dinp, so the tasks run in parallel without atomics.
template <typename F>
void flash_attention_backward(F* dinp, const F* dout, const F* inp,
                              const F* out, const F* lse, int B, int T, int C,
                              int NH, int KVH) {
  const math::AttentionHeads heads = math::MakeAttentionHeads(C, NH, KVH);
  const int hs = heads.hs;
  const int64_t C3 = heads.row();
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
#pragma omp parallel
  {
    std::vector<F> p(kQ * kK), dp(kQ * kK), delta(T);
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < static_cast<int64_t>(B) * KVH; bg++) {
      for (int i = 0; i < heads.group(); ++i) {
        const int64_t bh = internal::GroupHead(bg, i, heads);
        const internal::AttentionHead at = internal::HeadAt(bh, heads, T);
        const auto [q, k, v, dq, dk, dv] =
            internal::RowsAt(at, inp, dinp, heads);
        const F* o = out + at.y;
        const F* dout_bh = dout + at.y;
        const F* lse_bh = lse + bh * T;
        // delta[t] = dout[t] . out[t]: the softmax backward's row term.
        for (int t = 0; t < T; t++) {
          const F* a = dout_bh + t * int64_t{C};
          const F* c = o + t * int64_t{C};
          F dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int d = 0; d < hs; d++) dot += a[d] * c[d];
          delta[t] = dot;
        }
        for (int t0 = 0; t0 < T; t0 += kQ) {
          const int t1 = std::min(T, t0 + kQ), nq = t1 - t0;
          const F* dout_tile = dout_bh + t0 * int64_t{C};
          for (int k0 = 0; k0 < t1; k0 += kK) {
            const int nk = std::min(t1, k0 + kK) - k0;
            // p = exp(scale q k^T - lse), causal; dp = dout v^T.
            gemm<F>(false, true, nq, nk, hs, scale, q + t0 * C3, C3,
                    k + k0 * C3, C3, F(0), p.data(), kK);
            gemm<F>(false, true, nq, nk, hs, F(1), dout_tile, C, v + k0 * C3,
                    C3, F(0), dp.data(), kK);
            for (int i = 0; i < nq; i++) {
              F* prow = p.data() + i * kK;
              F* drow = dp.data() + i * kK;
              const int valid = std::min(nk, t0 + i - k0 + 1);
              const F row_lse = lse_bh[t0 + i], row_delta = delta[t0 + i];
#pragma omp simd
              for (int j = 0; j < valid; j++) {
                const F pj = internal::Exp(prow[j] - row_lse);
                prow[j] = pj;
                drow[j] = pj * (drow[j] - row_delta);  // ds
              }
              for (int j = valid; j < nk; j++) prow[j] = drow[j] = 0;
            }
            // dv[k0:] += p^T dout; dq[t0:] += scale ds k; dk[k0:] += scale
            // ds^T q.
            gemm<F>(true, false, nk, hs, nq, F(1), p.data(), kK, dout_tile, C,
                    F(1), dv + k0 * C3, C3);
            gemm<F>(false, false, nq, hs, nk, scale, dp.data(), kK, k + k0 * C3,
                    C3, F(1), dq + t0 * C3, C3);
            gemm<F>(true, false, nk, hs, nq, scale, dp.data(), kK, q + t0 * C3,
                    C3, F(1), dk + k0 * C3, C3);
          }
        }
      }
    }
  }
}

#define PT_INSTANTIATE(F)                                                   \
  template void flash_attention_forward<F>(F*, F*, const F*, int, int, int, \
                                           int, int);                       \
  template void flash_attention_backward<F>(                                \
      F*, const F*, const F*, const F*, const F*, int, int, int, int, int);
PT_INSTANTIATE(float)
PT_INSTANTIATE(double)
#undef PT_INSTANTIATE

}  // namespace ptrain::kernels
