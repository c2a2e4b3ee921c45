// RankBuild: everything one rank derives from a validated job spec and its
// place in the mesh, resolved once: the model's dimensions, the batch split
// into microbatches, ZeRO's options, this rank's plan (its stages, tensor
// slices and units), the schedule and each chunk's activation slots, what
// is recomputed, the device and the precision (`auto` resolved). The
// Trainer builds the rank from it and the memory estimate sizes the same
// rank from it, so the two cannot drift apart.
#ifndef PTRAIN_WORKER_ENGINE_PARALLEL_RANK_BUILD_H_
#define PTRAIN_WORKER_ENGINE_PARALLEL_RANK_BUILD_H_

#include <vector>

#include "common/spec.h"
#include "ptrain/v1/job.pb.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/plan.h"
#include "worker/engine/parallel/zero_store.h"

namespace ptrain {

struct RankBuild {
  GptConfig model;  // padded_vocab set for the tp degree
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;
  int T = 1;             // sequence length (model.block_size)
  int global_batch = 1;  // sequences per optimizer step, over all of dp
  int micro_B = 1;       // sequences per microbatch on one dp rank
  int microbatches = 1;  // per optimizer step
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int ep = 1;  // the ranks of dp × cp each MoE layer's experts split over
  int virtual_stages = 1;  // model chunks per pipeline rank
  bool sequence_parallel = false;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  Recompute recompute = Recompute::kNone;
  ZeroOptions zero;
  // parallel.offload=optimizer: Adam's state and the fp32 master weights
  // this rank updates in host memory, the step on the CPU cores.
  bool offload_optimizer = false;
  PlanOptions plan;         // this rank's
  std::vector<int> stages;  // the virtual stage of each of its chunks
  std::vector<int> slots;   // the activation slots of each chunk
  int chunks() const { return static_cast<int>(stages.size()); }
  // The positions of each sequence this rank holds: T/cp (zigzag).
  int T_local() const { return T / cp; }
  // The ranks holding the same weights, over which gradients are summed
  // and ZeRO shards: dp × cp.
  int replicas() const { return dp * cp; }
  // The ranks holding the same routed experts, over which their gradients
  // are summed and ZeRO shards them.
  int expert_replicas() const { return replicas() / ep; }
  int n_stages() const { return pp * virtual_stages; }
  bool last_stage(int chunk) const { return stages[chunk] == n_stages() - 1; }

  // The rank at (tp_rank, pp_rank) of a validated spec's mesh, for a
  // vocabulary of `vocab_size` (model.vocab_size, or the data's when that
  // is 0).
  static RankBuild Of(const v1::JobSpec& spec, int vocab_size, int tp_rank,
                      int pp_rank, int ep_rank = 0);

  // Chunk c's stage options as far as the build decides them (the caller
  // adds the tensor-parallel group, the store and the backend).
  StageOptions Stage(int chunk) const;
};

// The model of a spec: its dimensions, `vocab_size` (model.vocab_size, or
// the data's when that is 0) and the vocabulary padded for parallel.tp.
GptConfig ModelConfig(const v1::JobSpec& spec, int vocab_size);

// The plan options of the rank at (tp_rank, pp_rank) of a validated spec's
// mesh: degrees, ZeRO padding (over dp × cp), virtual stages and each
// stage's layers.
PlanOptions SpecPlan(const v1::JobSpec& spec, int tp_rank, int pp_rank,
                     int ep_rank = 0);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_PARALLEL_RANK_BUILD_H_
