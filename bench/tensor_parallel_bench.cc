// Tensor (and sequence) parallelism under mpirun: throughput, the tp
// group's communication per step against the analytic volume, and memory
// per rank against one rank's. Prints figures and ratios; never passes or
// fails on time. bench/tensor_parallel.sh runs it at tp=1 (one rank, all
// threads) and tp=2 (one thread per rank) side by side.
//
//   mpirun -n TP build/bench/tensor_parallel_bench [--config S|M] [--sp 0|1]
//          [--steps N] [--warmup N]
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/configs.h"
#include "bench/mpi_trainer.h"
#include "common/spec.h"
#include "worker/engine/parallel/memory_estimate.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/train/trainer.h"

namespace {

struct Args {
  std::string config = "M";
  bool sp = false;
  int steps = 6, warmup = 2;
};

void AddFlags(CLI::App& app, Args& a) {
  app.add_option("--config", a.config, "model: S or M")
      ->check(CLI::IsMember({"S", "M"}));
  app.add_option("--sp", a.sp, "sequence parallelism: 0 or 1");
  app.add_option("--steps", a.steps, "measured steps")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", a.warmup, "steps before measuring")
      ->check(CLI::Range(0, 100000));
}

std::vector<std::string> Overrides(const Args& a, int tp, bool sp,
                                   const std::string& recompute = "none") {
  std::vector<std::string> o = ptrain::BenchModel(a.config);
  for (const std::string& s :
       {std::string("train.global_batch=") + (a.config == "M" ? "8" : "16"),
        "train.recompute=" + recompute, "parallel.tp=" + std::to_string(tp),
        std::string("parallel.sequence_parallel=") + (sp ? "true" : "false"),
        "train.steps=" + std::to_string(a.warmup + a.steps)}) {
    o.push_back(s);
  }
  return o;
}

double Mb(int64_t bytes) { return static_cast<double>(bytes) / 1e6; }

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "tensor_parallel_bench: tensor (and sequence) parallel training under "
      "mpirun -n TP: tok/s, tp communication against the analytic volume, "
      "memory per rank"};
  AddFlags(app, a);
  CLI11_PARSE(app, argc, argv);
  const ptrain::MpiWorld mpi = ptrain::StartMpi(&argc, &argv);
  const int world = mpi.size, rank = mpi.rank;
  const int tp = world;
  {
    ptrain::MpiTrainer run =
        ptrain::MakeMpiTrainer(Overrides(a, tp, a.sp && tp > 1));
    const auto* spec = &run.spec;
    auto& tr = *run.trainer;
    auto& stats = *run.dims->comm_stats();
    const double total =
        ptrain::MeasureSteps(run, a.warmup, a.steps).mean * a.steps;
    const auto& mc = spec->model();
    const double B = spec->train().global_batch(), T = mc.block_size(),
                 C = mc.n_embd(), L = mc.n_layer();
    const double tokens = B * T;
    if (rank == 0) {
      const double mean = total / a.steps;
      std::printf("config %s, tp=%d%s, %d thread(s)/rank\n", a.config.c_str(),
                  tp, spec->parallel().sequence_parallel() ? " sp" : "",
                  omp_get_max_threads());
      std::printf("  %.1f ms/step, %.0f tok/s\n", mean * 1e3, tokens / mean);
    }
    if (rank == 0 && tp > 1) {
      // The analytic collectives of one step, each counted at the size of
      // the whole tensor (as the metrics count them). act: one (B, T, C)
      // activation. Without SP, per layer: an all-reduce after attn.c_proj
      // and after mlp.c_proj forward, and one into attn.c_attn and mlp.c_fc
      // backward; plus the embedding's forward and the LM head's backward.
      // With SP each of those all-reduces is a reduce-scatter and each
      // identity before a column-parallel layer an all-gather, in both
      // directions; backward also re-gathers the sharded input of each
      // column-parallel layer for its weight gradient (only the shard is
      // kept, which is SP's memory saving): per layer 6 all-gathers and 4
      // reduce-scatters, at the ends 3 and 2. The cross-entropy's (B, T)
      // statistics (3 all-reduces), the sequence-partial gradients and the
      // norm are small and left out.
      const bool sp = spec->parallel().sequence_parallel();
      const double act = B * T * C * 4;
      struct Want {
        const char* op;
        double layer, ends;  // collectives per layer, and at the ends
      };
      const std::vector<Want> want =
          sp ? std::vector<Want>{{"all_gather", 6, 3}, {"reduce_scatter", 4, 2}}
             : std::vector<Want>{{"all_reduce", 4, 2}};
      double measured = 0, analytic = 0, wire = 0, analytic_wire = 0,
             seconds = 0;
      // Bytes each rank sends on a ring: all-reduce 2(p-1)/p of the tensor,
      // all-gather and reduce-scatter (p-1)/p.
      auto ring = [&](const std::string& op) {
        return (tp - 1.0) / tp * (op == "all_reduce" ? 2 : 1);
      };
      for (const auto& [key, st] : stats.Snapshot()) {
        if (key.first != "tp") continue;
        const double bytes = static_cast<double>(st.bytes) / a.steps;
        double expect = 0;
        for (const Want& w : want) {
          if (key.second == w.op) expect = (w.layer * L + w.ends) * act;
        }
        measured += bytes;
        analytic += expect;
        wire += bytes * ring(key.second);
        analytic_wire += expect * ring(key.second);
        seconds += st.seconds / a.steps;
        std::printf(
            "  tp %-14s %5.1f calls/step %8.2f MB/step (analytic %8.2f MB) "
            "%7.1f ms/step\n",
            key.second.c_str(), double(st.calls) / a.steps, bytes / 1e6,
            expect / 1e6, st.seconds / a.steps * 1e3);
      }
      std::printf(
          "  tp total %.2f MB/step = %.3f x analytic; sent per rank %.2f "
          "MB/step (analytic %.2f MB); %.1f ms/step in tp collectives (%.1f%% "
          "of the step)\n",
          measured / 1e6, measured / analytic, wire / 1e6, analytic_wire / 1e6,
          seconds * 1e3, 100 * seconds / (total / a.steps));
    }
    if (rank == 0) {
      // The engine's own buffers, and the estimate (equal to them, see
      // checkpoint_reshard_test) for the other layouts of this model.
      const ptrain::MemoryBytes mem = tr.memory();
      const int V = tr.data().vocab_size;
      std::printf(
          "  this rank: params %.2f MB, grads %.2f MB, optimizer %.2f MB, "
          "activations %.2f MB\n",
          Mb(mem.params), Mb(mem.grads), Mb(mem.optimizer),
          Mb(mem.activations));
      // Layouts this model cannot take (tp not dividing n_head, or
      // block_size under SP) are left out.
      auto estimate = [&](int t, bool sp,
                          const std::string& recompute =
                              "none") -> std::optional<ptrain::MemoryEstimate> {
        auto s = ptrain::LoadJobSpecFile("examples/shakespeare-char.yaml",
                                         Overrides(a, t, sp, recompute));
        if (!s.ok()) return std::nullopt;
        return ptrain::EstimateRankMemory(*s, V);
      };
      const ptrain::MemoryEstimate one = *estimate(1, false);
      const double one_pgo = one.params + one.grads + one.optimizer;
      std::printf(
          "  per rank (estimate), params+grads+Adam and activations (ratio to "
          "tp=1):\n");
      // What one microbatch keeps from forward to backward (the part that
      // grows with microbatches in flight), without the working set every
      // layout needs once.
      auto stash = [&](int t, bool with_sp, ptrain::Recompute r) {
        const ptrain::GptConfig c = tr.model().config();
        const int mb = spec->train().global_batch();
        ptrain::GptConfig ct = c;
        ct.padded_vocab = ptrain::PaddedVocab(c.vocab_size, t);
        return double(
            ptrain::GptStage::ActivationFloats(ct, mb, c.block_size, 1, t,
                                               with_sp, r, c.n_layer, true) -
            ptrain::GptStage::ActivationFloats(ct, mb, c.block_size, 0, t,
                                               with_sp, r, c.n_layer, true));
      };
      for (int t : {1, 2, 3, 4, 6}) {
        for (bool sp : {false, true}) {
          if (sp && t == 1) continue;
          const auto e = estimate(t, sp), nosp = estimate(t, false);
          if (!e || !nosp) continue;
          const double pgo = e->params + e->grads + e->optimizer;
          std::printf(
              "    tp=%d%-3s %7.2f MB (%.3fx)  activations %7.2f MB (%.3fx; "
              "%.3fx of tp=%d without sp; stash per microbatch %.3fx)\n",
              t, sp ? " sp" : "", pgo / 1e6, pgo / one_pgo, Mb(e->activations),
              double(e->activations) / one.activations,
              double(e->activations) / nosp->activations, t,
              stash(t, sp, ptrain::Recompute::kNone) /
                  stash(t, false, ptrain::Recompute::kNone));
        }
      }
      // With the blocks recomputed (train.recompute=full) a microbatch keeps
      // only each block's input, which SP shards along the sequence; the
      // recomputed block and the backward's working set are there once.
      // tp 2 and 4, each without and with SP.
      auto each_layout = [](auto&& print) {
        for (int t : {2, 4}) {
          for (bool sp : {false, true}) print(t, sp);
        }
      };
      std::printf(
          "  with train.recompute=full, activations per rank (ratio to the "
          "same tp without sp, and to tp=1 without recomputation):\n");
      each_layout([&](int t, bool sp) {
        const auto e = estimate(t, sp, "full"),
                   nosp = estimate(t, false, "full");
        if (!e || !nosp) return;
        std::printf(
            "    tp=%d%-3s activations %7.2f MB (%.3fx of tp=%d without sp; "
            "%.3fx of tp=1; stash per microbatch %.2f MB, %.3fx)\n",
            t, sp ? " sp" : "", Mb(e->activations),
            double(e->activations) / nosp->activations, t,
            double(e->activations) / one.activations,
            stash(t, sp, ptrain::Recompute::kFull) * 4 / 1e6,
            stash(t, sp, ptrain::Recompute::kFull) /
                stash(t, false, ptrain::Recompute::kFull));
      });
      // Megatron's pairing: sequence parallelism with selective
      // recomputation (attention's probabilities computed again), against
      // plain tensor parallelism that keeps everything.
      std::printf(
          "  with train.recompute=selective, activations per rank (ratio to "
          "the same tp without sp and without recomputation):\n");
      each_layout([&](int t, bool sp) {
        const auto e = estimate(t, sp, "selective"), plain = estimate(t, false);
        if (!e || !plain) return;
        std::printf(
            "    tp=%d%-3s activations %7.2f MB (%.3fx of tp=%d without sp "
            "or recomputation; stash per microbatch %.3fx)\n",
            t, sp ? " sp" : "", Mb(e->activations),
            double(e->activations) / plain->activations, t,
            stash(t, sp, ptrain::Recompute::kSelective) /
                stash(t, false, ptrain::Recompute::kNone));
      });
    }
  }
  MPI_Finalize();
  return 0;
}
