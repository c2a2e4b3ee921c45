// Context parallelism under mpirun: tok/s, the cp group's ring traffic and
// time per step, and activations per rank against one rank's at the same
// sequence length. Prints figures and ratios; never passes or fails on
// time. bench/context_parallel.sh runs cp=1 (one rank, every core's
// thread) and cp=2 (one thread per rank) side by side.
//
//   mpirun -n CP build/bench/context_parallel_bench [--config S|M]
//          [--block-size T] [--batch B] [--recompute none|selective|full]
//          [--steps N] [--warmup N]
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
  std::string config = "M", recompute = "none";
  int block_size = 1024, batch = 4, steps = 3, warmup = 1;
};

void AddFlags(CLI::App& app, Args& a) {
  app.add_option("--config", a.config, "model: S or M")
      ->check(CLI::IsMember({"S", "M"}));
  app.add_option("--block-size", a.block_size,
                 "sequence length (model.block_size)")
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--batch", a.batch, "sequences per step")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--recompute", a.recompute, "train.recompute")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  app.add_option("--steps", a.steps, "measured steps")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", a.warmup, "steps before measuring")
      ->check(CLI::Range(0, 100000));
}

std::vector<std::string> Overrides(const Args& a, int cp) {
  std::vector<std::string> o = ptrain::BenchModel(a.config);
  o.push_back("model.block_size=" + std::to_string(a.block_size));
  o.push_back("train.global_batch=" + std::to_string(a.batch));
  o.push_back("train.recompute=" + a.recompute);
  o.push_back("train.precision=fp32");
  o.push_back("parallel.cp=" + std::to_string(cp));
  o.push_back("train.steps=" + std::to_string(a.warmup + a.steps));
  return o;
}

double Mb(double bytes) { return bytes / 1e6; }

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "context_parallel_bench: context-parallel training under mpirun -n CP: "
      "tok/s, the ring's traffic, activations per rank"};
  AddFlags(app, a);
  CLI11_PARSE(app, argc, argv);
  const ptrain::MpiWorld mpi = ptrain::StartMpi(&argc, &argv);
  const int cp = mpi.size;
  {
    ptrain::MpiTrainer run = ptrain::MakeMpiTrainer(Overrides(a, cp));
    auto& tr = *run.trainer;
    auto& stats = *run.dims->comm_stats();
    const ptrain::MeasuredSteps measured =
        ptrain::MeasureSteps(run, a.warmup, a.steps);
    const double mean = measured.mean;
    const float loss = measured.loss;
    const auto& mc = run.spec.model();
    const double B = a.batch, T = mc.block_size(), C = mc.n_embd(),
                 L = mc.n_layer();
    if (mpi.rank == 0) {
      std::printf(
          "config %s T=%d B=%d, cp=%d, recompute %s, %d thread(s)/rank\n",
          a.config.c_str(), a.block_size, a.batch, cp, a.recompute.c_str(),
          omp_get_max_threads());
      std::printf("  %.1f ms/step, %.0f tok/s, last loss %.6f\n", mean * 1e3,
                  B * T / mean, loss);
    }
    if (mpi.rank == 0 && cp > 1) {
      // What the ring moves per step and rank: each layer's packed keys
      // and values (B, T/cp, 2C) passed on cp−1 times in the forward; in
      // the backward cp−1 times again, and their gradient cp times (home
      // after the last step).
      const double block = B * (T / cp) * 2 * C * 4;
      const double least = L * block * (3 * cp - 2);
      double sent = 0, seconds = 0;
      for (const auto& [key, st] : stats.Snapshot()) {
        if (key.first != "cp") continue;
        if (key.second == "send") sent += double(st.bytes) / a.steps;
        seconds += st.seconds / a.steps;
        std::printf("  cp %-6s %6.1f calls/step %8.2f MB/step %7.1f ms/step\n",
                    key.second.c_str(), double(st.calls) / a.steps,
                    double(st.bytes) / a.steps / 1e6,
                    st.seconds / a.steps * 1e3);
      }
      std::printf(
          "  ring: sent %.2f MB/step per rank = %.2f x its keys, values and "
          "their gradients (%.2f MB); transfers in flight %.1f ms/step (from "
          "post to completion, overlapping the blocks' compute; %.1f%% of "
          "the step)\n",
          Mb(sent), sent / least, Mb(least), seconds * 1e3,
          100 * seconds / mean);
    }
    if (mpi.rank == 0) {
      // The engine's buffers of this rank, and the estimate (equal to them,
      // see checkpoint_reshard_test) at cp = 1 and at this cp.
      const ptrain::MemoryBytes mem = tr.memory();
      const int V = tr.data().vocab_size;
      auto estimate = [&](int c) {
        auto s = ptrain::LoadJobSpecFile("examples/shakespeare-char.yaml",
                                         Overrides(a, c));
        return ptrain::EstimateRankMemory(*s, V);
      };
      const ptrain::MemoryEstimate one = estimate(1), mine = estimate(cp);
      std::printf(
          "  activations per rank: engine %.2f MB, estimate %.2f MB; cp=1 "
          "estimate %.2f MB; ratio %.3f (target at cp=2 <= 0.55)\n",
          Mb(mem.activations), Mb(mine.activations), Mb(one.activations),
          double(mem.activations) / one.activations);
    }
  }
  MPI_Finalize();
  return 0;
}
