// Creation, the job API and what the metrics read; see coordinator.h. Every
// change of a job is computed on a copy of its record, written by Commit
// (SQLite first, in one transaction) and only then applied in memory and
// shown to watchers, all under mu_; a write the store refuses leaves memory
// as the disk has it and the supervisor tries again. Process work (fork,
// /proc scans, signals) is short and also under mu_, so the supervisor and
// the RPC handlers never see a half-made change.
#include "coordinator/coordinator.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/auth_token.h"
#include "common/bounded_file.h"
#include "common/exit_codes.h"
#include "common/job_state.h"
#include "common/net.h"
#include "common/planned_layout.h"
#include "common/private_file.h"
#include "common/spec.h"
#include "common/thread_entry.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/launcher.h"
#include "coordinator/paths.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace fs = std::filesystem;

namespace {

// A job's id for checkpoints and ranks that no other coordinator will give:
// its name and a ULID.
std::string NewJobUid(const std::string& name) {
  return absl::StrCat(name, "-", NewUlid());
}

}  // namespace

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

std::function<absl::StatusOr<UserTable>()> UsersLoader(
    const CoordinatorOptions& o) {
  if (!o.users_file.empty()) {
    return [path = o.users_file] { return UserTable::Load(path); };
  }
  if (!o.token_file.empty()) {
    return [path = o.token_file]() -> absl::StatusOr<UserTable> {
      absl::StatusOr<std::vector<std::string>> t =
          LoadTokenFile(path, "--token-file");
      if (!t.ok()) return t.status();
      return UserTable::FromTokens(*t);
    };
  }
  return [tokens = o.user_tokens]() -> absl::StatusOr<UserTable> {
    if (tokens.empty()) {
      return absl::InvalidArgumentError(
          "no users: give --users-file (or --token-file)");
    }
    return UserTable::FromTokens(tokens);
  };
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    CoordinatorOptions options) {
  std::error_code ec;
  const bool existed = fs::exists(options.state_dir, ec);
  fs::create_directories(options.state_dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state-dir ", options.state_dir, ": ", ec.message()));
  }
  if (!existed) chmod(options.state_dir.c_str(), 0700);
  if (absl::Status s = CheckPrivateDir(options.state_dir); !s.ok()) return s;
  TightenStateDir(options.state_dir);
  absl::StatusOr<int> lock_fd = LockStateDir(options.state_dir);
  if (!lock_fd.ok()) return lock_fd.status();
  absl::StatusOr<std::unique_ptr<Store>> store =
      Store::Open((fs::path(options.state_dir) / "ptcoord.db").string());
  if (!store.ok()) {
    close(*lock_fd);
    return store.status();
  }
  std::unique_ptr<Coordinator> c(
      new Coordinator(std::move(options), std::move(*store), *lock_fd));
  absl::StatusOr<std::unique_ptr<NodeRegistry>> nodes =
      NodeRegistry::Create(c->store_.get(), c->options_.nodes);
  if (!nodes.ok()) return nodes.status();
  c->nodes_ = std::move(*nodes);
  absl::StatusOr<std::unique_ptr<Users>> users =
      Users::Create(UsersLoader(c->options_));
  if (!users.ok()) return users.status();
  c->users_ = std::move(*users);
  absl::StatusOr<std::unique_ptr<AuditLog>> audit =
      AuditLog::Open((fs::path(c->options_.state_dir) / "audit.jsonl").string(),
                     c->options_.audit_max_bytes, c->options_.audit_keep);
  if (!audit.ok()) return audit.status();
  c->audit_ = std::move(*audit);
  // The one place that knows which backend runs the attempts.
  if (c->options_.slurm) {
    c->backend_ = NewSlurmBackend(c->options_);
  } else if (c->nodes_->enabled()) {
    c->backend_ = NewNodesBackend(c->options_, c->nodes_.get());
  } else {
    c->backend_ = NewLocalBackend(c->options_);
  }
  absl::StatusOr<std::vector<JobRecord>> jobs = c->store_->ListJobs();
  if (!jobs.ok()) return jobs.status();
  {
    absl::MutexLock lock(&c->mu_);
    // A job submitted before jobs had uids keeps none: its checkpoints
    // (in checkpoint.dir/JOB-ID/) carry none either, and its ranks, with an
    // empty PTRAIN_JOB_UID, resume them as their own.
    for (JobRecord& r : *jobs) {
      const std::string id = r.job.id();
      Entry& e = c->jobs_[id];
      e.record = std::move(r);
      // A watcher that has seen nothing (version 0) gets the job at once,
      // also one that ended before this ptcoord started and never changes
      // again.
      e.version = 1;
    }
  }
  c->ReplayUsage();
  c->Recover();
  return c;
}

Coordinator::Coordinator(CoordinatorOptions options,
                         std::unique_ptr<Store> store, int lock_fd)
    : options_(std::move(options)),
      store_(std::move(store)),
      lock_fd_(lock_fd),
      started_(absl::Now()),
      fair_share_(options_.fairshare_half_life),
      advertise_(options_.advertise_address) {}

void Coordinator::SetAdvertiseAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  advertise_ = address;
}

Coordinator::~Coordinator() {
  Stop();
  if (lock_fd_ >= 0) close(lock_fd_);
}

void Coordinator::Start() {
  if (supervisor_.joinable()) return;
  {
    // A re-adopted attempt's ranks could not report while we were down, nor
    // until they have reconnected: their hang timer starts now.
    absl::MutexLock lock(&mu_);
    for (auto& [id, run] : running_) run.last_report = absl::Now();
    last_supervised_ = absl::InfinitePast();
  }
  stop_ = false;
  supervisor_ = std::thread(ThreadEntry("supervisor", [this] {
    // A pass that starts this late (the machine or ptcoord too busy) delays
    // hang detection and kills: said, so that it is seen.
    const absl::Duration late = std::max(absl::Seconds(1), 5 * options_.tick);
    absl::Time previous = absl::Now();
    while (!stop_) {
      const absl::Time start = absl::Now();
      if (start - previous > late) {
        spdlog::warn(
            "supervision ran late: {} ms since the previous pass "
            "(every {} ms)",
            absl::ToInt64Milliseconds(start - previous),
            absl::ToInt64Milliseconds(options_.tick));
      }
      previous = start;
      Tick();
      // Once a minute: the ended jobs past their retention are forgotten.
      bool retention_due = false;
      {
        absl::MutexLock lock(&mu_);
        if (start - retention_checked_ >= absl::Minutes(1)) {
          retention_checked_ = start;
          retention_due = true;
        }
      }
      if (retention_due) ForgetExpiredJobs(start);
      absl::MutexLock lock(&mu_);
      wake_.WaitWithTimeout(&mu_, options_.tick);
    }
  }));
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

absl::Status Coordinator::Commit(Entry& e, JobUpdate update) {
  if (update.unix_ms == 0) update.unix_ms = NowMs();
  absl::Status s = store_->Apply(update);
  if (!s.ok()) return s;
  if (!update.event.empty()) {
    spdlog::info("{}: {}", update.record.job.id(), update.event);
  }
  last_store_error_.clear();
  e.record = std::move(update.record);
  ++e.version;
  e.message = update.event.empty() ? "progress" : update.event;
  changed_.SignalAll();
  return absl::OkStatus();
}

void Coordinator::CommitEvent(Entry& e, const std::string& event) {
  JobUpdate u;
  u.record = e.record;
  u.event = event;
  if (absl::Status s = Commit(e, std::move(u)); !s.ok()) LogStoreError(e, s);
}

void Coordinator::LogStoreError(const Entry& e, const absl::Status& s) {
  // Once per distinct error: a full disk would otherwise log every tick.
  const std::string text(s.message());
  if (text == last_store_error_) return;
  last_store_error_ = text;
  spdlog::error("{}: not saved, will retry: {}", e.record.job.id(), text);
}

Coordinator::Entry* Coordinator::Find(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<Caller> Coordinator::AuthenticateUser(
    const std::optional<std::string>& authorization) const {
  return users_->Authenticate(authorization);
}

absl::Status Coordinator::ReloadUsers() { return users_->Reload(); }

std::shared_ptr<const UserTable> Coordinator::UsersNow() const {
  return users_->table();
}

absl::StatusOr<std::string> Coordinator::JobOwner(const std::string& id) const {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return UnknownJob(id);
  return it->second.record.job.owner();
}

absl::Status Coordinator::AuthenticateRank(
    const std::string& job_id,
    const std::optional<std::string>& authorization) {
  std::string hash;
  {
    absl::MutexLock lock(&mu_);
    if (Entry* e = Find(job_id);
        e != nullptr && e->record.job.state() == v1::JOB_STATE_RUNNING) {
      hash = e->record.token_sha256;
    }
  }
  // An unknown job, an ended attempt and a wrong token look the same: no
  // probing for ids.
  return CheckBearerHash(authorization, hash);
}

absl::StatusOr<JobRecord> Coordinator::NewJobRecord(
    const std::string& spec_yaml, const std::vector<std::string>& overrides,
    const std::string& from_job, int64_t from_step) const {
  if (spec_yaml.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec_yaml is ", spec_yaml.size(), " bytes; the limit is ",
                     kMaxSpecBytes));
  }
  if (overrides.size() > 1000) {
    return absl::InvalidArgumentError("overrides: more than 1000 assignments");
  }
  // A model from a Hugging Face folder takes the fields the spec leaves out
  // from its config.json, read here (inside the data roots) as every input
  // is checked here.
  auto read = [&](const std::string& path) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> p = ConfinePath(
        "model.init_from", path, options_.work_root, options_.data_roots);
    if (!p.ok()) return p.status();
    return ReadBoundedFile("model.init_from", *p, 1 << 20);
  };
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpec(spec_yaml, overrides, "job spec", read);
  if (!spec.ok()) return spec.status();
  // `parallel: auto`: the planner's layout over the cluster as it is now,
  // kept with the job (the spec stored is the one that runs).
  v1::PlannedLayout plan;
  if (IsAutoLayout(*spec)) {
    if (!options_.plan_layout) return NoLayoutPlanner();
    if (absl::Status s =
            options_.plan_layout(backend_->Shape(*spec), &*spec, &plan);
        !s.ok()) {
      return s;
    }
  }
  const int world = WorldSize(*spec);
  // On nodes a job waits for slots (and GPUs) that may join later; Slurm
  // queues it. On its own host ptcoord knows now.
  if (absl::Status s = backend_->Admit(*spec, world); !s.ok()) return s;
  if (absl::Status s =
          ConfineSpecPaths(&*spec, options_.work_root, options_.data_roots);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckSpecInputsExist(*spec); !s.ok()) return s;
  JobRecord r;
  r.job.set_uid(NewJobUid(spec->name()));
  r.job.set_name(spec->name());
  r.job.set_state(v1::JOB_STATE_QUEUED);
  r.job.set_world_size(world);
  r.job.set_created_unix_ms(NowMs());
  r.job.mutable_progress()->set_total_steps(spec->train().steps());
  // Each job checkpoints into a folder of its own, named by its uid, so
  // `--resume-from latest` never picks up another job's steps, not even
  // those of a job of another coordinator sharing the checkpoint root. A
  // spec without checkpoint.dir gets one under --checkpoint-root: every
  // job ptcoord runs can be paused, preempted and restarted without loss.
  v1::CheckpointSpec* ckpt = spec->mutable_checkpoint();
  const std::string ckpt_root =
      ckpt->dir().empty() ? options_.checkpoint_root : ckpt->dir();
  if (!ckpt_root.empty())
    ckpt->set_dir((fs::path(ckpt_root) / r.job.uid()).string());
  *r.job.mutable_spec() = *spec;
  if (plan.ByteSizeLong() > 0) *r.job.mutable_plan() = std::move(plan);
  r.job.set_priority(*PriorityValue(spec->priority()));  // validated
  if (absl::Status s = SetForkSource(from_job, from_step, &r); !s.ok()) {
    return s;
  }
  return r;
}

absl::StatusOr<v1::Job> Coordinator::Submit(
    const std::string& spec_yaml, const std::vector<std::string>& overrides,
    const std::string& from_job, int64_t from_step, const Caller& by) {
  absl::StatusOr<JobRecord> r =
      NewJobRecord(spec_yaml, overrides, from_job, from_step);
  if (!r.ok()) return r.status();
  const std::string& owner = by.user;
  r->job.set_owner(owner);
  if (!Preemptible(r->job.spec()) && by.role != Role::kAdmin) {
    return absl::PermissionDeniedError(absl::StrCat(
        "restart.preemptible: false protects a job from preemption and needs "
        "role admin; ",
        owner, " is a ", RoleName(by.role)));
  }
  if (const User* u = users_->table()->Find(owner); u != nullptr) {
    const std::string never =
        NeverFitsQuota(owner, u->quota, HoldingOf(r->job));
    if (!never.empty()) return absl::InvalidArgumentError(never);
  }
  const int world = r->job.world_size();
  absl::MutexLock lock(&mu_);
  std::string event =
      absl::StrCat("submitted", By(owner), " (", world, " slots)");
  if (r->job.has_plan()) {
    absl::StrAppend(&event, "; ", PlannedLayoutEvent(r->job.plan()));
  }
  absl::StatusOr<JobRecord> stored =
      store_->InsertJob(std::move(*r), event, NowMs());
  if (!stored.ok()) return stored.status();
  Entry& e = jobs_[stored->job.id()];
  e.record = std::move(*stored);
  ++e.version;
  e.message = event;
  spdlog::info("{}: {} as {}", e.record.job.id(), event, e.record.job.uid());
  changed_.SignalAll();
  wake_.Signal();
  return e.record.job;
}

absl::StatusOr<std::string> Coordinator::DescribeRun(
    const v1::JobSpec& spec) const {
  // The spec as the ranks would read it, in a private file of the state
  // folder, removed whatever happens.
  const std::string path =
      (fs::path(options_.state_dir) /
       absl::StrCat("dry-run-", NewJobUid("spec"), ".yaml"))
          .string();
  if (absl::Status s = ReplacePrivateFile(path, JobSpecToYaml(spec)); !s.ok()) {
    return s;
  }
  LaunchRequest req;
  req.data_roots = RankDataRoots();
  req.world_size = 1;
  req.threads = 1;
  absl::StatusOr<CommandResult> run =
      RunCommand({options_.ptworker, "--dry-run", "--config", path},
                 AttemptEnvironment(req), options_.work_root);
  std::error_code ec;
  fs::remove(path, ec);
  if (!run.ok()) return run.status();
  if (run->exit_code != 0) {
    // Its one `ptworker: error:` line; bad input (exit 2) is the job's.
    absl::string_view why = absl::StripAsciiWhitespace(run->err);
    if (const size_t nl = why.rfind('\n'); nl != absl::string_view::npos)
      why.remove_prefix(nl + 1);
    absl::ConsumePrefix(&why, "ptworker: error: ");
    return run->exit_code == kExitBadInput
               ? absl::InvalidArgumentError(why)
               : absl::InternalError(
                     absl::StrCat("ptworker --dry-run exited with code ",
                                  run->exit_code, ": ", why));
  }
  return run->out;
}

absl::StatusOr<v1::DryRun> Coordinator::DryRunSubmit(
    const std::string& spec_yaml, const std::vector<std::string>& overrides,
    const std::string& from_job, int64_t from_step) {
  absl::StatusOr<JobRecord> r =
      NewJobRecord(spec_yaml, overrides, from_job, from_step);
  if (!r.ok()) return r.status();
  v1::DryRun out;
  out.set_world_size(r->job.world_size());
  if (r->job.has_plan()) *out.mutable_plan() = r->job.plan();
  // What the ranks would build, said by ptworker itself (no lock held: it
  // reads the data for its vocabulary).
  absl::StatusOr<std::string> report = DescribeRun(r->job.spec());
  if (!report.ok()) return report.status();
  out.set_report(std::move(*report));
  absl::MutexLock lock(&mu_);
  int ahead = 0;
  for (const auto& [id, e] : jobs_) {
    if (IsWaiting(e.record.job.state()) &&
        e.record.job.priority() >= r->job.priority()) {
      ++ahead;
    }
  }
  r->job.set_id("dry-run");
  const std::optional<AttemptPlace> place =
      backend_->Place(r->job, RunningJobsBut());
  if (ahead > 0) {
    // Jobs of its priority or higher come first (the order among those of
    // its own depends on their owners' fair share).
    out.set_waits(absl::StrCat(
        ahead, ahead == 1 ? " job is" : " jobs are",
        " queued ahead of it (of its priority or higher)",
        place.has_value() ? "; its ranks would fit beside the running jobs"
                          : ""));
  } else if (!place.has_value()) {
    out.set_waits(absl::StrCat("its ", r->job.world_size(), " ranks need ",
                               backend_->FreeSlots(RunningJobsBut())));
  } else {
    for (const v1::Placement& p : place->placement) *out.add_placement() = p;
  }
  return out;
}

absl::StatusOr<v1::GetJobResponse> Coordinator::Get(const std::string& id,
                                                    bool include_loss_history) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  v1::GetJobResponse out;
  {
    absl::MutexLock lock(&mu_);
    Entry* e = Find(id);
    if (e == nullptr) return UnknownJob(id);
    *out.mutable_job() = Shown(*e);
  }
  absl::StatusOr<std::vector<v1::Attempt>> attempts = store_->ListAttempts(id);
  if (!attempts.ok()) return attempts.status();
  for (v1::Attempt& a : *attempts) *out.add_attempts() = std::move(a);
  if (include_loss_history) {
    int64_t stored = 0;
    absl::StatusOr<std::vector<v1::LossPoint>> h =
        store_->LossHistory(id, options_.loss_points_per_series, &stored);
    if (!h.ok()) return h.status();
    for (v1::LossPoint& p : *h) *out.add_loss_history() = std::move(p);
    out.set_loss_points_stored(stored);
  }
  return out;
}

absl::StatusOr<std::vector<v1::Job>> Coordinator::List(
    v1::JobState state, int limit, const std::string& owner) {
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
    if ((state == v1::JOB_STATE_UNSPECIFIED || e.record.job.state() == state) &&
        (owner.empty() || e.record.job.owner() == owner)) {
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
    out.push_back(Shown(*picked[i]));
  return out;
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const std::string& id,
                                            const std::string& by) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return UnknownJob(id);
  const v1::Job& now = e->record.job;
  if (IsFinal(now.state()) || now.cancel_requested()) return now;  // idempotent
  JobUpdate u;
  u.record = e->record;
  v1::Job& job = u.record.job;
  job.set_cancel_requested(true);
  const bool waiting =
      IsWaiting(job.state()) || job.state() == v1::JOB_STATE_PAUSED;
  if (waiting) {
    job.set_state(v1::JOB_STATE_CANCELLED);
    job.set_finished_unix_ms(NowMs());
    u.event = absl::StrCat("cancelled", By(by), " before it ran");
  } else {
    u.event = absl::StrCat("cancel requested", By(by));
  }
  // Not written, not done: the caller may try again.
  if (absl::Status s = Commit(*e, std::move(u)); !s.ok()) return s;
  if (!waiting) {
    BeginKill(*e, "");
    wake_.Signal();
  }
  return e->record.job;
}

absl::StatusOr<v1::Job> Coordinator::Pause(const std::string& id,
                                           const std::string& by) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return UnknownJob(id);
  const v1::Job& now = e->record.job;
  if (IsFinal(now.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is ", StateName(now.state()),
                     ": only a queued or running job can be paused"));
  }
  if (now.state() == v1::JOB_STATE_PAUSED || now.pause_requested() ||
      now.cancel_requested()) {
    return now;  // idempotent; a cancel goes on
  }
  auto run = running_.find(id);
  if (run != running_.end() && !backend_->CanAskToStop()) {
    return absl::UnimplementedError(absl::StrCat(
        "job ", id, " runs under --launcher ", backend_->Name(),
        ", where pausing a running job is not built (cancel it, or pause it "
        "while it is queued)"));
  }
  JobUpdate u;
  u.record = e->record;
  v1::Job& job = u.record.job;
  const bool waiting = run == running_.end();
  if (waiting) {
    job.set_state(v1::JOB_STATE_PAUSED);
    u.event = absl::StrCat("paused", By(by), " before it ran");
  } else {
    job.set_pause_requested(true);
    u.event = absl::StrCat("pause requested", By(by));
  }
  if (absl::Status s = Commit(*e, std::move(u)); !s.ok()) return s;
  if (!waiting) {
    // The ranks save and exit 3; killed a hang timeout later if they do
    // not.
    RequestStop(*e, run->second);
    wake_.Signal();
  }
  return e->record.job;
}

absl::StatusOr<v1::Job> Coordinator::Resume(const std::string& id,
                                            const std::string& by) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return UnknownJob(id);
  const v1::Job& now = e->record.job;
  if (now.state() != v1::JOB_STATE_PAUSED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is ", StateName(now.state()),
                     now.pause_requested() ? " (pausing)" : "",
                     ": only a PAUSED job can be resumed"));
  }
  JobUpdate u;
  u.record = e->record;
  u.record.job.set_state(v1::JOB_STATE_QUEUED);
  u.event = absl::StrCat("resumed", By(by), ": queued again");
  if (absl::Status s = Commit(*e, std::move(u)); !s.ok()) return s;
  wake_.Signal();
  return e->record.job;
}

absl::StatusOr<v1::DeleteJobResponse> Coordinator::Delete(const std::string& id,
                                                          bool purge) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  v1::DeleteJobResponse out;
  std::string uid;
  {
    absl::MutexLock lock(&mu_);
    Entry* e = Find(id);
    if (e == nullptr) return UnknownJob(id);
    const v1::Job& job = e->record.job;
    if (!IsFinal(job.state())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " is ", StateName(job.state()),
          ": only an ended job (SUCCEEDED, FAILED or CANCELLED) can be "
          "deleted; cancel it first"));
    }
    if (absl::Status s = store_->DeleteJob(id); !s.ok()) return s;
    deleted_restarts_ += e->record.restarts_used;
    for (const auto& [reason, n] : job.requeues()) {
      deleted_requeues_[reason] += n;
    }
    out.set_job_id(id);
    out.set_checkpoint_dir(job.spec().checkpoint().dir());
    uid = job.uid();
    jobs_.erase(id);
    changed_.SignalAll();  // its watchers learn it is gone
  }
  // Off the lock: folders may be large. The job's folder of the state dir
  // is ptcoord's own; its checkpoints are removed only when asked, and
  // only a folder named by its uid (checkpoint.dir/UID).
  std::error_code ec;
  fs::remove_all(fs::path(options_.state_dir) / "jobs" / id, ec);
  const fs::path ckpt(out.checkpoint_dir());
  if (purge && !uid.empty() && ckpt.filename() == uid) {
    fs::remove_all(ckpt, ec);
    if (ec) {
      spdlog::warn("{}: deleted, but its checkpoints in {} were not: {}", id,
                   ckpt.string(), ec.message());
    } else {
      out.set_purged(true);
    }
  }
  spdlog::info("{}: deleted{}", id,
               out.purged() ? ", with its checkpoints" : "");
  return out;
}

std::vector<std::string> Coordinator::ForgetExpiredJobs(absl::Time now) {
  std::vector<std::string> expired;
  {
    absl::MutexLock lock(&mu_);
    if (options_.ended_job_retention <= absl::ZeroDuration()) return {};
    const int64_t before =
        absl::ToUnixMillis(now - options_.ended_job_retention);
    for (const auto& [id, e] : jobs_) {
      const v1::Job& job = e.record.job;
      if (IsFinal(job.state()) && job.finished_unix_ms() > 0 &&
          job.finished_unix_ms() < before) {
        expired.push_back(id);
      }
    }
  }
  std::vector<std::string> forgotten;
  for (const std::string& id : expired) {
    if (Delete(id, /*purge=*/false).ok()) forgotten.push_back(id);
  }
  if (!forgotten.empty()) {
    spdlog::info("forgot {} job(s) ended more than {} ago: {}",
                 forgotten.size(),
                 absl::FormatDuration(options_.ended_job_retention),
                 absl::StrJoin(forgotten, ", "));
  }
  return forgotten;
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>>
Coordinator::Events(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    if (Find(id) == nullptr) return UnknownJob(id);
  }
  return store_->ListEvents(id);
}

absl::StatusOr<std::vector<v1::LossPoint>> Coordinator::LossSince(
    const std::string& id, int64_t after, int64_t* stored, int64_t* last) {
  {
    absl::MutexLock lock(&mu_);
    if (Find(id) == nullptr) return UnknownJob(id);
  }
  return store_->LossHistory(id, options_.loss_points_per_series, stored, after,
                             last);
}

absl::StatusOr<std::vector<v1::Checkpoint>> Coordinator::Checkpoints(
    const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  std::string dir, uid;
  {
    absl::MutexLock lock(&mu_);
    Entry* e = Find(id);
    if (e == nullptr) return UnknownJob(id);
    dir = e->record.job.spec().checkpoint().dir();
    uid = e->record.job.uid();
  }
  absl::StatusOr<std::vector<v1::Checkpoint>> reported =
      store_->ListCheckpoints(id);
  if (!reported.ok()) return reported.status();
  // Committed folders on disk count too: a report may have been lost while
  // the coordinator was down. Pruned ones (keep_last) are not listed.
  // Listed only when committed and really under the job's folder (a
  // symlink out of it is not the job's checkpoint).
  std::map<int64_t, v1::Checkpoint> by_step;
  std::error_code ec;
  static const std::regex kStep("step-([0-9]{8,18})");
  if (!dir.empty()) {
    for (const fs::directory_entry& d : fs::directory_iterator(dir, ec)) {
      std::smatch m;
      const std::string name = d.path().filename().string();
      if (!std::regex_match(name, m, kStep)) continue;
      const int64_t step = std::stoll(m[1].str());
      absl::StatusOr<std::string> real =
          ResolveCheckpointDir("dir", d.path().string(), step, dir, uid);
      if (!real.ok()) continue;
      v1::Checkpoint c;
      c.set_step(step);
      c.set_dir(*real);
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

std::vector<Coordinator::RankEndpoint> Coordinator::Endpoints() const {
  absl::MutexLock lock(&mu_);
  std::vector<RankEndpoint> out;
  for (const auto& [id, run] : running_) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    const v1::Job& job = it->second.record.job;
    for (const auto& [rank, address] : run.endpoints) {
      // Ranks fill the placement's nodes in order (mpirun maps by slot).
      std::string node = HostName();
      int first = 0;
      for (const v1::Placement& p : job.placement()) {
        if (rank >= first && rank < first + p.ranks()) node = p.node();
        first += p.ranks();
      }
      out.push_back({id, job.name(), address, rank, job.attempts(), node});
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

std::vector<Coordinator::UnfinishedJob> Coordinator::UnfinishedJobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<UnfinishedJob> out;
  for (const auto& [id, e] : jobs_) {
    if (!IsFinal(e.record.job.state())) {
      out.push_back({e.record.job, e.record.restarts_used});
    }
  }
  return out;
}

int Coordinator::LocalSlotsUsed() const {
  absl::MutexLock lock(&mu_);
  return UsedSlots();
}

int64_t Coordinator::Restarts() const {
  absl::MutexLock lock(&mu_);
  int64_t n = deleted_restarts_;
  for (const auto& [id, e] : jobs_) n += e.record.restarts_used;
  return n;
}

std::map<std::string, int64_t> Coordinator::Requeues() const {
  std::map<std::string, int64_t> out;
  for (v1::AttemptEnd end : kRequeueEnds) out[EndName(end)] = 0;
  absl::MutexLock lock(&mu_);
  for (const auto& [reason, n] : deleted_requeues_) out[reason] += n;
  for (const auto& [id, e] : jobs_) {
    for (const auto& [reason, n] : e.record.job.requeues()) out[reason] += n;
  }
  return out;
}

int Coordinator::UsedSlots() const {
  int used = 0;
  for (const auto& [id, run] : running_) {
    auto it = jobs_.find(id);
    if (it != jobs_.end()) used += it->second.record.job.world_size();
  }
  return used;
}

RunningJobs Coordinator::RunningJobsBut(const std::string& except) const {
  return RunningJobsExcept({except});
}

RunningJobs Coordinator::RunningJobsExcept(
    const std::set<std::string>& except) const {
  RunningJobs out;
  for (const auto& [id, run] : running_) {
    auto it = jobs_.find(id);
    if (!except.count(id) && it != jobs_.end())
      out.push_back(&it->second.record.job);
  }
  return out;
}

v1::Job Coordinator::Shown(const Entry& e) {
  v1::Job job = e.record.job;
  if (!e.waiting.empty()) {
    job.set_waiting(e.waiting);
    job.set_queue_position(e.queue_position);
  }
  return job;
}

absl::StatusOr<v1::Job> Coordinator::SetPriority(const std::string& id,
                                                 const std::string& priority,
                                                 const std::string& by) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  absl::StatusOr<int> value = PriorityValue(priority);
  if (!value.ok()) return value.status();
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return UnknownJob(id);
  const v1::Job& now = e->record.job;
  if (IsFinal(now.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is ", StateName(now.state()),
                     ": an ended job has no priority to change"));
  }
  if (now.priority() == *value) return Shown(*e);
  JobUpdate u;
  u.record = e->record;
  u.record.job.set_priority(*value);
  u.event = absl::StrCat("priority set to ", PriorityWords(*value), By(by),
                         " (was ", PriorityWords(now.priority()), ")");
  if (absl::Status s = Commit(*e, std::move(u)); !s.ok()) return s;
  wake_.Signal();
  return Shown(*e);
}

std::vector<v1::Job> Coordinator::Queue() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> out;
  for (const std::string& id : queue_) {
    auto it = jobs_.find(id);
    if (it != jobs_.end() && IsWaiting(it->second.record.job.state())) {
      out.push_back(Shown(it->second));
    }
  }
  return out;
}

std::map<std::string, Coordinator::UserUsage> Coordinator::UsageByUser() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, UserUsage> out = totals_;
  for (auto& [user, u] : out) u.running_jobs = u.slots = u.gpus = 0;
  for (const v1::Job* job : RunningJobsBut()) {
    const Holding h = HoldingOf(*job);
    UserUsage& u = out[job->owner()];
    u.running_jobs += h.jobs;
    u.slots += h.slots;
    u.gpus += h.gpus;
  }
  return out;
}

void Coordinator::ReplayUsage() {
  // What the stored attempts held, decayed to now: the fair share goes on
  // across restarts of ptcoord.
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (const auto& [id, e] : jobs_) {
    absl::StatusOr<std::vector<v1::Attempt>> attempts =
        store_->ListAttempts(id);
    if (!attempts.ok()) continue;
    for (const v1::Attempt& a : *attempts) {
      if (a.started_unix_ms() <= 0) continue;
      const absl::Time from = absl::FromUnixMillis(a.started_unix_ms());
      const absl::Time to = a.finished_unix_ms() > 0
                                ? absl::FromUnixMillis(a.finished_unix_ms())
                                : now;
      fair_share_.Charge(e.record.job.owner(), e.record.job.world_size(), from,
                         std::min(to, now));
    }
  }
  charged_ = now;
}

}  // namespace ptrain
