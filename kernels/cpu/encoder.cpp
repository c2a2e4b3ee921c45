// Token + position embedding (GPT-2's encoder) forward and backward on CPU,
// in two parts so that tensor parallelism can split the vocabulary: the
// token rows a rank holds, then the positions. Not the output layer: that
// is a matmul with wte.
#include <algorithm>
#include <limits>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"

namespace ptrain::kernels {

namespace {
// Channels per task of encoder_backward; 64 floats = four cache lines.
constexpr int kChannelBlock = 64;
}  // namespace

// out is (B,T,C), inp is (B,T), wte is (Vl,C): rows [vocab_begin,
// vocab_begin + Vl) of the vocabulary. Tokens outside give zero rows.
template <typename F>
void embedding_forward(F* out, const int32_t* inp, const F* wte, int B, int T,
                       int C, int vocab_begin, int Vl) {
  internal::ParallelFor(
      static_cast<int64_t>(B) * T, [&](int64_t bt0, int64_t bt1) {
        for (int64_t bt = bt0; bt < bt1; bt++) {
          F* out_bt = out + bt * C;
          const int row = inp[bt] - vocab_begin;
          if (row < 0 || row >= Vl) {
#pragma omp simd
            for (int i = 0; i < C; i++) out_bt[i] = 0;
            continue;
          }
          const F* wte_ix = wte + static_cast<int64_t>(row) * C;
#pragma omp simd
          for (int i = 0; i < C; i++) out_bt[i] = wte_ix[i];
        }
      });
}

// dwte is (Vl,C), dout is (B,T,C), inp is (B,T). A token can repeat within
// the batch, so rows of dwte collide; threads split the channels instead of
// the positions, which keeps the sum race-free and its order (hence the
// result) independent of the thread count.
template <typename F>
void embedding_backward(F* dwte, const F* dout, const int32_t* inp, int B,
                        int T, int C, int vocab_begin, int Vl) {
  const int num_blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < num_blocks; blk++) {
    const int c0 = blk * kChannelBlock;
    const int c1 = std::min(C, c0 + kChannelBlock);
    for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
      const int row = inp[bt] - vocab_begin;
      if (row < 0 || row >= Vl) continue;
      const F* dout_bt = dout + bt * C;
      F* dwte_ix = dwte + static_cast<int64_t>(row) * C;
#pragma omp simd
      for (int i = c0; i < c1; i++) dwte_ix[i] += dout_bt[i];
    }
  }
}

// out is (B,T,C), wpe is (>=t0+T,C): position t of the batch is t0 + t.
template <typename F>
void position_forward(F* out, const F* wpe, int B, int T, int C, int t0) {
  internal::ParallelFor(
      static_cast<int64_t>(B) * T, [&](int64_t bt0, int64_t bt1) {
        for (int64_t bt = bt0; bt < bt1; bt++) {
          F* out_bt = out + bt * C;
          const F* wpe_t = wpe + static_cast<int64_t>(t0 + bt % T) * C;
#pragma omp simd
          for (int i = 0; i < C; i++) out_bt[i] += wpe_t[i];
        }
      });
}

// dwpe is (>=t0+T,C), dout is (B,T,C). Threads split the channels, as in
// embedding_backward, so the sum over the batch has a fixed order.
template <typename F>
void position_backward(F* dwpe, const F* dout, int B, int T, int C, int t0) {
  const int num_blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < num_blocks; blk++) {
    const int c0 = blk * kChannelBlock;
    const int c1 = std::min(C, c0 + kChannelBlock);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        const F* dout_bt = dout + (static_cast<int64_t>(b) * T + t) * C;
        F* dwpe_t = dwpe + static_cast<int64_t>(t0 + t) * C;
#pragma omp simd
        for (int i = c0; i < c1; i++) dwpe_t[i] += dout_bt[i];
      }
    }
  }
}

// The single-rank encoder: the whole vocabulary, positions from 0.
template <typename F>
void encoder_forward(F* out, const int32_t* inp, const F* wte, const F* wpe,
                     int B, int T, int C) {
  embedding_forward(out, inp, wte, B, T, C, 0, std::numeric_limits<int>::max());
  position_forward(out, wpe, B, T, C, 0);
}

template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* inp,
                      int B, int T, int C) {
  embedding_backward(dwte, dout, inp, B, T, C, 0,
                     std::numeric_limits<int>::max());
  position_backward(dwpe, dout, B, T, C, 0);
}

#define PT_INSTANTIATE(F)                                                     \
  template void embedding_forward<F>(F*, const int32_t*, const F*, int, int,  \
                                     int, int, int);                          \
  template void embedding_backward<F>(F*, const F*, const int32_t*, int, int, \
                                      int, int, int);                         \
  template void position_forward<F>(F*, const F*, int, int, int, int);        \
  template void position_backward<F>(F*, const F*, int, int, int, int);
PT_INSTANTIATE(float)
PT_INSTANTIATE(double)
#undef PT_INSTANTIATE

template void encoder_forward<float>(float*, const int32_t*, const float*,
                                     const float*, int, int, int);
template void encoder_forward<double>(double*, const int32_t*, const double*,
                                      const double*, int, int, int);
template void encoder_backward<float>(float*, float*, const float*,
                                      const int32_t*, int, int, int);
template void encoder_backward<double>(double*, double*, const double*,
                                       const int32_t*, int, int, int);

}  // namespace ptrain::kernels
