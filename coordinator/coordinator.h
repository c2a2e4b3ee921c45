// The control plane's logic: the job state machine. Job lifecycle, gang
// scheduling by priority, fair share and quotas, preemption, supervising
// attempts, restarts, recovery after a ptcoord restart; where and how an
// attempt runs is its AttemptBackend's business (attempt_backend.h: this host,
// the registered nodes, or Slurm). Plain C++ over absl::Status; service.cc
// translates gRPC onto it. Thread-safe. Durable state changes are written to
// the store first and applied in memory only once written, so memory is never
// ahead of disk.
//
// The class is defined over several files: coordinator.cc (creation and the
// job API), job_lineage.cc (going on from a checkpoint: --from, extend),
// rank_reports.cc (RankService), scheduling.cc (placing and launching, the
// node API), supervision.cc (the tick: ends, kills, hangs, restarts) and
// recovery.cc (after a ptcoord restart).
#ifndef PTRAIN_COORDINATOR_COORDINATOR_H_
#define PTRAIN_COORDINATOR_COORDINATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/spec.h"
#include "coordinator/attempt_backend.h"
#include "coordinator/audit.h"
#include "coordinator/auth_throttle.h"
#include "coordinator/auto_layout.h"
#include "coordinator/nodes.h"
#include "coordinator/queue_policy.h"
#include "coordinator/rank_times.h"
#include "coordinator/reports.h"
#include "coordinator/slurm.h"
#include "coordinator/state_dir.h"
#include "coordinator/store.h"
#include "coordinator/users.h"
#include "ptrain/v1/coordinator.pb.h"

namespace ptrain {

struct AttemptFacts;  // flight_analysis.h

struct CoordinatorOptions {
  // ptcoord.db, jobs/ and the lock file live here. Created 0700; refused
  // when another user owns it or group/others may write it; held by one
  // coordinator at a time (flock on STATE/lock).
  std::string state_dir;
  int local_slots = 1;
  // GPUs of this host that jobs run here may take, one per rank (indices
  // 0..local_gpus-1); -1: every GPU the driver shows. Not used on nodes or
  // under Slurm.
  int local_gpus = -1;
  // The users of JobService (users.h): `users_file` when given (reread by
  // ReloadUsers), else the tokens of `token_file` (reread too) or
  // `user_tokens`, each token an admin named token-N.
  std::string users_file;
  std::string token_file;
  std::vector<std::string> user_tokens;
  // How long a running job asked to stop for one of higher priority has
  // to save its step and exit before it is killed (it then resumes from
  // its newest checkpoint).
  absl::Duration preempt_grace = absl::Seconds(120);
  // Each user's decayed usage, by which jobs of one priority are ordered
  // (queue_policy.h), halves in this time.
  absl::Duration fairshare_half_life = absl::Hours(24 * 7);
  // STATE/audit.jsonl turns over at this size; so many older files kept.
  size_t audit_max_bytes = size_t{64} << 20;
  size_t audit_keep = 5;
  std::vector<std::string>
      data_roots;         // absolute; spec paths must lie under one
  std::string work_root;  // relative spec paths resolve here
  // Absolute. A job whose spec names no checkpoint.dir checkpoints into
  // CHECKPOINT_ROOT/UID, so a pause, a preemption or a restart continues
  // from where it stopped; its ranks may write there (PTRAIN_DATA_ROOTS).
  // Empty: such a job has no checkpoints.
  std::string checkpoint_root;
  std::string ptworker;
  std::string mpirun = "mpirun";
  std::string advertise_address;  // what ranks dial (PTRAIN_COORDINATOR)
  bool resume_flag = true;        // ptworker understands --resume-from
  int cores = 1;
  // The CPUs this host lets ptcoord use (AllowedCpus): with as many or more
  // than local_slots, each local slot stands for its own run of them
  // (SlotCpus) and each local rank is bound to its slot's. Empty: no
  // binding.
  std::vector<int> cpus;
  absl::Duration cancel_grace = absl::Seconds(10);  // SIGTERM -> SIGKILL
  // A rank that has not reached this coordinator for so long (it is gone:
  // killed, or its host lost) stops at the end of its step, after its
  // checkpoint, instead of training on unreported; the next coordinator
  // resumes the job from there. Longer than a coordinator's restart.
  // Zero: ranks never stop for that.
  absl::Duration rank_coordinator_grace = absl::Minutes(10);
  // An ended job is forgotten (ForgetExpiredJobs: as `ptctl delete`, its
  // checkpoints kept) this long after it finished, so the job list does
  // not grow forever. Zero: kept until deleted.
  absl::Duration ended_job_retention = absl::Hours(24 * 30);
  absl::Duration tick = absl::Milliseconds(200);  // supervision period
  // GetJob's loss history: at most this many points of each series (a job
  // of many steps thinned evenly, so that the answer stays small).
  int64_t loss_points_per_series = 10000;
  // Ranks serve /metrics here (PTRAIN_METRICS_BIND) and report the address;
  // "" = ranks serve no metrics.
  std::string rank_metrics_bind;
  // PEM the ranks trust for the coordinator's TLS certificate, copied to
  // jobs/ID/tls-ca.pem and named by PTRAIN_TLS_CA; "" = plain text.
  std::string tls_ca_pem;
  // The nodes that may register (NodeService) and when they count as down.
  // With a join token, jobs run on the registered nodes (mpirun with ptrsh
  // as its launch agent) instead of on this host's local_slots.
  NodeRegistryOptions nodes;
  std::string ptrsh;  // the launch agent binary (nodes only)
  // Attempts become Slurm jobs (sbatch, srun --mpi=pmix) instead of local
  // mpirun: Slurm places and queues them (docs/slurm.md).
  bool slurm = false;
  SlurmOptions slurm_options;
  // CIDR of the network nodes reach each other and ptcoord on; OpenMPI's
  // out-of-band and TCP transports are confined to it. "" = any.
  std::string cluster_network;
  // The layouts of `parallel: auto` jobs (auto_layout.h; ptcoord's:
  // PlannerWith of layout_planner.h); empty: such jobs are refused at
  // submit.
  LayoutPlanner plan_layout;
};

// Bounds on what a client may send (and kMaxSpecBytes of common/spec.h).
inline constexpr int kMaxListLimit = 10000;

class Coordinator {
 public:
  // Checks and locks the state dir (FailedPrecondition naming it, and the
  // holder's pid, when another coordinator holds it; PermissionDenied when
  // it is not private), opens the store and recovers jobs that were running
  // (docs/control-plane.md: a live attempt is re-adopted, a dead one is
  // finished from its exit_code file and run log or requeued to resume from
  // its latest checkpoint).
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(
      CoordinatorOptions options);
  // Stops supervision and releases the state dir; running attempts keep
  // running.
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // The cluster's nodes (NodeService, ptctl nodes).
  NodeRegistry& nodes() { return *nodes_; }
  // Failed authentication per peer, shared by every server of this
  // coordinator (gRPC and the web UI). Thread-safe.
  AuthThrottle& auth_throttle() { return auth_throttle_; }

  // Where ranks reach this coordinator (PTRAIN_COORDINATOR) when it is only
  // known after the server has bound its port; call before Start().
  void SetAdvertiseAddress(const std::string& address);
  // Starts the supervision thread (ticks every options.tick). Hang timers
  // of re-adopted attempts start here.
  void Start();
  void Stop();
  // One supervision pass: reap, detect hangs, escalate kills, schedule. A
  // change the store refuses (disk full) is retried by the next pass.
  void Tick();

  // The user whose token `authorization` carries; Unauthenticated when
  // none is.
  absl::StatusOr<Caller> AuthenticateUser(
      const std::optional<std::string>& authorization) const;
  // SIGHUP: reads the users (or token) file again. On an error the users
  // stay as they were and the error is returned (ptcoord logs it).
  absl::Status ReloadUsers();
  // The users as they are now.
  std::shared_ptr<const UserTable> UsersNow() const;
  // Every state-changing request (service.cc, audit.h).
  AuditLog& audit() { return *audit_; }
  // Job `id`'s owner ("" when none was recorded); NotFound for an unknown
  // job, InvalidArgument for an empty id.
  absl::StatusOr<std::string> JobOwner(const std::string& id) const;
  // OK when the bearer token is the running attempt's (its SHA-256 matches);
  // Unauthenticated otherwise, also for an unknown job or one with no
  // attempt running (a token dies with its attempt).
  absl::Status AuthenticateRank(
      const std::string& job_id,
      const std::optional<std::string>& authorization);

  // `from_job` (and `from_step`, 0: its newest checkpoint): start from
  // that job's checkpoint (SubmitJobRequest.from_job). `by`: the
  // authenticated user who submits it (Job.owner); only an admin may
  // submit a job with restart.preemptible false (PermissionDenied), and a
  // job beyond its owner's quota at once is refused (InvalidArgument).
  absl::StatusOr<v1::Job> Submit(const std::string& spec_yaml,
                                 const std::vector<std::string>& overrides,
                                 const std::string& from_job = "",
                                 int64_t from_step = 0,
                                 const Caller& by = {"", Role::kAdmin});
  // SubmitJobRequest.dry_run: refused as Submit would refuse; else what the
  // job would be (ptworker --dry-run of its spec) and where it would start
  // now, or why it would wait. Stores and starts nothing.
  absl::StatusOr<v1::DryRun> DryRunSubmit(
      const std::string& spec_yaml, const std::vector<std::string>& overrides,
      const std::string& from_job = "", int64_t from_step = 0);
  absl::StatusOr<v1::GetJobResponse> Get(const std::string& id,
                                         bool include_loss_history);
  // `owner` not empty: only that user's jobs.
  absl::StatusOr<std::vector<v1::Job>> List(v1::JobState state, int limit,
                                            const std::string& owner = "");
  // The job actions below name the user who asked (`by`, "" for none) in
  // the job's event.
  absl::StatusOr<v1::Job> Cancel(const std::string& id,
                                 const std::string& by = "");
  // PauseJob / ResumeJob (coordinator.proto).
  absl::StatusOr<v1::Job> Pause(const std::string& id,
                                const std::string& by = "");
  absl::StatusOr<v1::Job> Resume(const std::string& id,
                                 const std::string& by = "");
  // ExtendJob (coordinator.proto).
  absl::StatusOr<v1::Job> Extend(const std::string& id, int64_t steps,
                                 const std::string& by = "");
  // SetJobPriority (coordinator.proto).
  absl::StatusOr<v1::Job> SetPriority(const std::string& id,
                                      const std::string& priority,
                                      const std::string& by = "");
  // ListQueue: the waiting jobs in the order they would start, with why
  // each waits (Job.waiting, Job.queue_position), as the last scheduling
  // pass saw them.
  std::vector<v1::Job> Queue() const;
  // What each user's jobs hold and have used (ptcoord's metrics): running
  // jobs, their slots and GPUs now, and slot- and GPU-seconds since this
  // ptcoord started (not decayed).
  struct UserUsage {
    int running_jobs = 0;
    int slots = 0;
    int gpus = 0;
    double slot_seconds = 0;
    double gpu_seconds = 0;
  };
  std::map<std::string, UserUsage> UsageByUser() const;
  // DeleteJob (coordinator.proto): forgets an ended job, its checkpoint
  // folder removed too with `purge`.
  absl::StatusOr<v1::DeleteJobResponse> Delete(const std::string& id,
                                               bool purge);
  // Forgets the ended jobs that finished longer than
  // options.ended_job_retention ago (their checkpoints kept); the ids.
  std::vector<std::string> ForgetExpiredJobs(absl::Time now);
  absl::StatusOr<std::vector<v1::Checkpoint>> Checkpoints(
      const std::string& id);
  // The job's events (unix ms, message), oldest first.
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> Events(
      const std::string& id);
  // The loss points stored after point `after` (0: all, each series
  // thinned as GetJob thins it); `stored` gets how many there are after
  // `after`, `last` the number to ask after next time.
  absl::StatusOr<std::vector<v1::LossPoint>> LossSince(const std::string& id,
                                                       int64_t after,
                                                       int64_t* stored,
                                                       int64_t* last);

  // ptctl diagnose (docs/diagnose.md): the analysis of attempt `attempt`'s
  // flight recorder dumps. 0: the running attempt, whose ranks are asked
  // for fresh dumps first (this waits up to kDumpWait for them), else the
  // newest attempt whose ranks dumped. FailedPrecondition, saying why for
  // each attempt, when there is nothing to analyse.
  absl::StatusOr<v1::DiagnoseJobResponse> Diagnose(const std::string& id,
                                                   int attempt);
  // How long the ranks have to answer a request for dumps (a stopped one
  // never does).
  static constexpr absl::Duration kDumpWait = absl::Seconds(5);

  struct Snapshot {
    v1::Job job;
    uint64_t version = 0;  // grows with every change of the job
    std::string message;   // what the last change was
  };
  // Returns once the job's version exceeds `seen` or `timeout` passes (then
  // the unchanged snapshot). NotFound for an unknown id.
  absl::StatusOr<Snapshot> WaitForChange(const std::string& id, uint64_t seen,
                                         absl::Duration timeout);

  struct LogSource {
    int attempt = 0;
    std::string dir;
    bool finished = false;  // the attempt has ended: logs are complete
  };
  // `attempt` 0 = the latest. NotFound before the first attempt.
  absl::StatusOr<LogSource> Logs(const std::string& id, int attempt);

  // For a node's daemon: whether `token_sha256` is the token of a running
  // attempt placed on node `name` (NodeService.AuthorizeExec).
  absl::StatusOr<v1::AuthorizeExecResponse> AuthorizeExec(
      const v1::AuthorizeExecRequest& request);
  // The attempt uids of the running attempts placed on node `name`.
  std::vector<std::string> AttemptsOnNode(const std::string& name) const;
  // ptctl drain / uncordon; the node as it is now.
  absl::StatusOr<v1::Node> DrainNode(const std::string& name, bool drain);
  // ptctl forget-node: NodeRegistry::Forget, busy while a running attempt
  // is placed on the node.
  absl::Status ForgetNode(const std::string& name);
  // ptctl nodes approve: NodeRegistry::Approve; the node as it is now, and
  // the scheduler woken, since it may take ranks from now on.
  absl::StatusOr<v1::Node> ApproveNode(const std::string& name);
  // Every node, with slots_used filled in.
  std::vector<v1::Node> ListNodes() const;

  // Rank reports, after AuthenticateRank. InvalidArgument (reports.h rules;
  // a checkpoint must also be a committed folder of this job) and
  // FailedPrecondition (no attempt running) change nothing; Unavailable when
  // the store cannot write it (then nothing changes either).
  absl::Status ReportProgress(const v1::ReportProgressRequest& r);
  absl::Status ReportCheckpoint(const v1::ReportCheckpointRequest& r);
  absl::Status ReportEndpoint(const v1::ReportEndpointRequest& r);
  // A rank busy loading or saving is alive: its hang timer starts again.
  absl::Status ReportAlive(const v1::ReportAliveRequest& r);
  // What ReportAlive's step times said (the web UI's per-rank panel).
  const RankTimesBoard& rank_times() const { return rank_times_; }

  const CoordinatorOptions& options() const { return options_; }

  // A live rank's metrics endpoint, for Prometheus service discovery.
  struct RankEndpoint {
    std::string job_id, job_name, address;
    int rank = 0, attempt = 0;
    // The node the rank runs on (from the placement; this host's name for
    // a job on --local-slots).
    std::string node;
  };
  std::vector<RankEndpoint> Endpoints() const;
  // Jobs per state name, every state listed (zero included).
  std::map<std::string, int> JobCounts() const;
  // Restarts over all jobs: attempts that failed of the job's own doing and
  // were requeued, what restart.max_restarts limits (JobRecord's
  // restarts_used). Pauses, preemptions, lost nodes and the like are not
  // restarts: they are counted by Requeues.
  int64_t Restarts() const;
  // Attempts requeued (or paused) without a failure of the job's own, over
  // all jobs, by EndName of kRequeueEnds; every one listed, zero included.
  std::map<std::string, int64_t> Requeues() const;
  // Slots of this host that running attempts use (--local-slots).
  int LocalSlotsUsed() const;
  // A job not yet finished (queued, running, restarting or paused) and the
  // restarts it used.
  struct UnfinishedJob {
    v1::Job job;
    int restarts = 0;
  };
  std::vector<UnfinishedJob> UnfinishedJobs() const;

 private:
  // What only a live ptcoord knows about a running attempt: timers and
  // facts about its processes, not durable job state.
  struct Running {
    // The backend's own state of it; null only for one that did not start.
    std::unique_ptr<AttemptHandle> handle;
    std::string attempt_dir;
    std::optional<absl::Time>
        kill_at;  // SIGKILL deadline once SIGTERM went out
    // Why we ended it ("hang at step N ...", "stopped at step N to grow
    // back ..."), when we did.
    std::string kill_reason;
    // How it ended, once its backend said so (decided when ReadyToEnd).
    std::optional<AttemptStatus> end;
    // When a failure a dead node may explain was first seen: the node
    // grace runs from here.
    std::optional<absl::Time> ended_at;
    // Its end could not be written: not before this time again.
    std::optional<absl::Time> retry_at;
    absl::Time last_report;  // hang detection: last accepted rank report
    // The newest step it reported progress for: reports may not go back.
    int64_t last_step = -1;
    // The job's progress with the reports that could not be saved (a full
    // state disk) applied, counted in its unsaved_reports; unset while
    // every report was saved. Not in the record, which is what the disk
    // has, until a later report or the attempt's end is saved with it.
    std::optional<v1::Progress> received;
    // What a rank last said it was busy with (ReportAlive), until progress.
    std::string activity;
    // When each rank was last heard from (ReportAlive, ReportProgress).
    std::map<int, absl::Time> heard;
    std::map<int, std::string> endpoints;  // rank -> host:port of /metrics
    // Not the job's fault, not counted as a restart: a node of its
    // placement died, or it was stopped to grow back to its full dp.
    bool node_lost = false;
    bool growing = false;
    // Growing back where the attempt cannot be asked to stop: the newest
    // checkpoint step when slots were first seen free; the attempt stops
    // at the next checkpoint after it.
    std::optional<int64_t> grow_after_step;
    // When the attempt was asked (AskToStop: pause, grow back) to save a
    // checkpoint at the end of its step and exit 3.
    std::optional<absl::Time> stop_asked_at;
    // Asked to stop before any rank was heard from: asked again once one
    // is (RequestStop).
    bool stop_wanted = false;
    // Being stopped for this waiting job of higher priority (a
    // preemption): its end requeues it, whatever its exit code.
    std::string preempted_for;
    // Queued by its backend (Slurm PENDING), not running yet: what
    // preemption under such a backend looks at.
    bool backend_queued = false;
    int64_t newest_checkpoint = -1;  // reported by this attempt
    // When each rank last said which step it completed (ReportAlive's
    // times, ReportProgress): where a rank is that does not answer.
    std::map<int, std::pair<int64_t, absl::Time>> reported_steps;
    // Found hung: when its ranks were asked for dumps (the kill waits for
    // them up to kDumpWait), whether there was no way to ask, the analysis
    // made off the lock for that request (its summary, or why there is
    // none), and the first lines of it once committed.
    std::optional<absl::Time> dump_asked_at;
    bool dump_ask_failed = false;
    struct Analysed {
      absl::Time asked;
      absl::StatusOr<std::string> summary;
    };
    std::optional<Analysed> analysed;
    std::string hang_summary;
    // What the ended attempt left in its folder, read off the lock before
    // its end is decided: its run log and the end of its stderr.log.
    struct Left {
      RunLogSummary log;
      std::string stderr_tail;
    };
    std::optional<Left> left;
    // The ranks' process states the backend saw when it asked (the node
    // daemons'), by (host, pid).
    ProcessStates seen;
  };
  struct Entry {
    JobRecord record;
    uint64_t version = 0;
    std::string message;
    // While it waits: why, and its place in the queue (Job.waiting,
    // queue_position), from the last scheduling pass.
    std::string waiting;
    int queue_position = 0;
  };

  Coordinator(CoordinatorOptions options, std::unique_ptr<Store> store,
              int lock_fd);
  // recovery.cc: re-adopts or finishes the attempts the store says run.
  void Recover();
  // Writes `update` (whose record is the job's next record) to the store
  // and only then makes it the entry's record and wakes watchers. On a store
  // error nothing in memory changes and the error is returned.
  absl::Status Commit(Entry& e, JobUpdate update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits `event` alone (no change of the record); a store error is
  // logged, the event lost.
  void CommitEvent(Entry& e, const std::string& event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // scheduling.cc: starts waiting jobs where the backend places them, in
  // the queue's order (queue_policy.h: priority, fair share, submission),
  // within their owners' quotas, backfilling behind a blocked head only
  // where that does not delay it, and preempts jobs of lower priority for
  // the head; then stops shrunk jobs that can grow back.
  void Schedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under a backend that queues attempts itself (Slurm): the queued
  // attempt of the highest priority preempts running ones of lower
  // priority, the fewest whose slots make room for it.
  void PreemptForBackendQueue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Requeues PREEMPTED jobs (their attempts ended): QUEUED again.
  void RequeuePreempted() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the running jobs `victims` to stop for `head`.
  void Preempt(const std::vector<std::string>& victims, const Entry& head)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds what the running jobs held since the last charge to each owner's
  // fair-share usage and totals.
  void ChargeUsage(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges the stored attempts to their owners' fair share (Create).
  void ReplayUsage();
  // The job as users see it: with why it waits.
  static v1::Job Shown(const Entry& e);
  // The queue's view of the running jobs (queue_policy.h).
  std::vector<RunningJob> RunningForQueue() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GrowBack() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts an attempt of the job where `place` says, with its shrunk spec
  // when it has one.
  void Launch(Entry& e, const AttemptPlace& place)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The update that records the job's next attempt running `spec` at
  // `place`, with a new attempt token (`*token`, never stored).
  JobUpdate NextAttempt(const Entry& e, const AttemptPlace& place,
                        const v1::JobSpec& spec, std::string* token) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the backend starts for the job's (just recorded) attempt.
  LaunchRequest AttemptRequest(const Entry& e, const std::string& job_dir,
                               const std::string& token,
                               const AttemptPlace& place,
                               const v1::JobSpec& spec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // What a tick reads of the attempts' folders, whose files their ranks
  // write: gathered under the lock, read off it (ReadAttempt may take as
  // long as the disk does, and holds no lock), handed back under it
  // (coordinator_internal.h; supervision.cc, diagnosis.cc).
  struct AttemptRead;
  std::vector<AttemptRead> AttemptReadsDue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void ReadAttempt(AttemptRead& r);
  // The hang analysis of ReadAttempt (diagnosis.cc): done once every rank
  // answered or kDumpWait passed; the analysis written to flight/.
  static void AnalyseHang(AttemptRead& r);
  void TakeAttemptReads(std::vector<AttemptRead>& reads)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // supervision.cc: reaps, ends, kills and hang-checks every running
  // attempt.
  void Supervise() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SuperviseAttempt(Entry& e, Running& run, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends an attempt asked to stop that did not, and one silent for
  // restart.hang_timeout_s.
  void CheckHang(Entry& e, Running& run, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the ended attempt's outcome is decided: a failure a dead node
  // may explain waits up to the backend's NodeGrace() for CheckNodes. Once
  // it is, run.end's reason and lost node are the run's.
  bool ReadyToEnd(Entry& e, Running& run, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decides and commits the outcome of the ended attempt in running_[id];
  // the running_ entry goes only once that is on disk.
  void OnAttemptEnded(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the state, error and event of `u` for the ended attempt's end
  // (exit code `exit_code`, error text `error`, `resolved` when its records
  // showed it finished); returns how it ended.
  v1::AttemptEnd DecideEnd(const Running& run, int exit_code,
                           const std::string& error,
                           const std::string& resolved, JobUpdate& u) const;
  void BeginKill(Entry& e, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the attempt's ranks to save the step they are in and exit 3
  // (pause, preemption). Asked before any rank was heard from, they are
  // asked again once one is (stop_wanted, SuperviseAttempt): mpirun
  // forwards no signal to ranks it has not started yet. An attempt that
  // cannot be asked is ended instead (BeginKill): steps since its newest
  // checkpoint are lost.
  void RequestStop(Entry& e, Running& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // diagnosis.cc: for an attempt found hung, asks its ranks for dumps and,
  // once their analysis is made (run.analysed, by a later tick off the
  // lock), commits it as an event (run.hang_summary); true then, false
  // while it waits.
  bool ExplainHang(Entry& e, Running& run, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the analysis of attempt `attempt` of job `e` knows beside the
  // dumps (`asked`: when the ranks were asked for them; `run`: the running
  // attempt, whose ranks were heard from and whose processes are looked at,
  // null for an ended one, whose processes are gone; `seen`: the states the
  // backend saw).
  AttemptFacts FactsOf(const Entry& e, int attempt,
                       std::optional<absl::Time> asked, const Running* run,
                       ProcessStates seen) const;

  // How the job's latest attempt's run.jsonl is read: its context and the
  // newest step the store has of it (ReadRunLog's known_step).
  std::pair<ReportContext, int64_t> RunLogContext(const Entry& e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds to `u` what the attempt's run log (`log`, read by ReadRunLog)
  // holds beyond what the store has: progress, loss points and committed
  // checkpoints. True when the run log ends with its "end" record (every
  // step trained).
  bool RecoverFromRunLog(const Entry& e, const RunLogSummary& log, JobUpdate* u)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why the records of an attempt whose exit code is unknown show that the
  // job trained every step (`log_ended`: its run log's "end" record; else a
  // committed checkpoint of the last step on disk); "" when they do not.
  std::string FinishedBy(const JobUpdate& u, bool log_ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // rank_reports.cc: the job of a rank's report, once `check` (a reports.h
  // rule) has accepted the report in its running attempt's context:
  // NotFound for an unknown job, FailedPrecondition when no attempt runs,
  // else `check`'s refusal.
  absl::StatusOr<Entry*> CheckedReport(
      const std::string& job_id,
      const std::function<absl::Status(const ReportContext&)>& check)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running attempt's context for reports.h; FailedPrecondition when no
  // attempt runs.
  absl::StatusOr<ReportContext> RunningContext(const Entry& e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void LogStoreError(const Entry& e, const absl::Status& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int UsedSlots() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The jobs of the running attempts but job `except`'s.
  // A submission checked and made ready to store (Submit's rules, and
  // SetForkSource's for `from_job`), under no lock.
  absl::StatusOr<JobRecord> NewJobRecord(
      const std::string& spec_yaml, const std::vector<std::string>& overrides,
      const std::string& from_job, int64_t from_step) const;
  // The folders ranks may read and write (PTRAIN_DATA_ROOTS): the data
  // roots and the checkpoint root.
  std::vector<std::string> RankDataRoots() const;
  // Sets r's lineage to job `from_job`'s checkpoint at `from_step` (0: its
  // newest) when `from_job` is given; InvalidArgument naming the rule when
  // there is no such job or checkpoint, the step is past r's train.steps
  // or the models differ. Takes the lock for a moment.
  absl::Status SetForkSource(const std::string& from_job, int64_t from_step,
                             JobRecord* r) const;
  // `ptworker --dry-run` of `spec` (resolved, as the ranks would run it):
  // its report; InvalidArgument with its error line when it refuses the
  // job's input.
  absl::StatusOr<std::string> DescribeRun(const v1::JobSpec& spec) const;
  RunningJobs RunningJobsBut(const std::string& except = "") const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The jobs of the running attempts but those of `except`.
  RunningJobs RunningJobsExcept(const std::set<std::string>& except) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* Find(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  const std::unique_ptr<Store> store_;
  std::unique_ptr<NodeRegistry> nodes_;  // set by Create
  std::unique_ptr<Users> users_;         // set by Create
  std::unique_ptr<AuditLog> audit_;      // set by Create
  AuthThrottle auth_throttle_;
  // Runs the attempts (local, nodes or Slurm); set by Create.
  std::unique_ptr<AttemptBackend> backend_;
  const int lock_fd_;  // flock'ed STATE/lock, held for our lifetime
  const absl::Time started_;

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Running> running_ ABSL_GUARDED_BY(mu_);
  // What the deleted jobs had counted, so that the restart and requeue
  // counters never go down while this ptcoord runs.
  int64_t deleted_restarts_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> deleted_requeues_ ABSL_GUARDED_BY(mu_);
  // Each user's decayed usage (the queue's fair share) and undecayed
  // totals, charged up to `charged_` (ChargeUsage).
  FairShare fair_share_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, UserUsage> totals_ ABSL_GUARDED_BY(mu_);
  absl::Time charged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The waiting jobs in queue order, from the last scheduling pass.
  std::vector<std::string> queue_ ABSL_GUARDED_BY(mu_);
  // When ForgetExpiredJobs last looked.
  absl::Time retention_checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  RankTimesBoard rank_times_;
  std::string advertise_ ABSL_GUARDED_BY(mu_);
  std::string last_store_error_ ABSL_GUARDED_BY(mu_);  // logged once
  // When Supervise last ran (InfinitePast before the first tick): a tick
  // that comes late means we were paused or stalled, not the ranks.
  absl::Time last_supervised_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::CondVar changed_;
  absl::CondVar
      wake_;  // a submit or cancel wants a Tick now, not at the next period

  std::atomic<bool> stop_{false};
  std::thread supervisor_;
};

// The ends after which a job goes on (requeued, or paused until resumed)
// without a failure of its own, so without using up a restart.
inline constexpr v1::AttemptEnd kRequeueEnds[] = {
    v1::ATTEMPT_END_PAUSED, v1::ATTEMPT_END_STOPPED, v1::ATTEMPT_END_NODE_LOST,
    v1::ATTEMPT_END_GROWN,  v1::ATTEMPT_END_LOST,    v1::ATTEMPT_END_PREEMPTED};
int64_t NowMs();

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_COORDINATOR_H_
