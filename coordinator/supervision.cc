// The supervision tick (coordinator.h): every running attempt polled
// through its backend, its hang timer and node checks applied, a stopped
// one killed when it lingers, and an ended one decided — restart counted
// or requeued, after the node-loss grace when a dead node may explain its
// failure — and committed; then the waiting jobs are scheduled. What the
// attempts' ranks wrote (dumps, run log, stderr.log) is read before, off
// the lock.
#include <algorithm>
#include <filesystem>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/exit_codes.h"
#include "common/job_state.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace fs = std::filesystem;

namespace {

// A supervision tick later than its period by more than this means ptcoord
// itself could not run (see Supervise).
constexpr absl::Duration kLateSupervision = absl::Seconds(1);
// The lines of stderr.log a failed attempt's error ends with.
constexpr int kErrorTailLines = 20;
// How far back in stderr.log the launch agent's lines are looked for, and
// how many of them an error quotes.
constexpr int kAgentScanLines = 400;
constexpr int kAgentLines = 3;
constexpr absl::string_view kAgentSaid = "the launch agent said:\n";

// What a failed attempt's error quotes of its stderr.log: the launch
// agent's own lines ("ptrsh: ..."), which say why mpirun could not start
// ranks on a node where OpenMPI says only "ORTE was unable to reliably
// start one or more daemons", then the log's last kErrorTailLines lines.
std::string ErrorTail(const std::string& path) {
  const std::string text = TailLines(path, kAgentScanLines);
  std::vector<absl::string_view> lines =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  std::vector<absl::string_view> agent;
  for (absl::string_view l : lines) {
    if (absl::StartsWith(l, "ptrsh: ") && agent.size() < kAgentLines &&
        std::find(agent.begin(), agent.end(), l) == agent.end()) {
      agent.push_back(l);
    }
  }
  const size_t first =
      lines.size() > kErrorTailLines ? lines.size() - kErrorTailLines : 0;
  std::string out;
  if (!agent.empty()) {
    absl::StrAppend(&out, kAgentSaid, absl::StrJoin(agent, "\n"),
                    "\nlast stderr lines:\n");
  }
  for (size_t i = first; i < lines.size(); ++i) {
    absl::StrAppend(&out, lines[i], "\n");
  }
  return out;
}

// What went wrong with attempt `n` of a job of `steps` steps that ended
// with `exit_code` (`end` when no code is known), "" when nothing did.
// `kill_reason`: why ptcoord ended it, which says it best; `tail`: the last
// lines of its stderr.log.
std::string AttemptError(const std::string& kill_reason,
                         const AttemptStatus& end, int exit_code, int n,
                         int64_t steps, const std::string& tail) {
  if (!kill_reason.empty()) return kill_reason;
  if (end.exit_unknown) {
    return absl::StrCat(
        "attempt ", n,
        " ended without an exit code ptcoord can read (its exit_code file is "
        "empty or unreadable: a full disk?), and neither its run log nor a "
        "checkpoint at step ",
        steps, " shows it finished");
  }
  if (end.lost) {
    return absl::StrCat("attempt ", n,
                        " was lost: its processes ended without an exit code "
                        "(coordinator down, host restarted or killed)");
  }
  if (exit_code == 0) return "";
  return absl::StrCat("attempt ", n, " exited with code ", exit_code,
                      tail.empty() ? ""
                      : absl::StartsWith(tail, kAgentSaid)
                          ? "; "
                          : "; last stderr lines:\n",
                      tail);
}

}  // namespace

void Coordinator::Tick() {
  std::vector<AttemptRead> reads;
  {
    absl::MutexLock lock(&mu_);
    reads = AttemptReadsDue();
  }
  // Off the lock: a rank's files may be slow to read (a network
  // filesystem), and the RPCs go on meanwhile.
  const absl::Time read_from = absl::Now();
  for (AttemptRead& r : reads) ReadAttempt(r);
  const absl::Duration reading = absl::Now() - read_from;
  absl::MutexLock lock(&mu_);
  // Reports were heard while we read: that time is no stall (Supervise).
  if (last_supervised_ != absl::InfinitePast()) last_supervised_ += reading;
  TakeAttemptReads(reads);
  Supervise();
  Schedule();
}

std::vector<Coordinator::AttemptRead> Coordinator::AttemptReadsDue() {
  std::vector<AttemptRead> due;
  for (const auto& [id, run] : running_) {
    const Entry& e = jobs_[id];
    AttemptRead r;
    r.job_id = id;
    r.attempt = e.record.job.attempts();
    r.dir = run.attempt_dir;
    if (run.end.has_value() && !run.left.has_value()) {
      r.ended = true;
      std::tie(r.context, r.known_step) = RunLogContext(e);
    } else if (!run.end.has_value() && run.dump_asked_at.has_value() &&
               (!run.analysed.has_value() ||
                run.analysed->asked != *run.dump_asked_at)) {
      r.asked = run.dump_asked_at;
      r.ask_failed = run.dump_ask_failed;
      r.facts = FactsOf(e, r.attempt, run.dump_asked_at, &run, run.seen);
    } else {
      continue;
    }
    due.push_back(std::move(r));
  }
  return due;
}

void Coordinator::ReadAttempt(AttemptRead& r) {
  if (r.asked.has_value()) AnalyseHang(r);
  if (r.ended) {
    Running::Left& left = r.left.emplace();
    left.log = ReadRunLog((fs::path(r.dir) / "run.jsonl").string(), r.context,
                          r.known_step);
    left.stderr_tail = ErrorTail((fs::path(r.dir) / "stderr.log").string());
  }
}

void Coordinator::TakeAttemptReads(std::vector<AttemptRead>& reads) {
  for (AttemptRead& r : reads) {
    auto run = running_.find(r.job_id);
    // Meanwhile the attempt may have ended and another begun.
    if (run == running_.end() ||
        jobs_[r.job_id].record.job.attempts() != r.attempt) {
      continue;
    }
    if (r.left.has_value() && run->second.end.has_value()) {
      run->second.left = std::move(r.left);
    }
    if (r.analysed.has_value() && run->second.dump_asked_at == r.asked) {
      run->second.analysed =
          Running::Analysed{*r.asked, *std::move(r.analysed)};
    }
  }
}

void Coordinator::Supervise() {
  const absl::Time now = absl::Now();
  // Hang timers and node timeouts measure the ranks' and nodes' silence,
  // not ours. While supervision was kept from running (ptcoord paused, the
  // host overloaded, this lock held through a stalled disk write) no report
  // could be heard either, so that time does not count against them.
  const absl::Duration late = now - last_supervised_ - options_.tick;
  if (last_supervised_ != absl::InfinitePast() && late > kLateSupervision) {
    spdlog::warn(
        "supervision ran {} late (ptcoord paused or stalled): hang timers "
        "and node timeouts leave that time out",
        absl::FormatDuration(late));
    for (auto& [id, run] : running_) run.last_report += late;
    nodes_->LeaveOut(late);
  }
  last_supervised_ = now;
  ChargeUsage(now);
  std::vector<std::string> ids;
  for (const auto& [id, run] : running_) ids.push_back(id);
  for (const std::string& id : ids) {
    SuperviseAttempt(jobs_[id], running_[id], now);
  }
}

void Coordinator::SuperviseAttempt(Entry& e, Running& run, absl::Time now) {
  bool ending = false;
  if (!run.end.has_value()) {
    AttemptStatus status =
        backend_->Poll(*run.handle, now, run.kill_at.has_value());
    if (!status.event.empty()) CommitEvent(e, status.event);
    // Queued by its backend (Slurm) is not a hang: the timer starts when
    // it runs.
    if (status.state == AttemptStatus::kQueued) run.last_report = now;
    run.backend_queued = status.state == AttemptStatus::kQueued;
    ending = status.state == AttemptStatus::kEnding;
    if (status.state == AttemptStatus::kEnded) run.end = std::move(status);
  }
  // A node of the placement is gone: the attempt cannot go on.
  if (!run.end.has_value() && !ending && !run.kill_at.has_value()) {
    if (const std::string lost = backend_->LostNode(e.record.job, now);
        !lost.empty()) {
      run.node_lost = true;
      BeginKill(e, lost);
    }
  }
  if (run.end.has_value()) {
    // Decided once what it left is read (by the next tick, off the lock).
    if (ReadyToEnd(e, run, now) && run.left.has_value() &&
        (!run.retry_at.has_value() || now >= *run.retry_at)) {
      OnAttemptEnded(e);  // `run` is gone once that is written
    }
    return;
  }
  // Its leader (mpirun) is gone but ranks linger: they get the grace
  // period.
  if (ending && !run.kill_at.has_value()) {
    run.kill_at = now + options_.cancel_grace;
  }
  if (run.kill_at.has_value() && now >= *run.kill_at) {
    backend_->Kill(*run.handle);
    run.kill_at = now + options_.cancel_grace;
    return;
  }
  if (run.stop_wanted && !run.heard.empty() && !run.kill_at.has_value()) {
    // Asked before any rank was heard from: once more, now that they run.
    run.stop_wanted = false;
    backend_->AskToStop(*run.handle);
  }
  CheckHang(e, run, now);
}

void Coordinator::RequestStop(Entry& e, Running& run) {
  if (run.stop_asked_at.has_value() || run.kill_at.has_value()) return;
  if (run.handle != nullptr && backend_->AskToStop(*run.handle)) {
    run.stop_asked_at = absl::Now();
    run.stop_wanted = run.heard.empty();
  } else {
    BeginKill(e, "");
  }
}

void Coordinator::CheckHang(Entry& e, Running& run, absl::Time now) {
  const int64_t timeout_s = e.record.job.spec().restart().hang_timeout_s();
  // Asked to save and stop (pause, grow back): ranks still running a hang
  // timeout later are killed; preempted ones past the preemption's grace
  // (they go on from their newest checkpoint).
  if (run.stop_asked_at.has_value() && !run.kill_at.has_value()) {
    const absl::Duration grace = run.preempted_for.empty()
                                     ? absl::Seconds(timeout_s)
                                     : options_.preempt_grace;
    if (now - *run.stop_asked_at > grace) {
      if (!run.preempted_for.empty()) {
        CommitEvent(
            e, absl::StrCat("did not stop within the preemption's grace (",
                            absl::FormatDuration(options_.preempt_grace),
                            "): killed, to go on from its newest checkpoint"));
      }
      BeginKill(e, "");
      return;
    }
  }
  const absl::Duration silent = now - run.last_report;
  if (run.kill_at.has_value()) return;
  if (timeout_s <= 0 || silent <= absl::Seconds(timeout_s)) {
    run.dump_asked_at.reset();  // heard from again while asking
    return;
  }
  // Why it hangs first (the ranks' flight recorders), then the kill.
  if (!ExplainHang(e, run, now)) return;
  BeginKill(e, absl::StrCat(
                   "hang at step ", e.record.job.progress().step(),
                   run.activity.empty()
                       ? ""
                       : absl::StrCat(" (last busy with ", run.activity, ")"),
                   ": no report for ", absl::ToInt64Seconds(silent),
                   " s (restart.hang_timeout_s=", timeout_s, ")",
                   run.hang_summary.empty() ? "" : "; ", run.hang_summary));
}

bool Coordinator::ReadyToEnd(Entry& e, Running& run, absl::Time now) {
  AttemptStatus& end = *run.end;
  // A failure on nodes: the backend may hear of a dead node (a missed
  // heartbeat, Slurm marking it down) seconds after the attempt failed
  // because of it. Decided once it says, or after its grace.
  if (end.may_be_node_loss && !run.node_lost &&
      !e.record.job.cancel_requested() && run.kill_reason.empty()) {
    if (!run.ended_at.has_value()) run.ended_at = now;
    const NodeVerdict verdict =
        backend_->CheckNodes(*run.handle, e.record.job, *run.ended_at, now);
    if (!verdict.lost.empty()) {
      run.node_lost = true;
      end.reason = verdict.lost;
    } else if (!verdict.all_heard &&
               now - *run.ended_at <= backend_->NodeGrace()) {
      return false;
    }
  }
  end.may_be_node_loss = false;
  if (!end.reason.empty()) run.kill_reason = std::exchange(end.reason, "");
  if (end.node_lost) run.node_lost = true;
  return true;
}

void Coordinator::BeginKill(Entry& e, const std::string& reason) {
  auto it = running_.find(e.record.job.id());
  if (it == running_.end()) return;
  Running& run = it->second;
  if (!reason.empty() && run.kill_reason.empty()) run.kill_reason = reason;
  if (run.kill_at.has_value()) return;
  if (run.handle != nullptr) backend_->Terminate(*run.handle);
  run.kill_at = absl::Now() + options_.cancel_grace;
}

void Coordinator::OnAttemptEnded(Entry& e) {
  const std::string id = e.record.job.id();
  Running& run = running_[id];
  AttemptStatus& end = *run.end;
  int exit_code = end.exit_code;
  JobUpdate u;
  u.record = e.record;
  const bool log_ended = RecoverFromRunLog(e, run.left->log, &u);
  if (run.received.has_value() &&
      run.received->step() > u.record.job.progress().step()) {
    // Reports came that could not be saved, and the run log (on the same
    // full disk, often) did not have them either: the newest received
    // figures, with the count of points the history lacks.
    *u.record.job.mutable_progress() = *run.received;
  }
  const int n = u.record.job.attempts();

  // An end whose exit code we do not know is decided by what the attempt
  // left: a finished job must never train again.
  std::string resolved;
  if ((end.lost || end.exit_unknown) && run.kill_reason.empty()) {
    resolved = FinishedBy(u, log_ended);
    if (!resolved.empty()) {
      exit_code = 0;
      end.lost = end.exit_unknown = false;
    }
  }
  const std::string error =
      AttemptError(run.kill_reason, end, exit_code, n,
                   u.record.job.spec().train().steps(), run.left->stderr_tail);
  v1::Attempt& a = u.attempt.emplace();
  if (auto all = store_->ListAttempts(id);
      all.ok() && !all->empty() && all->back().number() == n) {
    a = all->back();
  }
  a.set_number(n);
  a.set_finished_unix_ms(NowMs());
  a.set_exit_code(end.lost || end.exit_unknown ? -1 : exit_code);
  a.set_error(error);
  a.set_dir(run.attempt_dir);
  // The attempt's token and uid die with it: a report signed with that
  // token is refused from now on.
  u.record.token_sha256.clear();
  u.record.attempt_uid.clear();
  const v1::AttemptEnd how = DecideEnd(run, exit_code, error, resolved, u);
  a.set_end(how);
  // Counted apart from restarts (restarts_used), so that an alert on
  // restarts does not fire on pauses, preemptions or lost nodes.
  if (std::find(std::begin(kRequeueEnds), std::end(kRequeueEnds), how) !=
      std::end(kRequeueEnds)) {
    ++(*u.record.job.mutable_requeues())[EndName(how)];
  }
  if (absl::Status s = Commit(e, std::move(u)); !s.ok()) {
    // Still running as far as the disk knows, so here too; try again soon.
    LogStoreError(e, s);
    run.retry_at = absl::Now() + absl::Seconds(1);
    return;
  }
  running_.erase(id);
}

v1::AttemptEnd Coordinator::DecideEnd(const Running& run, int exit_code,
                                      const std::string& error,
                                      const std::string& resolved,
                                      JobUpdate& u) const {
  const AttemptStatus& end = *run.end;
  JobRecord& next = u.record;
  v1::Job& job = next.job;
  const int n = job.attempts();
  const int max = job.spec().restart().max_restarts();
  // A pause asked of this attempt is answered by its end, one way or another.
  const bool pausing = job.pause_requested();
  job.set_pause_requested(false);
  v1::AttemptEnd how = v1::ATTEMPT_END_FAILED;
  if (job.cancel_requested()) {
    how = v1::ATTEMPT_END_CANCELLED;
    job.set_state(v1::JOB_STATE_CANCELLED);
    job.set_finished_unix_ms(NowMs());
    u.event = absl::StrCat("cancelled (attempt ", n, " ended)");
  } else if (error.empty()) {
    how = v1::ATTEMPT_END_SUCCEEDED;
    job.set_state(v1::JOB_STATE_SUCCEEDED);
    job.set_finished_unix_ms(NowMs());
    job.set_error("");
    u.event =
        absl::StrCat("succeeded on attempt ", n, resolved.empty() ? "" : " (",
                     resolved, resolved.empty() ? "" : ")");
  } else if (!run.preempted_for.empty() && !pausing) {
    // Stopped (or, past the grace, killed) for a job of higher priority:
    // not a failure, and no restart used. Queued again by the next pass.
    how = v1::ATTEMPT_END_PREEMPTED;
    job.set_error("");
    job.set_state(v1::JOB_STATE_PREEMPTED);
    u.event = absl::StrCat("preempted for ", run.preempted_for, " after step ",
                           job.progress().step(), " (attempt ", n,
                           " ended with exit code ", exit_code,
                           "; not counted as a restart)");
  } else if (pausing) {
    // Exit 3 when its ranks saved and stopped as asked; whatever else
    // ended it, it waits for ResumeJob now.
    how = v1::ATTEMPT_END_PAUSED;
    job.set_state(v1::JOB_STATE_PAUSED);
    job.set_error(exit_code == kExitStopped ? "" : error);
    u.event =
        absl::StrCat("paused after step ", job.progress().step(), " (attempt ",
                     n, " ended with exit code ", exit_code, ")");
  } else if (end.lost || end.exit_unknown || run.node_lost || run.growing) {
    // Not the job's fault: requeued without using up a restart.
    how = run.growing     ? v1::ATTEMPT_END_GROWN
          : run.node_lost ? v1::ATTEMPT_END_NODE_LOST
                          : v1::ATTEMPT_END_LOST;
    job.set_error(run.growing ? "" : error);
    job.set_state(v1::JOB_STATE_RESTARTING);
    u.event = absl::StrCat(error, "; requeued (not counted as a restart)");
  } else if (run.kill_reason.empty() && exit_code == kExitStopped) {
    // Its ranks were signalled (a preemption, an operator) and saved a
    // checkpoint before they stopped: not a failure.
    how = v1::ATTEMPT_END_STOPPED;
    job.set_error("");
    job.set_state(v1::JOB_STATE_RESTARTING);
    u.event = absl::StrCat("attempt ", n,
                           " stopped as asked after a checkpoint (exit code ",
                           kExitStopped,
                           "); requeued (not counted as a "
                           "restart)");
  } else if (run.kill_reason.empty() && exit_code == kExitBadInput) {
    // Deterministic bad input (spec, data, checkpoint): every restart would
    // fail the same way.
    job.set_error(error);
    job.set_state(v1::JOB_STATE_FAILED);
    job.set_finished_unix_ms(NowMs());
    u.event = absl::StrCat("failed on bad input (exit code ", kExitBadInput,
                           "), not restarted: ", error);
  } else if (next.restarts_used < max) {
    ++next.restarts_used;
    job.set_error(error);
    job.set_state(v1::JOB_STATE_RESTARTING);
    u.event = absl::StrCat("attempt ", n, " failed (restart ",
                           next.restarts_used, " of ", max, "): ", error);
  } else {
    job.set_error(error);
    job.set_state(v1::JOB_STATE_FAILED);
    job.set_finished_unix_ms(NowMs());
    u.event = absl::StrCat("failed after ", n, " attempts: ", error);
  }
  return how;
}

}  // namespace ptrain
