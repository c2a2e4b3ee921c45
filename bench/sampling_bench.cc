// Generation speed: tokens/s of Trainer::Sample with the key/value cache
// against recomputing the whole context for every token, on configs S and
// M (char Shakespeare, untrained weights: the cost does not depend on
// them), interleaved in rounds. Two references recompute the context for
// every token: over the same contexts as the cache (restarting from the
// last half at the block size; the same tokens), and over a window of the
// last block_size tokens sliding by one (the sampler before the cache).
// Prints figures and ratios; never passes or fails on time.
//
//   build/bench/sampling_bench [--config S|M|both] [--tokens N] [--rounds R]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/configs.h"
#include "bench/stats.h"
#include "common/spec.h"
#include "worker/engine/train/trainer.h"

namespace {

void RunConfig(const std::string& config, int tokens, int rounds) {
  std::vector<std::string> sets = ptrain::BenchModel(config);
  sets.push_back("train.sample_tokens=" + std::to_string(tokens));
  auto spec = ptrain::LoadJobSpecFile("examples/shakespeare-char.yaml", sets);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    std::exit(1);
  }
  ptrain::TrainerOptions options;
  options.peak_flops = 1e12;  // no MFU here: skip the measurement
  options.quiet = true;
  auto trainer = ptrain::Trainer::Create(*spec, options);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.status().ToString().c_str());
    std::exit(1);
  }
  using Mode = ptrain::TextSampler::Mode;
  std::vector<double> cached_s, recomputed_s, sliding_s;
  bool same = true;
  for (int r = 0; r < rounds; ++r) {
    auto time = [&](Mode mode, std::string* text) {
      const auto t0 = std::chrono::steady_clock::now();
      *text = (*trainer)->sampler().Sample(static_cast<uint64_t>(r), mode);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                           t0)
          .count();
    };
    std::string a, b, c;
    cached_s.push_back(time(Mode::kKvCache, &a));
    recomputed_s.push_back(time(Mode::kRecompute, &b));
    sliding_s.push_back(time(Mode::kSlidingWindow, &c));
    same = same && a == b;
  }
  const double cached = ptrain::Median(cached_s),
               recomputed = ptrain::Median(recomputed_s),
               sliding = ptrain::Median(sliding_s);
  std::printf(
      "config %s (block %d), %d tokens, %d threads, median of %d rounds:\n"
      "  key/value cache            %8.3f ms/token  %9.1f tokens/s\n"
      "  recompute the same context %8.3f ms/token  %9.1f tokens/s  "
      "(cache %.1fx; same tokens: %s)\n"
      "  recompute a sliding window %8.3f ms/token  %9.1f tokens/s  "
      "(cache %.1fx: the sampler before the cache)\n",
      config.c_str(), spec->model().block_size(), tokens, omp_get_max_threads(),
      rounds, 1e3 * cached / tokens, tokens / cached, 1e3 * recomputed / tokens,
      tokens / recomputed, recomputed / cached, same ? "yes" : "NO",
      1e3 * sliding / tokens, tokens / sliding, sliding / cached);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Generation speed with and without the key/value cache"};
  std::string config = "both";
  int tokens = 300, rounds = 3;
  app.add_option("--config", config, "S, M or both")
      ->check(CLI::IsMember({"S", "M", "both"}));
  app.add_option("--tokens", tokens, "tokens generated per sample")
      ->check(CLI::Range(1, 100000));
  app.add_option("--rounds", rounds, "interleaved rounds (median)")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  for (const char* c : {"S", "M"}) {
    if (config == "both" || config == c) RunConfig(c, tokens, rounds);
  }
  return 0;
}
