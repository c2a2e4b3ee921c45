// CPU causal attention, forward and backward, in its two forms: keeping
// the (B,NH,T,T) probabilities, and keeping one float per query row
// (flash_attention_*), over sequence lengths around the CPU backend's
// switch (kFlashAttentionT). Prints ms (best of R runs), the ratio, and
// the bytes each keeps; where the CPU has AVX512_BF16, also the bf16
// precision's kept form (attention_*_bf16, which the CPU backend runs below
// the switch) and its speed-up over the fp32 one. Never passes or fails on
// time.
//
//   build/bench/attention_bench [--rounds R] [--channels C] [--heads NH]
//                               [--kv-heads KVH]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "CLI/CLI.hpp"
#include "kernels/cpu/kernels.h"
#include "kernels/ops.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU attention: probabilities kept vs recomputed"};
  int rounds = 10, C = 384, NH = 6, KVH = 0;
  app.add_option("--rounds", rounds, "runs per form (best is printed)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--channels", C, "C")->check(CLI::Range(1, 8192));
  app.add_option("--heads", NH, "NH (divides C)")->check(CLI::Range(1, 256));
  app.add_option("--kv-heads", KVH, "KVH key/value heads (divides NH; 0: NH)")
      ->check(CLI::Range(0, 256));
  CLI11_PARSE(app, argc, argv);
  if (KVH == 0) KVH = NH;
  if (C % NH != 0 || NH % KVH != 0) {
    std::fprintf(stderr,
                 "--heads must divide --channels, --kv-heads --heads\n");
    return 2;
  }
  const int R = C + 2 * (C / NH) * KVH;  // an input row's width
  using ptrain::kernels::attention_backward;
  using ptrain::kernels::attention_forward;
  using ptrain::kernels::flash_attention_backward;
  using ptrain::kernels::flash_attention_forward;
  std::printf(
      "C%d NH%d KVH%d, %d threads, best of %d; the CPU backend switches at "
      "T=%lld\n"
      "     T  B | kept (T,T): fwd ms  bwd ms   MB | row lse: fwd ms  bwd ms"
      "   MB | time ratio | bf16 kept: fwd ms  bwd ms   MB | fp32/bf16\n",
      C, NH, KVH, omp_get_max_threads(), rounds,
      static_cast<long long>(ptrain::kernels::kFlashAttentionT));
  const bool bf16 = ptrain::kernels::CpuHasBf16();
  for (int T : {64, 256, 512, 1024, 2048}) {
    const int B = std::max(1, 4096 / T);  // 4096 positions a batch
    const size_t n3 = size_t(B) * T * R, n1 = size_t(B) * T * C;
    std::vector<float> inp(n3), dout(n1), out(n1), dinp(n3),
        att(size_t(B) * NH * T * T), datt(att.size()), lse(size_t(B) * NH * T);
    for (size_t i = 0; i < n3; i++) inp[i] = 0.5f * std::sin(0.37f * i);
    for (size_t i = 0; i < n1; i++) dout[i] = 0.1f * std::cos(0.11f * i);
    double f1 = 1e30, b1 = 1e30, f2 = 1e30, b2 = 1e30, f3 = 1e30, b3 = 1e30;
    for (int r = 0; r < rounds; ++r) {
      if (bf16) {
        const auto t0 = Clock::now();
        ptrain::kernels::attention_forward_bf16(out.data(), att.data(),
                                                inp.data(), B, T, C, NH, KVH);
        const auto t1 = Clock::now();
        ptrain::kernels::attention_backward_bf16(dinp.data(), nullptr,
                                                 dout.data(), inp.data(),
                                                 att.data(), B, T, C, NH, KVH);
        f3 = std::min(f3, Seconds(t0, t1));
        b3 = std::min(b3, Seconds(t1, Clock::now()));
      }
      const auto t0 = Clock::now();
      attention_forward(out.data(), att.data(), inp.data(), B, T, C, NH, KVH);
      const auto t1 = Clock::now();
      attention_backward(dinp.data(), datt.data(), dout.data(), inp.data(),
                         att.data(), B, T, C, NH, KVH);
      const auto t2 = Clock::now();
      flash_attention_forward(out.data(), lse.data(), inp.data(), B, T, C, NH,
                              KVH);
      const auto t3 = Clock::now();
      flash_attention_backward(dinp.data(), dout.data(), inp.data(), out.data(),
                               lse.data(), B, T, C, NH, KVH);
      const auto t4 = Clock::now();
      f1 = std::min(f1, Seconds(t0, t1));
      b1 = std::min(b1, Seconds(t1, t2));
      f2 = std::min(f2, Seconds(t2, t3));
      b2 = std::min(b2, Seconds(t3, t4));
    }
    // Kept from forward to backward, plus the backward's scratch.
    const double kept = 2.0 * att.size() * sizeof(float) / 1e6;
    const double rows = lse.size() * sizeof(float) / 1e6;
    std::printf("%6d %2d | %17.3f %7.3f %5.0f | %14.3f %7.3f %5.1f | %9.2fx", T,
                B, f1 * 1e3, b1 * 1e3, kept, f2 * 1e3, b2 * 1e3, rows,
                (f2 + b2) / (f1 + b1));
    if (bf16) {
      // Kept rounded, half the bytes; no backward scratch of that size.
      std::printf(" | %16.3f %7.3f %5.0f | %8.2fx", f3 * 1e3, b3 * 1e3,
                  att.size() * 2 / 1e6, (f1 + b1) / (f3 + b3));
    }
    std::printf("\n");
  }
  return 0;
}
