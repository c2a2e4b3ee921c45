// The RankService side of the job state machine (coordinator.h): the
// reports of a running attempt's ranks, accepted only with its token and
// checked field by field (reports.h) before anything changes.
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/reports.h"

namespace ptrain {

absl::StatusOr<ReportContext> Coordinator::RunningContext(
    const Entry& e) const {
  const v1::Job& job = e.record.job;
  if (job.state() != v1::JOB_STATE_RUNNING || !running_.count(job.id()) ||
      e.record.token_sha256.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(job.id(), " has no attempt running"));
  }
  return ReportContext{job.id(), job.attempts(), job.world_size(),
                       job.spec().train().steps(),
                       running_.at(job.id()).last_step};
}

absl::StatusOr<Coordinator::Entry*> Coordinator::CheckedReport(
    const std::string& job_id,
    const std::function<absl::Status(const ReportContext&)>& check) {
  Entry* e = Find(job_id);
  if (e == nullptr) return UnknownJob(job_id);
  absl::StatusOr<ReportContext> ctx = RunningContext(*e);
  if (!ctx.ok()) return ctx.status();
  if (absl::Status s = check(*ctx); !s.ok()) return s;
  return e;
}

absl::Status Coordinator::ReportProgress(const v1::ReportProgressRequest& r) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> checked = CheckedReport(
      r.job_id(),
      [&](const ReportContext& ctx) { return ValidateProgress(r, ctx); });
  if (!checked.ok()) return checked.status();
  Entry* e = *checked;
  // The rank is alive even when the disk is full.
  running_[r.job_id()].last_report = absl::Now();
  running_[r.job_id()].heard[r.rank()] = absl::Now();
  Running& run = running_[r.job_id()];
  if (!r.is_eval()) run.reported_steps[r.rank()] = {r.step(), absl::Now()};
  JobUpdate u;
  u.record = e->record;
  v1::Progress* p = u.record.job.mutable_progress();
  if (run.received.has_value()) *p = *run.received;
  p->set_step(r.step());
  if (r.is_eval()) {
    p->set_val_loss(r.val_loss());
  } else {
    p->set_loss(r.loss());
    p->set_tok_per_s(r.tok_per_s());
    p->set_mfu(r.mfu());
    p->set_lr(r.lr());
  }
  p->set_unix_ms(NowMs());
  v1::LossPoint& point = u.loss_points.emplace_back();
  point.set_step(r.step());
  point.set_loss(r.is_eval() ? 0.0 : r.loss());
  point.set_val_loss(r.is_eval() ? r.val_loss() : 0.0);
  if (r.is_eval()) {
    *point.mutable_val_loss_by_source() = r.val_loss_by_source();
  }
  point.set_attempt(r.attempt());
  if (!r.is_eval()) {
    point.set_tok_per_s(r.tok_per_s());
    point.set_mfu(r.mfu());
    point.set_lr(r.lr());
  }
  point.set_unix_ms(p->unix_ms());
  v1::Progress received = *p;
  if (absl::Status s = Commit(*e, std::move(u)); !s.ok()) {
    // Kept apart from the record: the attempt's end writes the newest
    // figures, and says how many points the loss history lacks.
    received.set_unsaved_reports(received.unsaved_reports() + 1);
    run.received = std::move(received);
    return s;
  }
  run.received.reset();
  run.last_step = std::max(run.last_step, r.step());
  run.activity.clear();
  return absl::OkStatus();
}

absl::Status Coordinator::ReportCheckpoint(
    const v1::ReportCheckpointRequest& r) {
  const auto check = [&](const ReportContext& ctx) {
    return ValidateCheckpoint(r, ctx);
  };
  std::string root, uid;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Entry*> e = CheckedReport(r.job_id(), check);
    if (!e.ok()) return e.status();
    root = (*e)->record.job.spec().checkpoint().dir();
    uid = (*e)->record.job.uid();
  }
  // Off the lock: the folder's manifest is read and hashed, its shards
  // looked at. Only a committed checkpoint is recorded.
  absl::StatusOr<std::string> dir =
      ResolveCheckpointDir("dir", r.dir(), r.step(), root, uid);
  if (!dir.ok()) return dir.status();
  absl::MutexLock lock(&mu_);
  // The attempt may have ended meanwhile: then the report is refused as
  // any report of an ended attempt is.
  absl::StatusOr<Entry*> checked = CheckedReport(r.job_id(), check);
  if (!checked.ok()) return checked.status();
  Entry* e = *checked;
  // A checkpoint is progress too: a long save must not look like a hang.
  running_[r.job_id()].last_report = absl::Now();
  JobUpdate u;
  u.record = e->record;
  if (r.resumed() && r.rolled_back_from() > 0) {
    // Its steps go back: the reports of the steps after the checkpoint
    // come again.
    u.event = absl::StrCat("rolled back at step ", r.rolled_back_from(), " (",
                           r.reason(), ") to the checkpoint at step ", r.step(),
                           ", skipping the ", r.rolled_back_from() - r.step(),
                           " steps of data since");
    if (absl::Status s = Commit(*e, std::move(u)); !s.ok()) return s;
    running_[r.job_id()].last_step = r.step();
    return absl::OkStatus();
  }
  if (r.resumed()) {
    // Where the attempt came back from; the checkpoint's own report (if its
    // writer lived to send it) stays as it was.
    u.event = absl::StrCat("attempt ", r.attempt(),
                           " resumed from the checkpoint at step ", r.step());
    return Commit(*e, std::move(u));
  }
  running_[r.job_id()].newest_checkpoint = r.step();
  v1::Checkpoint& c = u.checkpoints.emplace_back();
  c.set_step(r.step());
  c.set_dir(*dir);
  c.set_attempt(r.attempt());
  c.set_unix_ms(NowMs());
  u.event = absl::StrCat("checkpoint at step ", r.step());
  return Commit(*e, std::move(u));
}

absl::Status Coordinator::ReportEndpoint(const v1::ReportEndpointRequest& r) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> e = CheckedReport(
      r.job_id(),
      [&](const ReportContext& ctx) { return ValidateEndpoint(r, ctx); });
  if (!e.ok()) return e.status();
  JobUpdate u;
  u.record = (*e)->record;
  u.event = absl::StrCat("rank ", r.rank(), " metrics at ", r.address());
  if (absl::Status s = Commit(**e, std::move(u)); !s.ok()) return s;
  running_[r.job_id()].endpoints[r.rank()] = r.address();
  return absl::OkStatus();
}

absl::Status Coordinator::ReportAlive(const v1::ReportAliveRequest& r) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> e = CheckedReport(
      r.job_id(),
      [&](const ReportContext& ctx) { return ValidateAlive(r, ctx); });
  if (!e.ok()) return e.status();
  // In memory only: a sign of life every few seconds is not job history.
  Running& run = running_[r.job_id()];
  const absl::Time now = absl::Now();
  run.heard[r.rank()] = now;
  if (r.has_times()) {
    run.reported_steps[r.rank()] = {r.times().step(), now};
    rank_times_.Add(r.job_id(), r.attempt(), (*e)->record.job.world_size(),
                    r.rank(), r.times(), absl::ToUnixMillis(now));
  }
  if (!r.activity().empty()) {
    // Busy with what ends no step: alive.
    run.last_report = now;
    run.activity = r.activity();
  } else if (r.progress_age_ms() >= 0) {
    // A rank whose calls complete moves, however long its step; one that
    // only answers (waiting in a collective, looping) does not.
    run.last_report = std::max(run.last_report,
                               now - absl::Milliseconds(r.progress_age_ms()));
  }
  return absl::OkStatus();
}

}  // namespace ptrain
