// This machine's matrix-multiply peak, measured with the library the engine
// uses, as the denominator of MFU (model FLOPs utilisation).
#ifndef PTRAIN_WORKER_ENGINE_MODEL_FLOPS_H_
#define PTRAIN_WORKER_ENGINE_MODEL_FLOPS_H_

#include <string>

#include "kernels/ops.h"

namespace ptrain {

// FLOP/s of the best of `reps` single-precision n×n×n GEMMs on the current
// OpenMP thread count.
double MeasureSgemmPeakFlops(int n = 1024, int reps = 8);

// FLOP/s of the best of `reps` n×n×n matmuls of a GPU backend, in its
// compute precision (fp32, or bf16 tensor cores), timed to completion.
double MeasureMatmulPeakFlops(kernels::Ops& ops, int n = 4096, int reps = 5);

// A measurement on a loaded machine is low (65 to 495 GFLOP/s seen on one
// shared machine, which made MFU read 209%), and a peak is never higher
// than the machine can do. So each measurement is kept per machine in a
// cache file, and the best one stands: the larger of `measured` and the
// best kept for `key`, which is written back when `measured` beats it.
// Unreadable or damaged cache: `measured` (and the file is rewritten); ""
// for `cache_path`: no cache. Best effort, never an error.
double BestPeakFlops(double measured, const std::string& key,
                     const std::string& cache_path);

// What a measurement is comparable under: this host, its CPU model, `what`
// is measured (the backend: kernels::Ops::name(), which names a GPU's
// model) and the thread count. A change of any of them starts afresh;
// deleting the file forgets every peak.
std::string PeakCacheKey(const std::string& what, int threads);

// $XDG_CACHE_HOME/ptrain/matmul-peak.json, else
// $HOME/.cache/ptrain/matmul-peak.json, else "" (no cache).
std::string PeakCachePath();

// An MFU above 1 means the peak it divides by is too low: the warning to
// print once, naming the peak per rank and where it came from (`measured`,
// else --peak-gflops); "" for an MFU of at most 1.
std::string MfuAbovePeakWarning(double mfu, double peak_flops, bool measured);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_FLOPS_H_
