// AdamW over a slice of the flat parameter buffer, the learning-rate schedule
// and global-norm clipping. A slice (not the whole model) so that ZeRO ranks
// update only their shard with the same code.
#ifndef PTRAIN_WORKER_ENGINE_PARALLEL_OPTIMIZER_H_
#define PTRAIN_WORKER_ENGINE_PARALLEL_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "ptrain/v1/job.pb.h"
#include "worker/engine/comm/comm.h"
#include "worker/engine/model/plan.h"

namespace ptrain {

// Learning rate of 0-based step `step`: linear warmup to train.lr over
// warmup_steps, then train.lr_schedule: cosine or linear decay to
// train.min_lr at the last step, constant, or wsd (constant until the last
// decay_fraction of train.steps, then linear to min_lr). A function of the
// spec and the step alone, so a resumed run continues it exactly.
double LearningRate(const v1::TrainSpec& train, int64_t step);

// Factor that brings a gradient of global L2 norm `norm` down to `max_norm`
// (1 when it is already within, or when clipping is off: max_norm <= 0).
float ClipScale(double norm, double max_norm);

class AdamW {
 public:
  // Owns the moments of elements [begin, end) of a buffer laid out by
  // `layout`; decay applies to tensors with ParamInfo::decay.
  AdamW(const std::vector<ParamInfo>& layout, int64_t begin, int64_t end,
        const v1::TrainSpec& train, kernels::Ops* ops = nullptr);
  // Owns the moments of a shard made of `pieces`: [begin, end) ranges of the
  // buffer, concatenated in order. Elements outside every tensor (padding)
  // are never updated.
  AdamW(const std::vector<ParamInfo>& layout,
        const std::vector<std::pair<int64_t, int64_t>>& pieces,
        const v1::TrainSpec& train, kernels::Ops* ops = nullptr);

  // One update of params[begin,end) from grads[begin,end) (pointers to the
  // start of the slice), gradients multiplied by grad_scale first.
  // params_bf16, when not null, is the slice's bf16 compute copy (same
  // indices): written in the same pass (Ops::adamw_update_runs).
  void Step(float* params, void* params_bf16, const float* grads, float lr,
            float grad_scale);
  // The same step in pieces: BeginStep once, then Update over [lo, hi) of
  // the slice (indices of Step's pointers) until every element has had one
  // — bit for bit Step's result, in any order of pieces.
  void BeginStep() { ++t_; }
  void Update(float* params, void* params_bf16, const float* grads, int64_t lo,
              int64_t hi, float lr, float grad_scale);

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }  // resuming from a checkpoint
  int64_t bytes() const {
    return (m_.size() + v_.size()) * static_cast<int64_t>(sizeof(float));
  }
  // The moments, in the backend's memory (`ops`, null: the CPU).
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  kernels::Ops& ops() const { return *ops_; }
  int64_t size() const { return m_.size(); }

 private:
  // The stretches of the slice with one decay setting each (tag 1: decay),
  // in order.
  std::vector<kernels::Ops::Run> runs_;
  kernels::Ops* ops_;
  kernels::Buffer m_, v_;
  const float beta1_, beta2_, eps_, weight_decay_;
  int64_t t_ = 0;
};

class ZeroStore;

struct UpdateResult {
  double grad_norm = 0.0;  // global, before clipping
};

// The optimizer step of one rank of any layout: AdamW on what its ZeroStore
// says it updates (everything at zero 0, its shard from zero 1), after
// global-norm clipping in which every element of the model counts exactly
// once — shards summed over dp, tensor-parallel parts summed over tp while
// tp-replicated tensors (LayerNorm, biases of row-parallel layers, wpe)
// count once, stages summed over pp. Under sequence parallelism the
// gradients of sequence-partial tensors are first summed over tp.
class DistributedOptimizer {
 public:
  // The mesh's groups (ParallelDims::compute_groups).
  using Groups = ComputeGroups;
  // `store` is not owned and outlives the optimizer. offload (ZeRO-Offload,
  // parallel.offload=optimizer): the moments and an fp32 master copy of
  // what the store updates are kept in host memory and AdamW runs on the
  // CPU cores; each step copies the gradients to the host and the updated
  // weights back (the store's buffers stay where its backend keeps them).
  DistributedOptimizer(ZeroStore* store, const v1::TrainSpec& train,
                       Groups groups, bool offload = false);

  // One step at learning rate lr; the weights are whole again afterwards.
  UpdateResult Step(float lr);

  AdamW& adam() { return *adam_; }
  const AdamW& adam() const { return *adam_; }
  // Adam's moments, and offloaded the host's master weights and
  // gradients too.
  int64_t bytes() const {
    return adam_->bytes() + (host_params_.size() + host_grads_.size()) *
                                static_cast<int64_t>(sizeof(float));
  }

 private:
  // Sums over tp the gradients each tp rank holds part of: the
  // sequence-partial ones under sp, tensors replicated over tp that each
  // rank uses a part of (ParamInfo::tp_partial) always.
  void ReduceSequencePartial();
  // pp > 1: wte's gradient summed over stage 0 and the last stage.
  void ReduceTiedEmbedding();
  double GlobalNormSquared();

  // The AdamW step of offload: on the host's copies.
  void OffloadedStep(float lr, float scale);

  ZeroStore* const store_;
  const Groups groups_;
  const double clip_;
  const bool offload_;
  std::unique_ptr<AdamW> adam_;
  // offload: the master weights and the gradients of what the store
  // updates, in host memory; the store's version of its weights the
  // master copy was last made from or written to (another writer, such as
  // a checkpoint load, makes the next step copy them in again).
  kernels::HostBuffer host_params_, host_grads_;
  int64_t host_version_ = -1;
  // In the store's backend memory: the sequence-partial gradients, for one
  // all-reduce; the whole wte gradient (pp > 1, ZeRO).
  kernels::Buffer pack_;
  kernels::Buffer tied_;
  // The gradient norm's stretches (tag 1: tp-replicated), in the order of
  // ForEachUpdateStretch, the routed experts' apart; built at the first norm.
  std::vector<kernels::Ops::Run> norm_runs_, expert_runs_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_PARALLEL_OPTIMIZER_H_
