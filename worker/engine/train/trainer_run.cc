// Trainer::Run: the training loop of a job, with evaluation, sampling and
// checkpoints at the steps the spec asks for; what it reports goes through
// RunReport, its checkpoints and rollbacks through the Checkpointer.
#include <chrono>
#include <string>
#include <thread>

#include "spdlog/spdlog.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {

absl::Status Trainer::Run() {
  if (absl::Status s = report_->Open(); !s.ok()) return s;
  report_->MeasurePeak(compute_ops());
  report_->Start(memory(), model().config(), data_.vocab_size, compute_ops(),
                 graphs_unavailable_, checkpointer_->resumed_from(),
                 checkpointer_->start_step());
  const auto& train = spec_.train();
  for (int64_t s = checkpointer_->start_step(); s < train.steps(); ++s) {
    if (options_.hang_at_step.has_value() && *options_.hang_at_step == s + 1 &&
        options_.hang_rank.value_or(dims_->world_rank()) ==
            dims_->world_rank()) {
      spdlog::warn("test hook: hanging at step {}", s + 1);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const StepResult r = TrainStep(s);
    const int64_t step = s + 1;  // steps completed
    // Before anything reports or saves the step: a bad one never is.
    absl::StatusOr<int64_t> back = checkpointer_->HandleAnomaly(step, r);
    if (!back.ok()) return back.status();
    if (*back >= 0) {
      s = *back - 1;  // the loop goes on at the step after the checkpoint
      continue;
    }
    if (absl::Status st =
            report_->Step(step, r, flops_per_step(), device_ops_ != nullptr);
        !st.ok()) {
      return st;
    }
    if ((train.eval_every() > 0 && step % train.eval_every() == 0) ||
        step == train.steps()) {
      EvaluateAndReport(step);
    }
    if (train.sample_every() > 0 && step % train.sample_every() == 0 &&
        step != train.steps()) {
      SampleAndReport(step);
    }
    // A background save commits at the first step end after every rank
    // has written its shard.
    if (auto st = checkpointer_->CommitBackground(false); !st.ok()) return st;
    // Asked to stop (SIGUSR1 on any rank): this step is saved, here or
    // below, and the run ends after it.
    const bool stop =
        options_.stop_requested != nullptr && step != train.steps() &&
        AnyRankFailed(dims_->world_comm(), options_.stop_requested->load());
    if (absl::Status st = checkpointer_->SaveIfDue(step, stop); !st.ok()) {
      return st;
    }
    if (stop) {
      spdlog::warn("step {:>6} | stopping as asked (a stop signal){}", step,
                   spec_.checkpoint().dir().empty()
                       ? "; no checkpoint.dir, so nothing is saved"
                   : options_.job_uid.empty()
                       ? ", after this step's checkpoint; run again with "
                         "--resume-from latest to go on from it"
                       : ", after this step's checkpoint");
      report_->Emit({{"type", "stop"}, {"step", step}});
      stopped_ = true;
      return absl::OkStatus();
    }
  }
  if (auto st = checkpointer_->CommitBackground(true); !st.ok()) return st;
  SampleAndReport(train.steps());
  // The last record of a run that trained every step: how a coordinator
  // that could not learn the exit code knows the job finished.
  report_->Emit({{"type", "end"}, {"step", train.steps()}});
  return absl::OkStatus();
}

void Trainer::EvaluateAndReport(int64_t step) {
  const EvalResult val = [&] {
    Busy busy = report_->Scope(FlightPhase::kEval, "evaluating");
    return EvaluateSources();
  }();
  report_->Eval(step, val, data_.blend);
}

void Trainer::SampleAndReport(int64_t step) {
  const std::string text = [&] {
    Busy busy = report_->Scope(FlightPhase::kSample, "sampling");
    return sampler_->Sample(static_cast<uint64_t>(step));
  }();
  report_->Sample(step, text);
}

}  // namespace ptrain
