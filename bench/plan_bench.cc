// The layout planner against what was measured elsewhere, as Markdown
// tables (docs/planner.md):
//   published  Megatron-LM's weak-scaling runs (A100 80GB): each run's
//              teraFLOP/s per GPU as published, as predicted with the
//              paper's tp and pp, and the best layout left free;
//   gpu        GPT-2 124M and 350M (B8, T1024, one GPU) as a lent H200
//              measured ptrain's step (docs/cuda.md) against the h200
//              profile's prediction;
//   search     how long the search takes for a 70B Llama on 1024 H100s.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/spec.h"
#include "planner/published.h"
#include "planner/search.h"

namespace ptrain::planner {
namespace {

HardwareProfile Load(const std::string& name) {
  absl::StatusOr<HardwareProfile> p = LoadProfile(name);
  if (!p.ok()) {
    std::fprintf(stderr, "%s\n", std::string(p.status().message()).c_str());
    std::exit(1);
  }
  return *p;
}

int Published() {
  const HardwareProfile a100 = Load("a100");
  std::printf(
      "| params | GPUs | batch | paper tp, pp | paper TFLOP/s a GPU | "
      "predicted, paper's tp and pp | error | its layout | best free "
      "layout | predicted | searches |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n");
  double worst = 0;
  for (const PublishedRun& run : MegatronWeakScaling()) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<PublishedComparison> c = CompareWithPublished(run, a100);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (!c.ok()) {
      std::printf("| %.1fB | %s |\n", run.billions,
                  std::string(c.status().message()).c_str());
      continue;
    }
    const double error = c->pinned_tflops / run.tflops_per_gpu - 1;
    worst = std::max(worst, std::abs(error));
    std::printf(
        "| %.1fB | %d | %d | %d, %d | %.0f | %.0f | %+.0f%% | %s | %s "
        "| %.0f | %.1f s |\n",
        run.billions, run.gpus, run.batch, run.tp, run.pp, run.tflops_per_gpu,
        c->pinned_tflops, 100 * error, LayoutWords(c->pinned.spec).c_str(),
        LayoutWords(c->free.spec).c_str(), c->free_tflops, seconds);
    std::fflush(stdout);
  }
  std::printf("\nworst error %.1f%% (goal: within 20%% on every row)\n",
              100 * worst);
  return 0;
}

v1::JobSpec Gpt2(int layers, int heads, int C) {
  v1::JobSpec s = DefaultJobSpec();
  s.set_name("gpt2");
  s.mutable_model()->set_arch("gpt");
  s.mutable_model()->set_n_layer(layers);
  s.mutable_model()->set_n_head(heads);
  s.mutable_model()->set_n_embd(C);
  s.mutable_model()->set_block_size(1024);
  s.mutable_model()->set_vocab_size(50257);
  s.mutable_data()->set_path("data/input.txt");
  s.mutable_train()->set_global_batch(8);
  s.mutable_resources()->set_device("cuda");
  return s;
}

int Gpu() {
  const HardwareProfile h200 = Load("h200");
  struct Row {
    const char* model;
    v1::JobSpec spec;
    double measured_ms;
  };
  // docs/cuda.md: one H200, 2026-11-27, call 3 (124M) and call 1 (350M).
  const std::vector<Row> rows = {{"GPT-2 124M", Gpt2(12, 12, 768), 21.3},
                                 {"GPT-2 350M", Gpt2(24, 16, 1024), 58.2}};
  std::printf(
      "| model (B8, T1024, one H200) | measured ms/step | predicted | "
      "error |\n|---|---|---|---|\n");
  for (const Row& r : rows) {
    SearchOptions fixed;
    fixed.fixed = true;
    absl::StatusOr<PlanResult> p =
        PlanLayouts(PlanInputOf(r.spec, h200), Cluster{1, 1, 0}, h200, fixed);
    if (!p.ok() || p->best.empty()) {
      std::printf(
          "| %s | %s |\n", r.model,
          p.ok() ? "does not fit" : std::string(p.status().message()).c_str());
      continue;
    }
    const double ms = 1e3 * p->best[0].prediction.step_s;
    std::printf("| %s | %.1f | %.1f | %+.0f%% |\n", r.model, r.measured_ms, ms,
                100 * (ms / r.measured_ms - 1));
  }
  return 0;
}

int Search() {
  const HardwareProfile h100 = Load("h100");
  v1::JobSpec s = DefaultJobSpec();
  s.set_name("llama-70b");
  v1::ModelSpec* m = s.mutable_model();
  m->set_arch("llama");
  m->set_n_layer(80);
  m->set_n_head(64);
  m->set_n_kv_head(8);
  m->set_n_embd(8192);
  m->set_ffn_hidden(28672);
  m->set_block_size(4096);
  m->set_vocab_size(128256);
  m->set_tie_embeddings(false);
  s.mutable_data()->set_path("data/input.txt");
  s.mutable_train()->set_global_batch(1024);
  s.mutable_resources()->set_device("cuda");
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<PlanResult> p = PlanLayouts(
      PlanInputOf(s, h100), Cluster{128, 8, 0}, h100, SearchOptions{});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (!p.ok()) {
    std::printf("%s\n", std::string(p.status().message()).c_str());
    return 1;
  }
  std::printf(
      "70B Llama (T 4096, batch 1024) on 128 nodes × 8 H100: %.2f s (goal "
      "< 10 s), %lld layouts, %lld simulated, %lld sized; best %s: %.2f s a "
      "step, MFU %.1f%%\n",
      seconds, static_cast<long long>(p->layouts),
      static_cast<long long>(p->simulated), static_cast<long long>(p->sized),
      LayoutWords(p->best[0].spec).c_str(), p->best[0].prediction.step_s,
      100 * p->best[0].prediction.mfu);
  return 0;
}

}  // namespace
}  // namespace ptrain::planner

int main(int argc, char** argv) {
  CLI::App app{"the layout planner against published and measured runs"};
  std::string what = "all";
  app.add_option("--what", what, "published|gpu|search|all")
      ->check(CLI::IsMember({"published", "gpu", "search", "all"}));
  CLI11_PARSE(app, argc, argv);
  int rc = 0;
  if (what == "search" || what == "all") rc |= ptrain::planner::Search();
  if (what == "gpu" || what == "all") rc |= ptrain::planner::Gpu();
  if (what == "published" || what == "all") rc |= ptrain::planner::Published();
  return rc;
}
