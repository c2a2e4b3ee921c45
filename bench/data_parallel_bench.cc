// Data-parallel training under mpirun: throughput, how much of the gradient
// reduction backward hides, and per-rank memory against one rank's. Prints
// figures and ratios; never passes or fails on time.
//
//   mpirun -n 2 build/bench/data_parallel_bench [--config S|M] [--zero Z]
//          [--steps N] [--bucket-mb X] [--microbatches K]
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "CLI/CLI.hpp"
#include "bench/configs.h"
#include "bench/mpi_trainer.h"
#include "common/spec.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/train/trainer.h"

namespace {

struct Args {
  std::string config = "M";
  int zero = 0, steps = 6, warmup = 2, microbatches = 1;
  double bucket_mb = 4.0;
};

void AddFlags(CLI::App& app, Args& a) {
  app.add_option("--config", a.config, "model: S or M")
      ->check(CLI::IsMember({"S", "M"}));
  app.add_option("--zero", a.zero, "ZeRO stage")->check(CLI::Range(0, 3));
  app.add_option("--steps", a.steps, "measured steps")
      ->check(CLI::Range(1, 100000));
  app.add_option("--bucket-mb", a.bucket_mb, "gradient bucket size in MB")
      ->check(CLI::Range(0.001, 4096.0));
  app.add_option("--microbatches", a.microbatches, "microbatches per step")
      ->check(CLI::Range(1, 1024));
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "data_parallel_bench: data-parallel and ZeRO training under mpirun: "
      "tok/s, overlap of the gradient reduction, memory per rank"};
  AddFlags(app, a);
  CLI11_PARSE(app, argc, argv);
  const ptrain::MpiWorld mpi = ptrain::StartMpi(&argc, &argv);
  const int world = mpi.size, rank = mpi.rank;
  const bool m = a.config == "M";
  std::vector<std::string> overrides = ptrain::BenchModel(a.config);
  for (const std::string& s :
       {std::string("train.global_batch=") + (m ? "8" : "16"),
        "parallel.dp=" + std::to_string(world),
        "parallel.zero=" + std::to_string(a.zero),
        "parallel.microbatches=" + std::to_string(a.microbatches),
        "parallel.bucket_bytes=" +
            std::to_string(static_cast<int64_t>(a.bucket_mb * (1 << 20))),
        "train.steps=" + std::to_string(a.warmup + a.steps)}) {
    overrides.push_back(s);
  }
  {
    ptrain::MpiTrainer run = ptrain::MakeMpiTrainer(overrides);
    const auto* spec = &run.spec;
    auto& tr = *run.trainer;
    auto& stats = *run.dims->comm_stats();
    const double total =
        ptrain::MeasureSteps(run, a.warmup, a.steps).mean * a.steps;
    // The wait for reductions not hidden behind backward.
    const double exposed = stats.ExposedSeconds();
    // The gradient reductions issued during backward.
    const char* op = a.zero == 0 ? "all_reduce" : "reduce_scatter";
    const ptrain::CommStat red =
        stats.Get("dp", a.zero == 0 ? ptrain::CommOp::kAllReduce
                                    : ptrain::CommOp::kReduceScatter);
    const ptrain::CommStat gather = stats.Get("dp", ptrain::CommOp::kAllGather);
    const ptrain::MemoryBytes mem = tr.memory();
    // One rank alone holds weights, gradients and two Adam moments of every
    // element (the padded vocabulary included): 16 bytes each.
    const double single =
        16.0 * static_cast<double>(ptrain::GptNumParams(tr.model().config()) +
                                   int64_t{tr.model().config().padded_vocab -
                                           tr.model().config().vocab_size} *
                                       tr.model().config().n_embd);
    const double tokens = static_cast<double>(spec->train().global_batch()) *
                          spec->model().block_size();
    if (rank == 0) {
      const double mean = total / a.steps;
      std::printf(
          "config %s, dp=%d zero=%d microbatches=%d, %d thread(s)/rank, "
          "bucket %.1f MB\n",
          a.config.c_str(), world, a.zero, a.microbatches,
          omp_get_max_threads(), a.bucket_mb);
      std::printf("  %.1f ms/step, %.0f tok/s (global)\n", mean * 1e3,
                  tokens / mean);
      std::printf(
          "  dp %s: %.1f ms/step over %lld calls; blocked after backward "
          "%.1f ms/step: %.1f%% of the reduction time not hidden\n",
          op, red.seconds / a.steps * 1e3,
          static_cast<long long>(red.calls / a.steps), exposed / a.steps * 1e3,
          100.0 * exposed / std::max(red.seconds, 1e-12));
      std::printf("  dp all_gather: %.1f ms/step\n",
                  gather.seconds / a.steps * 1e3);
      const double pgo =
          static_cast<double>(mem.params + mem.grads + mem.optimizer);
      std::printf(
          "  memory per rank: params %.2f MB, grads %.2f MB, optimizer %.2f "
          "MB, activations %.2f MB\n",
          mem.params / 1e6, mem.grads / 1e6, mem.optimizer / 1e6,
          mem.activations / 1e6);
      std::printf(
          "  params+grads+optimizer %.2f MB = %.3f x the single-rank %.2f "
          "MB\n",
          pgo / 1e6, pgo / single, single / 1e6);
    }
  }
  MPI_Finalize();
  return 0;
}
