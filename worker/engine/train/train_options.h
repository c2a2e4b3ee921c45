// What a training run is given besides its spec (TrainerOptions: hooks,
// paths, test hooks) and what one optimizer step returns (StepResult).
#ifndef PTRAIN_WORKER_ENGINE_TRAIN_TRAIN_OPTIONS_H_
#define PTRAIN_WORKER_ENGINE_TRAIN_TRAIN_OPTIONS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/confined_fs.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/data/step_feed.h"
#include "worker/engine/report/expert_load.h"
#include "worker/engine/report/metrics.h"
#include "worker/engine/report/rank_step.h"

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
  ExpertLoad experts;  // a Mixture-of-Experts model's routing
  // The blend sources whose data began another epoch in this step.
  std::vector<StepFeed::EpochBegun> epochs_begun;
};

// A validation pass: the loss of the data (a blend's: the sources' weighted
// by their shares) and each source's (data.blend; else empty).
struct EvalResult {
  float loss = 0.0f;
  std::vector<float> sources;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_TRAIN_TRAIN_OPTIONS_H_
