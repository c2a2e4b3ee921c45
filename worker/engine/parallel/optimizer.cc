#include "worker/engine/parallel/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "worker/engine/parallel/memory_estimate.h"
#include "worker/engine/parallel/zero_store.h"

namespace ptrain {

double LearningRate(const v1::TrainSpec& train, int64_t step) {
  const double lr = train.lr(), min_lr = train.min_lr();
  const int64_t warmup = train.warmup_steps();
  if (step < warmup) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  const std::string& schedule = train.lr_schedule();
  if (schedule == "constant") return lr;
  // The steps that decay: all after warmup, or (wsd) the last
  // decay_fraction of the run, never before warmup ends.
  int64_t first = warmup;
  if (schedule == "wsd") {
    const auto decaying =
        std::max<int64_t>(1, std::llround(train.decay_fraction() *
                                          static_cast<double>(train.steps())));
    first = std::max(warmup, train.steps() - decaying);
  }
  if (step < first) return lr;
  const int64_t decay_steps = train.steps() - first;
  if (decay_steps <= 1) return lr;
  const double r = std::min(1.0, static_cast<double>(step - first) /
                                     static_cast<double>(decay_steps - 1));
  // A straight line for linear and wsd's decay; cosine otherwise (also for
  // a spec built without a schedule).
  const double coeff = schedule == "linear" || schedule == "wsd"
                           ? 1.0 - r
                           : 0.5 * (1.0 + std::cos(std::numbers::pi * r));
  return min_lr + coeff * (lr - min_lr);
}

float ClipScale(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  // PyTorch's clip_grad_norm_: the 1e-6 keeps a zero gradient finite.
  const double coef = max_norm / (norm + 1e-6);
  return static_cast<float>(std::min(coef, 1.0));
}

AdamW::AdamW(const std::vector<ParamInfo>& layout, int64_t begin, int64_t end,
             const v1::TrainSpec& train, kernels::Ops* ops)
    : AdamW(layout, {{begin, end}}, train, ops) {}

AdamW::AdamW(const std::vector<ParamInfo>& layout,
             const std::vector<std::pair<int64_t, int64_t>>& pieces,
             const v1::TrainSpec& train, kernels::Ops* ops)
    : ops_(ops != nullptr ? ops : &kernels::CpuOps()),
      beta1_(static_cast<float>(train.beta1())),
      beta2_(static_cast<float>(train.beta2())),
      eps_(static_cast<float>(train.eps())),
      weight_decay_(static_cast<float>(train.weight_decay())) {
  int64_t local = 0;  // where the current piece starts in the shard
  for (const auto& [begin, end] : pieces) {
    for (const ParamInfo& p : layout) {
      const int64_t lo = std::max(begin, p.offset);
      const int64_t hi = std::min(end, p.offset + p.numel);
      if (lo >= hi) continue;
      const int64_t at = local + (lo - begin);
      if (!runs_.empty() && runs_.back().tag == int{p.decay} &&
          runs_.back().begin + runs_.back().count == at) {
        runs_.back().count += hi - lo;
      } else {
        runs_.push_back({at, hi - lo, int{p.decay}});
      }
    }
    local += end - begin;
  }
  m_ = kernels::Buffer(ops_, local);
  v_ = kernels::Buffer(ops_, local);
}

void AdamW::Step(float* params, void* params_bf16, const float* grads, float lr,
                 float grad_scale) {
  BeginStep();
  Update(params, params_bf16, grads, 0, std::numeric_limits<int64_t>::max(), lr,
         grad_scale);
}

void AdamW::Update(float* params, void* params_bf16, const float* grads,
                   int64_t lo, int64_t hi, float lr, float grad_scale) {
  // The runs cut to [lo, hi).
  std::vector<kernels::Ops::Run> cut;
  for (const kernels::Ops::Run& r : runs_) {
    const int64_t b = std::max(r.begin, lo);
    const int64_t e = std::min(r.begin + r.count, hi);
    if (b < e) cut.push_back({b, e - b, r.tag});
  }
  ops_->adamw_update_runs(params, params_bf16, m_.data(), v_.data(), grads,
                          cut.data(), static_cast<int>(cut.size()), lr, beta1_,
                          beta2_, eps_, weight_decay_, t_, grad_scale);
}

DistributedOptimizer::DistributedOptimizer(ZeroStore* store,
                                           const v1::TrainSpec& train,
                                           Groups groups, bool offload)
    : store_(store),
      groups_(groups),
      clip_(train.grad_clip()),
      offload_(offload) {
  // Offloaded, Adam's moments live in host memory (the CPU backend's).
  kernels::Ops* adam_ops = offload ? &kernels::CpuOps() : &store->ops();
  adam_ = store->sharded()
              ? std::make_unique<AdamW>(store->layout(), store->ShardPieces(),
                                        train, adam_ops)
              : std::make_unique<AdamW>(store->layout(), 0,
                                        store->update_size(), train, adam_ops);
  if (offload) {
    // Page-locked where the store's backend can (a GPU copies to and from
    // it asynchronously).
    host_params_ = kernels::HostBuffer(&store->ops(), store->update_size());
    host_grads_ = kernels::HostBuffer(&store->ops(), store->update_size());
    if (host_params_.failed() || host_grads_.failed()) {
      const int64_t bytes =
          2 * store->update_size() * static_cast<int64_t>(sizeof(float));
      throw std::runtime_error(absl::StrCat(
          "parallel.offload=optimizer: cannot page-lock ", bytes,
          " bytes of host memory for the master weights and gradients this "
          "rank updates (the host has ",
          AvailableMemoryBytes(), " bytes available)"));
    }
  }
}

void DistributedOptimizer::ReduceSequencePartial() {
  if (groups_.tp == nullptr || groups_.tp->size() == 1) return;
  kernels::Ops& ops = store_->ops();
  float* grads = store_->update_grads();
  std::vector<std::pair<int64_t, int64_t>> stretches;  // (at, count)
  int64_t n = 0;
  store_->ForEachUpdateStretch([&](const ParamInfo& p, int64_t lo, int64_t hi,
                                   int64_t at) {
    if (!p.tp_partial && !(p.sequence_partial && groups_.sequence_parallel)) {
      return;
    }
    stretches.emplace_back(at, hi - lo);
    n += hi - lo;
  });
  if (n == 0) return;
  if (pack_.size() < n) pack_ = kernels::Buffer(&ops, n);
  float* packed = pack_.data();
  for (const auto& [at, count] : stretches) {
    ops.Copy(packed, grads + at, count);
    packed += count;
  }
  groups_.tp->AllReduce(pack_.data(), n);
  packed = pack_.data();
  for (const auto& [at, count] : stretches) {
    ops.Copy(grads + at, packed, count);
    packed += count;
  }
}

double DistributedOptimizer::GlobalNormSquared() {
  const float* grads = store_->update_grads();
  // [tp-split parts, routed experts' (tp-split), tp-replicated tensors]:
  // the first two summed over tp, the last (the same on every tp rank)
  // counted once.
  double sq[3] = {0.0, 0.0, 0.0};
  const bool tp = groups_.tp != nullptr && groups_.tp->size() > 1;
  if (store_->ops().device() != kernels::Device::kCpu && !tp &&
      groups_.embedding == nullptr && groups_.ep == nullptr) {
    // Without tp, a tied copy and experts apart every element of the
    // buffer counts once (the padding is zero): one reduction, one wait
    // for the device.
    sq[2] = store_->ops().SumSquares(grads, store_->update_size());
  } else {
    if (norm_runs_.empty() && expert_runs_.empty()) {
      // The same stretches every step: tagged once, 1 where tp-replicated.
      store_->ForEachUpdateStretch(
          [&](const ParamInfo& p, int64_t lo, int64_t hi, int64_t at) {
            if (p.tied_copy) return;  // counted on stage 0
            auto& runs = p.expert >= 0 ? expert_runs_ : norm_runs_;
            runs.push_back({at, hi - lo, p.tp_replicated() ? 1 : 0});
          });
    }
    double dense[2] = {0.0, 0.0}, experts[2] = {0.0, 0.0};
    store_->ops().SumSquaresRuns(grads, norm_runs_.data(),
                                 static_cast<int>(norm_runs_.size()), dense);
    if (!expert_runs_.empty()) {
      store_->ops().SumSquaresRuns(grads, expert_runs_.data(),
                                   static_cast<int>(expert_runs_.size()),
                                   experts);
    }
    sq[0] = dense[0];
    sq[1] = experts[0] + experts[1];
    sq[2] = dense[1];
  }
  if (store_->sharded() && groups_.dp != nullptr) {
    groups_.dp->AllReduce(sq, 3);
  } else if (groups_.ep != nullptr) {
    // Whole, each ep rank's experts are its own (sharded, the dp group's
    // sum counted each once).
    groups_.ep->AllReduce(&sq[1], 1);
  }
  if (groups_.tp != nullptr && groups_.tp->size() > 1) {
    groups_.tp->AllReduce(sq, 2);
  }
  double total = sq[0] + sq[1] + sq[2];
  if (groups_.pp != nullptr && groups_.pp->size() > 1) {
    groups_.pp->AllReduce(&total, 1);
  }
  return total;
}

void DistributedOptimizer::ReduceTiedEmbedding() {
  // Both ends of the pipeline hold a tied table, or neither does (the
  // model's head is not tied).
  const std::vector<ParamInfo>& layout = store_->layout();
  if (groups_.embedding == nullptr ||
      std::none_of(layout.begin(), layout.end(),
                   [](const ParamInfo& p) { return p.tied; })) {
    return;
  }
  float* grads = store_->update_grads();
  if (!store_->sharded()) {
    // Unsharded, wte on stage 0 and its copy on the last stage have the
    // same local shape and stretch: summing them makes both the gradient of
    // the one tied tensor.
    store_->ForEachUpdateStretch(
        [&](const ParamInfo& p, int64_t lo, int64_t hi, int64_t at) {
          if (p.tied) {
            groups_.embedding->AllReduce(grads + at, hi - lo);
          }
        });
    return;
  }
  // Sharded (ZeRO), the two stages cut wte into different dp shards (it
  // sits at different places of their units): assemble this stage's whole
  // wte gradient over dp, sum it over the embedding group, keep our shard.
  // Every rank of both stages takes part, whether or not its shard holds
  // part of wte.
  int64_t numel = 0;
  for (const ParamInfo& p : layout) {
    if (p.tied) numel = p.numel;
  }
  kernels::Ops& ops = store_->ops();
  if (tied_.size() != numel) tied_ = kernels::Buffer(&ops, numel);
  ops.Zero(tied_.data(), numel);
  store_->ForEachUpdateStretch(
      [&](const ParamInfo& p, int64_t lo, int64_t hi, int64_t at) {
        if (p.tied) ops.Copy(tied_.data() + lo, grads + at, hi - lo);
      });
  if (groups_.dp != nullptr) groups_.dp->AllReduce(tied_.data(), numel);
  groups_.embedding->AllReduce(tied_.data(), numel);
  store_->ForEachUpdateStretch(
      [&](const ParamInfo& p, int64_t lo, int64_t hi, int64_t at) {
        if (p.tied) ops.Copy(grads + at, tied_.data() + lo, hi - lo);
      });
}

UpdateResult DistributedOptimizer::Step(float lr) {
  ReduceSequencePartial();
  ReduceTiedEmbedding();
  UpdateResult r;
  r.grad_norm = std::sqrt(GlobalNormSquared());
  const float scale = ClipScale(r.grad_norm, clip_);
  if (offload_) {
    OffloadedStep(lr, scale);
    return r;
  }
  // Unsharded, the optimizer writes the weights' bf16 compute copy as it
  // updates them; sharded, the store rounds the gathered weights.
  float* params = store_->update_params();
  void* copy = store_->update_weights_copy();
  adam_->Step(params, copy, store_->update_grads(), lr, scale);
  if (copy != nullptr) store_->WeightsCopyWritten();
  store_->GatherUpdatedParams();
  return r;
}

void DistributedOptimizer::OffloadedStep(float lr, float scale) {
  kernels::Ops& device = store_->ops();
  const int64_t n = store_->update_size();
  // First step, or the weights were written since (initialised, loaded):
  // the master copy is taken from them.
  const bool take = store_->params_version() != host_version_;
  // The store makes its bf16 compute copy from what comes back
  // (update_params() counts as a write).
  float* params = store_->update_params();
  const float* grads = store_->update_grads();
  float* host_params = host_params_.data();
  float* host_grads = host_grads_.data();
  if (take) device.ToHost(host_params, params, n);
  // In pieces: every piece's gradients start out at once; each piece is
  // updated on the host once it is there, and its weights go back while
  // the next is updated.
  constexpr int64_t kPieces = 8, kMinPiece = int64_t{1} << 20;
  const int64_t pieces = std::clamp<int64_t>(n / kMinPiece, 1, kPieces);
  auto bound = [&](int64_t i) { return n * i / pieces; };
  std::vector<int64_t> copied(pieces);
  for (int64_t i = 0; i < pieces; ++i) {
    copied[i] = device.ToHostAsync(host_grads + bound(i), grads + bound(i),
                                   bound(i + 1) - bound(i));
  }
  adam_->BeginStep();
  for (int64_t i = 0; i < pieces; ++i) {
    device.WaitCopy(copied[i]);
    adam_->Update(host_params, nullptr, host_grads, bound(i), bound(i + 1), lr,
                  scale);
    device.FromHostAsync(params + bound(i), host_params + bound(i),
                         bound(i + 1) - bound(i));
  }
  device.ComputeAfterCopies();
  store_->GatherUpdatedParams();
  host_version_ = store_->params_version();
}

}  // namespace ptrain
