// Scheduling and launching for the job state machine (coordinator.h): the
// waiting jobs start where the backend places them in the queue's order
// (queue_policy.h: priority, fair share, submission), within their owners'
// quotas; the first that does not fit is the head, which preempts running
// jobs of lower priority and which the jobs behind it pass only where that
// does not delay it (EASY backfill); shrunk jobs grow back once their full
// size fits. Also the node API (drain, forget, the daemons'
// Exec authorization), which reads the placements of running attempts.
#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/auth_token.h"
#include "common/digest.h"
#include "common/echo.h"
#include "common/mesh.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace fs = std::filesystem;

namespace {

// n->slots_used from the slots of running attempts per node.
void SetSlotsUsed(const std::map<std::string, int>& used, v1::Node* n) {
  auto it = used.find(n->spec().name());
  n->set_slots_used(it == used.end() ? 0 : it->second);
}

}  // namespace

void Coordinator::Schedule() {
  RequeuePreempted();
  const absl::Time now = absl::Now();
  std::vector<Entry*> waiting;
  for (auto& [id, e] : jobs_) {
    e.waiting.clear();
    e.queue_position = 0;
    if (IsWaiting(e.record.job.state())) waiting.push_back(&e);
  }
  // The queue's order: priority, then the owner's fair share, then
  // submission (queue_policy.h).
  std::map<std::string, double> usage;
  for (Entry* e : waiting) {
    const std::string& owner = e->record.job.owner();
    if (!usage.count(owner)) usage[owner] = fair_share_.Usage(owner, now);
  }
  const auto key = [&](const Entry* e) {
    return QueueKey{e->record.job.priority(), usage[e->record.job.owner()],
                    e->record.seq};
  };
  std::sort(waiting.begin(), waiting.end(),
            [&](const Entry* a, const Entry* b) {
              return StartsBefore(key(a), key(b));
            });
  queue_.clear();
  for (Entry* e : waiting) queue_.push_back(e->record.job.id());
  // What each user's running jobs hold, as jobs start in this pass.
  std::map<std::string, Holding> held;
  for (const v1::Job* job : RunningJobsBut()) {
    held[job->owner()] += HoldingOf(*job);
  }
  const std::shared_ptr<const UserTable> users = users_->table();
  const Entry* head = nullptr;
  int position = 0;
  for (Entry* e : waiting) {
    const v1::Job& job = e->record.job;
    e->queue_position = ++position;
    const Holding need = HoldingOf(job);
    if (const User* u = users->Find(job.owner()); u != nullptr) {
      // Over its owner's quota a job waits without holding up the queue.
      e->waiting = QuotaReason(job.owner(), u->quota, held[job.owner()], need);
      if (!e->waiting.empty()) continue;
    }
    // Placed beside what the jobs launched so far in this pass hold.
    const std::optional<AttemptPlace> place =
        backend_->Place(job, RunningJobsBut());
    if (head != nullptr) {
      // Behind a blocked head: only where the head's planned start stays.
      const bool keeps =
          place.has_value() &&
          BackfillKeepsHeadStart(
              RunningForQueue(),
              [&](const std::set<std::string>& gone, bool with_candidate) {
                RunningJobs left = RunningJobsExcept(gone);
                v1::Job candidate;
                if (with_candidate) {
                  candidate = job;
                  candidate.clear_placement();
                  for (const v1::Placement& p : place->placement) {
                    *candidate.add_placement() = p;
                  }
                  left.push_back(&candidate);
                }
                return backend_->Place(head->record.job, left).has_value();
              });
      if (!keeps) {
        e->waiting =
            absl::StrCat("behind ", head->record.job.id(), " (",
                         PriorityWords(head->record.job.priority()), ")");
        continue;
      }
    } else if (!place.has_value()) {
      head = e;
      // Already preempting for it: wait for those jobs to save and stop.
      std::vector<std::string> stopping;
      for (const auto& [id, run] : running_) {
        if (run.preempted_for == job.id()) stopping.push_back(id);
      }
      if (stopping.empty()) {
        stopping = PickVictims(RunningForQueue(), job.priority(),
                               [&](const std::set<std::string>& victims) {
                                 return backend_
                                     ->Place(job, RunningJobsExcept(victims))
                                     .has_value();
                               });
        Preempt(stopping, *e);
      }
      if (!stopping.empty()) {
        e->waiting = absl::StrCat("preempting ", absl::StrJoin(stopping, ", "),
                                  ", saving");
      } else {
        const int free = backend_->FreeSlotCount(RunningJobsBut());
        e->waiting = free >= 0
                         ? absl::StrCat("needs ", job.world_size(), " slots, ",
                                        free, " free")
                         : absl::StrCat("needs ", job.world_size(), " slots: ",
                                        backend_->FreeSlots(RunningJobsBut()));
      }
      continue;
    }
    Launch(*e, *place);
    held[job.owner()] += need;
  }
  if (backend_->QueuesItself()) PreemptForBackendQueue();
  GrowBack();
}

void Coordinator::PreemptForBackendQueue() {
  const Entry* head = nullptr;
  for (const auto& [id, run] : running_) {
    const Entry& e = jobs_[id];
    if (!run.backend_queued || run.kill_at.has_value() || run.end.has_value()) {
      continue;
    }
    if (head == nullptr ||
        StartsBefore(
            QueueKey{e.record.job.priority(), 0, e.record.seq},
            QueueKey{head->record.job.priority(), 0, head->record.seq})) {
      head = &e;
    }
  }
  if (head == nullptr) return;
  const std::string& head_id = head->record.job.id();
  int used = 0;
  std::map<std::string, int> holds;
  for (const auto& [id, run] : running_) {
    if (run.preempted_for == head_id) return;  // already making room
    if (run.backend_queued) continue;
    holds[id] = jobs_[id].record.job.world_size();
    used += holds[id];
  }
  std::vector<RunningJob> running;
  for (RunningJob& r : RunningForQueue()) {
    if (holds.count(r.id)) running.push_back(std::move(r));
  }
  // Asked of the backend only when a job of lower priority runs.
  if (std::none_of(running.begin(), running.end(), [&](const RunningJob& r) {
        return r.preemptible && r.priority < head->record.job.priority();
      })) {
    return;
  }
  const int total = backend_->TotalSlots();
  const int need = head->record.job.world_size();
  if (total < 0 || total - used >= need) return;
  Preempt(PickVictims(running, head->record.job.priority(),
                      [&](const std::set<std::string>& victims) {
                        int freed = 0;
                        for (const std::string& v : victims) freed += holds[v];
                        return total - used + freed >= need;
                      }),
          *head);
}

void Coordinator::RequeuePreempted() {
  for (auto& [id, e] : jobs_) {
    if (e.record.job.state() != v1::JOB_STATE_PREEMPTED) continue;
    JobUpdate u;
    u.record = e.record;
    u.record.job.set_state(v1::JOB_STATE_QUEUED);
    u.event = absl::StrCat(
        "queued again after its preemption: resumes from "
        "its newest checkpoint when room returns");
    if (absl::Status s = Commit(e, std::move(u)); !s.ok()) LogStoreError(e, s);
  }
}

void Coordinator::Preempt(const std::vector<std::string>& victims,
                          const Entry& head) {
  const v1::Job& h = head.record.job;
  for (const std::string& id : victims) {
    auto run = running_.find(id);
    if (run == running_.end()) continue;
    Entry& e = jobs_[id];
    run->second.preempted_for = h.id();
    CommitEvent(e, absl::StrCat("preempted for ", h.id(), " (priority ",
                                PriorityWords(h.priority()), ", of ",
                                h.owner().empty() ? "-" : h.owner(),
                                "): asked to save its step and stop"));
    RequestStop(e, run->second);
  }
}

std::vector<RunningJob> Coordinator::RunningForQueue() const {
  std::vector<RunningJob> out;
  for (const auto& [id, run] : running_) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    const v1::Job& job = it->second.record.job;
    RunningJob r;
    r.id = id;
    r.priority = job.priority();
    // One being stopped ends now; it cannot be preempted again.
    const bool stopping = run.stop_asked_at.has_value() ||
                          run.kill_at.has_value() || run.end.has_value() ||
                          !run.preempted_for.empty() || job.pause_requested() ||
                          job.cancel_requested();
    r.eta_s = stopping ? std::optional<double>(0) : EtaSeconds(job);
    r.preemptible = Preemptible(job.spec()) && !stopping;
    out.push_back(std::move(r));
  }
  return out;
}

void Coordinator::ChargeUsage(absl::Time now) {
  if (charged_ == absl::InfinitePast() || now <= charged_) {
    charged_ = now;
    return;
  }
  const double dt = absl::ToDoubleSeconds(now - charged_);
  for (const v1::Job* job : RunningJobsBut()) {
    const Holding h = HoldingOf(*job);
    fair_share_.Charge(job->owner(), h.slots, charged_, now);
    UserUsage& t = totals_[job->owner()];
    t.slot_seconds += h.slots * dt;
    t.gpu_seconds += h.gpus * dt;
  }
  charged_ = now;
}

void Coordinator::GrowBack() {
  // Shrunk jobs grow back once their full size fits (their own slots
  // counted as free). Asked to stop (SIGUSR1), the ranks save a checkpoint
  // at the end of the step they are in and exit 3: no step is lost. An
  // attempt that cannot be asked is stopped right after its next
  // checkpoint.
  for (auto& [id, run] : running_) {
    Entry& e = jobs_[id];
    const v1::Job& job = e.record.job;
    if (!job.spec().restart().allow_grow() || job.dp() == 0 ||
        job.dp() >= JobLayout(job.spec()).degree("dp") ||
        run.kill_at.has_value() || run.end.has_value()) {
      continue;
    }
    if (run.stop_asked_at.has_value()) continue;  // asked already
    if (!backend_->FitsFullSize(job, RunningJobsBut(id))) {
      run.grow_after_step.reset();
      continue;
    }
    const std::string reason =
        absl::StrCat("stopped at step ", job.progress().step(),
                     " to grow back to dp=", JobLayout(job.spec()).degree("dp"),
                     " (the slots are free again)");
    // Not before a rank has reported: until then the ranks may still be
    // starting, and a stop signal could end a process that cannot take it
    // yet (seen: an attempt asked 2 s after its start died of SIGUSR1).
    if (run.heard.empty()) continue;
    if (backend_->AskToStop(*run.handle)) {
      run.growing = true;
      run.kill_reason = reason;
      run.stop_asked_at = absl::Now();
      continue;
    }
    if (!run.grow_after_step.has_value()) {
      run.grow_after_step = run.newest_checkpoint;
      if (job.spec().checkpoint().every() > 0) continue;
    }
    if (job.spec().checkpoint().every() > 0 &&
        run.newest_checkpoint <= *run.grow_after_step) {
      continue;
    }
    run.growing = true;
    BeginKill(e, reason);
  }
}

void Coordinator::Launch(Entry& e, const AttemptPlace& place) {
  const std::string id = e.record.job.id();
  const v1::JobSpec spec = place.shrunk.value_or(e.record.job.spec());
  std::string token;
  JobUpdate u = NextAttempt(e, place, spec, &token);
  const int attempt = u.record.job.attempts();
  const std::string attempt_dir = AttemptDir(options_.state_dir, id, attempt);
  // Durable before any process carries the uid, so a crash right after the
  // fork still finds (and re-adopts) the attempt. Not written: not started;
  // the job stays queued and the next tick tries again.
  if (absl::Status s = Commit(e, std::move(u)); !s.ok()) {
    LogStoreError(e, s);
    return;
  }
  Running& run = running_[id];
  run.attempt_dir = attempt_dir;
  run.last_report = absl::Now();
  // Queued by such a backend until its first poll says it runs.
  run.backend_queued = backend_->QueuesItself();
  absl::StatusOr<std::string> job_dir =
      PrepareJobDir(options_.state_dir, id, spec, e.record.job.world_size(),
                    options_.tls_ca_pem, place.nodes);
  absl::StatusOr<std::unique_ptr<AttemptHandle>> started =
      job_dir.ok()
          ? backend_->Start(AttemptRequest(e, *job_dir, token, place, spec),
                            spec)
          : absl::StatusOr<std::unique_ptr<AttemptHandle>>(job_dir.status());
  if (!started.ok()) {
    run.end.emplace().state = AttemptStatus::kEnded;
    run.kill_reason = absl::StrCat(
        "attempt ", attempt, " did not start: ", started.status().message());
    OnAttemptEnded(e);
    return;
  }
  run.handle = std::move(*started);
  JobUpdate s;
  s.record = e.record;
  v1::Attempt& a = s.attempt.emplace();
  a.set_number(attempt);
  a.set_started_unix_ms(NowMs());
  a.set_exit_code(-1);
  a.set_dir(attempt_dir);
  s.event = backend_->StartedEvent(*run.handle, &a);
  if (s.event.empty()) return;
  if (absl::Status c = Commit(e, std::move(s)); !c.ok()) {
    LogStoreError(e, c);  // the backend finds it again after a restart
  }
}

JobUpdate Coordinator::NextAttempt(const Entry& e, const AttemptPlace& place,
                                   const v1::JobSpec& spec,
                                   std::string* token) const {
  JobUpdate u;
  u.record = e.record;
  JobRecord& next = u.record;
  v1::Job& job = next.job;
  const int attempt = job.attempts() + 1;
  job.set_attempts(attempt);
  job.set_world_size(WorldSize(spec));
  job.set_dp(JobLayout(spec).degree("dp"));
  // A GPU job's ranks take GPUs no running job holds (the backend placed
  // them); run on this host, its GPUs are a placement on this host.
  job.clear_placement();
  for (const v1::Placement& p : place.placement) *job.add_placement() = p;
  if (job.started_unix_ms() == 0) job.set_started_unix_ms(NowMs());
  job.set_state(v1::JOB_STATE_RUNNING);
  // The token lives only in Launch and in the attempt's environment; the
  // store keeps its hash. The attempt uid (not secret) finds the attempt's
  // processes after a coordinator restart.
  *token = GenerateToken();
  next.token_sha256 = Sha256Hex(*token);
  next.attempt_uid = absl::StrCat(job.uid().empty() ? job.id() : job.uid(), ".",
                                  attempt, ".", RandomHex(4));
  v1::Attempt& a = u.attempt.emplace();
  a.set_number(attempt);
  a.set_started_unix_ms(NowMs());
  a.set_exit_code(-1);
  a.set_dir(AttemptDir(options_.state_dir, job.id(), attempt));
  u.event = absl::StrCat("attempt ", attempt, " started");
  if (!place.nodes.empty()) {
    std::vector<std::string> where;
    for (const NodeRanks& n : place.nodes) {
      where.push_back(absl::StrCat(n.name, "×", n.ranks));
    }
    absl::StrAppend(&u.event, " on ", absl::StrJoin(where, ", "));
  }
  if (const int spec_dp = JobLayout(job.spec()).degree("dp");
      job.dp() != spec_dp) {
    absl::StrAppend(&u.event, " shrunk to dp=", job.dp(), " (spec dp=", spec_dp,
                    "; microbatches ", JobLayout(spec).microbatches,
                    ", global batch ", spec.train().global_batch(), " kept)");
  }
  return u;
}

std::vector<std::string> Coordinator::RankDataRoots() const {
  std::vector<std::string> roots = options_.data_roots;
  if (!options_.checkpoint_root.empty())
    roots.push_back(options_.checkpoint_root);
  return roots;
}

LaunchRequest Coordinator::AttemptRequest(const Entry& e,
                                          const std::string& job_dir,
                                          const std::string& token,
                                          const AttemptPlace& place,
                                          const v1::JobSpec& spec) const {
  const v1::Job& job = e.record.job;
  LaunchRequest req;
  req.job_id = job.id();
  req.job_uid = job.uid();
  req.attempt = job.attempts();
  req.job_dir = job_dir;
  req.token = token;
  req.attempt_uid = e.record.attempt_uid;
  req.coordinator_address = advertise_;
  req.data_roots = RankDataRoots();
  if (!options_.tls_ca_pem.empty()) {
    req.tls_ca_file = (fs::path(job_dir) / "tls-ca.pem").string();
  }
  req.world_size = job.world_size();
  req.cores = options_.cores;
  req.ptworker = options_.ptworker;
  req.rank_metrics_bind = options_.rank_metrics_bind;
  req.coordinator_grace_s =
      absl::ToDoubleSeconds(options_.rank_coordinator_grace);
  req.work_dir = options_.work_root;
  req.resume_flag = options_.resume_flag;
  req.fork_from = job.lineage().from_checkpoint();
  req.threads = spec.resources().threads_per_rank();
  req.placement = place.nodes;
  for (const v1::Placement& p : job.placement()) {
    req.rank_gpus.insert(req.rank_gpus.end(), p.gpus().begin(), p.gpus().end());
  }
  req.rank_cpus = RankCpus(job);
  return req;
}

std::vector<v1::Node> Coordinator::ListNodes() const {
  std::vector<v1::Node> nodes = nodes_->List(absl::Now());
  absl::MutexLock lock(&mu_);
  const std::map<std::string, int> used = NodeSlotsUsed(RunningJobsBut());
  for (v1::Node& n : nodes) SetSlotsUsed(used, &n);
  return nodes;
}

absl::StatusOr<v1::Node> Coordinator::DrainNode(const std::string& name,
                                                bool drain) {
  absl::StatusOr<v1::Node> n = nodes_->SetDraining(name, drain, absl::Now());
  if (!n.ok()) return n;
  spdlog::info("node {} {}", name, drain ? "drained" : "uncordoned");
  absl::MutexLock lock(&mu_);
  SetSlotsUsed(NodeSlotsUsed(RunningJobsBut()), &*n);
  wake_.Signal();
  return n;
}

absl::StatusOr<v1::Node> Coordinator::ApproveNode(const std::string& name) {
  absl::StatusOr<v1::Node> n = nodes_->Approve(name, absl::Now());
  if (!n.ok()) return n;
  absl::MutexLock lock(&mu_);
  SetSlotsUsed(NodeSlotsUsed(RunningJobsBut()), &*n);
  wake_.Signal();
  return n;
}

absl::Status Coordinator::ForgetNode(const std::string& name) {
  absl::MutexLock lock(&mu_);
  const std::map<std::string, int> used = NodeSlotsUsed(RunningJobsBut());
  auto it = used.find(name);
  return nodes_->Forget(name, it != used.end() && it->second > 0, absl::Now());
}

absl::StatusOr<v1::AuthorizeExecResponse> Coordinator::AuthorizeExec(
    const v1::AuthorizeExecRequest& r) {
  if (absl::Status s = nodes_->CheckSession(r.name(), r.session()); !s.ok()) {
    return s;
  }
  const absl::Status denied = absl::PermissionDeniedError(
      absl::StrCat("the token is not that of a running attempt placed on node ",
                   EchoQuoted(r.name())));
  if (r.token_sha256().size() != 64) return denied;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, run] : running_) {
    const JobRecord& rec = jobs_[id].record;
    if (rec.token_sha256 != r.token_sha256() || run.kill_at.has_value() ||
        run.end.has_value()) {
      continue;
    }
    for (const v1::Placement& p : rec.job.placement()) {
      if (p.node() != r.name()) continue;
      v1::AuthorizeExecResponse out;
      out.set_job_id(id);
      out.set_attempt(rec.job.attempts());
      out.set_attempt_uid(rec.attempt_uid);
      return out;
    }
  }
  return denied;
}

std::vector<std::string> Coordinator::AttemptsOnNode(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, run] : running_) {
    auto it = jobs_.find(id);
    if (it == jobs_.end() || it->second.record.attempt_uid.empty()) continue;
    for (const v1::Placement& p : it->second.record.job.placement()) {
      if (p.node() == name) out.push_back(it->second.record.attempt_uid);
    }
  }
  return out;
}

}  // namespace ptrain
