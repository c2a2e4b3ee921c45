// Training throughput of the single-rank engine on configs S and M (char
// Shakespeare), against this machine's sgemm peak measured here with the same
// library, plus memory: analytic count vs buffers vs resident set growth.
// With --precision both (the default where the CPU has AVX512_BF16) each
// config also trains with train.precision=bf16 (bf16 matmul products) and
// the bf16/fp32 tok/s ratio is printed, of the two runs and of both
// trained again with their steps interleaved. With --arch llama the model
// is a Llama of each config's width (BenchLlama, bench/configs.h); with
// --arch both, GPT-2 and that Llama, then the two trained again with their
// steps interleaved and the Llama's MFU as a fraction of GPT-2's. Prints
// figures and ratios; never passes or fails on time.
//
//   build/bench/engine_throughput [--steps N] [--config S|M|both]
//                                 [--precision fp32|bf16|both]
//                                 [--arch gpt|llama|both]
#include <cblas.h>
#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/configs.h"
#include "bench/stats.h"
#include "common/spec.h"
#include "kernels/cpu/kernels.h"
#include "worker/engine/model/flops.h"
#include "worker/engine/train/trainer.h"

namespace {

// Resident set size from /proc/self/status, in bytes ("VmRSS" or "VmHWM").
int64_t ProcStatusBytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      return std::stoll(line.substr(std::strlen(key) + 1)) * 1024;
    }
  }
  return 0;
}

struct Config {
  const char* name;
  int L, NH, C, T, B, warmup, steps;
  bool llama = false;  // BenchLlama of this width, else GPT-2
};

// What a Llama of config c must hold, as AnalyticBytes below counts it.
// H: the MLP's hidden width, K: the key (and value) heads' channels.
int64_t LlamaAnalyticBytes(const Config& c, int V, int64_t H, int64_t K,
                           int64_t n_params, bool bf16, int64_t* activations) {
  const int64_t BT = static_cast<int64_t>(c.B) * c.T;
  // Saved per layer: ln1, qkv (3: key and value heads repeated for the
  // query heads), atty, residual2, ln2, residual3 = 8 C; gate_up 2 H
  // (silu(gate)·up is computed again in backward); RMSNorm's 1/rms = 2;
  // attention probabilities NH·T (bf16: rounded, half).
  const int64_t probs = static_cast<int64_t>(c.NH) * c.T / (bf16 ? 2 : 1);
  const int64_t per_layer = 8 * c.C + 2 * H + 2 + probs;
  const int64_t saved = BT * (c.L * per_layer + c.C /*embedding*/ + c.C +
                              1 /*ln_f*/ + V /*probs*/ + 1 /*losses*/);
  // Backward of one layer at a time: the stream's and a norm's gradients
  // (2 C), and the larger of attention's (its qkv row's 3 C, its output's
  // C, the q, k and v projections' C + 2 K, the probabilities' NH·T but in
  // bf16) and the MLP's (silu(gate)·up again and its gradient, 2 H, and
  // gate_up's, 2 H); and the logits'.
  const int64_t attention =
      5 * c.C + 2 * K + (bf16 ? 0 : static_cast<int64_t>(c.NH) * c.T);
  const int64_t working = BT * (2 * c.C + std::max(attention, 4 * H) + V);
  *activations = 4 * (saved + working);
  return 4 * 4 * n_params + *activations;
}

// What training must hold, counted from the model's definition rather than
// from the engine's allocation: 4 copies of the parameters (weights,
// gradients, two Adam moments) and, per token, what backward reads.
int64_t AnalyticBytes(const Config& c, int V, int64_t n_params, bool bf16,
                      int64_t* activations) {
  const int64_t BT = static_cast<int64_t>(c.B) * c.T;
  // Saved per layer: ln1, qkv(3), atty, residual2, ln2, fch(4), residual3 =
  // 12 C (GELU's output is computed again in backward, into room the
  // attention's gradients take later; in bf16 it is kept rounded, 4 C of
  // two bytes: 2 C more); LayerNorm mean/rstd = 4; attention probabilities
  // NH·T (bf16: rounded, half).
  const int64_t probs = static_cast<int64_t>(c.NH) * c.T / (bf16 ? 2 : 1);
  const int64_t per_layer = (bf16 ? 14LL : 12LL) * c.C + 4 + probs;
  const int64_t saved = BT * (c.L * per_layer + c.C /*embedding*/ + c.C +
                              2 /*ln_f*/ + V /*probs*/ + 1 /*losses*/);
  // Backward of one layer at a time: gradients of every activation of a
  // layer (15 C per token plus NH·T, less 4 C: GELU's input gradient
  // replaces its output's; bf16 attention needs no NH·T), and of the
  // logits.
  const int64_t working =
      BT * (11LL * c.C + (bf16 ? 0 : static_cast<int64_t>(c.NH) * c.T) + V);
  *activations = 4 * (saved + working);
  return 4 * 4 * n_params + *activations;
}

// A trainer of config c in `precision`; exits on error.
std::unique_ptr<ptrain::Trainer> MakeTrainer(const Config& c,
                                             const std::string& precision,
                                             double peak) {
  std::vector<std::string> overrides = {
      "model.n_layer=" + std::to_string(c.L),
      "model.n_head=" + std::to_string(c.NH),
      "model.n_embd=" + std::to_string(c.C),
      "model.block_size=" + std::to_string(c.T),
      "train.global_batch=" + std::to_string(c.B),
      "train.steps=" + std::to_string(c.warmup + c.steps),
      "train.precision=" + precision};
  if (c.llama) {
    for (std::string& o : ptrain::BenchLlama(c.NH, c.C)) {
      overrides.push_back(std::move(o));
    }
  }
  auto spec =
      ptrain::LoadJobSpecFile("examples/shakespeare-char.yaml", overrides);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    std::exit(1);
  }
  ptrain::TrainerOptions opt;
  opt.peak_flops = peak;
  opt.quiet = true;
  auto trainer = ptrain::Trainer::Create(*spec, opt);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*trainer);
}

// Trains config c in `precision`; returns its tok/s.
double RunConfig(const Config& c, const std::string& precision, double peak) {
  // Freed heap kept by malloc would be reused silently and hide growth.
  malloc_trim(0);
  const int64_t rss0 = ProcStatusBytes("VmRSS");
  const std::unique_ptr<ptrain::Trainer> trainer =
      MakeTrainer(c, precision, peak);
  ptrain::Trainer& tr = *trainer;
  for (int s = 0; s < c.warmup; ++s) tr.TrainStep(s);
  double total = 0, best = 1e30;
  ptrain::PhaseSeconds phases;
  for (int s = c.warmup; s < c.warmup + c.steps; ++s) {
    const ptrain::StepResult r = tr.TrainStep(s);
    total += r.seconds;
    best = std::min(best, r.seconds);
    phases.data += r.phases.data;
    phases.forward += r.phases.forward;
    phases.backward += r.phases.backward;
    phases.optimizer += r.phases.optimizer;
  }
  const double mean = total / c.steps;
  const double tokens = static_cast<double>(c.B) * c.T;
  const double flops = tr.flops_per_step();
  malloc_trim(0);  // drop the data loader's freed temporaries
  const int64_t rss1 = ProcStatusBytes("VmRSS");
  // The token arrays are data, not training state.
  const int64_t data_bytes =
      static_cast<int64_t>((ptrain::TokenCount(tr.data().train) +
                            ptrain::TokenCount(tr.data().val)) *
                           sizeof(uint16_t));
  const ptrain::GptConfig& model = tr.model().config();
  const std::string llama_dims =
      c.llama ? " KV" + std::to_string(model.kv_heads()) + " F" +
                    std::to_string(model.hidden())
              : "";
  std::printf(
      "config %s %s%s (L%d H%d%s C%d T%d B%d, %lld params): %.1f ms/step "
      "(best %.1f), %.0f tok/s, %.1f GFLOP/s, MFU %.1f%% of %s peak\n",
      c.name, c.llama ? "llama " : "", precision.c_str(), c.L, c.NH,
      llama_dims.c_str(), c.C, c.T, c.B,
      static_cast<long long>(ptrain::GptNumParams(model)), mean * 1e3,
      best * 1e3, tokens / mean, flops / mean / 1e9,
      100.0 * flops / mean / peak,
      precision == "bf16" ? "bf16 matmul" : "sgemm");
  std::printf(
      "  per step: data %.2f ms, forward %.2f ms, backward %.2f ms, "
      "optimizer %.2f ms\n",
      1e3 * phases.data / c.steps, 1e3 * phases.forward / c.steps,
      1e3 * phases.backward / c.steps, 1e3 * phases.optimizer / c.steps);
  const ptrain::MemoryBytes m = tr.memory();
  int64_t analytic_acts = 0;
  // The model as built: its vocabulary padded to a multiple of 128, the
  // padding rows of wte included.
  const bool bf16 = precision == "bf16";
  const int64_t analytic =
      c.llama
          ? LlamaAnalyticBytes(c, model.padded_vocab, model.hidden(),
                               int64_t{model.kv_heads()} * (c.C / c.NH),
                               tr.model().buffer_size(), bf16, &analytic_acts)
          : AnalyticBytes(c, model.padded_vocab, tr.model().buffer_size(), bf16,
                          &analytic_acts);
  const int64_t buffers = m.params + m.grads + m.optimizer + m.activations;
  std::printf(
      "  memory: params %.2f MB, grads %.2f MB, adam %.2f MB, activations "
      "%.2f MB (analytic %.2f MB)\n",
      m.params / 1e6, m.grads / 1e6, m.optimizer / 1e6, m.activations / 1e6,
      analytic_acts / 1e6);
  std::printf(
      "  memory: analytic %.2f MB, engine buffers %.2f MB (ratio %.3f), "
      "resident growth less %.2f MB of tokens %.2f MB (ratio %.3f)\n",
      analytic / 1e6, buffers / 1e6, double(buffers) / analytic,
      data_bytes / 1e6, (rss1 - rss0 - data_bytes) / 1e6,
      double(rss1 - rss0 - data_bytes) / analytic);
  return tokens / mean;
}

// Step times of two trainers stepped in turn (a, b, a, ...), past c's
// warm-up steps: each one's min and median.
struct TurnTimes {
  double min_a, med_a, min_b, med_b;
};
TurnTimes StepInTurn(const Config& c, ptrain::Trainer& a, ptrain::Trainer& b) {
  std::vector<double> ta, tb;
  for (int s = 0; s < c.warmup + c.steps; ++s) {
    const double x = a.TrainStep(s).seconds;
    const double y = b.TrainStep(s).seconds;
    if (s < c.warmup) continue;
    ta.push_back(x);
    tb.push_back(y);
  }
  return {*std::min_element(ta.begin(), ta.end()), ptrain::Median(ta),
          *std::min_element(tb.begin(), tb.end()), ptrain::Median(tb)};
}

// fp32 and bf16 trainers of config c, stepped in turn (fp32, bf16, fp32,
// ...) so that both see the same machine: a shared host's speed drifts
// over seconds, enough to move a ratio of two runs made one after the
// other by 10%. Prints each precision's min and median step time and the
// ratios.
void CompareInterleaved(const Config& c, double peak, double peak_bf16) {
  const std::unique_ptr<ptrain::Trainer> fp32 = MakeTrainer(c, "fp32", peak);
  const std::unique_ptr<ptrain::Trainer> bf16 =
      MakeTrainer(c, "bf16", peak_bf16);
  const TurnTimes t = StepInTurn(c, *fp32, *bf16);
  const double min32 = t.min_a, med32 = t.med_a, min16 = t.min_b,
               med16 = t.med_b;
  std::printf(
      "  config %s%s interleaved, %d steps each: fp32 min %.1f median %.1f "
      "ms/step, bf16 min %.1f median %.1f ms/step; bf16/fp32 tok/s %.2fx "
      "(min), %.2fx (median)\n",
      c.name, c.llama ? " llama" : "", c.steps, min32 * 1e3, med32 * 1e3,
      min16 * 1e3, med16 * 1e3, min32 / min16, med32 / med16);
}

// GPT-2 and the Llama of config c's width, in `precision`, stepped in turn
// (as CompareInterleaved does): each one's min and median step time, MFU
// at its median, and the Llama's MFU as a fraction of GPT-2's.
void CompareArchInterleaved(Config c, const std::string& precision,
                            double peak) {
  c.llama = false;
  const std::unique_ptr<ptrain::Trainer> gpt = MakeTrainer(c, precision, peak);
  c.llama = true;
  const std::unique_ptr<ptrain::Trainer> llama =
      MakeTrainer(c, precision, peak);
  const TurnTimes t = StepInTurn(c, *gpt, *llama);
  const double min_g = t.min_a, med_g = t.med_a, min_l = t.min_b,
               med_l = t.med_b;
  // FLOPs per step of the Llama over GPT-2's: the MFU ratio is the tok/s
  // ratio times this.
  const double flops = llama->flops_per_step() / gpt->flops_per_step();
  std::printf(
      "  config %s %s interleaved, %d steps each: gpt min %.1f median %.1f "
      "ms/step, MFU %.1f%%; llama min %.1f median %.1f ms/step, MFU %.1f%%; "
      "llama/gpt FLOPs per step %.3f, tok/s %.2fx (median), MFU %.2fx "
      "(median), %.2fx (min)\n",
      c.name, precision.c_str(), c.steps, min_g * 1e3, med_g * 1e3,
      100.0 * gpt->flops_per_step() / med_g / peak, min_l * 1e3, med_l * 1e3,
      100.0 * llama->flops_per_step() / med_l / peak, flops, med_g / med_l,
      flops * med_g / med_l, flops * min_g / min_l);
}

// The same 2048^3 product through OpenBLAS, to justify the library choice.
double OpenBlasSgemmFlops(int n) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f),
      c(size_t(n) * n);
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f,
                a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (r > 0) best = std::min(best, s);
  }
  return 2.0 * n * double(n) * n / best;
}

}  // namespace

int main(int argc, char** argv) {
  int steps_s = 40, steps_m = 6;
  std::string which = "both";
  std::string arch = "gpt";
  std::string precision = ptrain::kernels::CpuHasBf16() ? "both" : "fp32";
  CLI::App app{
      "engine_throughput: single-rank training tok/s, phases and memory on "
      "configs S and M against this machine's matmul peak"};
  app.add_option("--steps", steps_s,
                 "measured steps of each config (default: 40 for S, 6 for M)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--config", which, "S, M or both")
      ->check(CLI::IsMember({"S", "M", "both"}));
  app.add_option("--precision", precision,
                 "fp32, bf16 (CPUs with AVX512_BF16) or both (their default)")
      ->check(CLI::IsMember({"fp32", "bf16", "both"}));
  app.add_option("--arch", arch,
                 "gpt (GPT-2), llama (a Llama of each config's width) or "
                 "both, also stepped in turn (default: gpt)")
      ->check(CLI::IsMember({"gpt", "llama", "both"}));
  CLI11_PARSE(app, argc, argv);
  if (app.count("--steps") > 0) steps_m = steps_s;
  const double peak = ptrain::MeasureSgemmPeakFlops(2048, 5);
  const double blas = OpenBlasSgemmFlops(2048);
  std::printf(
      "threads %d, sgemm peak (oneDNN, 2048^3) %.1f GFLOP/s; OpenBLAS %.1f "
      "GFLOP/s (oneDNN/OpenBLAS %.2fx)\n",
      omp_get_max_threads(), peak / 1e9, blas / 1e9, peak / blas);
  double peak_bf16 = 0;
  if (precision != "fp32") {
    peak_bf16 =
        ptrain::MeasureMatmulPeakFlops(ptrain::kernels::CpuBf16Ops(), 2048, 5);
    std::printf(
        "bf16 matmul peak (operands rounded, oneDNN, 2048^3) %.1f GFLOP/s "
        "(%.2fx sgemm)\n",
        peak_bf16 / 1e9, peak_bf16 / peak);
  }
  auto run_arch = [&](const Config& c) {
    double fp32 = 0, bf16 = 0;
    if (precision != "bf16") fp32 = RunConfig(c, "fp32", peak);
    if (precision != "fp32") bf16 = RunConfig(c, "bf16", peak_bf16);
    if (fp32 > 0 && bf16 > 0) {
      std::printf(
          "  config %s%s: bf16/fp32 tok/s %.2fx (one run after the other)\n",
          c.name, c.llama ? " llama" : "", bf16 / fp32);
      CompareInterleaved(c, peak, peak_bf16);
    }
  };
  auto run = [&](Config c) {
    if (arch != "llama") run_arch(c);
    c.llama = true;
    if (arch != "gpt") run_arch(c);
    if (arch != "both") return;
    if (precision != "bf16") CompareArchInterleaved(c, "fp32", peak);
    if (precision != "fp32") CompareArchInterleaved(c, "bf16", peak_bf16);
  };
  if (which == "both" || which == "S")
    run({"S", 4, 4, 128, 64, 16, 5, steps_s});
  if (which == "both" || which == "M")
    run({"M", 6, 6, 384, 256, 8, 2, steps_m});
  std::printf("peak RSS %.1f MB\n", ProcStatusBytes("VmHWM") / 1e6);
  return 0;
}
