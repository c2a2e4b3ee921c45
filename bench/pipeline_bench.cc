// Pipeline parallelism under mpirun: tok/s, and per rank the time of each
// phase (forward, backward, bubble, optimizer) and of communication by group,
// printed as a table; each stage's bubble against the analytic
// (pp-1)/(m+pp-1). Prints figures and ratios; never passes or fails on time.
// bench/pipeline.sh runs the sweeps.
//
//   mpirun -n DP*TP*PP build/bench/pipeline_bench [--config S|M|names]
//          [--dp N] [--tp N] [--microbatches M]
//          [--schedule 1f1b|gpipe|interleaved|zb1p[,...]] [--virtual-stages V]
//          [--micro-batch B] [--layers L] [--zero Z] [--sp 0|1]
//          [--steps N] [--warmup N] [--first-stage-layers N]
//          [--last-stage-layers N] [--vocab V]
//
// --micro-batch fixes the sequences per microbatch (the global batch is then
// dp·m·B); without it the global batch is fixed (16 sequences, 8 for M) and
// more microbatches are smaller ones. --layers overrides the config's.
// --first/last-stage-layers set parallel.first/last_stage_layers. --vocab
// trains on random tokens of a V-word vocabulary (llm.c token files written
// under build/) instead of the text's characters: a larger head on the last
// stage.
//
// Several schedules (--schedule 1f1b,zb1p) train side by side in one run:
// one trainer each, their steps alternating, then each one's table and,
// against the first, the bubble and step ratios and whether every step's
// loss came out bit for bit the same.
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/configs.h"
#include "bench/mpi_trainer.h"
#include "worker/engine/data/data.h"
#include "worker/engine/parallel/schedule.h"

namespace {

std::vector<std::string> Split(const std::string& list) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

struct Args {
  std::string config = "S", schedule = "1f1b";
  int dp = 1, tp = 1, microbatches = 8, zero = 0, steps = 4, warmup = 1;
  int virtual_stages = 1, micro_batch = 0, layers = 0;
  int first_stage_layers = 0, last_stage_layers = 0, vocab = 0;
  bool sp = false;
};

void AddFlags(CLI::App& app, Args& a) {
  app.add_option("--config", a.config, "model: S, M or names")
      ->check(CLI::IsMember({"S", "M", "names"}));
  app.add_option("--schedule", a.schedule,
                 "1f1b, gpipe, interleaved or zb1p; several, comma-separated, "
                 "side by side")
      ->check([](const std::string& list) -> std::string {
        for (const std::string& s : Split(list)) {
          if (s != "1f1b" && s != "gpipe" && s != "interleaved" &&
              s != "zb1p") {
            return "--schedule: '" + s +
                   "' is not one of 1f1b, gpipe, interleaved, zb1p";
          }
        }
        return "";
      });
  const auto degree = CLI::Range(1, 1 << 16);
  app.add_option("--dp", a.dp, "data-parallel degree")->check(degree);
  app.add_option("--tp", a.tp, "tensor-parallel degree")->check(degree);
  app.add_option("--microbatches", a.microbatches, "microbatches per step")
      ->check(degree);
  app.add_option("--zero", a.zero, "ZeRO stage")->check(CLI::Range(0, 3));
  app.add_option("--sp", a.sp, "sequence parallelism: 0 or 1");
  app.add_option("--steps", a.steps, "measured steps")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", a.warmup, "steps before measuring")
      ->check(CLI::Range(0, 100000));
  app.add_option("--virtual-stages", a.virtual_stages,
                 "model chunks per pipeline rank (interleaved)")
      ->check(degree);
  app.add_option("--micro-batch", a.micro_batch,
                 "sequences per microbatch (0: fixed global batch)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--layers", a.layers, "model.n_layer (0: the config's)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--first-stage-layers", a.first_stage_layers,
                 "parallel.first_stage_layers")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--last-stage-layers", a.last_stage_layers,
                 "parallel.last_stage_layers")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--vocab", a.vocab,
                 "random tokens of this vocabulary (0: the text's characters)")
      ->check(CLI::Range(0, 65535));
}

// Per rank, summed over the measured steps.
enum Field {
  kStep,
  kForward,
  kBackward,
  kBubble,
  kWeight,
  kOptimizer,
  kDp,
  kTp,
  kPp,
  kEmbedding,
  kFields
};
const char* const kFieldNames[kFields] = {
    "step",      "forward", "backward", "bubble",  "(of it W)",
    "optimizer", "comm dp", "comm tp",  "comm pp", "comm emb"};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "pipeline_bench: pipeline-parallel training under mpirun -n DP*TP*PP: "
      "tok/s, per-rank phases and comm, the bubble against the analytic one"};
  AddFlags(app, a);
  CLI11_PARSE(app, argc, argv);
  const ptrain::MpiWorld mpi = ptrain::StartMpi(&argc, &argv);
  const int world = mpi.size, rank = mpi.rank;
  const int pp = world / (a.dp * a.tp);
  std::vector<std::string> o;
  if (a.config == "names") {
    // The names example: its own data and model.
    o = {"data.path=data/names.txt", "model.n_layer=4", "model.n_head=4",
         "model.n_embd=64", "model.block_size=16"};
  } else {
    o = ptrain::BenchModel(a.config);
  }
  // Enough sequences for every microbatch of every dp rank.
  const int batch = a.micro_batch > 0 ? a.dp * a.microbatches * a.micro_batch
                                      : std::max(a.config == "M" ? 8 : 16,
                                                 a.dp * a.microbatches);
  if (a.layers > 0) o.push_back("model.n_layer=" + std::to_string(a.layers));
  if (a.vocab > 0) {
    // Random tokens: the timing does not depend on what is learned.
    const std::string dir = "build/pipeline_bench_tokens";
    const std::string train =
                          dir + "/train_" + std::to_string(a.vocab) + ".bin",
                      val = dir + "/val_" + std::to_string(a.vocab) + ".bin";
    if (rank == 0) {
      std::filesystem::create_directories(dir);
      std::mt19937 rng(1);
      std::vector<uint16_t> tokens(1 << 18);
      for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng() % a.vocab);
      for (const std::string& path : {train, val}) {
        const absl::Status s = ptrain::WriteTokenFile(path, tokens);
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          MPI_Abort(MPI_COMM_WORLD, 2);
        }
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (const std::string& s :
         {std::string("data.path=''"), "data.train_bin=" + train,
          "data.val_bin=" + val,
          "model.vocab_size=" + std::to_string(a.vocab)}) {
      o.push_back(s);
    }
  }
  for (const std::string& s :
       {"train.global_batch=" + std::to_string(batch),
        "parallel.dp=" + std::to_string(a.dp),
        "parallel.tp=" + std::to_string(a.tp),
        "parallel.pp=" + std::to_string(pp),
        "parallel.zero=" + std::to_string(a.zero),
        "parallel.microbatches=" + std::to_string(a.microbatches),
        "parallel.first_stage_layers=" + std::to_string(a.first_stage_layers),
        "parallel.last_stage_layers=" + std::to_string(a.last_stage_layers),
        std::string("parallel.sequence_parallel=") + (a.sp ? "true" : "false"),
        "train.steps=" + std::to_string(a.warmup + a.steps)}) {
    o.push_back(s);
  }
  {
    // One trainer per schedule (virtual stages for interleaving only), their
    // steps alternating: the same machine state for each.
    struct Run {
      std::string schedule;
      int v = 1;
      ptrain::MpiTrainer run;
      double mine[kFields] = {};
      std::vector<float> losses;
    };
    std::vector<Run> runs;
    for (const std::string& schedule : Split(a.schedule)) {
      Run& r = runs.emplace_back();
      r.schedule = schedule;
      r.v = schedule == "interleaved" ? a.virtual_stages : 1;
      std::vector<std::string> with = o;
      with.push_back("parallel.schedule=" + schedule);
      with.push_back("parallel.virtual_stages=" + std::to_string(r.v));
      r.run = ptrain::MakeMpiTrainer(with);
    }
    for (int s = 0; s < a.warmup; ++s) {
      for (Run& r : runs) r.losses.push_back(r.run.trainer->TrainStep(s).loss);
    }
    for (Run& r : runs) r.run.dims->comm_stats()->Reset();
    for (int s = a.warmup; s < a.warmup + a.steps; ++s) {
      for (Run& run : runs) {
        const ptrain::StepResult r = run.run.trainer->TrainStep(s);
        run.losses.push_back(r.loss);
        double* mine = run.mine;
        mine[kStep] += r.seconds;
        mine[kForward] += r.phases.forward;
        mine[kBackward] += r.phases.backward;
        mine[kBubble] += r.phases.bubble;
        mine[kWeight] += r.phases.weight;
        mine[kOptimizer] += r.phases.optimizer;
      }
    }
    // Per schedule: rank 0's step and the mean measured and simulated
    // bubble fractions.
    struct Figures {
      double step = 0, bubble = 0, simulated = 0;
      double activations = 0;  // bytes, the rank that holds the most
    };
    std::vector<Figures> figures;
    for (Run& run : runs) {
      double* mine = run.mine;
      const std::map<std::string, Field> groups = {
          {"dp", kDp}, {"tp", kTp}, {"pp", kPp}, {"embedding", kEmbedding}};
      for (const auto& [key, st] : run.run.dims->comm_stats()->Snapshot()) {
        auto g = groups.find(key.first);
        if (g != groups.end()) mine[g->second] += st.seconds;
      }
      std::vector<double> all(static_cast<size_t>(world) * kFields);
      MPI_Gather(mine, kFields, MPI_DOUBLE, all.data(), kFields, MPI_DOUBLE, 0,
                 MPI_COMM_WORLD);
      // Each rank's activation buffers (every slot and the working set).
      const double acts =
          static_cast<double>(run.run.trainer->memory().activations);
      std::vector<double> all_acts(world);
      MPI_Gather(&acts, 1, MPI_DOUBLE, all_acts.data(), 1, MPI_DOUBLE, 0,
                 MPI_COMM_WORLD);
      if (rank != 0) continue;
      const auto& tr = *run.run.trainer;
      const auto& spec = run.run.spec;
      Figures& fig = figures.emplace_back();
      const double step = all[kStep] / a.steps;  // rank 0's, as logged
      fig.step = step;
      const double tokens =
          static_cast<double>(batch) * spec.model().block_size();
      std::printf(
          "config %s, dp=%d tp=%d pp=%d%s zero=%d, %s, v=%d, %d microbatches "
          "of %d, %d thread(s)/rank: %.1f ms/step, %.0f tok/s\n",
          a.config.c_str(), a.dp, a.tp, pp, a.sp ? " sp" : "", a.zero,
          run.schedule.c_str(), run.v, a.microbatches,
          batch / (a.dp * a.microbatches), omp_get_max_threads(), step * 1e3,
          tokens / step);
      if (pp > 1) {
        const std::vector<int> layers = *ptrain::PipelineStageLayers(
            spec.parallel(), spec.model().n_layer());
        std::printf("  layers per stage");
        for (size_t i = 0; i < layers.size(); ++i) {
          std::printf("%s%d", i ? "/" : " ", layers[i]);
        }
        std::printf(", vocabulary %d\n", tr.data().vocab_size);
      }
      std::printf("  rank stage");
      for (int f = 0; f < kFields; ++f) std::printf(" %10s", kFieldNames[f]);
      std::printf("   (ms/step)  bubble/step\n");
      const int per_stage = a.dp * a.tp;
      std::vector<double> stage_bubble(pp, 0.0);
      // Each stage's forward, backward (B where the schedule splits it) and
      // W of one microbatch, as measured.
      std::vector<double> stage_f(pp, 0.0), stage_b(pp, 0.0), stage_w(pp, 0.0);
      for (int r = 0; r < world; ++r) {
        const double* v = all.data() + static_cast<size_t>(r) * kFields;
        std::printf("  %4d %5d", r, r / per_stage);
        for (int f = 0; f < kFields; ++f) {
          std::printf(" %10.1f", v[f] / a.steps * 1e3);
        }
        const double frac = v[kBubble] / v[kStep];
        std::printf("   %10.3f\n", frac);
        stage_bubble[r / per_stage] += frac / per_stage;
        const double per_pass = 1.0 / (per_stage * a.steps * a.microbatches);
        stage_f[r / per_stage] += v[kForward] * per_pass;
        stage_b[r / per_stage] += (v[kBackward] - v[kWeight]) * per_pass;
        stage_w[r / per_stage] += v[kWeight] * per_pass;
      }
      std::printf("  activations per rank (MB):");
      for (int r = 0; r < world; ++r) {
        std::printf("%s%.2f", r ? "/" : " ", all_acts[r] / 1e6);
        fig.activations = std::max(fig.activations, all_acts[r]);
      }
      std::printf("\n");
      double mean = 0;
      for (double b : stage_bubble) mean += b / pp;
      fig.bubble = mean;
      // Interleaving divides the fill and drain by v: (pp-1)/(v·m+pp-1).
      const double analytic =
          ptrain::AnalyticBubble(pp, run.v * a.microbatches);
      std::printf(
          "  bubble: measured %.3f of the step (mean over stages; first %.3f, "
          "last %.3f), analytic (pp-1)/(%sm+pp-1) = %.3f, ratio %.2f\n",
          mean, stage_bubble.front(), stage_bubble.back(),
          run.v > 1 ? "v·" : "", analytic,
          analytic > 0 ? mean / analytic : 0.0);
      // The textbook assumes equal stages; the schedule simulated with each
      // stage's measured pass times is what this split can reach.
      const ptrain::ScheduleKind kind = ptrain::ScheduleKindOf(run.schedule);
      if (pp > 1) {
        std::vector<std::vector<ptrain::PipeAction>> orders;
        for (int r = 0; r < pp; ++r) {
          orders.push_back(
              ptrain::PipelineOrder(kind, pp, r, a.microbatches, run.v));
        }
        const double sim =
            ptrain::SimulateOrders(orders, run.v, stage_f, stage_b, stage_w)
                .bubble_fraction();
        fig.simulated = sim;
        auto per_stage_ms = [&](const std::vector<double>& t) {
          std::string out;
          for (int st = 0; st < pp; ++st) {
            char b[32];
            std::snprintf(b, sizeof b, "%s%.2f", st ? "/" : "", t[st] * 1e3);
            out += b;
          }
          return out;
        };
        std::printf(
            "  bubble simulated from the stages' measured pass times "
            "(forward %s, backward %s%s%s ms per microbatch): %.3f, "
            "measured/simulated %.2f\n",
            per_stage_ms(stage_f).c_str(), per_stage_ms(stage_b).c_str(),
            kind == ptrain::ScheduleKind::kZeroBubble ? ", of it W " : "",
            kind == ptrain::ScheduleKind::kZeroBubble
                ? per_stage_ms(stage_w).c_str()
                : "",
            sim, sim > 0 ? mean / sim : 0.0);
      }
    }
    // Each schedule against the first, which ran the same steps beside it.
    if (rank == 0) {
      for (size_t i = 1; i < runs.size(); ++i) {
        const bool same =
            runs[i].losses.size() == runs[0].losses.size() &&
            std::memcmp(runs[i].losses.data(), runs[0].losses.data(),
                        runs[0].losses.size() * sizeof(float)) == 0;
        std::printf(
            "%s against %s, side by side: bubble %.3f vs %.3f (ratio %.2f), "
            "step %.1f vs %.1f ms (ratio %.2f), most activations on a rank "
            "%.2f vs %.2f MB (ratio %.2f), losses of all %zu steps %s\n",
            runs[i].schedule.c_str(), runs[0].schedule.c_str(),
            figures[i].bubble, figures[0].bubble,
            figures[0].bubble > 0 ? figures[i].bubble / figures[0].bubble : 0.0,
            figures[i].step * 1e3, figures[0].step * 1e3,
            figures[0].step > 0 ? figures[i].step / figures[0].step : 0.0,
            figures[i].activations / 1e6, figures[0].activations / 1e6,
            figures[0].activations > 0
                ? figures[i].activations / figures[0].activations
                : 0.0,
            runs[0].losses.size(), same ? "bit-identical" : "DIFFERENT");
      }
    }
  }
  MPI_Finalize();
  return 0;
}
