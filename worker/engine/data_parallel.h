// Data parallelism and ZeRO over the dp group, as the UnitStore of a Gpt.
//
//   zero 0  replicated weights, gradients and Adam moments; gradients
//           all-reduced in buckets of parallel.bucket_bytes, each bucket
//           started as soon as its units' gradients are final in backward.
//   zero 1  Adam moments sharded: gradients reduce-scattered per unit as
//           backward finishes it, each rank updates its shard, weights
//           all-gathered.
//   zero 2  also gradients: a unit's gradients live in a scratch buffer only
//           until reduce-scattered (every microbatch) into the rank's shard.
//   zero 3  also weights (FSDP): a unit's weights are all-gathered before its
//           forward and again before its backward, and dropped after use.
//
// Units (gpt.h: embeddings, four per block, ln_f) are each padded to a
// multiple of dp and sharded evenly: rank r owns the r-th 1/dp of every unit.
// Not thread-safe; one instance per rank.
#ifndef PTRAIN_WORKER_ENGINE_DATA_PARALLEL_H_
#define PTRAIN_WORKER_ENGINE_DATA_PARALLEL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ptrain/v1/job.pb.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/comm.h"
#include "worker/engine/gpt.h"
#include "worker/engine/optimizer.h"

namespace ptrain {

struct UpdateResult {
  double grad_norm = 0.0;  // global, before clipping
};

class DataParallel : public UnitStore {
 public:
  // dp_group may be null when dp == 1 (nothing to communicate).
  DataParallel(const GptConfig& config, const v1::JobSpec& spec,
               Communicator* dp_group);
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int pad() const { return dp_; }  // the Gpt must use GptParamLayout(.., dp)

  // Every rank initialises exactly what it holds, from (seed, name, index).
  void InitParams(uint64_t seed);

  // Before the first microbatch of a step.
  void BeginStep();
  // Before each microbatch's forward; reductions of a replicated gradient
  // (zero 0, 1) are issued only in the last microbatch's backward.
  void BeginMicrobatch(bool last) { last_microbatch_ = last; }
  // After the last backward: waits for every reduction still in flight.
  void FinishGradients();
  // Global-norm clipping (each element counted once) and AdamW on this
  // rank's part, then weights made whole again where they are replicated.
  UpdateResult Update(float lr);

  // Bytes this rank holds: params (incl. gathered copies), grads (incl.
  // scratch), optimizer. Activations belong to the model.
  MemoryBytes memory() const;
  // Seconds FinishGradients spent blocked: the reduction time not hidden
  // behind backward.
  double exposed_seconds() const { return exposed_seconds_; }

  // Gathers the whole weight vector (padded layout) on every rank.
  std::vector<float> FullParams();

  // What this rank writes into a checkpoint: its 1/dp slice of every unit,
  // weights and both Adam moments, whatever the ZeRO stage (so that every
  // rank writes an equal share).
  std::vector<ShardRun> CheckpointRuns() const;
  // Fills what this rank holds (weights, and Adam moments when
  // with_optimizer) from `source`, reading only those slices.
  absl::Status LoadState(TensorSource& source, bool with_optimizer);
  int64_t optimizer_step() const { return optimizer_->steps_taken(); }
  void set_optimizer_step(int64_t t) { optimizer_->set_steps_taken(t); }
  const std::vector<ParamInfo>& layout() const { return layout_; }

  // UnitStore.
  const float* Params(int u) override;
  float* Grads(int u) override;
  void BeginForward(int u) override;
  void BeginBackward(int u) override;
  void EndBackward(int u) override;
  void Poll() override;

 private:
  struct Pending {
    std::unique_ptr<CommHandle> handle;
    int unit = -1;  // zero >= 2: the unit whose scratch is being reduced
    int slot = -1;  // its scratch slot
  };
  bool sharded_grads() const { return zero_ >= 2; }
  int64_t ShardSize(int u) const { return units_[u].size / dp_; }
  // First element of this rank's shard of unit u in the full buffer.
  int64_t ShardBegin(int u) const {
    return units_[u].begin + dp_rank_ * ShardSize(u);
  }
  void Complete(Pending& p);  // after the handle finished
  // Calls fn(param, global_lo, global_hi, local) for every stretch of a
  // tensor that this rank's shard holds: unit slices [ShardBegin(u), +size)
  // cut at tensor boundaries; `local` indexes the shard buffers.
  template <typename Fn>
  void ForEachShardStretch(Fn fn) const;
  void Gather(int u, float* dst);
  int SlotFor(int u) const;

  const int dp_, dp_rank_, zero_;
  const int n_units_;
  const int64_t bucket_bytes_;
  const double clip_;
  const bool reduce_into_shard_;  // zero 2-3 with a single microbatch
  Communicator* comm_;
  std::vector<ParamInfo> layout_;
  std::vector<UnitRange> units_;
  std::vector<int64_t> shard_offset_;  // unit -> offset in the shard buffers
  int64_t total_ = 0, shard_total_ = 0;

  std::vector<float> params_full_;  // zero 0-2
  std::vector<float> grads_full_;   // zero 0-1
  std::vector<float> param_shard_;  // zero 1-3: master weights of the shard
  std::vector<float> grad_shard_;   // zero 1-3
  // zero 2-3: gradient scratch per slot (0 embeddings, 1 ln_f, 2-3 blocks,
  // double-buffered so a block reduces while the next one computes) and
  // the reduce-scatter output of each slot.
  std::vector<float> scratch_[4], staging_[4];
  int slot_unit_[4] = {-1, -1, -1, -1};
  int next_block_slot_ = 2;
  // zero 3: gathered weights (0 embeddings, 1 ln_f, 2 the current block).
  std::vector<float> gathered_[3];
  int gathered_unit_[3] = {-1, -1, -1};

  std::unique_ptr<AdamW> optimizer_;
  std::deque<Pending> pending_;
  bool last_microbatch_ = true;
  int64_t bucket_lo_ = -1, bucket_hi_ = -1;
  double exposed_seconds_ = 0.0;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_DATA_PARALLEL_H_
