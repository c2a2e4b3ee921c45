// The device a rank trains on, checked before anything is built: its GPU
// where resources.device is cuda (the one ptcoord chose, else the node's
// GPUs in turn), whether the job's precision runs there, and the GPU memory
// its estimate must fit.
#ifndef PTRAIN_WORKER_ENGINE_TRAIN_RANK_DEVICE_H_
#define PTRAIN_WORKER_ENGINE_TRAIN_RANK_DEVICE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ptrain/v1/job.pb.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/train/train_options.h"

namespace ptrain {

// The GPU of this rank where resources.device is cuda, else -1;
// InvalidArgument when the device is neither or the node's GPUs do not do.
absl::StatusOr<int> RankGpu(const v1::JobSpec& spec, const ParallelDims& dims);

// InvalidArgument where the job's precision cannot run here: bf16 on a CPU
// without AVX512_BF16, or on a GPU (`gpu`; -1 on the cpu) without bf16
// tensor cores.
absl::Status CheckPrecision(const v1::JobSpec& spec, int gpu);

// The memory of the rank's own GPU (`gpu`; -1 on the cpu) its estimate is
// checked against: 0 (no check) on the cpu and where ranks share a GPU.
int64_t RankGpuBytes(const TrainerOptions& options, const ParallelDims& dims,
                     int gpu);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_TRAIN_RANK_DEVICE_H_
