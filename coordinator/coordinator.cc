// Job lifecycle, supervision and recovery; see coordinator.h. Every state
// change goes through Commit (SQLite first, then watchers), all under mu_;
// process work (fork, /proc scans, signals) is short and also under mu_, so
// the supervisor and the RPC handlers never see a half-made change.
#include "coordinator/coordinator.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "coordinator/auth.h"
#include "coordinator/launcher.h"
#include "coordinator/paths.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace fs = std::filesystem;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

bool IsFinal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED ||
         s == v1::JOB_STATE_CANCELLED;
}

std::string StateName(v1::JobState s) {
  std::string name = v1::JobState_Name(s);
  constexpr absl::string_view kPrefix = "JOB_STATE_";
  if (absl::StartsWith(name, kPrefix)) name = name.substr(kPrefix.size());
  return name;
}

namespace {

// What every lookup of a job id answers when there is no such job.
absl::Status UnknownJob(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
}

int WorldSize(const v1::JobSpec& spec) {
  return spec.parallel().dp() * spec.parallel().tp() * spec.parallel().pp();
}

bool IsWaiting(v1::JobState s) {
  return s == v1::JOB_STATE_QUEUED || s == v1::JOB_STATE_RESTARTING;
}

std::string AttemptDir(const std::string& state_dir, const std::string& id,
                       int n) {
  return (fs::path(state_dir) / "jobs" / id / absl::StrCat("attempt-", n))
      .string();
}

void LogIfError(const absl::Status& s, absl::string_view what) {
  if (!s.ok())
    spdlog::error("{}: {}", std::string(what), std::string(s.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    CoordinatorOptions options) {
  std::error_code ec;
  fs::create_directories(options.state_dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state-dir ", options.state_dir, ": ", ec.message()));
  }
  absl::StatusOr<std::unique_ptr<Store>> store =
      Store::Open((fs::path(options.state_dir) / "ptcoord.db").string());
  if (!store.ok()) return store.status();
  std::unique_ptr<Coordinator> c(
      new Coordinator(std::move(options), std::move(*store)));
  absl::StatusOr<std::vector<JobRecord>> jobs = c->store_->ListJobs();
  if (!jobs.ok()) return jobs.status();
  {
    absl::MutexLock lock(&c->mu_);
    for (JobRecord& r : *jobs) {
      const std::string id = r.job.id();
      c->jobs_[id].record = std::move(r);
    }
  }
  c->Recover();
  return c;
}

Coordinator::Coordinator(CoordinatorOptions options,
                         std::unique_ptr<Store> store)
    : options_(std::move(options)),
      store_(std::move(store)),
      scheduler_(options_.local_slots),
      advertise_(options_.advertise_address) {}

void Coordinator::SetAdvertiseAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  advertise_ = address;
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Start() {
  if (supervisor_.joinable()) return;
  stop_ = false;
  supervisor_ = std::thread([this] {
    while (!stop_) {
      Tick();
      absl::MutexLock lock(&mu_);
      wake_.WaitWithTimeout(&mu_, options_.tick);
    }
  });
}

void Coordinator::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.SignalAll();
  }
  if (supervisor_.joinable()) supervisor_.join();
  absl::MutexLock lock(&mu_);
  changed_.SignalAll();
}

void Coordinator::Recover() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, e] : jobs_) {
    JobRecord& r = e.record;
    if (r.job.state() != v1::JOB_STATE_RUNNING) continue;
    const std::string dir =
        AttemptDir(options_.state_dir, id, r.job.attempts());
    if (!AttemptProcesses(r.token).empty()) {
      // Re-adopt: the attempt kept training while we were down, and its ranks
      // report to the same address with the same token. Requeueing it would
      // throw away every step since its last checkpoint.
      Running& run = running_[id];
      run.attempt_dir = dir;
      run.is_child = false;
      r.last_progress_ms = NowMs();  // a full hang timeout from now
      Commit(e, absl::StrCat("attempt ", r.job.attempts(),
                             " re-adopted after a coordinator restart"));
      if (r.job.cancel_requested()) BeginKill(e, "");
      continue;
    }
    if (std::optional<int> rc = ReadExitCode(dir); rc.has_value()) {
      running_[id] = Running{dir, false, std::nullopt, "", std::nullopt};
      OnAttemptEnded(e, *rc);
      continue;
    }
    // Gone without an exit status (its processes died with the host or were
    // killed): not the job's fault, so it does not use up a restart.
    r.pid = 0;
    if (r.job.cancel_requested()) {
      r.job.set_state(v1::JOB_STATE_CANCELLED);
      r.job.set_finished_unix_ms(NowMs());
      Commit(e, "cancelled while the coordinator was down");
      continue;
    }
    const std::string lost =
        absl::StrCat("attempt ", r.job.attempts(),
                     " was lost while the coordinator was down");
    v1::Attempt a;
    if (auto all = store_->ListAttempts(id); all.ok() && !all->empty()) {
      a = all->back();
    }
    a.set_number(r.job.attempts());
    a.set_finished_unix_ms(NowMs());
    a.set_exit_code(-1);
    a.set_error(lost);
    a.set_dir(dir);
    LogIfError(store_->UpsertAttempt(id, a), "store attempt");
    FailAttempt(e, lost, /*counts=*/false);
  }
}

void Coordinator::Commit(Entry& e, const std::string& event) {
  LogIfError(store_->UpdateJob(e.record), "store job");
  if (!event.empty()) {
    LogIfError(store_->AddEvent(e.record.job.id(), NowMs(), event),
               "store event");
    spdlog::info("{}: {}", e.record.job.id(), event);
  }
  ++e.version;
  e.message = event.empty() ? "progress" : event;
  changed_.SignalAll();
}

Coordinator::Entry* Coordinator::Find(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::Status Coordinator::AuthenticateUser(
    const std::optional<std::string>& authorization) const {
  return CheckBearer(authorization, options_.user_tokens);
}

absl::Status Coordinator::AuthenticateRank(
    const std::string& job_id,
    const std::optional<std::string>& authorization) {
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    if (Entry* e = Find(job_id)) token = e->record.token;
  }
  // An unknown job and a wrong token look the same: no probing for ids.
  if (token.empty()) return absl::UnauthenticatedError("invalid job token");
  return CheckBearer(authorization, {token});
}

absl::StatusOr<v1::Job> Coordinator::Submit(
    const std::string& spec_yaml, const std::vector<std::string>& overrides) {
  if (spec_yaml.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec_yaml is ", spec_yaml.size(), " bytes; the limit is ",
                     kMaxSpecBytes));
  }
  if (overrides.size() > 1000) {
    return absl::InvalidArgumentError("overrides: more than 1000 assignments");
  }
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec(spec_yaml, overrides, "job spec");
  if (!spec.ok()) return spec.status();
  const int world = WorldSize(*spec);
  if (absl::Status s = scheduler_.CheckFits(world); !s.ok()) return s;
  if (absl::Status s =
          ConfineSpecPaths(&*spec, options_.work_root, options_.data_roots);
      !s.ok()) {
    return s;
  }
  JobRecord r;
  r.job.set_name(spec->name());
  r.job.set_state(v1::JOB_STATE_QUEUED);
  r.job.set_world_size(world);
  r.job.set_created_unix_ms(NowMs());
  r.job.mutable_progress()->set_total_steps(spec->train().steps());
  *r.job.mutable_spec() = *spec;

  absl::MutexLock lock(&mu_);
  absl::StatusOr<JobRecord> stored = store_->InsertJob(std::move(r));
  if (!stored.ok()) return stored.status();
  // Each job gets its own checkpoint folder, so that `--resume-from latest`
  // can never pick up another job's (or an earlier submission's) steps.
  v1::CheckpointSpec* ckpt = stored->job.mutable_spec()->mutable_checkpoint();
  if (!ckpt->dir().empty())
    ckpt->set_dir((fs::path(ckpt->dir()) / stored->job.id()).string());
  Entry& e = jobs_[stored->job.id()];
  e.record = std::move(*stored);
  Commit(e, absl::StrCat("submitted (", world, " slots)"));
  wake_.Signal();
  return e.record.job;
}

absl::StatusOr<v1::GetJobResponse> Coordinator::Get(const std::string& id,
                                                    bool include_loss_history) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  v1::GetJobResponse out;
  {
    absl::MutexLock lock(&mu_);
    Entry* e = Find(id);
    if (e == nullptr) return UnknownJob(id);
    *out.mutable_job() = e->record.job;
  }
  absl::StatusOr<std::vector<v1::Attempt>> attempts = store_->ListAttempts(id);
  if (!attempts.ok()) return attempts.status();
  for (v1::Attempt& a : *attempts) *out.add_attempts() = std::move(a);
  if (include_loss_history) {
    absl::StatusOr<std::vector<v1::LossPoint>> h = store_->LossHistory(id);
    if (!h.ok()) return h.status();
    for (v1::LossPoint& p : *h) *out.add_loss_history() = std::move(p);
  }
  return out;
}

absl::StatusOr<std::vector<v1::Job>> Coordinator::List(v1::JobState state,
                                                       int limit) {
  if (limit < 0 || limit > kMaxListLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit=", limit, " must be in [0, ", kMaxListLimit, "]"));
  }
  if (!v1::JobState_IsValid(state)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state=", state, " is not a JobState"));
  }
  std::vector<const Entry*> picked;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : jobs_) {
    if (state == v1::JOB_STATE_UNSPECIFIED || e.record.job.state() == state) {
      picked.push_back(&e);
    }
  }
  std::sort(picked.begin(), picked.end(), [](const Entry* a, const Entry* b) {
    return a->record.seq < b->record.seq;
  });
  const size_t first = limit == 0 || picked.size() <= static_cast<size_t>(limit)
                           ? 0
                           : picked.size() - limit;
  std::vector<v1::Job> out;
  for (size_t i = first; i < picked.size(); ++i)
    out.push_back(picked[i]->record.job);
  return out;
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return UnknownJob(id);
  v1::Job& job = e->record.job;
  if (IsFinal(job.state()) || job.cancel_requested()) return job;  // idempotent
  job.set_cancel_requested(true);
  if (IsWaiting(job.state())) {
    job.set_state(v1::JOB_STATE_CANCELLED);
    job.set_finished_unix_ms(NowMs());
    Commit(*e, "cancelled before it ran");
  } else {
    Commit(*e, "cancel requested");
    BeginKill(*e, "");
    wake_.Signal();
  }
  return job;
}

absl::StatusOr<std::vector<v1::Checkpoint>> Coordinator::Checkpoints(
    const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  std::string dir;
  {
    absl::MutexLock lock(&mu_);
    Entry* e = Find(id);
    if (e == nullptr) return UnknownJob(id);
    dir = e->record.job.spec().checkpoint().dir();
  }
  absl::StatusOr<std::vector<v1::Checkpoint>> reported =
      store_->ListCheckpoints(id);
  if (!reported.ok()) return reported.status();
  // Committed folders on disk count too: a report may have been lost while
  // the coordinator was down. Pruned ones (keep_last) are not listed.
  std::map<int64_t, v1::Checkpoint> by_step;
  std::error_code ec;
  static const std::regex kStep("step-([0-9]{8})");
  if (!dir.empty()) {
    for (const fs::directory_entry& d : fs::directory_iterator(dir, ec)) {
      std::smatch m;
      const std::string name = d.path().filename().string();
      if (!d.is_directory(ec) || !std::regex_match(name, m, kStep)) continue;
      v1::Checkpoint c;
      c.set_step(std::stoll(m[1].str()));
      c.set_dir(d.path().string());
      by_step[c.step()] = c;
    }
  }
  for (const v1::Checkpoint& c : *reported) {
    // Without a folder to look at, the reports are all we know.
    if (dir.empty() || by_step.count(c.step())) by_step[c.step()] = c;
  }
  std::vector<v1::Checkpoint> out;
  for (auto& [step, c] : by_step) out.push_back(c);
  return out;
}

absl::StatusOr<Coordinator::Snapshot> Coordinator::WaitForChange(
    const std::string& id, uint64_t seen, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    Entry* e = Find(id);
    if (e == nullptr) return UnknownJob(id);
    if (e->version > seen || absl::Now() >= deadline || stop_) {
      return Snapshot{e->record.job, e->version, e->message};
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::StatusOr<Coordinator::LogSource> Coordinator::Logs(const std::string& id,
                                                         int attempt) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  if (attempt < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("attempt=", attempt, " < 0"));
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return UnknownJob(id);
  const int latest = e->record.job.attempts();
  if (latest == 0)
    return absl::NotFoundError(absl::StrCat(id, " has not started yet"));
  if (attempt > latest) {
    return absl::NotFoundError(absl::StrCat(id, " has no attempt ", attempt,
                                            " (latest ", latest, ")"));
  }
  const int n = attempt == 0 ? latest : attempt;
  const bool finished = n < latest || !running_.count(id);
  return LogSource{n, AttemptDir(options_.state_dir, id, n), finished};
}

absl::Status Coordinator::ReportProgress(const v1::ReportProgressRequest& r) {
  if (r.step() < 0)
    return absl::InvalidArgumentError(absl::StrCat("step=", r.step(), " < 0"));
  absl::MutexLock lock(&mu_);
  Entry* e = Find(r.job_id());
  if (e == nullptr) return UnknownJob(r.job_id());
  v1::Job& job = e->record.job;
  if (r.attempt() != job.attempts() || job.state() != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "attempt ", r.attempt(), " of ", r.job_id(), " is not running"));
  }
  v1::Progress* p = job.mutable_progress();
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
  e->record.last_progress_ms = p->unix_ms();
  v1::LossPoint point;
  point.set_step(r.step());
  point.set_loss(r.is_eval() ? 0.0 : r.loss());
  point.set_val_loss(r.is_eval() ? r.val_loss() : 0.0);
  point.set_attempt(r.attempt());
  LogIfError(store_->AddLossPoint(job.id(), point), "store loss");
  Commit(*e, "");
  return absl::OkStatus();
}

absl::Status Coordinator::ReportCheckpoint(
    const v1::ReportCheckpointRequest& r) {
  if (r.step() < 0)
    return absl::InvalidArgumentError(absl::StrCat("step=", r.step(), " < 0"));
  absl::MutexLock lock(&mu_);
  Entry* e = Find(r.job_id());
  if (e == nullptr) return UnknownJob(r.job_id());
  v1::Checkpoint c;
  c.set_step(r.step());
  c.set_dir(r.dir());
  c.set_attempt(r.attempt());
  c.set_unix_ms(NowMs());
  absl::Status s = store_->AddCheckpoint(r.job_id(), c);
  if (!s.ok()) return s;
  // A checkpoint is progress too: a long save must not look like a hang.
  e->record.last_progress_ms = c.unix_ms();
  Commit(*e, absl::StrCat("checkpoint at step ", r.step()));
  return absl::OkStatus();
}

absl::Status Coordinator::ReportEndpoint(const v1::ReportEndpointRequest& r) {
  if (r.rank() < 0)
    return absl::InvalidArgumentError(absl::StrCat("rank=", r.rank(), " < 0"));
  absl::MutexLock lock(&mu_);
  Entry* e = Find(r.job_id());
  if (e == nullptr) return UnknownJob(r.job_id());
  // Only the current attempt's ranks are live endpoints.
  auto run = running_.find(r.job_id());
  if (run != running_.end() && r.attempt() == e->record.job.attempts()) {
    run->second.endpoints[r.rank()] = r.address();
  }
  Commit(*e, absl::StrCat("rank ", r.rank(), " metrics at ", r.address()));
  return absl::OkStatus();
}

std::vector<Coordinator::RankEndpoint> Coordinator::Endpoints() const {
  absl::MutexLock lock(&mu_);
  std::vector<RankEndpoint> out;
  for (const auto& [id, run] : running_) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    const v1::Job& job = it->second.record.job;
    for (const auto& [rank, address] : run.endpoints) {
      out.push_back({id, job.name(), address, rank, job.attempts()});
    }
  }
  return out;
}

std::map<std::string, int> Coordinator::JobCounts() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, int> out;
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (v1::JobState_IsValid(s) && s != v1::JOB_STATE_UNSPECIFIED) {
      out[StateName(static_cast<v1::JobState>(s))] = 0;
    }
  }
  for (const auto& [id, e] : jobs_) ++out[StateName(e.record.job.state())];
  return out;
}

int64_t Coordinator::Restarts() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, e] : jobs_) {
    n += std::max(0, e.record.job.attempts() - 1);
  }
  return n;
}

int Coordinator::UsedSlots() const {
  int used = 0;
  for (const auto& [id, run] : running_) {
    auto it = jobs_.find(id);
    if (it != jobs_.end()) used += it->second.record.job.world_size();
  }
  return used;
}

void Coordinator::BeginKill(Entry& e, const std::string& reason) {
  auto it = running_.find(e.record.job.id());
  if (it == running_.end()) return;
  Running& run = it->second;
  if (!reason.empty() && run.kill_reason.empty()) run.kill_reason = reason;
  if (run.kill_at.has_value()) return;
  SignalAttempt(static_cast<pid_t>(e.record.pid), e.record.token, SIGTERM);
  run.kill_at = absl::Now() + options_.cancel_grace;
}

void Coordinator::Launch(Entry& e) {
  JobRecord& r = e.record;
  v1::Job& job = r.job;
  const int attempt = job.attempts() + 1;
  job.set_attempts(attempt);
  if (job.started_unix_ms() == 0) job.set_started_unix_ms(NowMs());
  r.token = GenerateToken();
  r.pid = 0;
  r.last_progress_ms = NowMs();
  job.set_state(v1::JOB_STATE_RUNNING);
  // The token is durable before any process carries it, so a crash right
  // after the fork still finds (and re-adopts) the attempt.
  Commit(e, "");

  v1::Attempt a;
  a.set_number(attempt);
  a.set_started_unix_ms(NowMs());
  a.set_exit_code(-1);
  a.set_dir(AttemptDir(options_.state_dir, job.id(), attempt));
  absl::StatusOr<std::string> job_dir =
      PrepareJobDir(options_.state_dir, job.id(), job.spec(), job.world_size());
  absl::StatusOr<Launched> launched =
      absl::InternalError("job folder not prepared");
  if (!job_dir.ok()) {
    launched = job_dir.status();
  } else {
    LaunchRequest req;
    req.job_id = job.id();
    req.attempt = attempt;
    req.job_dir = *job_dir;
    req.token = r.token;
    req.coordinator_address = advertise_;
    req.world_size = job.world_size();
    req.cores = options_.cores;
    req.mpirun = options_.mpirun;
    req.ptworker = options_.ptworker;
    req.rank_metrics_bind = options_.rank_metrics_bind;
    req.work_dir = options_.work_root;
    req.resume_flag = options_.resume_flag;
    launched = LaunchAttempt(req);
  }
  if (!launched.ok()) {
    a.set_finished_unix_ms(NowMs());
    a.set_error(std::string(launched.status().message()));
    LogIfError(store_->UpsertAttempt(job.id(), a), "store attempt");
    FailAttempt(
        e, absl::StrCat("attempt ", attempt, " did not start: ", a.error()),
        true);
    return;
  }
  LogIfError(store_->UpsertAttempt(job.id(), a), "store attempt");
  r.pid = launched->pid;
  running_[job.id()] =
      Running{launched->attempt_dir, true, std::nullopt, "", std::nullopt};
  Commit(e, absl::StrCat("attempt ", attempt, " started (pid ", r.pid, ")"));
}

void Coordinator::OnAttemptEnded(Entry& e, int exit_code) {
  JobRecord& r = e.record;
  v1::Job& job = r.job;
  const std::string id = job.id();
  Running run = running_[id];
  running_.erase(id);
  r.pid = 0;

  std::string error;
  if (!run.kill_reason.empty()) {
    error = run.kill_reason;
  } else if (exit_code != 0) {
    const std::string tail =
        TailLines((fs::path(run.attempt_dir) / "stderr.log").string(), 20);
    error = absl::StrCat("attempt ", job.attempts(), " exited with code ",
                         exit_code,
                         tail.empty() ? "" : "; last stderr lines:\n", tail);
  }
  absl::StatusOr<std::vector<v1::Attempt>> attempts = store_->ListAttempts(id);
  v1::Attempt a;
  if (attempts.ok() && !attempts->empty() &&
      attempts->back().number() == job.attempts()) {
    a = attempts->back();
  }
  a.set_number(job.attempts());
  a.set_finished_unix_ms(NowMs());
  a.set_exit_code(exit_code);
  a.set_error(error);
  a.set_dir(run.attempt_dir);
  LogIfError(store_->UpsertAttempt(id, a), "store attempt");

  if (job.cancel_requested()) {
    job.set_state(v1::JOB_STATE_CANCELLED);
    job.set_finished_unix_ms(NowMs());
    Commit(e, absl::StrCat("cancelled (attempt ", job.attempts(), " ended)"));
  } else if (error.empty()) {
    job.set_state(v1::JOB_STATE_SUCCEEDED);
    job.set_finished_unix_ms(NowMs());
    job.set_error("");
    Commit(e, absl::StrCat("succeeded on attempt ", job.attempts()));
  } else {
    FailAttempt(e, error, /*counts=*/true);
  }
}

void Coordinator::FailAttempt(Entry& e, const std::string& error, bool counts) {
  JobRecord& r = e.record;
  v1::Job& job = r.job;
  job.set_error(error);
  const int max = job.spec().restart().max_restarts();
  if (!counts || r.restarts_used < max) {
    if (counts) ++r.restarts_used;
    job.set_state(v1::JOB_STATE_RESTARTING);
    Commit(e, absl::StrCat("attempt ", job.attempts(), " failed (restart ",
                           r.restarts_used, " of ", max, "): ", error));
  } else {
    job.set_state(v1::JOB_STATE_FAILED);
    job.set_finished_unix_ms(NowMs());
    Commit(e,
           absl::StrCat("failed after ", job.attempts(), " attempts: ", error));
  }
}

void Coordinator::Tick() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  std::vector<std::string> ids;
  for (const auto& [id, run] : running_) ids.push_back(id);
  for (const std::string& id : ids) {
    Entry& e = jobs_[id];
    Running& run = running_[id];
    JobRecord& r = e.record;
    // The wrapper shell ends after mpirun; the attempt has ended once no
    // process carrying its token is left (ranks may outlive mpirun briefly).
    if (!run.leader_exit.has_value()) {
      if (run.is_child && r.pid > 0) {
        if (std::optional<int> rc = ReapChild(static_cast<pid_t>(r.pid));
            rc.has_value()) {
          run.leader_exit =
              *rc >= 0 ? *rc : ReadExitCode(run.attempt_dir).value_or(-1);
        }
      } else if (!AttemptAlive(static_cast<pid_t>(r.pid), run.attempt_dir)) {
        run.leader_exit = ReadExitCode(run.attempt_dir)
                              .value_or(run.kill_at.has_value() ? 137 : -1);
      }
    }
    if (run.leader_exit.has_value()) {
      if (AttemptProcesses(r.token).empty()) {
        OnAttemptEnded(e, *run.leader_exit);
        continue;
      }
      // mpirun is gone but ranks linger: they get the grace period.
      if (!run.kill_at.has_value()) run.kill_at = now + options_.cancel_grace;
    }
    if (run.kill_at.has_value() && now >= *run.kill_at) {
      SignalAttempt(static_cast<pid_t>(r.pid), r.token, SIGKILL);
      run.kill_at = now + options_.cancel_grace;
      continue;
    }
    const int64_t timeout_ms =
        int64_t{r.job.spec().restart().hang_timeout_s()} * 1000;
    const int64_t silent_ms = NowMs() - r.last_progress_ms;
    if (!run.kill_at.has_value() && timeout_ms > 0 && silent_ms > timeout_ms) {
      BeginKill(e, absl::StrCat("hang at step ", r.job.progress().step(),
                                ": no progress report for ", silent_ms / 1000,
                                " s (restart.hang_timeout_s=",
                                r.job.spec().restart().hang_timeout_s(), ")"));
    }
  }

  std::vector<const Entry*> waiting;
  for (const auto& [id, e] : jobs_) {
    if (IsWaiting(e.record.job.state())) waiting.push_back(&e);
  }
  std::sort(waiting.begin(), waiting.end(), [](const Entry* a, const Entry* b) {
    return a->record.seq < b->record.seq;
  });
  std::vector<QueuedJob> queue;
  for (const Entry* e : waiting)
    queue.push_back({e->record.job.id(), e->record.job.world_size()});
  for (const std::string& id : scheduler_.Pick(queue, UsedSlots()))
    Launch(jobs_[id]);
}

}  // namespace ptrain
