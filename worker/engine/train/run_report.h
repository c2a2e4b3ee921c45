// What a training run reports as it goes: the run log's records
// (docs/run-log.md, written on rank 0 and handed to options.on_record), the
// log lines, the rank's metrics and step times, and what the rank is busy
// with between steps (Busy). The Trainer and the Checkpointer report
// through it.
#ifndef PTRAIN_WORKER_ENGINE_TRAIN_RUN_REPORT_H_
#define PTRAIN_WORKER_ENGINE_TRAIN_RUN_REPORT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "nlohmann/json.hpp"
#include "ptrain/v1/job.pb.h"
#include "worker/engine/comm/flight_recorder.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/parallel/rank_build.h"
#include "worker/engine/report/runlog.h"
#include "worker/engine/train/train_options.h"

namespace ptrain {

// Tells options.on_activity what the rank is busy with while it lives
// (scopes of it do not nest), and the flight recorder the phase it is in.
class Busy {
 public:
  Busy(const TrainerOptions& options, FlightRecorder* recorder,
       FlightPhase phase, const char* what);
  ~Busy();
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  const TrainerOptions& options_;
};

class RunReport {
 public:
  // None of the arguments is owned; all outlive the report.
  RunReport(const v1::JobSpec& spec, const TrainerOptions& options,
            ParallelDims* dims, const RankBuild& build);

  // Opens the run log on rank 0 (a sink that drops records elsewhere).
  absl::Status Open();
  // Writes one record (rank 0) and hands it to options.on_record.
  void Emit(const nlohmann::json& record);
  // A scope busy with `what` in `phase`.
  Busy Scope(FlightPhase phase, const char* what) const {
    return Busy(options_, dims_->flight_recorder(), phase, what);
  }

  // MFU's denominator, one rank's matmul peak: options.peak_flops, else
  // the measured peak of `compute` (null: the CPU's sgemm), cached.
  void MeasurePeak(kernels::Ops* compute);
  // The records and lines at the start of a run: the model, memory, the
  // layout, the checkpoint resumed from ("" for none) at `start_step`.
  void Start(const MemoryBytes& mem, const GptConfig& model, int vocab_size,
             kernels::Ops* compute, const std::string& graphs_unavailable,
             const std::string& resumed_from, int64_t start_step);
  // The record, line and metrics of step `step` (1-based) with result `r`
  // and the model FLOPs of a step; `gpu`: read the GPU's memory. An error
  // where the loss is not finite.
  absl::Status Step(int64_t step, const StepResult& r, double flops_per_step,
                    bool gpu);
  // A validation pass; `blend` names a blend's sources (empty: none).
  void Eval(int64_t step, const EvalResult& val,
            const std::vector<BlendPart>& blend);
  void Sample(int64_t step, const std::string& text);
  // A committed checkpoint: `blocked`, seconds the loop waited for it;
  // `written`, a background save's seconds to write this rank's shard.
  void Checkpoint(int64_t step, const std::string& dir, double blocked,
                  std::optional<double> written);

 private:
  bool log_rank() const { return dims_->world_rank() == 0; }
  // A Mixture-of-Experts step's load: metrics each step, the run log's
  // experts record and a line on `logged` steps.
  void Experts(int64_t step, const ExpertLoad& load, bool logged);

  const v1::JobSpec& spec_;
  const TrainerOptions& options_;
  ParallelDims* dims_;
  const RankBuild& build_;
  std::unique_ptr<RunLog> run_log_;
  double peak_flops_ = 0;
  bool mfu_warned_ = false;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_TRAIN_RUN_REPORT_H_
