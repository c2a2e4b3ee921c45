// This machine's matrix-multiply peak, measured with the library the engine
// uses, as the denominator of MFU (model FLOPs utilisation).
#ifndef PTRAIN_WORKER_ENGINE_FLOPS_H_
#define PTRAIN_WORKER_ENGINE_FLOPS_H_

#include "kernels/ops.h"

namespace ptrain {

// FLOP/s of the best of `reps` single-precision n×n×n GEMMs on the current
// OpenMP thread count.
double MeasureSgemmPeakFlops(int n = 1024, int reps = 8);

// FLOP/s of the best of `reps` n×n×n matmuls of a GPU backend, in its
// compute precision (fp32, or bf16 tensor cores), timed to completion.
double MeasureMatmulPeakFlops(kernels::Ops& ops, int n = 4096, int reps = 5);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_FLOPS_H_
