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

GradReducer::GradReducer(const std::vector<UnitRange>& units, int emb_unit,
                         int final_unit, int dp, int zero, int microbatches,
                         int64_t bucket_bytes, Communicator* dp_group,
                         kernels::Ops* ops)
    : units_(units),
      emb_unit_(emb_unit),
      final_unit_(final_unit),
      dp_(dp),
      zero_(zero),
      bucket_bytes_(bucket_bytes),
      reduce_into_shard_(microbatches == 1),
      comm_(dp_group),
      ops_(ops) {
  const std::vector<int64_t> sizes =
      SlotSizes(units_, emb_unit_, final_unit_, zero_);
  for (int s = 0; s < 4; ++s) {
    scratch_[s] = kernels::Buffer(ops_, sizes[s]);
    // With one microbatch a unit is reduced once per step, straight into
    // the (zeroed) shard; only accumulation needs a staging buffer.
    if (!reduce_into_shard_)
      staging_[s] = kernels::Buffer(ops_, sizes[s] / dp_);
  }
}

std::vector<int64_t> GradReducer::SlotSizes(const std::vector<UnitRange>& units,
                                            int emb_unit, int final_unit,
                                            int zero) {
  if (zero < 2) return std::vector<int64_t>(4, 0);
  // Block units differ in size; their shared slots fit the largest.
  int64_t block_max = 0;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    if (u != emb_unit && u != final_unit) {
      block_max = std::max(block_max, units[u].size);
    }
  }
  return {emb_unit >= 0 ? units[emb_unit].size : 0,
          final_unit >= 0 ? units[final_unit].size : 0, block_max, block_max};
}

int64_t GradReducer::ScratchFloats(const std::vector<UnitRange>& units,
                                   int emb_unit, int final_unit, int dp,
                                   int zero, int microbatches) {
  int64_t n = 0;
  for (int64_t size : SlotSizes(units, emb_unit, final_unit, zero)) {
    n += size + (microbatches == 1 ? 0 : size / dp);
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
        comm_->ReduceScatterAsync(scratch_[slot].data(), out, ShardSize(u));
    p.unit = u;
    p.slot = slot;
  } else if (!last_microbatch_ || (zero_ == 0 && dp_ == 1)) {
    return;  // gradients keep accumulating locally, or there is no one else
  } else if (zero_ == 1) {
    p.handle = comm_->ReduceScatterAsync(grads_full_ + units_[u].begin,
                                         grad_shard_ + (*shard_offset_)[u],
                                         ShardSize(u));
  } else {
    // Units finish in descending memory order, so a bucket is the contiguous
    // range from the last unit added up to the first.
    if (bucket_hi_ < 0) bucket_hi_ = units_[u].begin + units_[u].size;
    bucket_lo_ = units_[u].begin;
    const int64_t bytes =
        (bucket_hi_ - bucket_lo_) * static_cast<int64_t>(sizeof(float));
    if (bytes < bucket_bytes_ && bucket_lo_ != 0) return;
    p.handle = comm_->AllReduceAsync(grads_full_ + bucket_lo_,
                                     bucket_hi_ - bucket_lo_);
    bucket_lo_ = bucket_hi_ = -1;
  }
  pending_.push_back(std::move(p));
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
  if (comm_ != nullptr) comm_->stats().RecordExposed(blocked);
}

int64_t GradReducer::scratch_bytes() const {
  int64_t n = 0;
  for (int s = 0; s < 4; ++s) n += scratch_[s].size() + staging_[s].size();
  return n * static_cast<int64_t>(sizeof(float));
}

}  // namespace ptrain
