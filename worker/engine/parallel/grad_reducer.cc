// See grad_reducer.h.
#include "worker/engine/parallel/grad_reducer.h"

#include <algorithm>
#include <chrono>

#include "common/check.h"

namespace ptrain {
namespace {
// Slots: the embedding's, the final LayerNorm's, and two that blocks take
// in turn (one reduces while the next one's backward fills the other).
constexpr int kEmbSlot = 0, kFinalSlot = 1, kBlockSlot = 2;
}  // namespace

UnitGroups::UnitGroups(int dense_size, Communicator* dp_group,
                       Communicator* expert_group) {
  dense = {dense_size, dp_group != nullptr ? dp_group->rank() : 0, dp_group};
  expert = expert_group == nullptr ? dense
                                   : Group{expert_group->size(),
                                           expert_group->rank(), expert_group};
}

UnitGroups::UnitGroups(int dense_size, int expert_size) {
  dense.size = dense_size;
  expert.size = expert_size > 0 ? expert_size : dense_size;
}

GradReducer::GradReducer(const std::vector<UnitRange>& units, int emb_unit,
                         int final_unit, const UnitGroups& groups, int zero,
                         int microbatches, int64_t bucket_bytes,
                         kernels::Ops* ops)
    : units_(units),
      emb_unit_(emb_unit),
      final_unit_(final_unit),
      groups_(groups),
      zero_(zero),
      bucket_bytes_(bucket_bytes),
      reduce_into_shard_(microbatches == 1),
      ops_(ops) {
  const std::vector<int64_t> sizes =
      SlotSizes(units_, emb_unit_, final_unit_, zero_, &groups_);
  for (int s = 0; s < 4; ++s) {
    scratch_[s] = kernels::Buffer(ops_, sizes[s]);
    // With one microbatch a unit is reduced once per step, straight into
    // the (zeroed) shard; only accumulation needs a staging buffer.
    if (!reduce_into_shard_) staging_[s] = kernels::Buffer(ops_, sizes[4 + s]);
  }
}

std::vector<int64_t> GradReducer::SlotSizes(const std::vector<UnitRange>& units,
                                            int emb_unit, int final_unit,
                                            int zero,
                                            const UnitGroups* shards) {
  std::vector<int64_t> sizes(8, 0);
  if (zero < 2) return sizes;
  // Slot s takes the embedding's, the final unit's, or (2, 3) any block
  // unit: each fits the largest unit it takes, and its staging the largest
  // shard of one.
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    const int first = u == emb_unit ? 0 : u == final_unit ? 1 : 2;
    const int last = first == 2 ? 3 : first;
    for (int s = first; s <= last; ++s) {
      sizes[s] = std::max(sizes[s], units[u].size);
      if (shards != nullptr) {
        sizes[4 + s] = std::max(sizes[4 + s], shards->ShardSize(units[u]));
      }
    }
  }
  return sizes;
}

int64_t GradReducer::ScratchFloats(const std::vector<UnitRange>& units,
                                   int emb_unit, int final_unit,
                                   const UnitGroups& groups, int zero,
                                   int microbatches) {
  const std::vector<int64_t> sizes =
      SlotSizes(units, emb_unit, final_unit, zero, &groups);
  int64_t n = 0;
  for (int s = 0; s < 4; ++s) {
    n += sizes[s] + (microbatches == 1 ? 0 : sizes[4 + s]);
  }
  return n;
}

void GradReducer::Attach(float* grads_full, float* grad_shard,
                         const std::vector<int64_t>* shard_offset) {
  grads_full_ = grads_full;
  grad_shard_ = grad_shard;
  shard_offset_ = shard_offset;
}

void GradReducer::BeginStep() { bucket_lo_ = bucket_hi_ = -1; }

int GradReducer::SlotOf(int u) const {
  int slot = 0;
  while (slot < 4 && slot_unit_[slot] != u) ++slot;
  PT_CHECK(slot < 4, "gradients of a unit asked for outside its backward");
  return slot;
}

float* GradReducer::UnitGrads(int u) const {
  return scratch_[SlotOf(u)].data();
}

void GradReducer::BeginUnit(int u) {
  if (zero_ < 2) return;
  int slot = kEmbSlot;
  if (u == final_unit_) {
    slot = kFinalSlot;
  } else if (u != emb_unit_) {
    slot = next_block_slot_;
    next_block_slot_ =
        next_block_slot_ == kBlockSlot ? kBlockSlot + 1 : kBlockSlot;
  }
  // The slot may still be reducing the block before last: wait for it.
  while (slot_unit_[slot] != -1) {
    Pending& p = pending_.front();
    p.handle->Wait();
    Complete(p);
    pending_.pop_front();
  }
  ops_->Zero(scratch_[slot].data(), units_[u].size);
  slot_unit_[slot] = u;
}

void GradReducer::UnitDone(int u) {
  Pending p;
  if (zero_ >= 2) {
    const int slot = SlotOf(u);
    float* out = reduce_into_shard_ ? grad_shard_ + (*shard_offset_)[u]
                                    : staging_[slot].data();
    p.handle =
        CommOf(u)->ReduceScatterAsync(scratch_[slot].data(), out, ShardSize(u));
    p.unit = u;
    p.slot = slot;
  } else if (!last_microbatch_) {
    return;  // gradients keep accumulating locally
  } else if (zero_ == 1) {
    p.handle = CommOf(u)->ReduceScatterAsync(grads_full_ + units_[u].begin,
                                             grad_shard_ + (*shard_offset_)[u],
                                             ShardSize(u));
  } else {
    // Units finish in descending memory order, so a bucket is the contiguous
    // range from the last unit added up to the first, of units of one group
    // (a unit whose group is this rank alone ends it).
    const UnitRange& unit = units_[u];
    const bool alone = groups_.Of(unit).size == 1;
    if (bucket_hi_ >= 0 && (alone || bucket_expert_ != unit.expert)) {
      FlushBucket();
    }
    if (!alone) {
      if (bucket_hi_ < 0) bucket_hi_ = unit.begin + unit.size;
      bucket_lo_ = unit.begin;
      bucket_expert_ = unit.expert;
      const int64_t bytes =
          (bucket_hi_ - bucket_lo_) * static_cast<int64_t>(sizeof(float));
      if (bytes >= bucket_bytes_) FlushBucket();
    }
    if (unit.begin == 0 && bucket_hi_ >= 0) FlushBucket();
    return;
  }
  pending_.push_back(std::move(p));
}

void GradReducer::FlushBucket() {
  const UnitGroups::Group& g = bucket_expert_ ? groups_.expert : groups_.dense;
  Pending p;
  p.handle =
      g.comm->AllReduceAsync(grads_full_ + bucket_lo_, bucket_hi_ - bucket_lo_);
  pending_.push_back(std::move(p));
  bucket_lo_ = bucket_hi_ = -1;
}

void GradReducer::Complete(Pending& p) {
  if (p.slot < 0) return;
  if (!reduce_into_shard_) {
    ops_->Add(grad_shard_ + (*shard_offset_)[p.unit], staging_[p.slot].data(),
              ShardSize(p.unit));
  }
  slot_unit_[p.slot] = -1;
}

void GradReducer::Poll() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->handle->Test()) {
      Complete(*it);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void GradReducer::Finish() {
  if (pending_.empty()) return;  // nothing to wait for
  const auto t0 = std::chrono::steady_clock::now();
  for (Pending& p : pending_) {
    p.handle->Wait();
    Complete(p);
  }
  pending_.clear();
  const double blocked =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  if (groups_.dense.comm != nullptr) {
    groups_.dense.comm->stats().RecordExposed(blocked);
  }
}

int64_t GradReducer::scratch_bytes() const {
  int64_t n = 0;
  for (int s = 0; s < 4; ++s) n += scratch_[s].size() + staging_[s].size();
  return n * static_cast<int64_t>(sizeof(float));
}

}  // namespace ptrain
