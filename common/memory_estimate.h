// What one rank of a job allocates for its model, before it allocates it:
// parameters, gradients, Adam moments and saved activations, laid out as the
// CPU engine lays them out (GptParamLayout units padded to parallel.dp, the
// ZeRO stage's buffers, Gpt's activation buffer). A pure function of the
// JobSpec, so ptworker can refuse a job that cannot fit with a clear error
// instead of dying in the allocator. Not the data tokens, not the run's
// small buffers (inputs, sampling).
#ifndef PTRAIN_COMMON_MEMORY_ESTIMATE_H_
#define PTRAIN_COMMON_MEMORY_ESTIMATE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

// Bytes per rank; a value that does not fit in int64 is INT64_MAX.
struct MemoryEstimate {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0;
  int64_t total() const;  // saturating sum
};

// `vocab_size` is the vocabulary the model is built with: model.vocab_size,
// or the data's when that is 0. Only tp = pp = 1 layouts exist today.
MemoryEstimate EstimateRankMemory(const v1::JobSpec& spec, int64_t vocab_size);

// MemAvailable from /proc/meminfo, else the physical memory; 0 if unknown.
int64_t AvailableMemoryBytes();

// ResourceExhausted when `ranks_on_node` ranks of this estimate need more
// than `available_bytes` (0: unknown, no check). The message names every
// spec field that sizes the estimate, the bytes of each part and what is
// available.
absl::Status CheckMemoryFits(const v1::JobSpec& spec, int64_t vocab_size,
                             int ranks_on_node, int64_t available_bytes);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_MEMORY_ESTIMATE_H_
