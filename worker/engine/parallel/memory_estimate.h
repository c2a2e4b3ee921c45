// What one rank of a job allocates for its model, before it allocates it:
// parameters, gradients, Adam moments, saved activations and the copy a
// background checkpoint writes from, computed from
// the same plan and by the same size functions the engine allocates with
// (BuildPlan, ZeroStore::Measure, GptStage::ActivationFloats) over the same
// RankBuild the Trainer builds its rank from. So ptworker
// can refuse a job that cannot fit with a clear error instead of dying in
// the allocator. Not the data tokens, not the run's small buffers (inputs,
// sampling).
#ifndef PTRAIN_WORKER_ENGINE_PARALLEL_MEMORY_ESTIMATE_H_
#define PTRAIN_WORKER_ENGINE_PARALLEL_MEMORY_ESTIMATE_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "ptrain/v1/job.pb.h"
#include "worker/engine/model/plan.h"
#include "worker/engine/parallel/rank_build.h"
#include "worker/engine/parallel/zero_store.h"

namespace ptrain {

// Bytes per rank; a value that does not fit in int64 is INT64_MAX.
struct MemoryEstimate {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0;
  // checkpoint.async_save with checkpoints on: the host copy of the state
  // a background save writes from (the rank's weights and both moments).
  int64_t checkpoint = 0;
  // Where the parts are: a GPU job (resources.device=cuda) keeps weights,
  // gradients, activations and, unless offloaded (parallel.offload), the
  // optimizer on its GPU; the rest is host memory. A CPU job's is all host.
  bool gpu = false;
  bool offload = false;
  int64_t total() const;   // saturating sum
  int64_t host() const;    // the parts in host memory
  int64_t device() const;  // the parts on the rank's GPU (0 on the CPU)
};

// The rank `build` describes; `async_copy`: checkpoint.async_save with
// checkpoints on.
MemoryEstimate EstimateRankMemory(const RankBuild& build, bool async_copy);
// The same with the rank's parameter footprint already measured
// (ZeroStore::Measure of its plan): the layout planner measures each
// stage's once for the layouts that share it.
MemoryEstimate EstimateRankMemory(const RankBuild& build, bool async_copy,
                                  const ZeroStore::Footprint& footprint);

// Whether the ranks of `spec` keep a copy of their state to checkpoint
// from (checkpoint.async_save with checkpoints on): EstimateRankMemory's
// `async_copy`.
bool AsyncCheckpointCopy(const v1::JobSpec& spec);

// The pipeline stages one of whose ranks needs the most of a pipeline of
// `pp`: ranks differ in their tensors (the first embeds, the last holds
// the head) and in microbatches in flight (fewer further down a pipeline),
// so the first, the second (the fullest of the middle ones) and the last
// (repeated where pp < 3).
std::array<int, 3> FullestStageCandidates(int pp);

// A rank of pipeline stage `stage` of a validated spec (every rank of a
// stage needs the same: its tp, cp and dp peers hold equal parts).
MemoryEstimate EstimateStageMemory(const v1::JobSpec& spec, int vocab_size,
                                   int stage);

// The rank of a validated spec (its bounds keep the plan's sizes in int64)
// that needs the most.
MemoryEstimate EstimateRankMemory(const v1::JobSpec& spec, int vocab_size);

// MemAvailable from /proc/meminfo, else the physical memory; 0 if unknown.
int64_t AvailableMemoryBytes();

// e in words: each part in the memory that holds it and the totals
// ("host: params 1.2 MB, ... = 5.0 MB; GPU: ..."), for a dry run.
std::string DescribeMemory(const MemoryEstimate& e);

// ResourceExhausted when `ranks_on_node` ranks of this estimate need more
// host memory than `available_bytes` (0: unknown, no check), or, for a GPU
// job, one rank needs more than `gpu_bytes` (its GPU's memory; 0: unknown,
// no check). The message names every spec field that sizes the estimate,
// the bytes of each part and what is available, and says when
// train.recompute=full or parallel.offload=optimizer would fit.
absl::Status CheckMemoryFits(const v1::JobSpec& spec, int vocab_size,
                             int ranks_on_node, int64_t available_bytes,
                             int64_t gpu_bytes = 0);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_PARALLEL_MEMORY_ESTIMATE_H_
