// Job lifecycle, supervision and recovery; see coordinator.h. Every change
// of a job is computed on a copy of its record, written by Commit (SQLite
// first, in one transaction) and only then applied in memory and shown to
// watchers, all under mu_; a write the store refuses leaves memory as the
// disk has it and the supervisor tries again. Process work (fork, /proc
// scans, signals) is short and also under mu_, so the supervisor and the
// RPC handlers never see a half-made change.
#include "coordinator/coordinator.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <regex>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/auth_token.h"
#include "common/digest.h"
#include "common/exit_codes.h"
#include "common/gpu_inventory.h"
#include "common/job_state.h"
#include "common/spec.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/launcher.h"
#include "coordinator/paths.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace fs = std::filesystem;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

std::string LocalHostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

namespace {

// A supervision tick later than its period by more than this means ptcoord
// itself could not run (see Supervise).
constexpr absl::Duration kLateSupervision = absl::Seconds(1);

// The GPUs jobs run on this host may take: --local-gpus, else the driver's
// count; none asked of the driver when jobs run on nodes or under Slurm.
int LocalGpus(const CoordinatorOptions& o) {
  if (o.local_gpus >= 0) return o.local_gpus;
  if (o.slurm || !o.nodes.join_tokens.empty()) return 0;
  return GpuCount();
}

// Node `name` of `nodes`, or null.
const v1::Node* FindNode(const std::vector<v1::Node>& nodes,
                         const std::string& name) {
  for (const v1::Node& n : nodes) {
    if (n.spec().name() == name) return &n;
  }
  return nullptr;
}

// n->slots_used from the slots of running attempts per node.
void SetSlotsUsed(const std::map<std::string, int>& used, v1::Node* n) {
  auto it = used.find(n->spec().name());
  n->set_slots_used(it == used.end() ? 0 : it->second);
}

// A job's id for checkpoints and ranks that no other coordinator will give:
// its name and a ULID.
std::string NewJobUid(const std::string& name) {
  return absl::StrCat(name, "-", NewUlid());
}

}  // namespace

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
  c->Recover();
  return c;
}

Coordinator::Coordinator(CoordinatorOptions options,
                         std::unique_ptr<Store> store, int lock_fd)
    : options_(std::move(options)),
      store_(std::move(store)),
      scheduler_(options_.local_slots, LocalGpus(options_)),
      lock_fd_(lock_fd),
      started_(absl::Now()),
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
    const JobRecord& r = e.record;
    if (r.job.state() != v1::JOB_STATE_RUNNING) continue;
    Running run;
    run.attempt_dir = AttemptDir(options_.state_dir, id, r.job.attempts());
    run.is_child = false;
    run.last_report = absl::Now();
    const AttemptKey key = KeyOf(r);
    bool alive = false;
    if (options_.slurm) {
      // Found by its name: also an attempt whose id never reached the
      // store (ptcoord died right after sbatch).
      absl::StatusOr<std::string> sid =
          FindSlurmJob(SlurmJobName(id, r.job.attempts()));
      if (!sid.ok()) {
        spdlog::warn("{}: cannot ask Slurm for attempt {}: {}", id,
                     r.job.attempts(), std::string(sid.status().message()));
      }
      if (sid.ok() && !sid->empty()) {
        run.slurm_id = *sid;
        alive = true;
      }
    } else {
      alive = !AttemptProcesses(key).empty();
    }
    if (alive) {
      // Re-adopt: the attempt kept training while we were down, and its ranks
      // report to the same address with the same token. Requeueing it would
      // throw away every step since its last checkpoint. What they logged
      // while we were down is taken from the run log.
      if (!options_.slurm) run.pgid = AttemptLeader(key, run.attempt_dir);
      running_[id] = run;
      JobUpdate u;
      u.record = r;
      RecoverFromRunLog(e, run.attempt_dir, &u);
      u.event = absl::StrCat("attempt ", r.job.attempts(),
                             " re-adopted after a coordinator restart");
      if (absl::Status s = Commit(e, std::move(u)); !s.ok()) {
        LogStoreError(e, s);
      }
      // Its reports go on from the newest step it logged.
      if (absl::StatusOr<Store::LastSteps> last =
              store_->LastLossSteps(id, r.job.attempts());
          last.ok()) {
        running_[id].last_step = std::max(last->step, last->eval);
      }
      if (e.record.job.cancel_requested()) BeginKill(e, "");
      continue;
    }
    // Ended while we were down: the exit_code file decides (OnAttemptEnded
    // asks the run log and checkpoints when it cannot).
    TakeExitFile(run);
    running_[id] = run;
  }
  Supervise();
}

void Coordinator::TakeExitFile(Running& run) {
  const AttemptExit ex = ReadAttemptExit(run.attempt_dir);
  run.leader_exit = ex.kind == AttemptExit::kCode ? ex.code : -1;
  // Still pending: its processes died with the host or were killed, which
  // is not the job's fault, so it does not use up a restart.
  run.lost = ex.kind == AttemptExit::kPending;
  run.exit_unknown = ex.kind == AttemptExit::kUnknown;
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

absl::Status Coordinator::AuthenticateUser(
    const std::optional<std::string>& authorization) const {
  return CheckBearer(authorization, options_.user_tokens);
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
  // On nodes a job waits for slots (and GPUs) that may join later; Slurm
  // queues it. On its own host ptcoord knows now.
  if (!nodes_->enabled() && !options_.slurm) {
    if (absl::Status s = scheduler_.CheckFits(world); !s.ok()) return s;
    if (OnGpus(*spec)) {
      // --local-gpus was checked against the driver when ptcoord started.
      const std::string why =
          options_.local_gpus >= 0 ? "" : GpuUnavailableReason();
      if (!why.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "resources.device=cuda: this coordinator runs jobs on its own "
            "host, which cannot train on a GPU: ",
            why));
      }
      const int gpus = scheduler_.total_gpus();
      if (world > gpus && !RanksShareGpus()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "resources.device=cuda: the job's ", world,
            " ranks (parallel.dp × tp × pp) need one GPU each, and this "
            "coordinator's host, where it runs jobs, offers ",
            gpus, options_.local_gpus >= 0 ? " (--local-gpus)" : ""));
      }
    }
  }
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
  // those of a job of another coordinator sharing the checkpoint root.
  v1::CheckpointSpec* ckpt = spec->mutable_checkpoint();
  if (!ckpt->dir().empty())
    ckpt->set_dir((fs::path(ckpt->dir()) / r.job.uid()).string());
  *r.job.mutable_spec() = *spec;

  absl::MutexLock lock(&mu_);
  const std::string event = absl::StrCat("submitted (", world, " slots)");
  absl::StatusOr<JobRecord> stored =
      store_->InsertJob(std::move(r), event, NowMs());
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
    int64_t stored = 0;
    absl::StatusOr<std::vector<v1::LossPoint>> h =
        store_->LossHistory(id, options_.loss_points_per_series, &stored);
    if (!h.ok()) return h.status();
    for (v1::LossPoint& p : *h) *out.add_loss_history() = std::move(p);
    out.set_loss_points_stored(stored);
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
    u.event = "cancelled before it ran";
  } else {
    u.event = "cancel requested";
  }
  // Not written, not done: the caller may try again.
  if (absl::Status s = Commit(*e, std::move(u)); !s.ok()) return s;
  if (!waiting) {
    BeginKill(*e, "");
    wake_.Signal();
  }
  return e->record.job;
}

absl::StatusOr<v1::Job> Coordinator::Pause(const std::string& id) {
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
  if (run != running_.end() && options_.slurm) {
    return absl::UnimplementedError(absl::StrCat(
        "job ", id,
        " runs under --launcher slurm, where pausing a running job is not "
        "built (cancel it, or pause it while it is queued)"));
  }
  JobUpdate u;
  u.record = e->record;
  v1::Job& job = u.record.job;
  const bool waiting = run == running_.end();
  if (waiting) {
    job.set_state(v1::JOB_STATE_PAUSED);
    u.event = "paused before it ran";
  } else {
    job.set_pause_requested(true);
    u.event = "pause requested";
  }
  if (absl::Status s = Commit(*e, std::move(u)); !s.ok()) return s;
  if (!waiting) {
    Running& r = run->second;
    // The ranks save and exit 3; killed a hang timeout later if they do
    // not (or at once when no launcher can be signalled: steps since the
    // last checkpoint are lost then).
    if (SignalLauncher(KeyOf(e->record), SIGUSR1)) {
      r.stop_asked_at = absl::Now();
    } else {
      BeginKill(*e, "");
    }
    wake_.Signal();
  }
  return e->record.job;
}

absl::StatusOr<v1::Job> Coordinator::Resume(const std::string& id) {
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
  u.event = "resumed: queued again";
  if (absl::Status s = Commit(*e, std::move(u)); !s.ok()) return s;
  wake_.Signal();
  return e->record.job;
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
      std::string node = LocalHostName();
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
  int64_t n = 0;
  for (const auto& [id, e] : jobs_) n += e.record.restarts_used;
  return n;
}

std::map<std::string, int64_t> Coordinator::Requeues() const {
  std::map<std::string, int64_t> out;
  for (v1::AttemptEnd end : kRequeueEnds) out[EndName(end)] = 0;
  absl::MutexLock lock(&mu_);
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

void Coordinator::BeginKill(Entry& e, const std::string& reason) {
  auto it = running_.find(e.record.job.id());
  if (it == running_.end()) return;
  Running& run = it->second;
  if (!reason.empty() && run.kill_reason.empty()) run.kill_reason = reason;
  if (run.kill_at.has_value()) return;
  if (!run.slurm_id.empty()) {
    // Slurm signals the batch script and every step (SIGTERM, then
    // SIGKILL after its KillWait).
    if (absl::Status s = CancelSlurmJob(run.slurm_id, ""); !s.ok()) {
      spdlog::warn("{}: {}", e.record.job.id(), std::string(s.message()));
    }
  } else {
    SignalAttempt(run.pgid, KeyOf(e.record), SIGTERM);
  }
  run.kill_at = absl::Now() + options_.cancel_grace;
}

bool Coordinator::RecoverFromRunLog(const Entry& e,
                                    const std::string& attempt_dir,
                                    JobUpdate* u) {
  const v1::Job& job = e.record.job;
  const ReportContext ctx{job.id(), job.attempts(), job.world_size(),
                          job.spec().train().steps()};
  // Points of this attempt past the last one its reports delivered (an
  // attempt's steps only grow): the run log is read back to that one.
  int64_t have_step = -1, have_eval = -1;
  if (absl::StatusOr<Store::LastSteps> last =
          store_->LastLossSteps(job.id(), job.attempts());
      last.ok()) {
    have_step = last->step;
    have_eval = last->eval;
  }
  const RunLogSummary log = ReadRunLog(
      (fs::path(attempt_dir) / "run.jsonl").string(), ctx, have_step);
  if (log.records.empty() && log.checkpoints.empty()) return log.ended;
  v1::Progress* p = u->record.job.mutable_progress();
  if (log.last_step.has_value()) {
    p->set_step(log.last_step->step);
    p->set_loss(log.last_step->loss);
    p->set_lr(log.last_step->lr);
    p->set_tok_per_s(log.last_step->tok_per_s);
    p->set_mfu(log.last_step->mfu);
    p->set_unix_ms(NowMs());
  }
  if (log.last_eval.has_value()) {
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
    q.set_attempt(job.attempts());
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

void Coordinator::Launch(Entry& e, const std::vector<NodeRanks>& placement,
                         const v1::JobSpec* spec) {
  const std::string id = e.record.job.id();
  JobUpdate u;
  u.record = e.record;
  JobRecord& next = u.record;
  v1::Job& job = next.job;
  const v1::JobSpec& run_spec = spec != nullptr ? *spec : job.spec();
  const int attempt = job.attempts() + 1;
  job.set_attempts(attempt);
  job.set_world_size(WorldSize(run_spec));
  job.set_dp(run_spec.parallel().dp());
  job.clear_placement();
  // A GPU job's ranks take GPUs no running job holds (FreeNodes, or the
  // local scheduler, counted them free). Run on this host, its GPUs are
  // kept as a placement on this host (mpirun still runs locally).
  std::map<std::string, std::set<int>> gpus_held;
  if (OnGpus(run_spec)) gpus_held = GpusHeld(id);
  for (const NodeRanks& n : placement) {
    v1::Placement* p = job.add_placement();
    p->set_node(n.name);
    p->set_ranks(n.ranks);
    if (OnGpus(run_spec)) {
      for (int g : TakeGpus(gpus_held[n.name], n.ranks)) p->add_gpus(g);
    }
  }
  if (placement.empty() && TakesLocalGpus(run_spec)) {
    v1::Placement* p = job.add_placement();
    p->set_node(LocalHostName());
    p->set_ranks(job.world_size());
    for (int g : TakeGpus(gpus_held[LocalHostName()], job.world_size())) {
      p->add_gpus(g);
    }
  }
  if (job.started_unix_ms() == 0) job.set_started_unix_ms(NowMs());
  job.set_state(v1::JOB_STATE_RUNNING);
  // The token lives only in this function and in the attempt's environment;
  // the store keeps its hash. The attempt uid (not secret) finds the
  // attempt's processes after a coordinator restart.
  const std::string token = GenerateToken();
  next.token_sha256 = Sha256Hex(token);
  next.attempt_uid = absl::StrCat(job.uid().empty() ? id : job.uid(), ".",
                                  attempt, ".", RandomHex(4));
  const std::string attempt_dir = AttemptDir(options_.state_dir, id, attempt);
  v1::Attempt& a = u.attempt.emplace();
  a.set_number(attempt);
  a.set_started_unix_ms(NowMs());
  a.set_exit_code(-1);
  a.set_dir(attempt_dir);
  u.event = absl::StrCat("attempt ", attempt, " started");
  if (!placement.empty()) {
    std::vector<std::string> where;
    for (const NodeRanks& n : placement) {
      where.push_back(absl::StrCat(n.name, "×", n.ranks));
    }
    absl::StrAppend(&u.event, " on ", absl::StrJoin(where, ", "));
  }
  if (job.dp() != job.spec().parallel().dp()) {
    absl::StrAppend(&u.event, " shrunk to dp=", job.dp(),
                    " (spec dp=", job.spec().parallel().dp(), "; microbatches ",
                    run_spec.parallel().microbatches(), ", global batch ",
                    run_spec.train().global_batch(), " kept)");
  }
  // Durable before any process carries the uid, so a crash right after the
  // fork still finds (and re-adopts) the attempt. Not written: not started;
  // the job stays queued and the next tick tries again.
  if (absl::Status s = Commit(e, std::move(u)); !s.ok()) {
    LogStoreError(e, s);
    return;
  }
  const v1::Job& started = e.record.job;
  Running& run = running_[id];
  run.attempt_dir = attempt_dir;
  run.last_report = absl::Now();
  absl::StatusOr<std::string> job_dir =
      PrepareJobDir(options_.state_dir, id, run_spec, started.world_size(),
                    options_.tls_ca_pem, placement);
  std::string nodes_file;
  int threads = run_spec.resources().threads_per_rank();
  if (job_dir.ok() && !placement.empty()) {
    // Where ptrsh finds each node's daemon, and the threads every rank
    // gets: the fewest cores per rank over the placement.
    std::string text;
    int min_threads = 0;
    for (const v1::Node& n : nodes_->List(absl::Now())) {
      // Only a node whose daemon proved its session (registered with its
      // secret, heartbeating) gets an attempt's token: a node that went
      // down since it was placed is left out, and ptrsh refuses to reach it.
      if (n.state() != v1::NODE_STATE_UP) continue;
      for (const NodeRanks& p : placement) {
        if (p.name != n.spec().name()) continue;
        absl::StrAppend(&text, p.name, " ", n.spec().address(), "\n");
        const int t = std::max(1, n.spec().cores() / p.ranks);
        min_threads = min_threads == 0 ? t : std::min(min_threads, t);
      }
    }
    if (threads == 0) threads = min_threads;
    nodes_file = (fs::path(*job_dir) / "nodes").string();
    if (absl::Status s = WritePrivateFile(nodes_file, text); !s.ok()) {
      job_dir = s;
    }
  }
  absl::StatusOr<Launched> launched =
      job_dir.ok() ? absl::InternalError("not launched") : job_dir.status();
  if (job_dir.ok()) {
    LaunchRequest req;
    req.job_id = id;
    req.job_uid = started.uid();
    req.attempt = attempt;
    req.job_dir = *job_dir;
    req.token = token;
    req.attempt_uid = e.record.attempt_uid;
    req.coordinator_address = advertise_;
    req.data_roots = options_.data_roots;
    if (!options_.tls_ca_pem.empty())
      req.tls_ca_file = (fs::path(*job_dir) / "tls-ca.pem").string();
    req.world_size = started.world_size();
    req.cores = options_.cores;
    req.mpirun = options_.mpirun;
    req.ptworker = options_.ptworker;
    req.rank_metrics_bind = options_.rank_metrics_bind;
    req.work_dir = options_.work_root;
    req.resume_flag = options_.resume_flag;
    req.threads = threads;
    req.placement = placement;
    for (const v1::Placement& p : started.placement()) {
      req.rank_gpus.insert(req.rank_gpus.end(), p.gpus().begin(),
                           p.gpus().end());
    }
    req.rsh_agent = options_.ptrsh;
    req.nodes_file = nodes_file;
    req.cluster_network = options_.cluster_network;
    if (options_.slurm) {
      const int cpus = std::max(1, run_spec.resources().threads_per_rank());
      absl::StatusOr<std::string> sid =
          SubmitSlurmAttempt(req, run_spec.resources().ranks_per_node(), cpus,
                             options_.slurm_options);
      if (sid.ok()) {
        run.slurm_id = *sid;
        run.is_child = false;
        JobUpdate s;
        s.record = e.record;
        v1::Attempt& a = s.attempt.emplace();
        a.set_number(attempt);
        a.set_started_unix_ms(NowMs());
        a.set_exit_code(-1);
        a.set_dir(attempt_dir);
        a.set_slurm_job_id(*sid);
        s.event = absl::StrCat("attempt ", attempt, " is Slurm job ", *sid,
                               " (", SlurmJobName(id, attempt), ")");
        if (absl::Status c = Commit(e, std::move(s)); !c.ok()) {
          LogStoreError(e, c);  // found again by its name after a restart
        }
        return;
      }
      launched = sid.status();
    } else {
      launched = LaunchAttempt(req);
    }
  }
  if (!launched.ok()) {
    run.is_child = false;
    run.leader_exit = -1;
    run.kill_reason = absl::StrCat(
        "attempt ", attempt, " did not start: ", launched.status().message());
    OnAttemptEnded(e);
    return;
  }
  run.pgid = launched->pid;
  spdlog::info("{}: attempt {} is pid {}", id, attempt, run.pgid);
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

void Coordinator::OnAttemptEnded(Entry& e) {
  const std::string id = e.record.job.id();
  Running& run = running_[id];
  int exit_code = run.leader_exit.value_or(-1);
  JobUpdate u;
  u.record = e.record;
  const bool log_ended = RecoverFromRunLog(e, run.attempt_dir, &u);
  JobRecord& next = u.record;
  v1::Job& job = next.job;
  const int n = job.attempts();

  // An end whose exit code we do not know is decided by what the attempt
  // left: a finished job must never train again.
  std::string resolved;
  if ((run.lost || run.exit_unknown) && run.kill_reason.empty()) {
    resolved = FinishedBy(u, log_ended);
    if (!resolved.empty()) {
      exit_code = 0;
      run.lost = run.exit_unknown = false;
    }
  }
  std::string error;
  if (!run.kill_reason.empty()) {
    error = run.kill_reason;
  } else if (run.exit_unknown) {
    error = absl::StrCat(
        "attempt ", n,
        " ended without an exit code ptcoord can read (its exit_code file is "
        "empty or unreadable: a full disk?), and neither its run log nor a "
        "checkpoint at step ",
        job.spec().train().steps(), " shows it finished");
  } else if (run.lost) {
    error = absl::StrCat("attempt ", n,
                         " was lost: its processes ended without an exit code "
                         "(coordinator down, host restarted or killed)");
  } else if (exit_code != 0) {
    const std::string tail =
        TailLines((fs::path(run.attempt_dir) / "stderr.log").string(), 20);
    error = absl::StrCat("attempt ", n, " exited with code ", exit_code,
                         tail.empty() ? "" : "; last stderr lines:\n", tail);
  }
  v1::Attempt& a = u.attempt.emplace();
  if (auto all = store_->ListAttempts(id);
      all.ok() && !all->empty() && all->back().number() == n) {
    a = all->back();
  }
  a.set_number(n);
  a.set_finished_unix_ms(NowMs());
  a.set_exit_code(run.lost || run.exit_unknown ? -1 : exit_code);
  a.set_error(error);
  a.set_dir(run.attempt_dir);
  // The attempt's token and uid die with it: a report signed with that
  // token is refused from now on.
  next.token_sha256.clear();
  next.attempt_uid.clear();

  const int max = job.spec().restart().max_restarts();
  // A pause asked of this attempt is answered by its end, one way or another.
  const bool pausing = job.pause_requested();
  job.set_pause_requested(false);
  v1::AttemptEnd end = v1::ATTEMPT_END_FAILED;
  if (job.cancel_requested()) {
    end = v1::ATTEMPT_END_CANCELLED;
    job.set_state(v1::JOB_STATE_CANCELLED);
    job.set_finished_unix_ms(NowMs());
    u.event = absl::StrCat("cancelled (attempt ", n, " ended)");
  } else if (error.empty()) {
    end = v1::ATTEMPT_END_SUCCEEDED;
    job.set_state(v1::JOB_STATE_SUCCEEDED);
    job.set_finished_unix_ms(NowMs());
    job.set_error("");
    u.event =
        absl::StrCat("succeeded on attempt ", n, resolved.empty() ? "" : " (",
                     resolved, resolved.empty() ? "" : ")");
  } else if (pausing) {
    // Exit 3 when its ranks saved and stopped as asked; whatever else
    // ended it, it waits for ResumeJob now.
    end = v1::ATTEMPT_END_PAUSED;
    job.set_state(v1::JOB_STATE_PAUSED);
    job.set_error(exit_code == kExitStopped ? "" : error);
    u.event =
        absl::StrCat("paused after step ", job.progress().step(), " (attempt ",
                     n, " ended with exit code ", exit_code, ")");
  } else if (run.lost || run.exit_unknown || run.node_lost || run.growing) {
    // Not the job's fault: requeued without using up a restart.
    end = run.growing     ? v1::ATTEMPT_END_GROWN
          : run.node_lost ? v1::ATTEMPT_END_NODE_LOST
                          : v1::ATTEMPT_END_LOST;
    job.set_error(run.growing ? "" : error);
    job.set_state(v1::JOB_STATE_RESTARTING);
    u.event = absl::StrCat(error, "; requeued (not counted as a restart)");
  } else if (run.kill_reason.empty() && exit_code == kExitStopped) {
    // Its ranks were signalled (a preemption, an operator) and saved a
    // checkpoint before they stopped: not a failure.
    end = v1::ATTEMPT_END_STOPPED;
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
  a.set_end(end);
  // Counted apart from restarts (restarts_used), so that an alert on
  // restarts does not fire on pauses, preemptions or lost nodes.
  if (std::find(std::begin(kRequeueEnds), std::end(kRequeueEnds), end) !=
      std::end(kRequeueEnds)) {
    ++(*job.mutable_requeues())[EndName(end)];
  }
  if (absl::Status s = Commit(e, std::move(u)); !s.ok()) {
    // Still running as far as the disk knows, so here too; try again soon.
    LogStoreError(e, s);
    run.retry_at = absl::Now() + absl::Seconds(1);
    return;
  }
  running_.erase(id);
}

bool Coordinator::ReadyToEnd(Entry& e, Running& run,
                             const std::vector<v1::Node>& nodes,
                             absl::Time now) {
  const v1::Job& job = e.record.job;
  // Only a placement on nodes has nodes to wait for (a local GPU job's
  // placement names this host).
  if (!nodes_->enabled() || job.placement().empty() || run.node_lost ||
      job.cancel_requested() || !run.kill_reason.empty() ||
      run.leader_exit.value_or(-1) == 0) {
    return true;
  }
  // A failed attempt on nodes: mpirun notices a dead node (about 1 s) long
  // before its heartbeats time out. Decide once every node of the
  // placement has heartbeated since (the job's own failure) or one is down
  // (not the job's fault).
  if (!run.ended_at.has_value()) run.ended_at = now;
  bool all_heard = true;
  for (const v1::Placement& p : job.placement()) {
    const v1::Node* n = FindNode(nodes, p.node());
    if (n == nullptr || n->state() != v1::NODE_STATE_UP) {
      run.node_lost = true;
      run.kill_reason =
          absl::StrCat("attempt ", job.attempts(), " lost node ", p.node(),
                       " (no heartbeat; its processes are gone)");
      return true;
    }
    if (absl::FromUnixMillis(n->last_heartbeat_unix_ms()) <= *run.ended_at) {
      all_heard = false;
    }
  }
  return all_heard ||
         now - *run.ended_at > options_.nodes.timeout + absl::Seconds(2);
}

void Coordinator::PollSlurm(Entry& e, Running& run, absl::Time now) {
  if (run.leader_exit.has_value() || now < run.next_poll) return;
  run.next_poll = now + absl::Seconds(1);
  absl::StatusOr<SlurmJob> job = QuerySlurmJob(run.slurm_id);
  if (!job.ok() && job.status().code() != absl::StatusCode::kNotFound) {
    return;  // slurmctld unreachable: ask again later
  }
  if (job.ok() && !SlurmJobEnded(job->state)) {
    // Queued by Slurm is not a hang: the timer starts when it runs.
    if (job->state == "PENDING" || job->state == "CONFIGURING") {
      run.last_report = now;
    }
    if (job->state != run.slurm_state) {
      run.slurm_state = job->state;
      JobUpdate u;
      u.record = e.record;
      u.event = absl::StrCat("Slurm job ", run.slurm_id, " ", job->state,
                             job->reason.empty() || job->reason == "None"
                                 ? ""
                                 : absl::StrCat(" (", job->reason, ")"),
                             job->nodes.empty() || job->nodes == "(null)"
                                 ? ""
                                 : absl::StrCat(" on ", job->nodes));
      if (absl::Status s = Commit(e, std::move(u)); !s.ok()) {
        LogStoreError(e, s);
      }
    }
    return;
  }
  // Ended (or purged): the batch script's exit_code file decides when it
  // got to write it; else Slurm's record.
  const std::optional<int> rc = ReadExitCode(run.attempt_dir);
  if (!job.ok()) {
    run.leader_exit = rc.value_or(-1);
    run.lost = !rc.has_value() && !run.kill_at.has_value();
    return;
  }
  run.leader_exit = rc.has_value()     ? *rc
                    : job->signal != 0 ? 128 + job->signal
                                       : job->exit_code;
  if (job->state == "NODE_FAIL") {
    run.node_lost = true;
    run.kill_reason = absl::StrCat("attempt ", e.record.job.attempts(),
                                   " lost a node: Slurm job ", run.slurm_id,
                                   " ended NODE_FAIL on ", job->nodes);
  } else if (job->state == "CANCELLED" && !run.kill_at.has_value()) {
    run.kill_reason = absl::StrCat("Slurm job ", run.slurm_id,
                                   " was cancelled outside ptrain (scancel)");
  } else if (job->state != "COMPLETED" && *run.leader_exit == 0) {
    run.leader_exit = 1;
    run.kill_reason =
        absl::StrCat("Slurm job ", run.slurm_id, " ended ", job->state,
                     job->reason.empty() ? "" : " (" + job->reason + ")");
  }
  if (job->state == "NODE_FAIL" || job->state == "CANCELLED" ||
      *run.leader_exit == 0 || *run.leader_exit == kExitBadInput ||
      *run.leader_exit == kExitStopped || run.kill_at.has_value()) {
    return;
  }
  // A dead node usually fails the job (its other ranks lose their peers)
  // seconds before slurmctld marks the node down: the failure counts as the
  // job's own only once Slurm has had the grace to say so.
  absl::StatusOr<std::vector<std::string>> lost = SlurmLostNodes(job->nodes);
  if (lost.ok() && !lost->empty()) {
    run.node_lost = true;
    run.kill_reason = absl::StrCat(
        "attempt ", e.record.job.attempts(), " lost a node: Slurm reports ",
        absl::StrJoin(*lost, ","), " down or not responding (Slurm job ",
        run.slurm_id, " ended ", job->state, ")");
    return;
  }
  if (!run.slurm_failed_at.has_value()) run.slurm_failed_at = now;
  if (now - *run.slurm_failed_at < options_.slurm_options.node_grace) {
    run.leader_exit.reset();
    run.kill_reason.clear();
    run.last_report = now;  // waiting on Slurm is not a hang
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
  const std::vector<v1::Node> nodes =
      nodes_->enabled() ? nodes_->List(now) : std::vector<v1::Node>();
  // Right after a restart every node is down until it registers again:
  // re-adopted attempts are not ended for that.
  const bool nodes_settled = now - started_ > options_.nodes.timeout;
  std::vector<std::string> ids;
  for (const auto& [id, run] : running_) ids.push_back(id);
  for (const std::string& id : ids) {
    Entry& e = jobs_[id];
    Running& run = running_[id];
    const AttemptKey key = KeyOf(e.record);
    if (!run.slurm_id.empty()) {
      PollSlurm(e, run, now);
      if (run.leader_exit.has_value()) {
        if (!run.retry_at.has_value() || now >= *run.retry_at) {
          OnAttemptEnded(e);
        }
        continue;
      }
    }
    // The wrapper shell ends after mpirun; the attempt has ended once no
    // process of it is left (ranks may outlive mpirun briefly).
    if (!run.leader_exit.has_value() && run.slurm_id.empty()) {
      if (run.is_child && run.pgid > 0) {
        if (std::optional<int> rc = ReapChild(run.pgid); rc.has_value()) {
          if (*rc >= 0) {
            run.leader_exit = *rc;
          } else {
            TakeExitFile(run);
          }
        }
      } else if (!AttemptAlive(run.pgid, run.attempt_dir)) {
        TakeExitFile(run);
        if (run.leader_exit.value_or(-1) < 0 && run.kill_at.has_value()) {
          run.leader_exit = 128 + SIGKILL;
          run.lost = run.exit_unknown = false;
        }
      }
    }
    // A node of the placement stopped heartbeating: the attempt cannot
    // go on (a frozen node would hold it forever, a cut link for minutes).
    if (nodes_->enabled() && !run.leader_exit.has_value() &&
        !run.kill_at.has_value() && nodes_settled) {
      for (const v1::Placement& p : e.record.job.placement()) {
        const v1::Node* n = FindNode(nodes, p.node());
        if (n == nullptr || n->state() != v1::NODE_STATE_UP) {
          run.node_lost = true;
          BeginKill(e, absl::StrCat(
                           "attempt ", e.record.job.attempts(), " lost node ",
                           p.node(), " (no heartbeat for ",
                           absl::FormatDuration(options_.nodes.timeout), ")"));
          break;
        }
      }
    }
    if (run.leader_exit.has_value()) {
      if (AttemptProcesses(key).empty()) {
        if (!ReadyToEnd(e, run, nodes, now)) continue;
        if (!run.retry_at.has_value() || now >= *run.retry_at) {
          OnAttemptEnded(e);
        }
        continue;
      }
      // mpirun is gone but ranks linger: they get the grace period.
      if (!run.kill_at.has_value()) run.kill_at = now + options_.cancel_grace;
    }
    if (run.kill_at.has_value() && now >= *run.kill_at) {
      if (!run.slurm_id.empty()) {
        CancelSlurmJob(run.slurm_id, "KILL").IgnoreError();
        run.kill_at = now + options_.cancel_grace;
        continue;
      }
      SignalAttempt(run.pgid, key, SIGKILL);
      run.kill_at = now + options_.cancel_grace;
      continue;
    }
    const int64_t timeout_s = e.record.job.spec().restart().hang_timeout_s();
    // Asked to save and stop (SIGUSR1: pause, grow back): ranks still
    // running a hang timeout later are killed.
    if (run.stop_asked_at.has_value() && !run.kill_at.has_value() &&
        now - *run.stop_asked_at > absl::Seconds(timeout_s)) {
      BeginKill(e, "");
      continue;
    }
    const absl::Duration silent = now - run.last_report;
    if (!run.kill_at.has_value() && timeout_s > 0 &&
        silent > absl::Seconds(timeout_s)) {
      BeginKill(e, absl::StrCat(
                       "hang at step ", e.record.job.progress().step(),
                       run.activity.empty() ? ""
                                            : absl::StrCat(" (last busy with ",
                                                           run.activity, ")"),
                       ": no report for ", absl::ToInt64Seconds(silent),
                       " s (restart.hang_timeout_s=", timeout_s, ")"));
    }
  }
}

void Coordinator::Tick() {
  absl::MutexLock lock(&mu_);
  Supervise();
  std::vector<const Entry*> waiting;
  for (const auto& [id, e] : jobs_) {
    if (IsWaiting(e.record.job.state())) waiting.push_back(&e);
  }
  std::sort(waiting.begin(), waiting.end(), [](const Entry* a, const Entry* b) {
    return a->record.seq < b->record.seq;
  });
  if (nodes_->enabled()) {
    ScheduleOnNodes(waiting);
    return;
  }
  if (options_.slurm) {
    // Slurm queues and places: every waiting job becomes a Slurm job. One
    // that ran and lost nodes shrinks (when allowed) to what Slurm's up
    // nodes can hold, instead of waiting for nodes that may not return.
    for (const Entry* w : waiting) {
      Entry& e = jobs_[w->record.job.id()];
      const v1::JobSpec& spec = e.record.job.spec();
      std::optional<v1::JobSpec> shrunk;
      if (spec.restart().allow_shrink() && e.record.job.attempts() > 0) {
        const int per_rank = std::max(1, spec.resources().threads_per_rank());
        absl::StatusOr<std::vector<int>> cpus =
            SlurmUpNodeCpus(options_.slurm_options.partition);
        const int capacity =
            cpus.ok() ? SlurmTaskCapacity(*cpus, per_rank,
                                          spec.resources().ranks_per_node())
                      : 0;
        if (cpus.ok() && WorldSize(spec) > capacity) {
          for (int dp = spec.parallel().dp() - 1; dp >= 1; --dp) {
            absl::StatusOr<v1::JobSpec> s = ShrinkDp(spec, dp);
            if (s.ok() && WorldSize(*s) <= capacity) {
              shrunk = *s;
              break;
            }
          }
        }
      }
      Launch(e, {}, shrunk.has_value() ? &*shrunk : nullptr);
    }
    return;
  }
  std::vector<QueuedJob> queue;
  for (const Entry* e : waiting) {
    const v1::Job& job = e->record.job;
    queue.push_back({job.id(), job.world_size(),
                     TakesLocalGpus(job.spec()) ? job.world_size() : 0});
  }
  const int gpus_used = static_cast<int>(GpusHeld("")[LocalHostName()].size());
  for (const std::string& id : scheduler_.Pick(queue, UsedSlots(), gpus_used))
    Launch(jobs_[id]);
}

bool Coordinator::TakesLocalGpus(const v1::JobSpec& spec) const {
  return !nodes_->enabled() && !options_.slurm && OnGpus(spec) &&
         !RanksShareGpus();
}

std::map<std::string, int> Coordinator::NodeSlotsUsed(const std::string& except,
                                                      bool gpus_only) const {
  std::map<std::string, int> used;
  for (const auto& [id, run] : running_) {
    auto it = jobs_.find(id);
    if (id == except || it == jobs_.end()) continue;
    if (gpus_only && !OnGpus(it->second.record.job.spec())) continue;
    for (const v1::Placement& p : it->second.record.job.placement()) {
      used[p.node()] += p.ranks();
    }
  }
  return used;
}

std::map<std::string, std::set<int>> Coordinator::GpusHeld(
    const std::string& except) const {
  std::map<std::string, std::set<int>> held;
  for (const auto& [id, run] : running_) {
    auto it = jobs_.find(id);
    if (id == except || it == jobs_.end()) continue;
    for (const v1::Placement& p : it->second.record.job.placement()) {
      held[p.node()].insert(p.gpus().begin(), p.gpus().end());
    }
  }
  return held;
}

std::vector<FreeNode> Coordinator::FreeNodes(const std::vector<v1::Node>& nodes,
                                             const std::string& except,
                                             bool gpus) const {
  return FreeNodesOf(nodes, NodeSlotsUsed(except),
                     gpus ? NodeSlotsUsed(except, /*gpus_only=*/true)
                          : std::map<std::string, int>{},
                     gpus);
}

void Coordinator::ScheduleOnNodes(const std::vector<const Entry*>& waiting) {
  const std::vector<v1::Node> nodes = nodes_->List(absl::Now());
  bool blocked = false;
  for (const Entry* w : waiting) {
    Entry& e = jobs_[w->record.job.id()];
    const v1::JobSpec& spec = e.record.job.spec();
    // What the jobs launched so far in this pass left free.
    const std::vector<FreeNode> free = FreeNodes(nodes, "", OnGpus(spec));
    const int tp = spec.parallel().tp();
    const int per_node = spec.resources().ranks_per_node();
    std::vector<NodeRanks> place =
        PlaceRanks(free, WorldSize(spec), tp, per_node);
    std::optional<v1::JobSpec> shrunk;
    // Only a job that ran and lost slots shrinks; a new one waits.
    if (place.empty() && spec.restart().allow_shrink() &&
        e.record.job.attempts() > 0) {
      for (int dp = spec.parallel().dp() - 1; dp >= 1 && place.empty(); --dp) {
        absl::StatusOr<v1::JobSpec> s = ShrinkDp(spec, dp);
        if (!s.ok()) continue;
        place = PlaceRanks(free, WorldSize(*s), tp, per_node);
        if (!place.empty()) shrunk = *s;
      }
    }
    // Strict FIFO, as on one host: the first job that does not fit holds
    // the queue.
    if (place.empty()) {
      blocked = true;
      break;
    }
    Launch(e, place, shrunk.has_value() ? &*shrunk : nullptr);
  }
  if (blocked) return;  // queued jobs come before growing ones
  // Shrunk jobs grow back once their full size fits (their own slots
  // counted as free). Under mpirun, SIGUSR1 has the ranks save a checkpoint
  // at the end of the step they are in and exit 3: no step is lost. Under
  // Slurm the attempt is cancelled right after its next checkpoint.
  for (auto& [id, run] : running_) {
    Entry& e = jobs_[id];
    const v1::Job& job = e.record.job;
    if (!job.spec().restart().allow_grow() || job.dp() == 0 ||
        job.dp() >= job.spec().parallel().dp() || run.kill_at.has_value() ||
        run.leader_exit.has_value()) {
      continue;
    }
    if (run.stop_asked_at.has_value()) continue;  // asked already
    if (PlaceRanks(FreeNodes(nodes, id, OnGpus(job.spec())),
                   WorldSize(job.spec()), job.spec().parallel().tp(),
                   job.spec().resources().ranks_per_node())
            .empty()) {
      run.grow_after_step.reset();
      continue;
    }
    const std::string reason =
        absl::StrCat("stopped at step ", job.progress().step(),
                     " to grow back to dp=", job.spec().parallel().dp(),
                     " (the slots are free again)");
    if (run.slurm_id.empty() && SignalLauncher(KeyOf(e.record), SIGUSR1)) {
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

std::vector<v1::Node> Coordinator::ListNodes() const {
  std::vector<v1::Node> nodes = nodes_->List(absl::Now());
  absl::MutexLock lock(&mu_);
  const std::map<std::string, int> used = NodeSlotsUsed();
  for (v1::Node& n : nodes) SetSlotsUsed(used, &n);
  return nodes;
}

absl::StatusOr<v1::Node> Coordinator::DrainNode(const std::string& name,
                                                bool drain) {
  absl::StatusOr<v1::Node> n = nodes_->SetDraining(name, drain, absl::Now());
  if (!n.ok()) return n;
  spdlog::info("node {} {}", name, drain ? "drained" : "uncordoned");
  absl::MutexLock lock(&mu_);
  SetSlotsUsed(NodeSlotsUsed(), &*n);
  wake_.Signal();
  return n;
}

absl::Status Coordinator::ForgetNode(const std::string& name) {
  absl::MutexLock lock(&mu_);
  const std::map<std::string, int> used = NodeSlotsUsed();
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
                   r.name().substr(0, 63)));
  if (r.token_sha256().size() != 64) return denied;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, run] : running_) {
    const JobRecord& rec = jobs_[id].record;
    if (rec.token_sha256 != r.token_sha256() || run.kill_at.has_value() ||
        run.leader_exit.has_value()) {
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
