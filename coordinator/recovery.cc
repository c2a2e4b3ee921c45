// Recovery after a ptcoord restart (docs/control-plane.md, "Recovery"):
// every attempt the store says runs is found again through the backend,
// re-adopted when alive, else finished from its exit_code file, and in both
// cases its run log fills in what its reports did not deliver.
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/reports.h"

namespace ptrain {

namespace fs = std::filesystem;

void Coordinator::Recover() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, e] : jobs_) {
    const JobRecord& r = e.record;
    if (r.job.state() != v1::JOB_STATE_RUNNING) continue;
    const std::string attempt_dir =
        AttemptDir(options_.state_dir, id, r.job.attempts());
    Adopted found =
        backend_->Adopt({id, r.job.attempts(), KeyOf(r), attempt_dir});
    Running& run = running_[id];
    run.handle = std::move(found.handle);
    run.attempt_dir = attempt_dir;
    run.last_report = absl::Now();
    // Ended while we were down: its exit_code file decides when Supervise
    // polls it (OnAttemptEnded asks the run log and checkpoints when it
    // cannot).
    if (!found.alive) continue;
    // Re-adopt: the attempt kept training while we were down, and its ranks
    // report to the same address with the same token. Requeueing it would
    // throw away every step since its last checkpoint. What they logged
    // while we were down is taken from the run log.
    JobUpdate u;
    u.record = r;
    // Before any RPC is served: nothing waits for the lock yet.
    const auto [context, known_step] = RunLogContext(e);
    RecoverFromRunLog(
        e,
        ReadRunLog((fs::path(run.attempt_dir) / "run.jsonl").string(), context,
                   known_step),
        &u);
    u.event = absl::StrCat("attempt ", r.job.attempts(),
                           " re-adopted after a coordinator restart");
    if (absl::Status s = Commit(e, std::move(u)); !s.ok()) {
      LogStoreError(e, s);
    }
    // Its reports go on from the newest step it logged.
    if (absl::StatusOr<Store::LastSteps> last =
            store_->LastLossSteps(id, r.job.attempts());
        last.ok()) {
      run.last_step = std::max(last->step, last->eval);
    }
    if (e.record.job.cancel_requested()) BeginKill(e, "");
  }
  Supervise();
  // Attempts that ended while we were down are decided now, from what they
  // left (read here, under the lock: no RPC is served yet).
  std::vector<AttemptRead> reads = AttemptReadsDue();
  for (AttemptRead& r : reads) ReadAttempt(r);
  TakeAttemptReads(reads);
  Supervise();
}

std::pair<ReportContext, int64_t> Coordinator::RunLogContext(const Entry& e) {
  const v1::Job& job = e.record.job;
  // Points of this attempt past the last one its reports delivered (an
  // attempt's steps only grow): the run log is read back to that one.
  int64_t have_step = -1;
  if (absl::StatusOr<Store::LastSteps> last =
          store_->LastLossSteps(job.id(), job.attempts());
      last.ok()) {
    have_step = last->step;
  }
  return {ReportContext{job.id(), job.attempts(), job.world_size(),
                        job.spec().train().steps()},
          have_step};
}

bool Coordinator::RecoverFromRunLog(const Entry& e, const RunLogSummary& log,
                                    JobUpdate* u) {
  const v1::Job& job = e.record.job;
  // Reports may have come since the log was read: what the store has now
  // is left out.
  int64_t have_step = -1, have_eval = -1;
  if (absl::StatusOr<Store::LastSteps> last =
          store_->LastLossSteps(job.id(), job.attempts());
      last.ok()) {
    have_step = last->step;
    have_eval = last->eval;
  }
  if (log.records.empty() && log.checkpoints.empty()) return log.ended;
  v1::Progress* p = u->record.job.mutable_progress();
  if (log.last_step.has_value() && log.last_step->step > have_step) {
    p->set_step(log.last_step->step);
    p->set_loss(log.last_step->loss);
    p->set_lr(log.last_step->lr);
    p->set_tok_per_s(log.last_step->tok_per_s);
    p->set_mfu(log.last_step->mfu);
    p->set_unix_ms(NowMs());
  }
  if (log.last_eval.has_value() && log.last_eval->step > have_eval) {
    p->set_val_loss(log.last_eval->val_loss);
    p->set_step(std::max(p->step(), log.last_eval->step));
  }
  for (const RunLogRecord& rec : log.records) {
    const bool eval = rec.kind == RunLogRecord::kEval;
    if (rec.step <= (eval ? have_eval : have_step)) continue;
    v1::LossPoint& q = u->loss_points.emplace_back();
    q.set_step(rec.step);
    q.set_loss(eval ? 0.0 : rec.loss);
    q.set_val_loss(eval ? rec.val_loss : 0.0);
    q.mutable_val_loss_by_source()->insert(rec.val_loss_by_source.begin(),
                                           rec.val_loss_by_source.end());
    q.set_attempt(job.attempts());
    if (!eval) {
      q.set_tok_per_s(rec.tok_per_s);
      q.set_mfu(rec.mfu);
      q.set_lr(rec.lr);
    }
    // Recovered now: when it was trained is not in the run log.
    q.set_unix_ms(NowMs());
  }
  std::set<int64_t> known;
  if (auto c = store_->ListCheckpoints(job.id()); c.ok()) {
    for (const v1::Checkpoint& k : *c) known.insert(k.step());
  }
  for (const RunLogRecord& rec : log.checkpoints) {
    if (known.count(rec.step)) continue;
    // Pruned since (keep_last), or never committed: not listed.
    absl::StatusOr<std::string> dir =
        ResolveCheckpointDir("run.jsonl dir", rec.dir, rec.step,
                             job.spec().checkpoint().dir(), job.uid());
    if (!dir.ok()) continue;
    v1::Checkpoint& c = u->checkpoints.emplace_back();
    c.set_step(rec.step);
    c.set_dir(*dir);
    c.set_attempt(job.attempts());
    c.set_unix_ms(NowMs());
    known.insert(rec.step);
  }
  return log.ended;
}

std::string Coordinator::FinishedBy(const JobUpdate& u, bool log_ended) {
  const v1::Job& job = u.record.job;
  if (log_ended) {
    return "its exit code was not recorded; its run log ends with the record "
           "of a finished run";
  }
  // The last step's checkpoint as the disk has it: the attempt may have
  // died between committing it and logging or reporting it.
  const std::string root = job.spec().checkpoint().dir();
  const int64_t last = job.spec().train().steps();
  if (root.empty() ||
      !ResolveCheckpointDir("checkpoint.dir",
                            (fs::path(root) / StepFolderName(last)).string(),
                            last, root, job.uid())
           .ok()) {
    return "";
  }
  return absl::StrCat(
      "its exit code was not recorded; its committed checkpoint of the last "
      "step, ",
      last, ", shows it finished");
}

}  // namespace ptrain
