#include "worker/engine/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/kernels.h"

namespace ptrain {

namespace {
// Scratch slots of zero 2-3 and gathered-weight slots of zero 3.
constexpr int kEmbSlot = 0, kFinalSlot = 1, kBlockSlot = 2;
}  // namespace

DataParallel::DataParallel(const GptConfig& config, const v1::JobSpec& spec,
                           Communicator* dp_group)
    : dp_(spec.parallel().dp()),
      dp_rank_(dp_group != nullptr ? dp_group->rank() : 0),
      zero_(spec.parallel().zero()),
      n_units_(GptNumUnits(config)),
      bucket_bytes_(spec.parallel().bucket_bytes()),
      clip_(spec.train().grad_clip()),
      reduce_into_shard_(spec.parallel().microbatches() == 1),
      comm_(dp_group) {
  if (comm_ == nullptr && (dp_ > 1 || zero_ > 0)) {
    throw std::invalid_argument(
        "DataParallel: dp > 1 or zero > 0 needs a group");
  }
  if (comm_ != nullptr && comm_->size() != dp_) {
    throw std::invalid_argument("DataParallel: group size differs from dp");
  }
  layout_ = GptParamLayout(config, dp_);
  units_ = GptUnits(layout_, dp_);
  total_ = units_.back().begin + units_.back().size;
  shard_offset_.resize(n_units_);
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (int u = 0; u < n_units_; ++u) {
    shard_offset_[u] = shard_total_;
    shard_total_ += ShardSize(u);
    pieces.emplace_back(ShardBegin(u), ShardBegin(u) + ShardSize(u));
  }
  if (zero_ <= 2) params_full_.assign(total_, 0.0f);
  if (zero_ <= 1) grads_full_.assign(total_, 0.0f);
  if (zero_ >= 1) {
    param_shard_.assign(shard_total_, 0.0f);
    grad_shard_.assign(shard_total_, 0.0f);
  }
  // Block units differ in size; their shared slots fit the largest.
  int64_t block_max = 0;
  for (int u = 1; u < n_units_ - 1; ++u) {
    block_max = std::max(block_max, units_[u].size);
  }
  if (zero_ >= 2) {
    const int64_t sizes[4] = {units_[0].size, units_[n_units_ - 1].size,
                              block_max, block_max};
    for (int s = 0; s < 4; ++s) {
      scratch_[s].assign(sizes[s], 0.0f);
      // With one microbatch a unit is reduced once per step, straight into
      // the (zeroed) shard; only accumulation needs a staging buffer.
      if (!reduce_into_shard_) staging_[s].assign(sizes[s] / dp_, 0.0f);
    }
  }
  if (zero_ == 3) {
    gathered_[kEmbSlot].assign(units_[0].size, 0.0f);
    gathered_[kFinalSlot].assign(units_[n_units_ - 1].size, 0.0f);
    gathered_[kBlockSlot].assign(block_max, 0.0f);
  }
  optimizer_ = zero_ == 0
                   ? std::make_unique<AdamW>(layout_, 0, total_, spec.train())
                   : std::make_unique<AdamW>(layout_, pieces, spec.train());
}

void DataParallel::InitParams(uint64_t seed) {
  for (const ParamInfo& p : layout_) {
    if (zero_ <= 2) {
      float* dst = params_full_.data() + p.offset;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = InitialValue(p, seed, i);
    }
    if (zero_ >= 1) {
      // Only the elements of this rank's shard, computed directly.
      const int64_t lo = std::max(p.offset, ShardBegin(p.unit));
      const int64_t hi =
          std::min(p.offset + p.numel, ShardBegin(p.unit) + ShardSize(p.unit));
      float* dst =
          param_shard_.data() + shard_offset_[p.unit] - ShardBegin(p.unit);
      for (int64_t g = lo; g < hi; ++g) {
        dst[g] = InitialValue(p, seed, g - p.offset);
      }
    }
  }
}

void DataParallel::BeginStep() {
  if (!grads_full_.empty()) {
    std::fill(grads_full_.begin(), grads_full_.end(), 0.0f);
  }
  if (sharded_grads()) std::fill(grad_shard_.begin(), grad_shard_.end(), 0.0f);
  bucket_lo_ = bucket_hi_ = -1;
}

void DataParallel::Gather(int u, float* dst) {
  comm_->AllGather(param_shard_.data() + shard_offset_[u], dst, ShardSize(u));
}

const float* DataParallel::Params(int u) {
  if (zero_ <= 2) return params_full_.data() + units_[u].begin;
  const int slot =
      u == 0 ? kEmbSlot : (u == n_units_ - 1 ? kFinalSlot : kBlockSlot);
  if (gathered_unit_[slot] != u) {
    throw std::logic_error("DataParallel: weights of a unit not gathered");
  }
  return gathered_[slot].data();
}

void DataParallel::BeginForward(int u) {
  if (zero_ < 3) return;
  const int slot =
      u == 0 ? kEmbSlot : (u == n_units_ - 1 ? kFinalSlot : kBlockSlot);
  Gather(u, gathered_[slot].data());
  gathered_unit_[slot] = u;
}

int DataParallel::SlotFor(int u) const {
  for (int s = 0; s < 4; ++s) {
    if (slot_unit_[s] == u) return s;
  }
  throw std::logic_error("DataParallel: gradients of a unit not in backward");
}

float* DataParallel::Grads(int u) {
  if (!sharded_grads()) return grads_full_.data() + units_[u].begin;
  return scratch_[SlotFor(u)].data();
}

void DataParallel::BeginBackward(int u) {
  BeginForward(u);  // zero 3 gathers the weights again
  if (!sharded_grads()) return;
  int slot = kEmbSlot;
  if (u == n_units_ - 1) {
    slot = kFinalSlot;
  } else if (u != 0) {
    slot = next_block_slot_;
    next_block_slot_ = next_block_slot_ == 2 ? 3 : 2;
  }
  // The slot may still be reducing the block before last: wait for it.
  while (slot_unit_[slot] != -1) {
    Pending& p = pending_.front();
    p.handle->Wait();
    Complete(p);
    pending_.pop_front();
  }
  std::fill(scratch_[slot].begin(), scratch_[slot].begin() + units_[u].size,
            0.0f);
  slot_unit_[slot] = u;
}

void DataParallel::EndBackward(int u) {
  Pending p;
  if (sharded_grads()) {
    const int slot = SlotFor(u);
    float* out = reduce_into_shard_ ? grad_shard_.data() + shard_offset_[u]
                                    : staging_[slot].data();
    p.handle =
        comm_->ReduceScatterAsync(scratch_[slot].data(), out, ShardSize(u));
    p.unit = u;
    p.slot = slot;
  } else if (!last_microbatch_ || (zero_ == 0 && dp_ == 1)) {
    return;  // gradients keep accumulating locally, or there is no one else
  } else if (zero_ == 1) {
    p.handle = comm_->ReduceScatterAsync(grads_full_.data() + units_[u].begin,
                                         grad_shard_.data() + shard_offset_[u],
                                         ShardSize(u));
  } else {
    // Units finish in descending memory order, so a bucket is the contiguous
    // range from the last unit added up to the first.
    if (bucket_hi_ < 0) bucket_hi_ = units_[u].begin + units_[u].size;
    bucket_lo_ = units_[u].begin;
    const int64_t bytes =
        (bucket_hi_ - bucket_lo_) * static_cast<int64_t>(sizeof(float));
    if (bytes < bucket_bytes_ && u != 0) return;
    p.handle = comm_->AllReduceAsync(grads_full_.data() + bucket_lo_,
                                     bucket_hi_ - bucket_lo_);
    bucket_lo_ = bucket_hi_ = -1;
  }
  pending_.push_back(std::move(p));
}

void DataParallel::Complete(Pending& p) {
  if (p.slot < 0) return;
  if (reduce_into_shard_) {
    slot_unit_[p.slot] = -1;
    return;
  }
  float* dst = grad_shard_.data() + shard_offset_[p.unit];
  const float* src = staging_[p.slot].data();
  const int64_t n = ShardSize(p.unit);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  slot_unit_[p.slot] = -1;
}

void DataParallel::Poll() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->handle->Test()) {
      Complete(*it);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void DataParallel::FinishGradients() {
  const auto t0 = std::chrono::steady_clock::now();
  for (Pending& p : pending_) {
    p.handle->Wait();
    Complete(p);
  }
  pending_.clear();
  exposed_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
}

UpdateResult DataParallel::Update(float lr) {
  UpdateResult r;
  double sq = 0.0;
  if (zero_ == 0) {
    // Replicated and already summed: every rank computes the same norm.
    sq = kernels::sum_squares(grads_full_.data(), total_);
  } else {
    sq = kernels::sum_squares(grad_shard_.data(), shard_total_);
    comm_->AllReduce(&sq, 1);
  }
  r.grad_norm = std::sqrt(sq);
  const float scale = ClipScale(r.grad_norm, clip_);
  if (zero_ == 0) {
    optimizer_->Step(params_full_.data(), grads_full_.data(), lr, scale);
    return r;
  }
  optimizer_->Step(param_shard_.data(), grad_shard_.data(), lr, scale);
  if (zero_ <= 2) {
    for (int u = 0; u < n_units_; ++u) {
      Gather(u, params_full_.data() + units_[u].begin);
    }
  }
  return r;
}

std::vector<float> DataParallel::FullParams() {
  if (zero_ <= 2) return params_full_;
  std::vector<float> out(total_);
  for (int u = 0; u < n_units_; ++u) Gather(u, out.data() + units_[u].begin);
  return out;
}

MemoryBytes DataParallel::memory() const {
  auto bytes = [](const std::vector<float>& v) {
    return static_cast<int64_t>(v.size() * sizeof(float));
  };
  MemoryBytes m;
  m.params = bytes(params_full_) + bytes(param_shard_);
  for (const auto& g : gathered_) m.params += bytes(g);
  m.grads = bytes(grads_full_) + bytes(grad_shard_);
  for (int s = 0; s < 4; ++s)
    m.grads += bytes(scratch_[s]) + bytes(staging_[s]);
  m.optimizer = optimizer_->bytes();
  return m;
}

template <typename Fn>
void DataParallel::ForEachShardStretch(Fn fn) const {
  for (const ParamInfo& p : layout_) {
    const int64_t begin = ShardBegin(p.unit), end = begin + ShardSize(p.unit);
    const int64_t lo = std::max(p.offset, begin);
    const int64_t hi = std::min(p.offset + p.numel, end);
    if (lo < hi) fn(p, lo, hi, shard_offset_[p.unit] + (lo - begin));
  }
}

std::vector<ShardRun> DataParallel::CheckpointRuns() const {
  // Weights, then first moments, then second moments: a reader that needs a
  // stretch of every unit finds it contiguous in each section.
  std::vector<ShardRun> runs, m_runs, v_runs;
  AdamW& opt = *optimizer_;
  ForEachShardStretch(
      [&](const ParamInfo& p, int64_t lo, int64_t hi, int64_t local) {
        // Replicated buffers are indexed globally, shard buffers locally.
        const float* w =
            zero_ == 3 ? param_shard_.data() + local : params_full_.data() + lo;
        const int64_t at = zero_ == 0 ? lo : local;
        runs.push_back({p.name, lo - p.offset, hi - lo, w});
        m_runs.push_back(
            {ExpAvgName(p.name), lo - p.offset, hi - lo, opt.m() + at});
        v_runs.push_back(
            {ExpAvgSqName(p.name), lo - p.offset, hi - lo, opt.v() + at});
      });
  runs.insert(runs.end(), m_runs.begin(), m_runs.end());
  runs.insert(runs.end(), v_runs.begin(), v_runs.end());
  return runs;
}

absl::Status DataParallel::LoadState(TensorSource& source,
                                     bool with_optimizer) {
  AdamW& opt = *optimizer_;
  // Replicated state: whole tensors, read by every rank (its layout needs
  // them).
  for (const ParamInfo& p : layout_) {
    if (zero_ <= 2) {
      if (auto s =
              source.Read(p.name, 0, p.numel, params_full_.data() + p.offset);
          !s.ok()) {
        return s;
      }
    }
    if (with_optimizer && zero_ == 0) {
      if (auto s =
              source.Read(ExpAvgName(p.name), 0, p.numel, opt.m() + p.offset);
          !s.ok()) {
        return s;
      }
      if (auto s =
              source.Read(ExpAvgSqName(p.name), 0, p.numel, opt.v() + p.offset);
          !s.ok()) {
        return s;
      }
    }
  }
  // Sharded state: only this rank's stretches, weights then each moment
  // (the order checkpoints store them in, so reads move forward).
  absl::Status status = absl::OkStatus();
  if (zero_ == 0) return status;
  for (int kind = 0; kind < (with_optimizer ? 3 : 1); ++kind) {
    ForEachShardStretch([&](const ParamInfo& p, int64_t lo, int64_t hi,
                            int64_t local) {
      if (!status.ok()) return;
      const int64_t start = lo - p.offset, n = hi - lo;
      if (kind == 1) {
        status = source.Read(ExpAvgName(p.name), start, n, opt.m() + local);
      } else if (kind == 2) {
        status = source.Read(ExpAvgSqName(p.name), start, n, opt.v() + local);
      } else if (zero_ == 3) {
        status = source.Read(p.name, start, n, param_shard_.data() + local);
      } else {
        std::copy_n(params_full_.data() + lo, n, param_shard_.data() + local);
      }
    });
  }
  return status;
}

}  // namespace ptrain
