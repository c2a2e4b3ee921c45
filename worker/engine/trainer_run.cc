// Trainer::Run: the training loop of a job and what it reports — the run
// log's records, the log lines, the rank's metrics — with evaluation,
// sampling and checkpoints at the steps the spec asks for.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/ops_cuda.h"
#include "spdlog/spdlog.h"
#include "worker/engine/flops.h"
#include "worker/engine/trainer.h"

namespace ptrain {

namespace {

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Tells options.on_activity what the rank is busy with while it lives
// (scopes of it do not nest), and the flight recorder the phase it is in.
class Busy {
 public:
  Busy(const TrainerOptions& options, FlightRecorder* recorder,
       FlightPhase phase, const char* what)
      : options_(options) {
    if (recorder != nullptr) recorder->Enter(phase);
    if (options_.on_activity) options_.on_activity(what);
  }
  ~Busy() {
    if (options_.on_activity) options_.on_activity("");
  }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  const TrainerOptions& options_;
};

}  // namespace

absl::Status Trainer::Run() {
  if (absl::Status s = OpenRunLog(); !s.ok()) return s;
  peak_flops_ = MatmulPeak();
  ReportStart();
  const auto& train = spec_.train();
  for (int64_t s = start_step_; s < train.steps(); ++s) {
    if (options_.hang_at_step.has_value() && *options_.hang_at_step == s + 1 &&
        options_.hang_rank.value_or(dims_->world_rank()) ==
            dims_->world_rank()) {
      spdlog::warn("test hook: hanging at step {}", s + 1);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const StepResult r = TrainStep(s);
    const int64_t step = s + 1;  // steps completed
    // Before anything reports or saves the step: a bad one never is.
    absl::StatusOr<int64_t> back = HandleAnomaly(step, r);
    if (!back.ok()) return back.status();
    if (*back >= 0) {
      s = *back - 1;  // the loop goes on at the step after the checkpoint
      continue;
    }
    if (absl::Status st = ReportStep(step, r); !st.ok()) return st;
    if ((train.eval_every() > 0 && step % train.eval_every() == 0) ||
        step == train.steps()) {
      EvaluateAndReport(step);
    }
    if (train.sample_every() > 0 && step % train.sample_every() == 0 &&
        step != train.steps()) {
      SampleAndReport(step);
    }
    // A background save commits at the first step end after every rank
    // has written its shard (one small all-reduce a step while it writes).
    if (background_save_.pending() && background_save_.AllWritten(world())) {
      if (auto st = FinishBackgroundAndReport(); !st.ok()) return st;
    }
    // Asked to stop (SIGUSR1 on any rank): this step is saved, here or
    // below, and the run ends after it.
    const bool stop = options_.stop_requested != nullptr &&
                      step != train.steps() &&
                      AnyRankFailed(world(), options_.stop_requested->load());
    if (absl::Status st = CheckpointIfDue(step, stop); !st.ok()) return st;
    if (stop) {
      spdlog::warn("step {:>6} | stopping as asked (a stop signal){}", step,
                   spec_.checkpoint().dir().empty()
                       ? "; no checkpoint.dir, so nothing is saved"
                   : options_.job_uid.empty()
                       ? ", after this step's checkpoint; run again with "
                         "--resume-from latest to go on from it"
                       : ", after this step's checkpoint");
      Emit({{"type", "stop"}, {"step", step}});
      stopped_ = true;
      return absl::OkStatus();
    }
  }
  if (background_save_.pending()) {
    if (auto st = FinishBackgroundAndReport(); !st.ok()) return st;
  }
  SampleAndReport(train.steps());
  // The last record of a run that trained every step: how a coordinator
  // that could not learn the exit code knows the job finished.
  Emit({{"type", "end"}, {"step", train.steps()}});
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Trainer::HandleAnomaly(int64_t step,
                                               const StepResult& r) {
  double loss = r.loss;
  if (options_.nan_at_step == step && !nan_injected_) {
    spdlog::warn("test hook: the loss of step {} reads as NaN", step);
    loss = std::nan("");
    nan_injected_ = true;
  }
  AnomalyGuard::Verdict v = anomaly_guard_.Check(step, loss, r.grad_norm);
  // Every rank decides alike, whatever it saw itself.
  if (!AnyRankFailed(world(), !v.kind.empty())) return -1;
  if (v.kind.empty()) {
    v = {"nan", absl::StrCat("another rank saw an anomaly at step ", step)};
  }
  if (options_.metrics != nullptr) options_.metrics->OnAnomaly(v.kind);
  const v1::AnomalySpec& policy = spec_.train().anomaly();
  if (policy.nan() == "ignore") {
    spdlog::warn("step {:>6} | {}; going on (train.anomaly.nan=ignore)", step,
                 v.reason);
    Emit({{"type", "anomaly"},
          {"step", step},
          {"kind", v.kind},
          {"reason", v.reason},
          {"action", "ignored"}});
    return -1;
  }
  // Decided alike on every rank: they end together (MarkAgreed).
  if (policy.nan() == "stop") {
    return MarkAgreed(world(), absl::FailedPreconditionError(absl::StrCat(
                                   v.reason,
                                   "; stopping (train.anomaly.nan=stop): a "
                                   "restart would meet it again")));
  }
  if (rollbacks_ >= policy.max_rollbacks()) {
    return MarkAgreed(world(),
                      absl::FailedPreconditionError(absl::StrCat(
                          v.reason, "; the run rolled back ", rollbacks_,
                          " times already (train.anomaly.max_rollbacks=",
                          policy.max_rollbacks(), ")")));
  }
  return RollBack(step, v.kind, v.reason);
}

absl::StatusOr<int64_t> Trainer::RollBack(int64_t step, const std::string& kind,
                                          const std::string& reason) {
  Busy busy(options_, recorder(), FlightPhase::kCheckpoint,
            "rolling back to a checkpoint");
  // A save of an earlier, good step may still be writing: it commits
  // first, so that it is the newest.
  if (background_save_.pending()) {
    if (auto st = FinishBackgroundAndReport(); !st.ok()) return st;
  }
  const int64_t skip = data_skip_;
  // Back only along this run's own history, and never forward: the folder
  // may hold newer checkpoints of an earlier run that this one resumed
  // before. Those pruned since are no candidates.
  const std::string& root = spec_.checkpoint().dir();
  auto listed =
      root.empty()
          ? absl::StatusOr<std::vector<std::string>>(std::vector<std::string>{})
          : ListCheckpoints(root, options_.fs);
  if (auto agreed = AgreeOnStatus(
          world(), listed.status(),
          absl::StrCat("rollback: another rank could not list '", root, "'"));
      !agreed.ok()) {
    return agreed;
  }
  std::vector<std::string> candidates;
  for (const std::string& dir : lineage_.At(step)) {
    if (std::find(listed->begin(), listed->end(), dir) != listed->end()) {
      candidates.push_back(dir);
    }
  }
  resumed_from_.clear();
  if (!candidates.empty()) {
    if (absl::Status loaded = LoadNewestOf(candidates, /*latest=*/true);
        !loaded.ok()) {
      return loaded;
    }
  }
  if (resumed_from_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(reason, "; no checkpoint of this run at or before step ",
                     step, " to roll back to under checkpoint.dir '", root,
                     "' (train.anomaly.nan=rollback)"));
  }
  const int64_t back = start_step_;
  if (back > step) {  // the candidates above rule it out
    return absl::InternalError(absl::StrCat("rollback at step ", step,
                                            " loaded '", resumed_from_,
                                            "' of the later step ", back));
  }
  ++rollbacks_;
  lineage_.DropAfter(back);
  // The batches since the checkpoint led to it: the run goes on past them.
  data_skip_ = skip + (step - back);
  spdlog::warn(
      "step {:>6} | {}; rolled back to step {} ({}), skipping {} steps of "
      "data (rollback {} of {})",
      step, reason, back, resumed_from_, step - back, rollbacks_,
      spec_.train().anomaly().max_rollbacks());
  Emit({{"type", "rollback"},
        {"step", step},
        {"to_step", back},
        {"dir", resumed_from_},
        {"kind", kind},
        {"reason", reason},
        {"skipped_steps", step - back},
        {"data_skip", data_skip_}});
  return back;
}

absl::Status Trainer::OpenRunLog() {
  run_log_ = std::make_unique<RunLog>();
  if (!options_.log_json_path.empty() && is_log_rank()) {
    auto opened = RunLog::Open(options_.log_json_path);
    if (!opened.ok()) return opened.status();
    run_log_ = std::move(*opened);
  }
  return absl::OkStatus();
}

void Trainer::Emit(const nlohmann::json& record) {
  run_log_->Write(record);
  if (options_.on_record && is_log_rank()) options_.on_record(record);
}

double Trainer::MatmulPeak() {
  // MFU's denominator: the measured matmul peak of what trains, the CPU's
  // sgemm or the GPU's matmul in the job's precision.
  if (options_.peak_flops > 0) return options_.peak_flops;
  Busy busy(options_, recorder(), FlightPhase::kSetup,
            "measuring the matmul peak");
  const double measured = compute_ops() != nullptr
                              ? MeasureMatmulPeakFlops(*compute_ops())
                              : MeasureSgemmPeakFlops();
  return BestPeakFlops(
      measured,
      PeakCacheKey(
          compute_ops() != nullptr ? compute_ops()->name() : "cpu sgemm",
          omp_get_max_threads()),
      PeakCachePath());
}

void Trainer::ReportStart() {
  const MemoryBytes mem = memory();
  spdlog::info(
      "model: {} parameters (L={} NH={} C={} T={} V={}), {} threads, {} "
      "matmul peak {:.1f} GFLOP/s",
      GptNumParams(model().config()), spec_.model().n_layer(),
      spec_.model().n_head(), spec_.model().n_embd(), build_.T,
      data_.vocab_size, omp_get_max_threads(),
      compute_ops() != nullptr ? compute_ops()->name() : "cpu sgemm",
      peak_flops_ / 1e9);
  spdlog::info(
      "memory per rank: params {:.1f} MB, grads {:.1f} MB, optimizer {:.1f} "
      "MB, activations {:.1f} MB",
      mem.params / 1e6, mem.grads / 1e6, mem.optimizer / 1e6,
      mem.activations / 1e6);
  if (options_.metrics != nullptr) options_.metrics->SetMemory(mem);
  if (CudaGraphsOf(spec_) != CudaGraphs::kOff) {
    if (graphs_unavailable_.empty()) {
      spdlog::info(
          "cuda graphs: each microbatch's forward and backward recorded at "
          "its second run, then replayed");
    } else {
      spdlog::info("train.cuda_graphs=auto: launching op by op ({})",
                   graphs_unavailable_);
    }
  }
  const auto& par = spec_.parallel();
  Emit({{"type", "layout"},
        {"world", dims_->world_size()},
        {"dp", par.dp()},
        {"tp", par.tp()},
        {"pp", par.pp()},
        {"cp", par.cp()},
        {"zero", par.zero()},
        {"sequence_parallel", par.sequence_parallel()},
        {"microbatches", par.microbatches()},
        {"schedule", build_.pp > 1 ? par.schedule() : "none"},
        {"virtual_stages", par.virtual_stages()},
        {"stage_layers", build_.plan.stage_layers}});
  if (!resumed_from_.empty()) {
    // The checkpoint this attempt starts from, read off the directory: it may
    // be newer than the previous attempt's last "checkpoint" record, when that
    // attempt died between committing a checkpoint and logging it.
    Emit({{"type", "resume"}, {"step", start_step_}, {"dir", resumed_from_}});
  }
  Emit({{"type", "memory"},
        {"params_bytes", mem.params},
        {"grads_bytes", mem.grads},
        {"optimizer_bytes", mem.optimizer},
        {"activations_bytes", mem.activations}});
  if (options_.metrics != nullptr && !spec_.checkpoint().dir().empty() &&
      spec_.checkpoint().every() > 0) {
    options_.metrics->OnCheckpointPolicy(spec_.checkpoint().every());
  }
}

absl::Status Trainer::ReportStep(int64_t step, const StepResult& r) {
  const auto& train = spec_.train();
  const double tokens_per_step =
      static_cast<double>(train.global_batch()) * build_.T;
  const double tok_per_s = tokens_per_step / r.seconds;
  // Model FLOPs of the global batch over the peak of every rank.
  const double mfu =
      flops_per_step() / r.seconds / (peak_flops_ * dims_->world_size());
  if (!mfu_warned_ && is_log_rank()) {
    const std::string w =
        MfuAbovePeakWarning(mfu, peak_flops_, options_.peak_flops <= 0);
    mfu_warned_ = !w.empty();
    if (mfu_warned_) spdlog::warn("step {:>6} | {}", step, w);
  }
  if (options_.metrics != nullptr) {
    options_.metrics->OnStep(step, r.loss, r.seconds, tok_per_s, mfu, r.phases);
    options_.metrics->UpdateComm(*dims_->comm_stats());
    if (device_ops_ != nullptr) {
      const kernels::CudaMemory gpu = kernels::CudaMemoryInfo();
      options_.metrics->SetGpuMemory(gpu.used, gpu.total);
    }
  }
  if (options_.on_rank_step) {
    RankStep rank_step;
    rank_step.step = step;
    rank_step.seconds = r.seconds;
    rank_step.comm_exposed = r.comm_exposed;
    for (const auto& [key, stat] : dims_->comm_stats()->Snapshot()) {
      rank_step.comm_seconds[key.first] += stat.seconds;  // key: (group, op)
    }
    options_.on_rank_step(rank_step);
  }
  if (!std::isfinite(r.loss)) {
    return absl::InternalError(
        absl::StrCat("loss is ", r.loss, " at step ", step));
  }
  Emit({{"type", "step"},
        {"step", step},
        {"loss", r.loss},
        {"lr", r.lr},
        {"ms", r.seconds * 1e3},
        {"tok_per_s", tok_per_s},
        {"mfu", mfu},
        {"grad_norm", r.grad_norm},
        {"comm_exposed_ms", r.comm_exposed * 1e3}});
  if (!options_.quiet &&
      (step == 1 || step % train.log_every() == 0 || step == train.steps())) {
    spdlog::info(
        "step {:>6}/{} | loss {:.6f} | lr {:.2e} | norm {:.3f} | {:.1f} ms | "
        "{:.0f} tok/s | MFU {:.1f}%",
        step, train.steps(), r.loss, r.lr, r.grad_norm, r.seconds * 1e3,
        tok_per_s, 100.0 * mfu);
  }
  return absl::OkStatus();
}

void Trainer::EvaluateAndReport(int64_t step) {
  const float val = [&] {
    Busy busy(options_, recorder(), FlightPhase::kEval, "evaluating");
    return Evaluate();
  }();
  if (options_.metrics != nullptr) options_.metrics->OnEval(val);
  spdlog::info("step {:>6} | val loss {:.6f}", step, val);
  Emit({{"type", "eval"}, {"step", step}, {"val_loss", val}});
}

void Trainer::SampleAndReport(int64_t step) {
  const std::string text = [&] {
    Busy busy(options_, recorder(), FlightPhase::kSample, "sampling");
    return Sample(static_cast<uint64_t>(step));
  }();
  spdlog::info("sample at step {}:\n{}", step, text);
  Emit({{"type", "sample"}, {"step", step}, {"text", text}});
}

void Trainer::ReportCheckpoint(int64_t step, const std::string& dir,
                               double blocked, std::optional<double> written) {
  lineage_.Add(step, dir);
  if (options_.metrics != nullptr) options_.metrics->OnCheckpoint(blocked);
  nlohmann::json record = {{"type", "checkpoint"},
                           {"step", step},
                           {"dir", dir},
                           {"seconds", blocked}};
  if (written.has_value()) {
    spdlog::info(
        "step {:>6} | checkpoint {} ({:.2f} s blocked; written in the "
        "background in {:.2f} s)",
        step, dir, blocked, *written);
    record["write_seconds"] = *written;
  } else {
    spdlog::info("step {:>6} | checkpoint {} ({:.2f} s)", step, dir, blocked);
  }
  Emit(record);
}

absl::Status Trainer::FinishBackgroundAndReport() {
  const auto t0 = Clock::now();
  const int64_t saved_step = background_save_.step();
  auto dir = [&] {
    Busy busy(options_, recorder(), FlightPhase::kCheckpoint,
              "committing a checkpoint");
    return background_save_.Finish(world());
  }();
  if (!dir.ok()) return dir.status();
  ReportCheckpoint(saved_step, *dir, background_blocked_ + SecondsSince(t0),
                   background_save_.write_seconds());
  return absl::OkStatus();
}

absl::Status Trainer::CheckpointIfDue(int64_t step, bool stop) {
  const auto& ckpt = spec_.checkpoint();
  const int64_t steps = spec_.train().steps();
  if (ckpt.dir().empty() ||
      !(stop || (ckpt.every() > 0 && step % ckpt.every() == 0) ||
        step == steps)) {
    return absl::OkStatus();
  }
  // The previous background save first: its wait counts as its own.
  if (background_save_.pending()) {
    if (auto st = FinishBackgroundAndReport(); !st.ok()) return st;
  }
  const auto t0 = Clock::now();
  Busy busy(options_, recorder(), FlightPhase::kCheckpoint,
            "writing a checkpoint");
  if (ckpt.async_save() && step != steps && !stop) {
    auto committed = StartCheckpointAt(step);
    if (!committed.ok()) return committed.status();
    background_blocked_ = SecondsSince(t0);
    if (!*committed) return absl::OkStatus();  // reported once it commits
    ReportCheckpoint(step, CheckpointFolder(ckpt.dir(), step),
                     background_blocked_, std::nullopt);
    return absl::OkStatus();
  }
  auto dir = SaveCheckpointAt(step);
  if (!dir.ok()) return dir.status();
  ReportCheckpoint(step, *dir, SecondsSince(t0), std::nullopt);
  return absl::OkStatus();
}

}  // namespace ptrain
