// See zero_store.h.
#include "worker/engine/parallel/zero_store.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "common/check.h"

namespace ptrain {

namespace {
constexpr int kEmbSlot = 0, kFinalSlot = 1, kBlockSlots[2] = {2, 3};

// The units that stay in use for a whole pass: the embedding (wte, wpe)
// and the final LayerNorm, when the stage holds them.
int UnitOf(const std::vector<ParamInfo>& layout, const char* name) {
  for (const ParamInfo& p : layout) {
    if (p.name == name) return p.unit;
  }
  return -1;
}
}  // namespace

ZeroStore::Sizes ZeroStore::ComputeSizes(const std::vector<ParamInfo>& layout,
                                         const std::vector<UnitRange>& units,
                                         const UnitGroups& groups, int zero,
                                         int grad_zero, bool bf16_weights) {
  Sizes z;
  z.emb_unit = UnitOf(layout, "wte");
  z.final_unit = UnitOf(layout, "ln_f.weight");
  z.total = units.empty() ? 0 : units.back().begin + units.back().size;
  int64_t block_max = 0;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    z.shard_total += groups.ShardSize(units[u]);
    if (u != z.emb_unit && u != z.final_unit) {
      block_max = std::max(block_max, units[u].size);
    }
  }
  if (zero <= 2) z.params_full = z.total;
  if (grad_zero <= 1) z.grads_full = z.total;
  if (zero >= 1) z.shard = z.shard_total;
  if (zero == 3) {
    z.gathered[kEmbSlot] = z.emb_unit >= 0 ? units[z.emb_unit].size : 0;
    z.gathered[kFinalSlot] = z.final_unit >= 0 ? units[z.final_unit].size : 0;
    for (int s : kBlockSlots) z.gathered[s] = block_max;
  }
  if (bf16_weights) {
    z.params16 = (z.params_full + 1) / 2;
    for (int s = 0; s < kSlots; ++s) {
      z.gathered16[s] = (z.gathered[s] + 1) / 2;
    }
  }
  return z;
}

ZeroStore::Footprint ZeroStore::Measure(const std::vector<ParamInfo>& layout,
                                        int dp, const ZeroOptions& o,
                                        int expert_dp) {
  const std::vector<UnitRange> units = Units(layout, dp);
  const UnitGroups groups(dp, expert_dp);
  const Sizes z =
      ComputeSizes(layout, units, groups, o.zero, GradZero(o), o.bf16_weights);
  Footprint f;
  f.params = z.params_full + z.shard + z.params16;
  for (int s = 0; s < kSlots; ++s) {
    f.params += z.gathered[s] + z.gathered16[s];
  }
  f.grads = z.grads_full + z.shard +
            GradReducer::ScratchFloats(units, z.emb_unit, z.final_unit, groups,
                                       GradZero(o), o.microbatches);
  f.update = o.zero >= 1 ? z.shard_total : z.total;
  return f;
}

ZeroStore::ZeroStore(std::vector<ParamInfo> layout, int dp,
                     const ZeroOptions& o, Communicator* dp_group,
                     kernels::Ops* ops, Communicator* expert_group)
    : dp_(dp),
      zero_(o.zero),
      grad_zero_(GradZero(o)),
      bf16_weights_(o.bf16_weights),
      groups_(dp, dp_group, expert_group),
      layout_(std::move(layout)),
      units_(Units(layout_, dp)),
      n_units_(static_cast<int>(units_.size())),
      ops_(ops) {
  PT_CHECK(ops_ != nullptr, "a store needs the backend holding its buffers");
  Communicator* comm = groups_.dense.comm;
  PT_CHECK(comm != nullptr || (dp_ == 1 && zero_ == 0),
           "dp > 1 or zero > 0 needs a dp group");
  PT_CHECK(comm == nullptr || comm->size() == dp_,
           "the dp group's size differs from dp");
  PT_CHECK(dp_ % groups_.expert.size == 0,
           "the experts' group does not divide the dp group");
  PT_CHECK(!bf16_weights_ || ops_->activation_type() == kernels::DType::kBf16,
           "a bf16 copy of the weights on a backend that computes in fp32");
  const Sizes z =
      ComputeSizes(layout_, units_, groups_, zero_, grad_zero_, bf16_weights_);
  emb_unit_ = z.emb_unit;
  final_unit_ = z.final_unit;
  total_ = z.total;
  shard_total_ = z.shard_total;
  shard_offset_.resize(n_units_);
  int64_t offset = 0;
  for (int u = 0; u < n_units_; ++u) {
    shard_offset_[u] = offset;
    offset += ShardSize(u);
  }
  params_full_ = kernels::Buffer(ops_, z.params_full);
  grads_full_ = kernels::Buffer(ops_, z.grads_full);
  param_shard_ = kernels::Buffer(ops_, z.shard);
  grad_shard_ = kernels::Buffer(ops_, z.shard);
  params16_ = kernels::Buffer(ops_, z.params16);
  for (int s = 0; s < kSlots; ++s) {
    gathered_[s] = kernels::Buffer(ops_, z.gathered[s]);
    gathered16_[s] = kernels::Buffer(ops_, z.gathered16[s]);
  }
  reducer_ = std::make_unique<GradReducer>(units_, emb_unit_, final_unit_,
                                           groups_, grad_zero_, o.microbatches,
                                           o.bucket_bytes, ops_);
  reducer_->Attach(grads_full_.empty() ? nullptr : grads_full_.data(),
                   grad_shard_.empty() ? nullptr : grad_shard_.data(),
                   &shard_offset_);
}

void ZeroStore::InitParams(uint64_t seed) {
  ++params_version_;
  DropPrefetch();
  // Computed on the host, then copied where the backend keeps them.
  const bool on_host = ops_->device() == kernels::Device::kCpu;
  std::vector<float> host;
  for (const ParamInfo& p : layout_) {
    auto value = [&](int64_t local) {
      const std::optional<int64_t> g = GlobalIndex(p, local);
      return g.has_value() ? InitialValue(p, seed, *g) : 0.0f;
    };
    if (zero_ <= 2) {
      if (!on_host) host.resize(p.numel);
      float* dst = on_host ? params_full_.data() + p.offset : host.data();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = value(i);
      if (!on_host) {
        ops_->FromHost(params_full_.data() + p.offset, host.data(), p.numel);
      }
    }
  }
  if (!sharded()) return;
  // Only the elements of this rank's shard, computed directly.
  if (!on_host) host.assign(shard_total_, 0.0f);
  float* shard = on_host ? param_shard_.data() : host.data();
  ForEachUpdateStretch([&](const ParamInfo& p, int64_t lo, int64_t hi,
                           int64_t at) {
    for (int64_t i = lo; i < hi; ++i) {
      const std::optional<int64_t> g = GlobalIndex(p, i);
      shard[at + (i - lo)] = g.has_value() ? InitialValue(p, seed, *g) : 0.0f;
    }
  });
  if (!on_host) ops_->FromHost(param_shard_.data(), host.data(), shard_total_);
}

void ZeroStore::BeginStep() {
  if (!grads_full_.empty()) ops_->Zero(grads_full_.data(), grads_full_.size());
  if (grad_zero_ >= 2 && !grad_shard_.empty()) {
    ops_->Zero(grad_shard_.data(), grad_shard_.size());
  }
  reducer_->BeginStep();
}

std::vector<std::pair<int64_t, int64_t>> ZeroStore::ShardPieces() const {
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (int u = 0; u < n_units_; ++u) {
    pieces.emplace_back(ShardBegin(u), ShardBegin(u) + ShardSize(u));
  }
  return pieces;
}

float* ZeroStore::update_params() {
  ++params_version_;
  DropPrefetch();  // it read the weights about to change
  return sharded() ? param_shard_.data() : params_full_.data();
}

void* ZeroStore::update_weights_copy() {
  return bf16_weights_ && !sharded() ? params16_.data() : nullptr;
}

void ZeroStore::RoundInto(void* dst, const float* src, int64_t n) {
  // Rows of a fixed width, so that a large buffer is rounded in parallel.
  constexpr int64_t kWidth = 4096;
  const int64_t rows = n / kWidth, tail = n - rows * kWidth;
  auto* d = static_cast<uint16_t*>(dst);
  const kernels::DType bf = kernels::DType::kBf16;
  if (rows > 0) ops_->Convert(kernels::Act(d, bf), src, rows, kWidth);
  if (tail > 0) {
    ops_->Convert(kernels::Act(d + rows * kWidth, bf), src + rows * kWidth, 1,
                  tail);
  }
}

float* ZeroStore::update_grads() {
  return sharded() ? grad_shard_.data() : grads_full_.data();
}

void ZeroStore::Gather(int u, float* dst) {
  CommOf(u)->AllGather(param_shard_.data() + shard_offset_[u], dst,
                       ShardSize(u));
}

void ZeroStore::GatherUpdatedParams() {
  if (zero_ != 1 && zero_ != 2) return;
  ++params_version_;
  for (int u = 0; u < n_units_; ++u) {
    Gather(u, params_full_.data() + units_[u].begin);
  }
}

int ZeroStore::WeightSlot(int u) const {
  for (int s = 0; s < kSlots; ++s) {
    if (gathered_unit_[s] == u) return s;
  }
  return -1;
}

const float* ZeroStore::Params(int u) {
  if (zero_ <= 2) return params_full_.data() + units_[u].begin;
  const int slot = WeightSlot(u);
  PT_CHECK(slot >= 0, "weights of a unit not gathered");
  return gathered_[slot].data();
}

kernels::ConstAct ZeroStore::Weights(int u) {
  if (!bf16_weights_) return Params(u);
  const kernels::DType bf = kernels::DType::kBf16;
  if (zero_ <= 2) {
    Settle();
    return kernels::ConstAct(params16_.data(), bf).Offset(units_[u].begin);
  }
  const int slot = WeightSlot(u);
  PT_CHECK(slot >= 0, "weights of a unit not gathered");
  if (copy_unit_[slot] != u) {
    RoundInto(gathered16_[slot].data(), gathered_[slot].data(), units_[u].size);
    copy_unit_[slot] = u;
  }
  return kernels::ConstAct(gathered16_[slot].data(), bf);
}

void ZeroStore::Settle() {
  // Zero 3's copies are made per gathered unit, inside the pass.
  if (bf16_weights_ && zero_ <= 2 && copy_version_ != params_version_) {
    RoundInto(params16_.data(), params_full_.data(), total_);
    copy_version_ = params_version_;
  }
}

void ZeroStore::BeginForward(int u) {
  if (zero_ == 3) GatherFor(u, u + 1);
}

void ZeroStore::GatherFor(int u, int next) {
  auto is_block = [&](int v) {
    return v >= 0 && v < n_units_ && v != emb_unit_ && v != final_unit_;
  };
  int slot = -1;
  if (!is_block(u)) {
    slot = u == emb_unit_ ? kEmbSlot : kFinalSlot;
    Gather(u, gathered_[slot].data());
  } else if (prefetch_.unit == u) {
    prefetch_.handle->Wait();
    slot = prefetch_.slot;
    prefetch_ = Prefetch{};
    ++gather_counts_.blocks;
    ++gather_counts_.ahead;
  } else {
    ++gather_counts_.blocks;
    // Only one block unit is in use at a time, and the one before is done
    // with its slot: either block slot takes it.
    DropPrefetch();
    slot = kBlockSlots[0];
    Gather(u, gathered_[slot].data());
  }
  // The slot holds u now, and no other does (another may still name u
  // from an earlier pass, with weights since changed).
  for (int& held : gathered_unit_) {
    if (held == u) held = -1;
  }
  gathered_unit_[slot] = u;
  copy_unit_[slot] = -1;  // rounded again when the matmuls ask
  if (!is_block(u) || !is_block(next) || prefetch_.unit == next) return;
  // The next unit of the pass into the other block slot, while this one
  // computes (its previous unit there is done).
  const int other = slot == kBlockSlots[0] ? kBlockSlots[1] : kBlockSlots[0];
  gathered_unit_[other] = -1;
  prefetch_.unit = next;
  prefetch_.slot = other;
  prefetch_.handle =
      CommOf(next)->AllGatherAsync(param_shard_.data() + shard_offset_[next],
                                   gathered_[other].data(), ShardSize(next));
}

void ZeroStore::DropPrefetch() {
  if (prefetch_.unit < 0) return;
  prefetch_.handle->Wait();
  prefetch_ = Prefetch{};
}

float* ZeroStore::Grads(int u) {
  if (grad_zero_ >= 2) return reducer_->UnitGrads(u);
  return grads_full_.data() + units_[u].begin;
}

void ZeroStore::BeginBackward(int u) {
  if (zero_ == 3) GatherFor(u, u - 1);  // the weights again; backwards
  reducer_->BeginUnit(u);
}

void ZeroStore::EndBackward(int u) { reducer_->UnitDone(u); }

std::vector<float> ZeroStore::FullParams() {
  if (zero_ <= 2) {
    std::vector<float> out(params_full_.size());
    ops_->ToHost(out.data(), params_full_.data(), params_full_.size());
    return out;
  }
  std::vector<float> out(total_);
  for (int u = 0; u < n_units_; ++u) Gather(u, out.data() + units_[u].begin);
  return out;
}

MemoryBytes ZeroStore::memory() const {
  constexpr int64_t kFloat = sizeof(float);
  MemoryBytes m;
  m.params =
      (params_full_.size() + param_shard_.size() + params16_.size()) * kFloat;
  for (int s = 0; s < kSlots; ++s) {
    m.params += (gathered_[s].size() + gathered16_[s].size()) * kFloat;
  }
  m.grads = (grads_full_.size() + grad_shard_.size()) * kFloat +
            reducer_->scratch_bytes();
  return m;
}

}  // namespace ptrain
