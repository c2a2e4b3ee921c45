// Expert parallelism under mpirun: an 8-expert top-2 MoE at config M's
// width on dp ranks with the experts split over ep of them (ep=1: every
// rank holds every expert). Prints tok/s, the all-to-all's time and share
// of the step, the bytes it moves, the experts' memory per rank (weights,
// gradients and Adam's moments of the experts this rank holds) and the
// memory estimate. Figures only; never passes or fails on time.
// With --tp, the ranks are dp × tp, and --expert-tp splits each expert
// over that many of the tp ranks (parallel.expert_tp; 0: all of them).
// bench/expert_parallel.sh runs ep=1 and ep=2 on 2 ranks side by side, and
// tp=2 with expert_tp 2 and 1.
//
//   mpirun -n DP·TP build/bench/expert_parallel_bench --ep EP [--tp TP]
//          [--expert-tp N] [--config S|M] [--experts E] [--top-k K]
//          [--batch B] [--capacity-factor F] [--steps N] [--warmup N]
#include <mpi.h>
#include <omp.h>

#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/configs.h"
#include "bench/mpi_trainer.h"
#include "common/spec.h"
#include "worker/engine/parallel/memory_estimate.h"

namespace {

struct Args {
  std::string config = "M";
  int ep = 1, tp = 1, expert_tp = 0, experts = 8, top_k = 2, batch = 8,
      steps = 3, warmup = 1;
  double capacity_factor = 0;
};

void AddFlags(CLI::App& app, Args& a) {
  app.add_option("--config", a.config, "model width: S or M")
      ->check(CLI::IsMember({"S", "M"}));
  app.add_option("--ep", a.ep, "parallel.ep (divides the ranks)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--tp", a.tp, "parallel.tp (divides the ranks)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--expert-tp", a.expert_tp,
                 "parallel.expert_tp (divides --tp; 0: all of tp)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--experts", a.experts, "model.moe.experts")
      ->check(CLI::Range(1, 1 << 10));
  app.add_option("--top-k", a.top_k, "model.moe.top_k")
      ->check(CLI::Range(1, 1 << 10));
  app.add_option("--batch", a.batch, "sequences per step, over every rank")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--capacity-factor", a.capacity_factor,
                 "model.moe.capacity_factor (0: dropless)")
      ->check(CLI::Range(0.0, 1e3));
  app.add_option("--steps", a.steps, "measured steps")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", a.warmup, "steps before measuring")
      ->check(CLI::Range(0, 100000));
}

std::vector<std::string> Overrides(const Args& a, int dp, int ep) {
  std::vector<std::string> o = ptrain::BenchModel(a.config);
  for (const std::string& f :
       {"model.moe.experts=" + std::to_string(a.experts),
        "model.moe.top_k=" + std::to_string(a.top_k),
        "model.moe.capacity_factor=" + std::to_string(a.capacity_factor),
        "train.global_batch=" + std::to_string(a.batch),
        std::string("train.precision=fp32"),
        "parallel.dp=" + std::to_string(dp / a.tp),
        "parallel.tp=" + std::to_string(a.tp),
        "parallel.expert_tp=" + std::to_string(a.expert_tp),
        "parallel.ep=" + std::to_string(ep),
        "train.steps=" + std::to_string(a.warmup + a.steps)}) {
    o.push_back(f);
  }
  return o;
}

double Mb(double bytes) { return bytes / 1e6; }

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "expert_parallel_bench: MoE training under mpirun -n DP with the "
      "experts split over --ep of the ranks: tok/s, the all-to-all's share, "
      "the experts' memory per rank"};
  AddFlags(app, a);
  CLI11_PARSE(app, argc, argv);
  const ptrain::MpiWorld mpi = ptrain::StartMpi(&argc, &argv);
  {
    ptrain::MpiTrainer run =
        ptrain::MakeMpiTrainer(Overrides(a, mpi.size, a.ep));
    auto& tr = *run.trainer;
    auto& stats = *run.dims->comm_stats();
    const ptrain::MeasuredSteps measured =
        ptrain::MeasureSteps(run, a.warmup, a.steps);
    const double mean = measured.mean;
    const float loss = measured.loss;
    const auto& mc = run.spec.model();
    const double tokens = double(a.batch) * mc.block_size();
    // The experts this rank holds: their weights, gradients and Adam's two
    // moments (zero 0: all four whole).
    double expert_floats = 0;
    for (const ptrain::ParamInfo& p : tr.store().layout()) {
      if (p.expert >= 0) expert_floats += double(p.numel);
    }
    const double expert_bytes = 4 * 4 * expert_floats;
    const ptrain::CommStat a2a = stats.Get("ep", ptrain::CommOp::kAllToAll);
    const double a2a_seconds = a2a.seconds / a.steps,
                 a2a_bytes = double(a2a.bytes) / a.steps,
                 a2a_calls = double(a2a.calls) / a.steps;
    const ptrain::MemoryEstimate est =
        ptrain::EstimateRankMemory(run.spec, tr.data().vocab_size);
    if (mpi.rank == 0) {
      std::printf(
          "config %s, %d experts top-%d, %s, dp=%d tp=%d expert_tp=%d ep=%d, "
          "B=%d T=%d, %d thread(s)/rank\n",
          a.config.c_str(), a.experts, a.top_k,
          a.capacity_factor > 0 ? "capacity" : "dropless", mpi.size / a.tp,
          a.tp, a.expert_tp > 0 ? a.expert_tp : a.tp, a.ep, a.batch,
          mc.block_size(), omp_get_max_threads());
      std::printf("  %.1f ms/step, %.0f tok/s, last loss %.6f\n", mean * 1e3,
                  tokens / mean, loss);
      std::printf(
          "  all-to-all (group ep): %.1f calls/step, %.2f MB/step sent by "
          "rank 0, %.1f ms/step = %.1f%% of the step\n",
          a2a_calls, Mb(a2a_bytes), a2a_seconds * 1e3,
          100 * a2a_seconds / mean);
      std::printf(
          "  experts' memory per rank (weights, gradients, Adam): %.1f MB\n",
          Mb(expert_bytes));
      std::printf(
          "  memory estimate per rank: params %.1f MB, grads %.1f MB, "
          "optimizer %.1f MB, activations %.1f MB\n",
          Mb(est.params), Mb(est.grads), Mb(est.optimizer),
          Mb(est.activations));
    }
  }
  MPI_Finalize();
  return 0;
}
