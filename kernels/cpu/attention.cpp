// Causal multi-head self-attention forward and backward on CPU: per (batch,
// head) GEMMs straight on the interleaved QKV buffer, softmax in between.
// Not flash attention: the (T,T) probabilities are materialised and saved.
// Also the cached attention of generation (new positions over earlier
// keys and values).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_head.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace ptrain::kernels {

namespace {

// Query rows per causal tile. A tile's scores are computed only for keys
// [0, end of tile), which skips most of the masked upper triangle while each
// GEMM stays large enough to run near sgemm speed.
constexpr int kTile = 64;

}  // namespace

// out is (B,T,C), att is (B,NH,T,T), inp is (B,T,C+2K).
// One (b,h) pair per task; gemm called from inside the parallel region runs
// on its calling thread, so the pairs are the only level of parallelism.
template <typename F>
void attention_forward(F* out, F* att, const F* inp, int B, int T, int C,
                       int NH, int KVH) {
  const math::AttentionHeads heads = math::MakeAttentionHeads(C, NH, KVH);
  const int hs = heads.hs;
  const int64_t C3 = heads.row();
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < static_cast<int64_t>(B) * NH; bh++) {
    // q, k, v are (T,hs) views with row stride C+2K; out_bh is (T,hs) with
    // row stride C; att_bh is (T,T).
    const internal::AttentionHead at = internal::HeadAt(bh, heads, T);
    const F* q = inp + at.q;
    const F* k = inp + at.k;
    const F* v = k + heads.K();
    F* out_bh = out + at.y;
    F* att_bh = att + bh * T * T;
    for (int t0 = 0; t0 < T; t0 += kTile) {
      const int t1 = std::min(T, t0 + kTile);
      // att[t0:t1, 0:t1] = scale * q[t0:t1] @ k[0:t1]^T
      gemm<F>(false, true, t1 - t0, t1, hs, scale, q + t0 * C3, C3, k, C3, F(0),
              att_bh + static_cast<int64_t>(t0) * T, T);
      for (int t = t0; t < t1; t++) {
        F* row = att_bh + static_cast<int64_t>(t) * T;
        const F inv_sum = F(1) / internal::ExpShifted(row, t + 1);
#pragma omp simd
        for (int t2 = 0; t2 <= t; t2++) row[t2] *= inv_sum;
        for (int t2 = t + 1; t2 < T; t2++) row[t2] = 0;
      }
      // out[t0:t1] = att[t0:t1, 0:t1] @ v[0:t1]
      gemm<F>(false, false, t1 - t0, hs, t1, F(1),
              att_bh + static_cast<int64_t>(t0) * T, T, v, C3, F(0),
              out_bh + t0 * static_cast<int64_t>(C), C);
    }
  }
}

// dinp is (B,T,C+2K), datt is (B,NH,T,T) scratch, dout is (B,T,C),
// inp is (B,T,C+2K), att is (B,NH,T,T).
// Mirrors forward tile by tile; the sums over query tiles (dk, dv) accumulate
// through beta = 1. A task is a (b, key/value head) pair: it walks the
// query heads of its group one after the other, so that each task owns
// its columns of dinp and a key/value head's gradient sums its group's in
// one order.
template <typename F>
void attention_backward(F* dinp, F* datt, const F* dout, const F* inp,
                        const F* att, int B, int T, int C, int NH, int KVH) {
  const math::AttentionHeads heads = math::MakeAttentionHeads(C, NH, KVH);
  const int hs = heads.hs;
  const int64_t C3 = heads.row();
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
#pragma omp parallel for schedule(static)
  for (int64_t bg = 0; bg < static_cast<int64_t>(B) * KVH; bg++) {
    for (int i = 0; i < heads.group(); ++i) {
      const int64_t bh = internal::GroupHead(bg, i, heads);
      const internal::AttentionHead at = internal::HeadAt(bh, heads, T);
      const auto [q, k, v, dq, dk, dv] = internal::RowsAt(at, inp, dinp, heads);
      const F* dout_bh = dout + at.y;
      const F* att_bh = att + bh * T * T;
      F* datt_bh = datt + bh * T * T;
      for (int t0 = 0; t0 < T; t0 += kTile) {
        const int t1 = std::min(T, t0 + kTile);
        const int nt = t1 - t0;
        const F* att_tile = att_bh + static_cast<int64_t>(t0) * T;
        F* datt_tile = datt_bh + static_cast<int64_t>(t0) * T;
        const F* dout_tile = dout_bh + t0 * static_cast<int64_t>(C);
        // datt[t0:t1, 0:t1] = dout[t0:t1] @ v[0:t1]^T
        gemm<F>(false, true, nt, t1, hs, F(1), dout_tile, C, v, C3, F(0),
                datt_tile, T);
        // dv[0:t1] += att[t0:t1, 0:t1]^T @ dout[t0:t1]
        gemm<F>(true, false, t1, hs, nt, F(1), att_tile, T, dout_tile, C, F(1),
                dv, C3);
        // Softmax backward in place: dpreatt = att * (datt - sum(att * datt)).
        for (int t = t0; t < t1; t++) {
          const F* pr = att_bh + static_cast<int64_t>(t) * T;
          F* d = datt_bh + static_cast<int64_t>(t) * T;
          F dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int t2 = 0; t2 <= t; t2++) dot += pr[t2] * d[t2];
#pragma omp simd
          for (int t2 = 0; t2 <= t; t2++) d[t2] = pr[t2] * (d[t2] - dot);
          for (int t2 = t + 1; t2 < T; t2++) d[t2] = 0;
        }
        // dq[t0:t1] += scale * dpreatt[t0:t1, 0:t1] @ k[0:t1]
        gemm<F>(false, false, nt, hs, t1, scale, datt_tile, T, k, C3, F(1),
                dq + t0 * C3, C3);
        // dk[0:t1] += scale * dpreatt[t0:t1, 0:t1]^T @ q[t0:t1]
        gemm<F>(true, false, t1, hs, nt, scale, datt_tile, T, q + t0 * C3, C3,
                F(1), dk, C3);
      }
    }
  }
}

// kcache, vcache are (KVH,capacity,hs); qkv is (n,C+2K); out is (n,C).
// The new keys and values are stored, one (key/value head, new position)
// pair per task; then one (query head, new position) pair per task: a dot
// product per cached key of its head's group, the softmax, and the
// probability-weighted sum of the cached values.
template <typename F>
void attention_decode(F* out, F* kcache, F* vcache, const F* qkv, int n,
                      int pos, int C, int NH, int KVH, int capacity) {
  const math::AttentionHeads heads = math::MakeAttentionHeads(C, NH, KVH);
  const int hs = heads.hs;
  const int64_t C3 = heads.row();
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
  auto row = [&](F* cache, int g, int t) {
    return cache + (static_cast<int64_t>(g) * capacity + t) * hs;
  };
  // Tasks are (head, new position) pairs, head-major.
  internal::ParallelFor(
      static_cast<int64_t>(KVH) * n,
      [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; j++) {
          const int g = static_cast<int>(j / n), i = static_cast<int>(j % n);
          const F* src = qkv + i * C3 + heads.k(g);
          std::copy(src, src + hs, row(kcache, g, pos + i));
          std::copy(src + heads.K(), src + heads.K() + hs,
                    row(vcache, g, pos + i));
        }
      },
      /*align=*/1);
  internal::ParallelFor(
      static_cast<int64_t>(NH) * n,
      [&](int64_t j0, int64_t j1) {
        std::vector<F> scores(pos + n);
        for (int64_t j = j0; j < j1; j++) {
          const int h = static_cast<int>(j / n), i = static_cast<int>(j % n);
          const int g = heads.Kv(h);
          const F* q = qkv + i * C3 + heads.q(h);
          const int len = pos + i + 1;
          for (int t = 0; t < len; t++) {
            const F* k = row(kcache, g, t);
            F dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int d = 0; d < hs; d++) dot += q[d] * k[d];
            scores[t] = dot * scale;
          }
          const F inv_sum = F(1) / internal::ExpShifted(scores.data(), len);
          F* o = out + static_cast<int64_t>(i) * C + heads.q(h);
          std::fill(o, o + hs, F(0));
          for (int t = 0; t < len; t++) {
            const F p = scores[t] * inv_sum;
            const F* v = row(vcache, g, t);
#pragma omp simd
            for (int d = 0; d < hs; d++) o[d] += p * v[d];
          }
        }
      },
      /*align=*/1);
}

#define PT_INSTANTIATE(F)                                                     \
  template void attention_forward<F>(F*, F*, const F*, int, int, int, int,    \
                                     int);                                    \
  template void attention_backward<F>(F*, F*, const F*, const F*, const F*,   \
                                      int, int, int, int, int);               \
  template void attention_decode<F>(F*, F*, F*, const F*, int, int, int, int, \
                                    int, int);
PT_INSTANTIATE(float)
PT_INSTANTIATE(double)
#undef PT_INSTANTIATE

}  // namespace ptrain::kernels
