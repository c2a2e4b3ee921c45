// The training loop of one job: builds data, the model stage, its ZeRO store
// and the optimizer from a JobSpec and the parallel plan, then steps,
// evaluates, samples and logs. Tensor (and sequence) parallelism lives in
// the stage's layers, data parallelism and ZeRO in its UnitStore (ZeroStore)
// and the DistributedOptimizer; every rank runs the same loop, rank 0 writes
// the logs.
#ifndef PTRAIN_WORKER_ENGINE_TRAINER_H_
#define PTRAIN_WORKER_ENGINE_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/confined_fs.h"
#include "kernels/ops.h"
#include "nlohmann/json.hpp"
#include "ptrain/v1/job.pb.h"
#include "worker/engine/anomaly.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/data.h"
#include "worker/engine/gpt_stage.h"
#include "worker/engine/metrics.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/parallel_dims.h"
#include "worker/engine/pipeline_runtime.h"
#include "worker/engine/rank_build.h"
#include "worker/engine/rank_step.h"
#include "worker/engine/runlog.h"
#include "worker/engine/schedule.h"
#include "worker/engine/zero_store.h"

namespace ptrain {

struct TrainerOptions {
  std::string log_json_path;  // "" for no run log
  double peak_flops = 0.0;    // MFU denominator; 0 measures sgemm at start
  bool quiet = false;         // no per-step lines on stderr
  // Called on rank 0 with every run-log record (docs/run-log.md) as it is
  // written: how ptworker reports progress to the coordinator.
  std::function<void(const nlohmann::json&)> on_record;
  // Called on every rank with what the rank is busy with between steps for
  // a while ("writing a checkpoint", "evaluating"), then with "" when it is
  // done (ProgressReporter::SetActivity).
  std::function<void(const std::string&)> on_activity;
  // Called on every rank at the end of each step it completes (before
  // evaluation and checkpoints), with the step's times and the rank's
  // running communication totals by group: how each rank tells the
  // coordinator its step times (ProgressReporter::OnRankStep).
  std::function<void(const RankStep&)> on_rank_step;
  // "" (start fresh), "latest" (newest intact checkpoint of this model and
  // data under checkpoint.dir, falling back past damaged ones and skipping
  // other models' and data's; fresh if there is none; one of another job
  // is refused) or a checkpoint folder (must load, or Create fails).
  std::string resume_from;
  // With resume_from "latest": the checkpoint folder (another job's:
  // ptctl submit --from) to go on from when checkpoint.dir holds none of
  // this run's yet, loaded as a named folder is (weights, optimizer, step;
  // the data and schedule may differ). "" for none.
  std::string fork_from;
  SaveOptions save;  // test hooks (keep_last and fs come from spec and fs)
  // Every data file, checkpoint file and folder and model.init_from is
  // opened through this (confined to $PTRAIN_DATA_ROOTS under ptcoord).
  ConfinedFs fs;
  // The coordinator's unique id of this job ($PTRAIN_JOB_UID), recorded in
  // every checkpoint; "latest" refuses a checkpoint with another one. ""
  // (standalone): the run takes the id of the checkpoint it resumes, else
  // a new one (NewRunUid).
  std::string job_uid;
  // A checkpoint.dir holding another run's checkpoint at a step this run
  // would save (a step it cannot save, as a run never overwrites another's):
  // false, a warning at start and a failed save when the step comes; true
  // (ptworker), Create refuses the run (FailedPrecondition) before it
  // trains, so that no work is lost to it.
  bool refuse_other_runs_steps = false;
  // Ranks of this job on this machine, and the memory they may use (unset:
  // MemAvailable). Create refuses a job whose estimate does not fit.
  int ranks_on_node = 1;
  std::optional<int64_t> memory_bytes;
  // A GPU job: the memory of the rank's GPU (unset: what the GPU reports;
  // not checked where ranks share a GPU, PTRAIN_CUDA_SHARE_GPUS).
  std::optional<int64_t> gpu_memory_bytes;
  // Test hook, set only from the environment: at this step (1-based) the
  // loop stops making progress — on the world rank hang_rank alone when
  // that is set (the others then wait for it in their next collective).
  std::optional<int64_t> hang_at_step;
  std::optional<int64_t> hang_rank;
  // Test hook, set only from the environment: the loss of this step
  // (1-based) reads as NaN to the anomaly guard, the first time the run
  // reaches it.
  std::optional<int64_t> nan_at_step;
  // Prometheus metrics of this rank (not owned; null for none).
  RankMetrics* metrics = nullptr;
  // Set (by a signal handler) to ask the run to stop: at the end of the
  // step during which any rank saw it set, every rank saves a checkpoint
  // of that step (when checkpoint.dir is set) and Run returns with
  // stopped() true. Not owned; null: never (and no per-step agreement).
  const std::atomic<bool>* stop_requested = nullptr;
};

struct StepResult {
  float loss = 0.0f;
  double lr = 0.0;
  double grad_norm = 0.0;
  double seconds = 0.0;
  PhaseSeconds phases;  // backward includes waiting for gradient reductions
  // Of `seconds`: waiting for communication meant to be hidden (the data-
  // parallel gradient reductions; on a GPU, the compute stream's stalls on
  // them, recorded once the GPU has passed them, so they may fall in a
  // later step's).
  double comm_exposed = 0.0;
};

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
  // Mean loss over train.eval_batches fixed validation batches.
  float Evaluate();
  // How Sample computes each token's logits.
  enum class SampleMode {
    // The context is the last tokens, at most block_size of them; when it
    // is full it restarts from its last block_size/2. Each token costs one
    // position's forward (GptStage::Decode) plus, at a restart, the kept
    // half's.
    kKvCache,
    // The same contexts, recomputed whole for every token: the same tokens,
    // up to rounding (for tests and benchmarks).
    kRecompute,
    // The sampler without a cache: the last block_size tokens recomputed
    // for every token, the window sliding by one (for benchmarks).
    kSlidingWindow,
  };
  // Text generated from train.sample_prompt; `salt` varies the draw.
  std::string Sample(uint64_t salt, SampleMode mode = SampleMode::kKvCache);

  // Writes a checkpoint of the state after `step` steps (collective),
  // after committing a background save still pending.
  absl::StatusOr<std::string> SaveCheckpointAt(int64_t step);
  // The same written in the background (checkpoint.async_save): copies the
  // state, starts the write and returns; Run commits it at a later step.
  // True when the step was committed already (nothing pending).
  absl::StatusOr<bool> StartCheckpointAt(int64_t step);
  // Collective: commits the pending background save, waiting for this
  // rank's write. Returns the folder.
  absl::StatusOr<std::string> FinishBackgroundCheckpoint() {
    return background_save_.Finish(world());
  }
  bool background_checkpoint_pending() const {
    return background_save_.pending();
  }
  // Steps already done when Run starts (from a resumed checkpoint).
  int64_t start_step() const { return start_step_; }
  // Steps of data skipped (rollbacks): step s trains on the batch of
  // s + skipped_steps(). SkipData(n) skips n more, from the next step on.
  int64_t skipped_steps() const { return data_skip_; }
  void SkipData(int64_t steps) { data_skip_ += steps; }
  // Run returned early, at options.stop_requested, after the step's
  // checkpoint.
  bool stopped() const { return stopped_; }
  // Checkpoint bytes this rank read when resuming.
  int64_t resume_bytes_read() const { return resume_bytes_read_; }

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
  // Sum over the ranks holding the same weights, dp × cp (identity on
  // one).
  double SumOverReplicas(double x);
  // Microbatch `first`.. of `sampler`'s batch `batch` into `inputs` and
  // `targets` (micro_B · T_local each): under context parallelism this
  // rank's zigzag positions of each sequence.
  void FillMicrobatch(BatchSampler& sampler, int64_t batch, int first,
                      int32_t* inputs, int32_t* targets);
  // The world group; null on one rank.
  Communicator* world() const { return dims_->world_comm(); }
  FlightRecorder* recorder() const { return dims_->flight_recorder(); }
  bool last_stage() const { return dims_->pp_rank() == build_.pp - 1; }
  // The first sequence of microbatch `mb` in the global batch: dp rank r
  // takes the r-th block of microbatches·micro_B sequences.
  int FirstSequence(int mb) const {
    return (dims_->dp_rank() * build_.microbatches + mb) * build_.micro_B;
  }
  // Run's parts (trainer_run.cc): the run log (opened on rank 0; a sink
  // that drops records elsewhere) and each record written to it, MFU's
  // denominator, the records and lines at the start and of each step,
  // evaluation and sampling with their reports, and the checkpoint of a
  // step when it is due (`stop`: asked to stop after this step).
  absl::Status OpenRunLog();
  void Emit(const nlohmann::json& record);
  double MatmulPeak();
  void ReportStart();
  absl::Status ReportStep(int64_t step, const StepResult& r);
  void EvaluateAndReport(int64_t step);
  void SampleAndReport(int64_t step);
  absl::Status CheckpointIfDue(int64_t step, bool stop);
  // Commits the pending background save and reports it.
  absl::Status FinishBackgroundAndReport();
  // `blocked`: seconds the loop waited for this save; `written`: for a
  // background save, seconds its thread took to write this rank's shard.
  void ReportCheckpoint(int64_t step, const std::string& dir, double blocked,
                        std::optional<double> written);

  // Loads weights from model.init_from, then the resume_from checkpoint;
  // sets run_uid_ and warns of another run's checkpoints where this run
  // will save.
  absl::Status LoadInitialState();
  // Loads the resume_from checkpoint, if any (docs/checkpoints.md, Loading).
  absl::Status Resume();
  // Loads the first of `candidates` (folders, newest first) that loads:
  // with `latest`, past damaged ones and ones of another model or data;
  // else the first must. OK with nothing loaded when none fits and none
  // was damaged.
  absl::Status LoadNewestOf(const std::vector<std::string>& candidates,
                            bool latest);
  // train.anomaly after step `step` (1-based) trained with result `r`:
  // -1 to go on, else the step the run rolled back to (the newest
  // checkpoint's, its data since skipped); an error stops the run.
  absl::StatusOr<int64_t> HandleAnomaly(int64_t step, const StepResult& r);
  absl::StatusOr<int64_t> RollBack(int64_t step, const std::string& kind,
                                   const std::string& reason);
  // What loading one of Resume's candidates found: `fatal`, no other
  // candidate may be tried; `other`, it is another model's or data's.
  struct ResumeCandidate {
    bool fatal = false, other = false;
    int64_t step = 0, opt_step = 0, skipped_steps = 0;
    std::string owner;  // its job_uid
  };
  // Loads checkpoint `dir` into the state (this rank's part; `field` names
  // where it came from in errors). `latest`: Resume is looking for the
  // newest that fits, not loading a named one.
  absl::Status LoadCandidate(const std::string& dir, bool latest,
                             const std::string& field, ResumeCandidate* c);

  const v1::JobSpec spec_;
  TrainerOptions options_;
  TokenData data_;
  // The mesh of one Create made when it was given none; dims_ is it or
  // the caller's (never null).
  std::unique_ptr<ParallelDims> own_dims_;
  ParallelDims* dims_;
  // What this rank builds, resolved from the spec and dims_.
  const RankBuild build_;
  int64_t start_step_ = 0, resume_bytes_read_ = 0;
  std::string resumed_from_;  // the checkpoint directory resumed from, if any
  // Whose checkpoints this run writes and prunes (CheckpointMeta::job_uid).
  std::string run_uid_;
  // resources.device=cuda: the GPU backend everything below runs on (null:
  // the CPU); declared first so that it outlives their buffers.
  std::unique_ptr<kernels::Ops> device_ops_;
  // What the model computes on: the GPU backend, the CPU's with bf16
  // matmuls (train.precision=bf16 on cpu), or null for the fp32 CPU.
  kernels::Ops* compute_ops() const {
    if (device_ops_ != nullptr) return device_ops_.get();
    return build_.precision == Precision::kBf16 ? &kernels::CpuBf16Ops()
                                                : nullptr;
  }
  std::vector<float> checkpoint_host_;  // a GPU's state copied for saving
  // checkpoint.async_save: the save being written, and the seconds the
  // loop was blocked starting it.
  BackgroundSave background_save_;
  // train.anomaly: the guard, the rollbacks made, the data skipped by them
  // (CheckpointMeta::skipped_steps), whether the NaN test hook fired.
  AnomalyGuard anomaly_guard_;
  CheckpointLineage lineage_;  // what a rollback may return to
  int rollbacks_ = 0;
  int64_t data_skip_ = 0;
  bool nan_injected_ = false;
  double background_blocked_ = 0;
  bool stopped_ = false;
  std::unique_ptr<RunLog> run_log_;
  double peak_flops_ = 0;  // the matmul peak of one rank (Run)
  bool mfu_warned_ = false;
  // Commits a background save still pending (unreported: Run reports
  // its own before it gets here).
  absl::Status CommitPendingSave();
  CheckpointMeta CheckpointMetaAt(int64_t step) const;
  SaveOptions CheckpointSaveOptions() const;
  // This rank's state as checkpoint runs (into the live state on the CPU).
  std::vector<ShardRun> CheckpointRunsNow();
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
  std::unique_ptr<BatchSampler> train_sampler_, val_sampler_;
  // Every microbatch's tokens of a step (microbatch mb at
  // mb·micro_B·T_local); evaluation uses the first microbatch's room.
  std::vector<int32_t> inputs_, targets_;
  // cp > 1: one microbatch's whole sequences, before FillMicrobatch takes
  // this rank's positions.
  std::vector<int32_t> whole_inputs_, whole_targets_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_TRAINER_H_
