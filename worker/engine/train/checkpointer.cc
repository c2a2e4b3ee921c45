#include "worker/engine/train/checkpointer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/mesh.h"
#include "common/seconds.h"
#include "common/spec.h"
#include "spdlog/spdlog.h"
#include "worker/engine/checkpoint/checkpoint_state.h"
#include "worker/engine/checkpoint/hf_checkpoint.h"

namespace ptrain {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

Checkpointer::Checkpointer(const v1::JobSpec& spec,
                           const TrainerOptions& options, ParallelDims* dims,
                           const RankBuild& build, const TokenData& data,
                           State state)
    : spec_(spec),
      options_(options),
      dims_(dims),
      build_(build),
      data_(data),
      state_(state),
      anomaly_guard_(spec.train().anomaly()) {}

absl::StatusOr<std::string> Checkpointer::FinishBackgroundCheckpoint() {
  return background_save_.Finish(world());
}

absl::Status Checkpointer::CommitBackground(bool all_ranks) {
  if (!background_save_.pending()) return absl::OkStatus();
  // Unless told to, only once every rank has written its shard (one small
  // all-reduce a step while it writes).
  if (!all_ranks && !background_save_.AllWritten(world())) {
    return absl::OkStatus();
  }
  return FinishBackgroundAndReport();
}

absl::Status Checkpointer::LoadInitialState() {
  const std::string& init = spec_.model().init_from();
  if (!init.empty()) {
    // init_from is validated as "llmc:PATH" or "hf:DIR".
    absl::StatusOr<std::unique_ptr<TensorSource>> src;
    if (absl::StartsWith(init, kHfPrefix)) {
      src = HfSource::Open(init.substr(kHfPrefix.size()), *state_.model,
                           options_.fs, "model.init_from");
    } else {
      src = LlmcSource::Open(init.substr(5), *state_.model, options_.fs,
                             "model.init_from");
    }
    absl::Status s =
        src.ok() ? LoadState(*state_.store, state_.optimizer->adam(), **src,
                             /*with_optimizer=*/false)
                 : src.status();
    if (auto agreed = AgreeOnStatus(world(), s,
                                    "model.init_from: another rank failed to "
                                    "load (see its error)");
        !agreed.ok()) {
      return agreed;
    }
    state_.store->GatherUpdatedParams();
  }
  // Under ptcoord the job's uid names its checkpoints; a standalone run
  // goes on as the run it resumes (so it prunes that run's older steps),
  // else it is a run of its own.
  run_uid_ = options_.job_uid;
  if (absl::Status s = Resume(); !s.ok()) return s;
  if (run_uid_.empty()) run_uid_ = NewRunUid(world());
  // Two runs cannot save one step in one folder: the save of such a step
  // fails. Said now rather than when the step comes; an error here would
  // make every trainer built from a spec depend on what its folder holds.
  const auto& ckpt = spec_.checkpoint();
  if (ckpt.dir().empty() || !dims_->world_rank() == 0) return absl::OkStatus();
  const int64_t steps = spec_.train().steps();
  auto others = OtherRunsCheckpointsAt(
      ckpt.dir(), run_uid_,
      [&](int64_t step) {
        return step > start_step_ && step <= steps &&
               (step == steps ||
                (ckpt.every() > 0 && step % ckpt.every() == 0));
      },
      options_.fs);
  if (others.ok() && !others->empty()) {
    const std::string what = absl::StrCat(
        "checkpoint.dir '", ckpt.dir(), "' holds ",
        absl::StrJoin(*others, ", "), " of another run, at steps this run ('",
        run_uid_,
        "') saves, and a run never overwrites another's checkpoint. Give this "
        "run a folder of its own (--set checkpoint.dir=...), or go on from "
        "that run with --resume-from latest if it is of this model and data");
    if (options_.refuse_other_runs_steps) {
      return absl::FailedPreconditionError(what);
    }
    spdlog::warn("{}: those saves will fail", what);
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::LoadCandidate(const std::string& dir, bool latest,
                                         const std::string& field,
                                         Candidate* c) {
  const bool standalone = options_.job_uid.empty();
  auto reader = CheckpointReader::Open(dir, options_.fs, field);
  if (!reader.ok()) {
    // Damaged or not a checkpoint (of this format): fall back. Refused
    // by confinement, or unreadable: stop.
    const absl::StatusCode code = reader.status().code();
    c->fatal = code != absl::StatusCode::kDataLoss &&
               code != absl::StatusCode::kFailedPrecondition;
    return reader.status();
  }
  const CheckpointMeta& meta = (*reader)->meta();
  if (latest && !standalone && meta.job_uid != options_.job_uid) {
    c->fatal = true;
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", dir, "' belongs to job '", meta.job_uid,
        "', not to this job '", options_.job_uid,
        "' (PTRAIN_JOB_UID); refusing to resume another job's checkpoint "
        "(give checkpoint.dir a folder of this job's own)"));
  }
  // Not this run's model or data: skipped by `latest`, refused when
  // named.
  auto mismatch = [&](absl::Status why) {
    c->other = latest;
    c->fatal = !latest;
    return why;
  };
  if (absl::Status compatible =
          (*reader)->CheckCompatible(*state_.model, state_.store->layout());
      !compatible.ok()) {
    return mismatch(compatible);
  }
  if (data_.has_tokenizer && meta.vocab != data_.tokenizer.vocab()) {
    return mismatch(absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", dir,
                     "' was trained on another vocabulary than "
                     "data.path '",
                     spec_.data().path(), "'")));
  }
  // Named, a checkpoint may go on with other data of its vocabulary.
  if (latest && meta.data_digest.has_value() &&
      *meta.data_digest != data_.digest) {
    const v1::DataSpec& d = spec_.data();
    return mismatch(absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", dir, "' was trained on other data than ",
        d.path().empty() ? "data.train_bin '" + d.train_bin()
                         : "data.path '" + d.path(),
        "' (data_digest ", absl::Hex(*meta.data_digest, absl::kZeroPad16),
        ", this data's ", absl::Hex(data_.digest, absl::kZeroPad16), ")")));
  }
  if (meta.step > spec_.train().steps()) {
    c->fatal = true;
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", dir, "' is at step ", meta.step,
                     ", past train.steps=", spec_.train().steps()));
  }
  c->step = meta.step;
  c->opt_step = meta.optimizer_step;
  c->skipped_steps = meta.skipped_steps;
  c->owner = meta.job_uid;
  absl::Status loaded =
      LoadState(*state_.store, state_.optimizer->adam(), **reader,
                /*with_optimizer=*/true);
  resume_bytes_read_ = (*reader)->bytes_read();
  return loaded;
}

absl::Status Checkpointer::Resume() {
  const std::string& from = options_.resume_from;
  if (from.empty()) return absl::OkStatus();
  const bool latest = from == "latest";
  const std::string& root = spec_.checkpoint().dir();
  if (latest && root.empty()) {
    spdlog::info("resume: no checkpoint.dir, starting fresh");
    return absl::OkStatus();
  }
  auto listed = latest ? ListCheckpoints(root, options_.fs)
                       : absl::StatusOr<std::vector<std::string>>(
                             std::vector<std::string>{from});
  if (auto agreed = AgreeOnStatus(
          world(), listed.status(),
          absl::StrCat("resume: another rank could not list '", root, "'"));
      !agreed.ok()) {
    return agreed;
  }
  const std::string& fork = options_.fork_from;
  if (latest && listed->empty()) {
    if (!fork.empty()) return LoadNewestOf({fork}, /*latest=*/false);
    spdlog::info("resume: no checkpoint under '{}', starting fresh", root);
    return absl::OkStatus();
  }
  absl::Status loaded = LoadNewestOf(*listed, latest);
  // None of this run's loaded (another model's, data's): the fork's.
  if (loaded.ok() && latest && resumed_from_.empty() && !fork.empty()) {
    return LoadNewestOf({fork}, /*latest=*/false);
  }
  return loaded;
}

absl::Status Checkpointer::LoadNewestOf(
    const std::vector<std::string>& candidates, bool latest) {
  const bool standalone = options_.job_uid.empty();
  const std::string& root = spec_.checkpoint().dir();
  const std::string field = latest ? "checkpoint.dir" : "--resume-from";
  std::string skipped;
  bool damaged = false;
  for (const std::string& dir : candidates) {
    // `latest` skips a checkpoint of another model or data (standalone runs
    // of several models may share a folder) and falls back past a damaged
    // one. Another job's, or one past train.steps, is an error: an older
    // one would not do either. A named folder must load.
    Candidate c;
    absl::Status s = LoadCandidate(dir, latest, field, &c);
    const bool failed = AnyRankFailed(world(), !s.ok());
    const bool any_fatal = AnyRankFailed(world(), c.fatal);
    const bool any_other = AnyRankFailed(world(), c.other);
    if (!failed) {
      state_.store->GatherUpdatedParams();
      start_step_ = c.step;
      resumed_from_ = dir;
      lineage_.Add(c.step, dir);
      if (standalone) run_uid_ = c.owner;
      state_.optimizer->adam().set_steps_taken(c.opt_step);
      state_.feed->set_skipped_steps(c.skipped_steps);
      spdlog::info("resumed from '{}' at step {}{}", dir, c.step, skipped);
      return absl::OkStatus();
    }
    if (s.ok()) s = absl::DataLossError("another rank failed to read " + dir);
    if (!latest || any_fatal) return s;
    if (any_other) {
      spdlog::warn("resume: skipping {}", std::string(s.message()));
      absl::StrAppend(&skipped, " (skipped ", dir,
                      ", of another model or data)");
      continue;
    }
    spdlog::warn("resume: skipping damaged checkpoint '{}': {}", dir,
                 std::string(s.message()));
    absl::StrAppend(&skipped, " (skipped damaged ", dir, ")");
    damaged = true;
  }
  if (!damaged) {
    spdlog::info(
        "resume: no checkpoint of this model and data under '{}'{}, starting "
        "fresh",
        root, skipped);
    return absl::OkStatus();
  }
  return absl::DataLossError(
      absl::StrCat("resume: no intact checkpoint under '", root, "'", skipped));
}

CheckpointMeta Checkpointer::MetaAt(int64_t step) const {
  CheckpointMeta meta;
  meta.step = step;
  meta.tokens_seen =
      step * static_cast<int64_t>(build_.global_batch) * build_.T;
  meta.optimizer_step = state_.optimizer->adam().steps_taken();
  meta.seed = spec_.train().seed();
  meta.skipped_steps = state_.feed->skipped_steps();
  meta.model = *state_.model;
  if (data_.has_tokenizer) meta.vocab = data_.tokenizer.vocab();
  meta.data_digest = data_.digest;
  meta.spec_yaml = JobSpecToYaml(spec_);
  for (const MeshDimension& d : MeshDimensions()) {
    meta.degrees[std::string(d.name)] = dims_->degree(d.name);
  }
  meta.zero = dims_->zero();
  meta.world = dims_->world_size();
  meta.job_uid = run_uid_;
  return meta;
}

SaveOptions Checkpointer::SaveOptionsNow() const {
  SaveOptions save = options_.save;
  save.keep_last = spec_.checkpoint().keep_last();
  save.fs = options_.fs;
  return save;
}

std::vector<ShardRun> Checkpointer::RunsNow() {
  const bool tp_rank0 = dims_->tp_rank() == 0;
  return CheckpointRuns(*state_.store, state_.optimizer->adam(), tp_rank0,
                        &host_);
}

absl::Status Checkpointer::CommitPendingSave() {
  if (!background_save_.pending()) return absl::OkStatus();
  return background_save_.Finish(world()).status();
}

absl::StatusOr<std::string> Checkpointer::SaveCheckpointAt(int64_t step) {
  if (auto s = CommitPendingSave(); !s.ok()) return s;
  return SaveCheckpoint(spec_.checkpoint().dir(), MetaAt(step), RunsNow(),
                        world(), SaveOptionsNow());
}

absl::StatusOr<bool> Checkpointer::StartCheckpointAt(int64_t step) {
  if (auto s = CommitPendingSave(); !s.ok()) return s;
  return background_save_.Start(spec_.checkpoint().dir(), MetaAt(step),
                                RunsNow(), world(), SaveOptionsNow());
}

absl::StatusOr<int64_t> Checkpointer::HandleAnomaly(int64_t step,
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
    state_.report->Emit({{"type", "anomaly"},
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

absl::StatusOr<int64_t> Checkpointer::RollBack(int64_t step,
                                               const std::string& kind,
                                               const std::string& reason) {
  Busy busy = state_.report->Scope(FlightPhase::kCheckpoint,
                                   "rolling back to a checkpoint");
  // A save of an earlier, good step may still be writing: it commits
  // first, so that it is the newest.
  if (background_save_.pending()) {
    if (auto st = FinishBackgroundAndReport(); !st.ok()) return st;
  }
  const int64_t skip = state_.feed->skipped_steps();
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
  state_.feed->set_skipped_steps(skip + (step - back));
  spdlog::warn(
      "step {:>6} | {}; rolled back to step {} ({}), skipping {} steps of "
      "data (rollback {} of {})",
      step, reason, back, resumed_from_, step - back, rollbacks_,
      spec_.train().anomaly().max_rollbacks());
  state_.report->Emit({{"type", "rollback"},
                       {"step", step},
                       {"to_step", back},
                       {"dir", resumed_from_},
                       {"kind", kind},
                       {"reason", reason},
                       {"skipped_steps", step - back},
                       {"data_skip", state_.feed->skipped_steps()}});
  return back;
}

void Checkpointer::Report(int64_t step, const std::string& dir, double blocked,
                          std::optional<double> written) {
  lineage_.Add(step, dir);
  state_.report->Checkpoint(step, dir, blocked, written);
}

absl::Status Checkpointer::FinishBackgroundAndReport() {
  const auto t0 = Clock::now();
  const int64_t saved_step = background_save_.step();
  auto dir = [&] {
    Busy busy = state_.report->Scope(FlightPhase::kCheckpoint,
                                     "committing a checkpoint");
    return background_save_.Finish(world());
  }();
  if (!dir.ok()) return dir.status();
  Report(saved_step, *dir, background_blocked_ + SecondsSince(t0),
         background_save_.write_seconds());
  return absl::OkStatus();
}

absl::Status Checkpointer::SaveIfDue(int64_t step, bool stop) {
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
  Busy busy =
      state_.report->Scope(FlightPhase::kCheckpoint, "writing a checkpoint");
  if (ckpt.async_save() && step != steps && !stop) {
    auto committed = StartCheckpointAt(step);
    if (!committed.ok()) return committed.status();
    background_blocked_ = SecondsSince(t0);
    if (!*committed) return absl::OkStatus();  // reported once it commits
    Report(step, CheckpointFolder(ckpt.dir(), step), background_blocked_,
           std::nullopt);
    return absl::OkStatus();
  }
  auto dir = SaveCheckpointAt(step);
  if (!dir.ok()) return dir.status();
  Report(step, *dir, SecondsSince(t0), std::nullopt);
  return absl::OkStatus();
}

}  // namespace ptrain
