// ZeroStore: where a rank's weights and gradients live under data
// parallelism and ZeRO over its dp group — the UnitStore of its GptStage.
//
//   zero 0  replicated weights, gradients and Adam moments.
//   zero 1  Adam moments sharded; weights and gradients replicated, the
//           gradients reduce-scattered into the rank's shard.
//   zero 2  also gradients: a unit's gradients live in a scratch slot only
//           until reduce-scattered (every microbatch) into the shard.
//   zero 3  also weights (FSDP): a unit's weights are all-gathered before
//           its forward and again before its backward, and dropped after.
//
// In a pipeline (reduce_once_per_step) zero 2 and 3 keep the stage's
// gradients whole through the step and reduce-scatter them once, in the
// last microbatch, as zero 1 does: a pipeline runs many microbatches per
// step (at least pp to fill it), and reducing every one of them would
// multiply the dp traffic by that many, while whole gradients cost only
// the stage's 1/pp of the model. Zero 3 still shards the weights.
//
// Units (plan.h) are each padded to a multiple of dp and sharded evenly:
// rank r owns the r-th 1/dp of every unit. Under expert parallelism the
// routed experts' units (UnitRange::expert) belong to the smaller group of
// the ranks holding the same experts (dp/ep of them, dividing dp): their
// gradients are summed, and they are sharded, over it. When gradients are
// reduced is the GradReducer's business (grad_reducer.h), the update the
// DistributedOptimizer's (optimizer.h). Not thread-safe.
#ifndef PTRAIN_WORKER_ENGINE_PARALLEL_ZERO_STORE_H_
#define PTRAIN_WORKER_ENGINE_PARALLEL_ZERO_STORE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/engine/comm/comm.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/plan.h"
#include "worker/engine/parallel/grad_reducer.h"

namespace ptrain {

struct ZeroOptions {
  int zero = 0;                     // stage 0..3
  int microbatches = 1;             // per optimizer step
  int64_t bucket_bytes = 25 << 20;  // zero 0: all-reduce bucket size
  // Zero 2-3: reduce gradients once per step, not every microbatch (set
  // for pipelines, pp > 1).
  bool reduce_once_per_step = false;
  // Keep a bf16 compute copy of the weights beside the fp32 master ones,
  // which the matmuls read (UnitStore::Weights): bf16 compute, whose
  // backend stores activations in bf16 (Ops::activation_type).
  bool bf16_weights = false;
};

class ZeroStore : public UnitStore {
 public:
  // `layout` is BuildPlan's with pad = dp. dp_group may be null when dp = 1
  // and zero = 0 (nothing to communicate). `ops` (kernels::CpuOps() for the
  // CPU) holds the buffers (dp_group must then communicate its memory).
  // expert_group: the ranks holding the same routed experts, for the experts'
  // units (null: the dp group).
  ZeroStore(std::vector<ParamInfo> layout, int dp, const ZeroOptions& options,
            Communicator* dp_group, kernels::Ops* ops,
            Communicator* expert_group = nullptr);
  ZeroStore(const ZeroStore&) = delete;
  ZeroStore& operator=(const ZeroStore&) = delete;

  const std::vector<ParamInfo>& layout() const { return layout_; }
  const std::vector<UnitRange>& units() const { return units_; }
  int dp() const { return dp_; }
  int zero() const { return zero_; }
  kernels::Ops& ops() const { return *ops_; }

  // Every rank initialises exactly what it holds, from (seed, name, global
  // index): the same numbers on any layout.
  void InitParams(uint64_t seed);

  // Before the first microbatch of a step; before each microbatch (the last
  // one's backward issues the reductions of replicated gradients); after
  // the last backward (waits for every reduction in flight).
  void BeginStep();
  void BeginMicrobatch(bool last) { reducer_->BeginMicrobatch(last); }
  // Waits for the reductions; the time blocked is the dp group's exposed
  // communication (CommStats::ExposedSeconds).
  void FinishGradients() { reducer_->Finish(); }

  // The buffers the optimizer updates: the whole replicated vectors at
  // zero 0, this rank's shard from zero 1 on (shard_size() elements, the
  // pieces of ShardPieces() concatenated).
  bool sharded() const { return zero_ >= 1; }
  // Mutable: whoever asks may write the weights, so the bf16 compute copy
  // is made again from them before the matmuls next read it (unless
  // WeightsCopyWritten says the writer wrote it too).
  float* update_params();
  float* update_grads();
  // Unsharded with a bf16 compute copy: the copy at update_params()'s
  // indices, which the optimizer writes as it updates the weights (then
  // calls WeightsCopyWritten); else null.
  void* update_weights_copy();
  void WeightsCopyWritten() { copy_version_ = params_version_; }
  // Counts the times the weights may have been written (update_params(),
  // initialisation, gathers): a copy made at one version is current while
  // the version is unchanged.
  int64_t params_version() const { return params_version_; }
  int64_t update_size() const { return sharded() ? shard_total_ : total_; }
  // [begin, end) ranges of the flat layout this rank's shard is made of.
  std::vector<std::pair<int64_t, int64_t>> ShardPieces() const;
  // Zero 1-2: makes the replicated weights whole again after an update of
  // the shards.
  void GatherUpdatedParams();

  // fn(param, local_lo, local_hi, at): every stretch [local_lo, local_hi)
  // of a tensor's local elements that this rank updates, `at` indexing
  // update_params()/update_grads(). Zero 0: every tensor whole.
  template <typename Fn>
  void ForEachUpdateStretch(Fn fn) const;
  // The same over this rank's 1/dp of every unit, whatever the ZeRO stage
  // (at zero 0 a slice of the replicated vectors): what it writes into a
  // checkpoint, so that the dp group writes every element once.
  template <typename Fn>
  void ForEachShardStretch(Fn fn) const;

  // The whole weight vector (padded layout) on every rank (collective), in
  // host memory.
  std::vector<float> FullParams();

  // Zero 3: the block units' weights gathered so far, and how many of
  // those had been gathered ahead (while the unit before computed).
  struct GatherCounts {
    int64_t blocks = 0, ahead = 0;
  };
  GatherCounts gather_counts() const { return gather_counts_; }

  // Bytes this rank holds: params (incl. gathered copies), grads (incl.
  // scratch). Optimizer and activations belong to others.
  MemoryBytes memory() const;

  // What a ZeroStore over `layout` allocates, in floats, without building
  // one (memory estimates): the same numbers memory() reports / 4.
  // expert_dp: the size of the group holding the same experts (0: dp).
  struct Footprint {
    int64_t params = 0, grads = 0;
    int64_t update = 0;  // update_size(): Adam keeps two floats per element
  };
  static Footprint Measure(const std::vector<ParamInfo>& layout, int dp,
                           const ZeroOptions& options, int expert_dp = 0);

  // UnitStore.
  const float* Params(int u) override;
  kernels::ConstAct Weights(int u) override;
  float* Grads(int u) override;
  void BeginForward(int u) override;
  void BeginBackward(int u) override;
  void EndBackward(int u) override;
  void Poll() override { reducer_->Poll(); }
  void Settle() override;

 private:
  // Zero 3's gathered-weight slots: the embedding's, the final unit's, and
  // two for blocks (the current unit's and the next one's, gathered ahead).
  static constexpr int kSlots = 4;
  // The buffers' sizes for a layout; the constructor allocates them.
  struct Sizes {
    int64_t total = 0, shard_total = 0;
    int emb_unit = -1, final_unit = -1;
    int64_t params_full = 0, grads_full = 0, shard = 0;
    int64_t gathered[kSlots] = {0, 0, 0, 0};
    // Floats of the bf16 compute copies: of params_full, of each gathered
    // slot.
    int64_t params16 = 0, gathered16[kSlots] = {0, 0, 0, 0};
  };
  static Sizes ComputeSizes(const std::vector<ParamInfo>& layout,
                            const std::vector<UnitRange>& units,
                            const UnitGroups& groups, int zero, int grad_zero,
                            bool bf16_weights);
  // The ZeRO stage gradients are handled by: zero, but 1 for zero 2-3
  // reduced once per step.
  static int GradZero(const ZeroOptions& o) {
    return o.reduce_once_per_step && o.zero >= 2 ? 1 : o.zero;
  }
  int64_t ShardSize(int u) const { return groups_.ShardSize(units_[u]); }
  // First element of this rank's shard of unit u in the full buffer.
  int64_t ShardBegin(int u) const {
    return units_[u].begin + groups_.Of(units_[u]).rank * ShardSize(u);
  }
  Communicator* CommOf(int u) const { return groups_.Of(units_[u]).comm; }
  // Gathered-weight slot (zero 3) holding unit u's weights: the embedding
  // and the final unit have their own (they bracket the whole pass), blocks
  // take turns in two; -1 where u is in none.
  int WeightSlot(int u) const;
  void Gather(int u, float* dst);
  // n fp32 values rounded into a bf16 buffer (the compute copy).
  void RoundInto(void* dst, const float* src, int64_t n);

  const int dp_, zero_, grad_zero_;
  const bool bf16_weights_;
  const UnitGroups groups_;
  std::vector<ParamInfo> layout_;
  std::vector<UnitRange> units_;
  const int n_units_;
  std::vector<int64_t> shard_offset_;  // unit -> offset in the shard buffers
  int64_t total_ = 0, shard_total_ = 0;
  int emb_unit_ = -1, final_unit_ = -1;  // -1 when the stage has none

  kernels::Ops* ops_;
  kernels::Buffer params_full_;  // zero 0-2
  kernels::Buffer grads_full_;   // zero 0-1
  kernels::Buffer param_shard_;  // zero 1-3: master weights of the shard
  kernels::Buffer grad_shard_;   // zero 1-3
  // zero 3: gathered weights (0 embedding, 1 final, 2 the current block).
  kernels::Buffer gathered_[kSlots];
  int gathered_unit_[kSlots] = {-1, -1, -1, -1};
  // Zero 3: the block unit being gathered ahead into the block slot the
  // current one is not in (the next unit in the direction of the pass),
  // and the gather's handle; unit -1: none.
  struct Prefetch {
    int unit = -1, slot = -1;
    std::unique_ptr<CommHandle> handle;
  };
  Prefetch prefetch_;
  GatherCounts gather_counts_;
  // Zero 3: unit u's weights in a slot (gathered now, or ahead earlier),
  // then the gather of `next` ahead where it is a block unit.
  void GatherFor(int u, int next);
  // Waits for a gather ahead and forgets it (its slot is needed, or the
  // weights it read are about to change).
  void DropPrefetch();
  // The bf16 compute copies (bf16_weights), two to a float: of params_full_
  // (zero 0-2), made from the version of the weights it says; of each
  // gathered slot (zero 3), made for the unit it says.
  kernels::Buffer params16_;
  int64_t params_version_ = 0, copy_version_ = -1;
  kernels::Buffer gathered16_[kSlots];
  int copy_unit_[kSlots] = {-1, -1, -1, -1};

  std::unique_ptr<GradReducer> reducer_;
};

template <typename Fn>
void ZeroStore::ForEachShardStretch(Fn fn) const {
  for (const ParamInfo& p : layout_) {
    const int64_t begin = ShardBegin(p.unit), end = begin + ShardSize(p.unit);
    const int64_t lo = std::max(p.offset, begin);
    const int64_t hi = std::min(p.offset + p.numel, end);
    if (lo >= hi) continue;
    // The update buffers are the whole vectors at zero 0, the shard after.
    const int64_t at = sharded() ? shard_offset_[p.unit] + (lo - begin) : lo;
    fn(p, lo - p.offset, hi - p.offset, at);
  }
}

template <typename Fn>
void ZeroStore::ForEachUpdateStretch(Fn fn) const {
  if (sharded()) {
    ForEachShardStretch(fn);
    return;
  }
  for (const ParamInfo& p : layout_) fn(p, int64_t{0}, p.numel, p.offset);
}

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_PARALLEL_ZERO_STORE_H_
