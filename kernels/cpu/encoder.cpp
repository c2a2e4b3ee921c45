// Token + position embedding (GPT-2's encoder) forward and backward on CPU.
// Not the embedding lookup of the output layer: that is a matmul with wte.
#include <algorithm>

#include "kernels/cpu/kernels.h"

namespace ptrain::kernels {

namespace {
// Channels per task of encoder_backward; 64 floats = four cache lines.
constexpr int kChannelBlock = 64;
}  // namespace

// out is (B,T,C), inp is (B,T), wte is (V,C), wpe is (>=T,C).
template <typename F>
void encoder_forward(F* out, const int32_t* inp, const F* wte, const F* wpe,
                     int B, int T, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
    const int t = static_cast<int>(bt % T);
    F* out_bt = out + bt * C;
    const F* wte_ix = wte + static_cast<int64_t>(inp[bt]) * C;
    const F* wpe_t = wpe + static_cast<int64_t>(t) * C;
#pragma omp simd
    for (int i = 0; i < C; i++) out_bt[i] = wte_ix[i] + wpe_t[i];
  }
}

// dwte is (V,C), dwpe is (>=T,C), dout is (B,T,C), inp is (B,T).
// A token can repeat within the batch, so rows of dwte collide; threads split
// the channels instead of the positions, which keeps the sum race-free and
// its order (hence the result) independent of the thread count.
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* inp,
                      int B, int T, int C) {
  const int num_blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < num_blocks; blk++) {
    const int c0 = blk * kChannelBlock;
    const int c1 = std::min(C, c0 + kChannelBlock);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        const int64_t bt = static_cast<int64_t>(b) * T + t;
        const F* dout_bt = dout + bt * C;
        F* dwte_ix = dwte + static_cast<int64_t>(inp[bt]) * C;
        F* dwpe_t = dwpe + static_cast<int64_t>(t) * C;
#pragma omp simd
        for (int i = c0; i < c1; i++) {
          dwte_ix[i] += dout_bt[i];
          dwpe_t[i] += dout_bt[i];
        }
      }
    }
  }
}

template void encoder_forward<float>(float*, const int32_t*, const float*,
                                     const float*, int, int, int);
template void encoder_forward<double>(double*, const int32_t*, const double*,
                                      const double*, int, int, int);
template void encoder_backward<float>(float*, float*, const float*,
                                      const int32_t*, int, int, int);
template void encoder_backward<double>(double*, double*, const double*,
                                       const int32_t*, int, int, int);

}  // namespace ptrain::kernels
