// GradReducer: sums gradients over the dp group while backward is still
// running, unit by unit as each unit's gradients become final.
//
//   zero 0  all-reduce in buckets of about parallel.bucket_bytes of
//           consecutive units, in the last microbatch of a step;
//   zero 1  reduce-scatter of each unit into the rank's shard, in the last
//           microbatch;
//   zero 2-3  a unit's gradients live in a scratch slot (owned here) only
//           until reduce-scattered, every microbatch, into the shard: with
//           one microbatch straight into it, else through a staging buffer
//           added on completion.
//
// The persistent gradient buffers belong to the ZeroStore and are attached.
// Not thread-safe.
#ifndef PTRAIN_WORKER_ENGINE_PARALLEL_GRAD_REDUCER_H_
#define PTRAIN_WORKER_ENGINE_PARALLEL_GRAD_REDUCER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "worker/engine/comm/comm.h"
#include "worker/engine/model/plan.h"

namespace ptrain {

// The groups a unit's gradients are summed over: the dp group, or for the
// routed experts' units (UnitRange::expert) the ranks holding the same
// experts.
struct UnitGroups {
  struct Group {
    int size = 1, rank = 0;
    Communicator* comm = nullptr;  // null: size 1 without MPI
  };
  Group dense, expert;
  // `dense_size` ranks over dp_group; `expert_group` null: the same.
  UnitGroups(int dense_size, Communicator* dp_group,
             Communicator* expert_group);
  // Sizes alone (memory estimates): expert_size 0 is dense_size.
  UnitGroups(int dense_size, int expert_size);
  const Group& Of(const UnitRange& u) const {
    return u.expert ? expert : dense;
  }
  int64_t ShardSize(const UnitRange& u) const { return u.size / Of(u).size; }
};

class GradReducer {
 public:
  // emb_unit / final_unit: the units that stay in backward for the whole
  // pass (-1 when the stage has none); every other unit is a block unit.
  // The scratch lives in `ops`' memory (not owned), like the gradients.
  GradReducer(const std::vector<UnitRange>& units, int emb_unit, int final_unit,
              const UnitGroups& groups, int zero, int microbatches,
              int64_t bucket_bytes, kernels::Ops* ops);
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // grads_full: the replicated gradients (zero 0-1; else null); grad_shard
  // and shard_offset: the rank's shard and where each unit's part starts
  // in it (zero 1-3; else null).
  void Attach(float* grads_full, float* grad_shard,
              const std::vector<int64_t>* shard_offset);

  void BeginStep();
  void BeginMicrobatch(bool last) { last_microbatch_ = last; }
  // Zero 2-3: unit u's gradients for this backward pass, a zeroed scratch
  // slot from BeginUnit until its reduction was issued by UnitDone.
  void BeginUnit(int u);
  float* UnitGrads(int u) const;
  // Unit u's gradients of this pass are complete: issues its reduction when
  // one is due.
  void UnitDone(int u);
  // Progresses reductions in flight (between kernels of backward).
  void Poll();
  // Waits for every reduction still in flight; the time it blocked is
  // recorded as exposed in the group's CommStats (RecordExposed).
  void Finish();

  int64_t scratch_bytes() const;
  // The floats of scratch and staging a reducer with these arguments
  // allocates (memory estimates).
  static int64_t ScratchFloats(const std::vector<UnitRange>& units,
                               int emb_unit, int final_unit,
                               const UnitGroups& groups, int zero,
                               int microbatches);

 private:
  struct Pending {
    std::unique_ptr<CommHandle> handle;
    int unit = -1;  // zero >= 2: the unit whose scratch is being reduced
    int slot = -1;  // its scratch slot
  };
  // Scratch size of each slot (0 with zero < 2), and of its staging (the
  // largest shard of a unit it takes).
  static std::vector<int64_t> SlotSizes(const std::vector<UnitRange>& units,
                                        int emb_unit, int final_unit, int zero,
                                        const UnitGroups* shards = nullptr);
  int64_t ShardSize(int u) const { return groups_.ShardSize(units_[u]); }
  Communicator* CommOf(int u) const { return groups_.Of(units_[u]).comm; }
  int SlotOf(int u) const;
  void Complete(Pending& p);  // after its handle finished

  const std::vector<UnitRange> units_;
  const int emb_unit_, final_unit_;
  const UnitGroups groups_;
  const int zero_;
  const int64_t bucket_bytes_;
  const bool reduce_into_shard_;  // zero 2-3 with a single microbatch
  kernels::Ops* ops_;
  float* grads_full_ = nullptr;
  float* grad_shard_ = nullptr;
  const std::vector<int64_t>* shard_offset_ = nullptr;

  // zero 2-3: scratch per slot (0 embedding, 1 final, 2-3 blocks, double
  // buffered so a block reduces while the next one computes) and the
  // reduce-scatter output of each slot when accumulating.
  kernels::Buffer scratch_[4], staging_[4];
  int slot_unit_[4] = {-1, -1, -1, -1};
  int next_block_slot_ = 2;

  std::deque<Pending> pending_;
  bool last_microbatch_ = true;
  int64_t bucket_lo_ = -1, bucket_hi_ = -1;
  bool bucket_expert_ = false;  // the bucket's units are experts'
  void FlushBucket();           // all-reduces the bucket (zero 0)
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_PARALLEL_GRAD_REDUCER_H_
