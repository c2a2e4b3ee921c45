// The training loop of one job: builds data, the model stage, its ZeRO store
// and the optimizer from a JobSpec and the parallel plan, then steps,
// evaluates, samples and logs. Tensor (and sequence) parallelism lives in
// the stage's layers, data parallelism and ZeRO in its UnitStore (ZeroStore)
// and the DistributedOptimizer; every rank runs the same loop, rank 0 writes
// the logs.
#ifndef PTRAIN_WORKER_ENGINE_TRAIN_TRAINER_H_
#define PTRAIN_WORKER_ENGINE_TRAIN_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "ptrain/v1/job.pb.h"
#include "worker/engine/data/data.h"
#include "worker/engine/data/step_feed.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/parallel/optimizer.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/parallel/pipeline_runtime.h"
#include "worker/engine/parallel/rank_build.h"
#include "worker/engine/parallel/schedule.h"
#include "worker/engine/parallel/zero_store.h"
#include "worker/engine/train/checkpointer.h"
#include "worker/engine/train/run_report.h"
#include "worker/engine/train/text_sampler.h"
#include "worker/engine/train/train_options.h"

namespace ptrain {

class Trainer {
 public:
  // Loads the data, checks that the model fits in memory
  // (memory_estimate.h) and builds it; a bad spec or bad data is
  // InvalidArgument/NotFound naming the field, a model that does not fit
  // ResourceExhausted naming the fields that size it, a damaged checkpoint
  // DataLoss. Writes nothing. `dims` (not owned, may be null for a single
  // rank without MPI: the trainer makes a mesh of one) gives the groups;
  // every rank returns an error if any rank fails.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const v1::JobSpec& spec, const TrainerOptions& options,
      ParallelDims* dims = nullptr);
  // Create for one rank on the CPU (spec's world size 1, device cpu) over
  // `data` as given instead of spec.data's files, which it neither reads
  // nor checks: for what draws no batch, such as sampling from the
  // options.resume_from checkpoint with the vocabulary it records (each
  // split must still hold one sequence of block_size + 1 tokens). No
  // memory check; InvalidArgument for another layout or device.
  static absl::StatusOr<std::unique_ptr<Trainer>> CreateWithData(
      const v1::JobSpec& spec, const TrainerOptions& options, TokenData data);
  ~Trainer();

  // Trains train.steps steps with evaluation and sampling, writing the run
  // log (opened here, after every check has passed).
  absl::Status Run();

  // One optimizer step (0-based index) over the global batch of that step.
  StepResult TrainStep(int64_t step);
  // Mean loss over train.eval_batches fixed validation batches (of each
  // blend source).
  EvalResult EvaluateSources();
  float Evaluate() { return EvaluateSources().loss; }

  // Its checkpoints (resume, saves, rollbacks), its samples and its data.
  Checkpointer& checkpoints() { return *checkpointer_; }
  TextSampler& sampler() { return *sampler_; }
  StepFeed& feed() { return *feed_; }
  // Run returned early, at options.stop_requested, after the step's
  // checkpoint.
  bool stopped() const { return stopped_; }

  void set_metrics(RankMetrics* metrics) { options_.metrics = metrics; }

  // The rank's first model chunk: its whole stage, but under an
  // interleaved schedule, where the rank holds `chunks()` of them.
  GptStage& model() { return *chunks_.front(); }
  int chunks() const { return static_cast<int>(chunks_.size()); }
  ZeroStore& store() { return *store_; }
  DistributedOptimizer& optimizer() { return *optimizer_; }
  bool is_log_rank() const { return dims_->world_rank() == 0; }
  const TokenData& data() const { return data_; }
  MemoryBytes memory() const;
  double flops_per_step() const;
  // Recorded passes (train.cuda_graphs) over the rank's chunks.
  GptStage::GraphCounts graph_counts() const;

 private:
  // `dims` is not null; gpu: the rank's GPU where resources.device is cuda
  // (else -1).
  Trainer(const v1::JobSpec& spec, const TrainerOptions& options,
          TokenData data, ParallelDims* dims, int gpu);
  // Builds the rank's chunks over slices of the store (`layout`: the plan's
  // tensors of this rank), and the pipeline that runs them.
  void BuildChunks(const std::vector<ParamInfo>& layout);
  // The parts of the run that use the model: the step feed, the
  // checkpoints and the sampler.
  void BuildRunParts();
  // Sum over the ranks holding the same weights, dp × cp (identity on
  // one).
  double SumOverReplicas(double x);
  // Run's evaluation and sample after step `step`, with their reports.
  void EvaluateAndReport(int64_t step);
  void SampleAndReport(int64_t step);
  // What the model computes on: the GPU backend, the CPU's with bf16
  // matmuls (train.precision=bf16 on cpu), or null for the fp32 CPU.
  kernels::Ops* compute_ops() const {
    if (device_ops_ != nullptr) return device_ops_.get();
    return build_.precision == Precision::kBf16 ? &kernels::CpuBf16Ops()
                                                : nullptr;
  }

  const v1::JobSpec spec_;
  TrainerOptions options_;
  TokenData data_;
  // The mesh of one Create made when it was given none; dims_ is it or
  // the caller's (never null).
  std::unique_ptr<ParallelDims> own_dims_;
  ParallelDims* dims_;
  // What this rank builds, resolved from the spec and dims_.
  const RankBuild build_;
  // resources.device=cuda: the GPU backend everything below runs on (null:
  // the CPU); declared first so that it outlives their buffers.
  std::unique_ptr<kernels::Ops> device_ops_;
  std::unique_ptr<ZeroStore> store_;
  // The model chunks of this rank (one but under an interleaved schedule),
  // each over its slice of the store.
  std::vector<std::unique_ptr<UnitStoreSlice>> slices_;
  std::vector<std::unique_ptr<GptStage>> chunks_;
  // Why train.cuda_graphs (on or auto) leaves this rank's passes op by op:
  // the job's (CudaGraphsUnsupported) or else the backend's
  // (Ops::CaptureUnsupported); "" when they are recorded or graphs are off.
  // The one place the decision is made (`on` where the job cannot be
  // recorded never gets here: validation and Create refuse it).
  std::string graphs_unavailable_;
  // This rank's passes of an optimizer step: the schedule's order, or
  // F0 B0 F1 B1 … without a pipeline.
  std::vector<PipeAction> order_;
  std::unique_ptr<PipelineRuntime> runtime_;
  std::unique_ptr<DistributedOptimizer> optimizer_;
  std::unique_ptr<StepFeed> feed_;
  std::unique_ptr<RunReport> report_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<TextSampler> sampler_;
  bool stopped_ = false;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_TRAIN_TRAINER_H_
