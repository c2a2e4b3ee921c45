// The MPI benchmarks' common start: MPI, a job spec from the example and
// overrides, the rank layout over MPI_COMM_WORLD, and a quiet trainer. Any
// failure prints its error (rank 0) and ends every rank with exit 2.
#ifndef PTRAIN_BENCH_MPI_TRAINER_H_
#define PTRAIN_BENCH_MPI_TRAINER_H_

#include <mpi.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/spec.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {

// MPI started for a benchmark: the world's size and this rank.
struct MpiWorld {
  int size = 1, rank = 0;
};
inline MpiWorld StartMpi(int* argc, char*** argv) {
  MPI_Init(argc, argv);
  MpiWorld w;
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  return w;
}

struct MpiTrainer {
  v1::JobSpec spec;
  std::unique_ptr<ParallelDims> dims;
  std::unique_ptr<Trainer> trainer;
};

inline MpiTrainer MakeMpiTrainer(const std::vector<std::string>& overrides) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto fail = [&](const absl::Status& s) {
    if (rank == 0) std::fprintf(stderr, "%s\n", s.ToString().c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  };
  MpiTrainer t;
  auto spec = LoadJobSpecFile("examples/shakespeare-char.yaml", overrides);
  if (!spec.ok()) fail(spec.status());
  t.spec = *spec;
  auto dims = ParallelDims::Create(t.spec.parallel(), MPI_COMM_WORLD);
  if (!dims.ok()) fail(dims.status());
  t.dims = std::move(*dims);
  TrainerOptions opt;
  opt.peak_flops = 1e12;
  opt.quiet = true;
  auto trainer = Trainer::Create(t.spec, opt, t.dims.get());
  if (!trainer.ok()) fail(trainer.status());
  t.trainer = std::move(*trainer);
  return t;
}

// A benchmark's measured steps: `warmup` steps, the communication counters
// reset, then `steps` more: their mean seconds and the last one's loss.
struct MeasuredSteps {
  double mean = 0;
  float loss = 0;
};
inline MeasuredSteps MeasureSteps(MpiTrainer& run, int warmup, int steps) {
  for (int s = 0; s < warmup; ++s) run.trainer->TrainStep(s);
  run.dims->comm_stats()->Reset();
  MeasuredSteps m;
  double total = 0;
  for (int s = warmup; s < warmup + steps; ++s) {
    const StepResult r = run.trainer->TrainStep(s);
    total += r.seconds;
    m.loss = r.loss;
  }
  m.mean = total / steps;
  return m;
}

}  // namespace ptrain

#endif  // PTRAIN_BENCH_MPI_TRAINER_H_
