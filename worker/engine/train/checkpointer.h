// A run's checkpoints: where it starts (model.init_from, then the
// resume_from checkpoint, newest first and falling back past damaged ones,
// else the --from job's), its saves (in the loop or in the background,
// checkpoint.async_save, when due or when asked to stop), and the anomaly
// guard's rollbacks to an earlier checkpoint of this run with the data
// since skipped (train.anomaly). docs/checkpoints.md says what is saved.
#ifndef PTRAIN_WORKER_ENGINE_TRAIN_CHECKPOINTER_H_
#define PTRAIN_WORKER_ENGINE_TRAIN_CHECKPOINTER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ptrain/v1/job.pb.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/data/data.h"
#include "worker/engine/data/step_feed.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/parallel/optimizer.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/parallel/rank_build.h"
#include "worker/engine/parallel/zero_store.h"
#include "worker/engine/train/anomaly.h"
#include "worker/engine/train/run_report.h"
#include "worker/engine/train/train_options.h"

namespace ptrain {

class Checkpointer {
 public:
  // The state it saves and loads, and where it reports; not owned.
  struct State {
    ZeroStore* store = nullptr;
    DistributedOptimizer* optimizer = nullptr;
    const GptConfig* model = nullptr;
    StepFeed* feed = nullptr;  // the data skipped (CheckpointMeta)
    RunReport* report = nullptr;
  };
  Checkpointer(const v1::JobSpec& spec, const TrainerOptions& options,
               ParallelDims* dims, const RankBuild& build,
               const TokenData& data, State state);

  // Loads weights from model.init_from, then the resume_from checkpoint;
  // sets the run's uid and warns of (or, options.refuse_other_runs_steps,
  // refuses) another run's checkpoints where this run will save.
  absl::Status LoadInitialState();

  // Writes a checkpoint of the state after `step` steps (collective),
  // after committing a background save still pending.
  absl::StatusOr<std::string> SaveCheckpointAt(int64_t step);
  // The same written in the background (checkpoint.async_save): copies the
  // state, starts the write and returns. True when the step was committed
  // already (nothing pending).
  absl::StatusOr<bool> StartCheckpointAt(int64_t step);
  // Collective: commits the pending background save, waiting for this
  // rank's write. Returns the folder.
  absl::StatusOr<std::string> FinishBackgroundCheckpoint();
  bool background_checkpoint_pending() const {
    return background_save_.pending();
  }

  // The loop's part, after step `step` (1-based) trained with result `r`:
  // -1 to go on, else the step the run rolled back to (the newest
  // checkpoint's, its data since skipped); an error stops the run.
  absl::StatusOr<int64_t> HandleAnomaly(int64_t step, const StepResult& r);
  // Commits a background save once every rank has written its shard
  // (`all_ranks`: commit it whatever they have written), and reports it.
  absl::Status CommitBackground(bool all_ranks);
  // Saves step `step` when checkpoint.every, the last step or `stop`
  // (asked to stop after it) says so, and reports it.
  absl::Status SaveIfDue(int64_t step, bool stop);

  // Steps already done when the run starts (from a resumed checkpoint).
  int64_t start_step() const { return start_step_; }
  const std::string& resumed_from() const { return resumed_from_; }
  // Checkpoint bytes this rank read when resuming.
  int64_t resume_bytes_read() const { return resume_bytes_read_; }

 private:
  // What loading one of Resume's candidates found: `fatal`, no other
  // candidate may be tried; `other`, it is another model's or data's.
  struct Candidate {
    bool fatal = false, other = false;
    int64_t step = 0, opt_step = 0, skipped_steps = 0;
    std::string owner;  // its job_uid
  };
  Communicator* world() const { return dims_->world_comm(); }
  // Loads the resume_from checkpoint, if any (docs/checkpoints.md, Loading).
  absl::Status Resume();
  // Loads the first of `candidates` (folders, newest first) that loads:
  // with `latest`, past damaged ones and ones of another model or data;
  // else the first must. OK with nothing loaded when none fits and none
  // was damaged.
  absl::Status LoadNewestOf(const std::vector<std::string>& candidates,
                            bool latest);
  // Loads checkpoint `dir` into the state (this rank's part; `field` names
  // where it came from in errors). `latest`: Resume is looking for the
  // newest that fits, not loading a named one.
  absl::Status LoadCandidate(const std::string& dir, bool latest,
                             const std::string& field, Candidate* c);
  absl::StatusOr<int64_t> RollBack(int64_t step, const std::string& kind,
                                   const std::string& reason);
  // Commits the pending background save and reports it.
  absl::Status FinishBackgroundAndReport();
  // Commits a background save still pending (unreported).
  absl::Status CommitPendingSave();
  void Report(int64_t step, const std::string& dir, double blocked,
              std::optional<double> written);
  CheckpointMeta MetaAt(int64_t step) const;
  SaveOptions SaveOptionsNow() const;
  // This rank's state as checkpoint runs (into the live state on the CPU).
  std::vector<ShardRun> RunsNow();

  const v1::JobSpec& spec_;
  const TrainerOptions& options_;
  ParallelDims* dims_;
  const RankBuild& build_;
  const TokenData& data_;
  const State state_;
  int64_t start_step_ = 0, resume_bytes_read_ = 0;
  std::string resumed_from_;  // the checkpoint directory resumed from, if any
  // Whose checkpoints this run writes and prunes (CheckpointMeta::job_uid).
  std::string run_uid_;
  std::vector<float> host_;  // a GPU's state copied for saving
  // checkpoint.async_save: the save being written, and the seconds the
  // loop was blocked starting it.
  BackgroundSave background_save_;
  double background_blocked_ = 0;
  // train.anomaly: the guard, the rollbacks made, whether the NaN test
  // hook fired; what a rollback may return to.
  AnomalyGuard anomaly_guard_;
  int rollbacks_ = 0;
  bool nan_injected_ = false;
  CheckpointLineage lineage_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_TRAIN_CHECKPOINTER_H_
