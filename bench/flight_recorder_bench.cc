// What the flight recorder costs a training step (docs/diagnose.md): config
// S under mpirun, the recorder on (2048 entries) and off in alternated
// rounds on the same ranks, the median step of each and their ratio; and
// one recorded call alone. Prints figures and ratios; never passes or fails
// on time.
//
//   mpirun -n 4 build/bench/flight_recorder_bench [--tp 2] [--pp 2]
//          [--rounds R] [--steps N]
#include <mpi.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/configs.h"
#include "bench/mpi_trainer.h"
#include "bench/stats.h"
#include "worker/engine/comm/flight_recorder.h"

namespace {

struct Args {
  int tp = 2, pp = 2, rounds = 6, steps = 10;
};

// Nanoseconds one call costs the recorder (issued and completed), alone.
double NanosPerCall() {
  ptrain::FlightRecorder r;
  constexpr int kCalls = 200000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) {
    r.Completed(r.Issued("tp", ptrain::CommOp::kAllReduce, 4096));
  }
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now() - t0)
             .count() /
         kCalls;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "flight_recorder_bench: config S training steps with the flight "
      "recorder on and off, alternated; the cost of one recorded call"};
  app.add_option("--tp", a.tp, "tensor-parallel degree")
      ->check(CLI::Range(1, 64));
  app.add_option("--pp", a.pp, "pipeline stages")->check(CLI::Range(1, 64));
  app.add_option("--rounds", a.rounds, "on/off rounds")
      ->check(CLI::Range(1, 1000));
  app.add_option("--steps", a.steps, "steps per round and setting")
      ->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  const ptrain::MpiWorld mpi = ptrain::StartMpi(&argc, &argv);
  const int dp = mpi.size / (a.tp * a.pp);
  if (dp < 1 || dp * a.tp * a.pp != mpi.size) {
    if (mpi.rank == 0) {
      std::fprintf(stderr, "%d ranks is not a multiple of tp %d x pp %d\n",
                   mpi.size, a.tp, a.pp);
    }
    MPI_Finalize();
    return 2;
  }
  std::vector<std::string> overrides = ptrain::BenchModel("S");
  for (const std::string& s :
       {std::string("train.global_batch=16"),
        "parallel.dp=" + std::to_string(dp),
        "parallel.tp=" + std::to_string(a.tp),
        "parallel.pp=" + std::to_string(a.pp),
        std::string("parallel.microbatches=4"),
        "train.steps=" + std::to_string(2 + 2 * a.rounds * a.steps)}) {
    overrides.push_back(s);
  }
  {
    ptrain::MpiTrainer run = ptrain::MakeMpiTrainer(overrides);
    ptrain::Trainer& tr = *run.trainer;
    ptrain::FlightRecorder& recorder = *run.dims->flight_recorder();
    int64_t step = 0;
    for (; step < 2; ++step) tr.TrainStep(step);  // warm-up
    std::vector<double> on, off;
    uint64_t recorded = 0;
    for (int round = 0; round < a.rounds; ++round) {
      // Alternated, and the order swapped every round: drift in the
      // machine's speed falls on both alike.
      for (const bool with : {round % 2 == 0, round % 2 != 0}) {
        recorder.SetCapacity(with ? ptrain::FlightRecorder::kDefaultCapacity
                                  : 0);
        const uint64_t before = recorder.recorded();
        for (int s = 0; s < a.steps; ++s) {
          const double seconds = tr.TrainStep(step++).seconds;
          (with ? on : off).push_back(seconds);
        }
        if (with) recorded += recorder.recorded() - before;
      }
    }
    const double nanos = NanosPerCall();
    if (mpi.rank == 0) {
      const double m_on = ptrain::Median(on), m_off = ptrain::Median(off);
      const double per_step =
          static_cast<double>(recorded) / (a.rounds * a.steps);
      std::printf(
          "config S, dp=%d tp=%d pp=%d, %d thread(s)/rank, %d rounds of %d "
          "steps each way\n",
          dp, a.tp, a.pp, omp_get_max_threads(), a.rounds, a.steps);
      std::printf("  recorder off: %.3f ms/step (median)\n", m_off * 1e3);
      std::printf("  recorder on:  %.3f ms/step (median), %.0f entries/step\n",
                  m_on * 1e3, per_step);
      std::printf("  on/off: %.4f (%+.2f%%)\n", m_on / m_off,
                  100.0 * (m_on / m_off - 1.0));
      std::printf(
          "  one recorded call: %.0f ns; x entries/step = %.4f ms/step = "
          "%.3f%% of the step\n",
          nanos, nanos * per_step / 1e6,
          100.0 * nanos * per_step / 1e9 / m_off);
    }
  }
  MPI_Finalize();
  return 0;
}
