// What a rank puts into a checkpoint and takes back: the weights and both
// Adam moments of its 1/dp share of every unit (ZeroStore's shard
// stretches, whatever the ZeRO stage), as global boxes; it takes back what
// it updates (everything at zero 0, its shard after) — so a checkpoint written
// by any layout (dp, tp, ZeRO stage) loads on any other. Not the file format
// (checkpoint.h), not the decision when to save (the trainer).
#ifndef PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_STATE_H_
#define PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_STATE_H_

#include <vector>

#include "absl/status/status.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/parallel/optimizer.h"
#include "worker/engine/parallel/zero_store.h"

namespace ptrain {

// Weights first, then every first moment, then every second moment: a
// reader that needs a stretch of every tensor finds each kind contiguous.
// Tensors replicated over tp are written only when `write_tp_replicated`
// (tp rank 0), so that every element is written once. The runs point into
// `store` and `adam`, valid until they change — or, where they live in a
// GPU's memory, into `host`, which receives a copy of the three (and must
// outlive the runs).
std::vector<ShardRun> CheckpointRuns(ZeroStore& store, AdamW& adam,
                                     bool write_tp_replicated,
                                     std::vector<float>* host);

// Fills what this rank updates (weights, and Adam moments when
// with_optimizer) from `source`, reading only those boxes. Not collective:
// once every rank has succeeded the caller makes replicated weights whole
// (ZeroStore::GatherUpdatedParams).
absl::Status LoadState(ZeroStore& store, AdamW& adam, TensorSource& source,
                       bool with_optimizer);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_STATE_H_
