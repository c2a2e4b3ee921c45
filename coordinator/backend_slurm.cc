// The Slurm backend (ptcoord --launcher slurm, docs/slurm.md): every attempt
// is one Slurm job (sbatch, srun --mpi=pmix), watched through scontrol at
// most once a second, ended with scancel; Slurm queues and places it. A job
// that lost nodes shrinks to what Slurm's up nodes can hold.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/exit_codes.h"
#include "coordinator/backend_mpirun.h"
#include "coordinator/coordinator.h"
#include "coordinator/slurm.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kPollEvery = absl::Seconds(1);

struct SlurmAttempt : AttemptHandle {
  std::string job_id;
  int attempt = 0;
  std::string attempt_dir;
  // Its Slurm job; "" for an adopted attempt Slurm no longer knew, which
  // is then watched as processes of this host (`orphan`).
  std::string slurm_id;
  std::optional<ProcessAttempt> orphan;
  std::string state;  // as scontrol last said
  std::string nodes;  // its NodeList once it has ended
  absl::Time next_poll = absl::InfinitePast();
  absl::Time next_node_check = absl::InfinitePast();
};

SlurmAttempt& Slurm(AttemptHandle& handle) {
  return static_cast<SlurmAttempt&>(handle);
}

// The change of a Slurm job that is still queued or running, as an event.
std::string StateEvent(const std::string& id, const SlurmJob& job) {
  return absl::StrCat("Slurm job ", id, " ", job.state,
                      job.reason.empty() || job.reason == "None"
                          ? ""
                          : absl::StrCat(" (", job.reason, ")"),
                      job.nodes.empty() || job.nodes == "(null)"
                          ? ""
                          : absl::StrCat(" on ", job.nodes));
}

// How the ended Slurm job `job` of attempt `a` ended: the batch script's
// exit_code file decides when it got to write it; else Slurm's record.
AttemptStatus EndOf(const SlurmAttempt& a, const SlurmJob& job, bool ending) {
  AttemptStatus end;
  end.state = AttemptStatus::kEnded;
  const std::optional<int> rc = ReadExitCode(a.attempt_dir);
  end.exit_code = rc.has_value()    ? *rc
                  : job.signal != 0 ? 128 + job.signal
                                    : job.exit_code;
  if (job.state == "NODE_FAIL") {
    end.node_lost = true;
    end.reason = absl::StrCat("attempt ", a.attempt, " lost a node: Slurm job ",
                              a.slurm_id, " ended NODE_FAIL on ", job.nodes);
  } else if (job.state == "CANCELLED" && !ending) {
    end.reason = absl::StrCat("Slurm job ", a.slurm_id,
                              " was cancelled outside ptrain (scancel)");
  } else if (job.state != "COMPLETED" && end.exit_code == 0) {
    end.exit_code = 1;
    end.reason =
        absl::StrCat("Slurm job ", a.slurm_id, " ended ", job.state,
                     job.reason.empty() ? "" : " (" + job.reason + ")");
  }
  // A dead node usually fails the job (its other ranks lose their peers)
  // seconds before slurmctld marks the node down.
  end.may_be_node_loss =
      !(job.state == "NODE_FAIL" || job.state == "CANCELLED" ||
        end.exit_code == 0 || end.exit_code == kExitBadInput ||
        end.exit_code == kExitStopped || ending);
  return end;
}

class SlurmBackend : public AttemptBackend {
 public:
  explicit SlurmBackend(const CoordinatorOptions& o) : options_(o) {}

  std::string Name() const override { return "slurm"; }

  // Slurm queues and places: every waiting job becomes a Slurm job. One
  // that ran and lost nodes shrinks (when allowed) to what Slurm's up nodes
  // can hold, instead of waiting for nodes that may not return.
  std::optional<AttemptPlace> Place(const v1::Job& job,
                                    const RunningJobs& /*running*/) override {
    const v1::JobSpec& spec = job.spec();
    AttemptPlace place;
    if (!spec.restart().allow_shrink() || job.attempts() == 0) return place;
    const int per_rank = std::max(1, spec.resources().threads_per_rank());
    absl::StatusOr<std::vector<int>> cpus =
        SlurmUpNodeCpus(options_.slurm_options.partition);
    if (!cpus.ok()) return place;
    const int capacity =
        SlurmTaskCapacity(*cpus, per_rank, spec.resources().ranks_per_node());
    if (WorldSize(spec) > capacity) {
      place.shrunk = ShrinkToFit(
          spec, [&](const v1::JobSpec& s) { return WorldSize(s) <= capacity; });
    }
    return place;
  }

  absl::StatusOr<std::unique_ptr<AttemptHandle>> Start(
      LaunchRequest request, const v1::JobSpec& spec) override {
    const int cpus = std::max(1, spec.resources().threads_per_rank());
    absl::StatusOr<std::string> id =
        SubmitSlurmAttempt(request, spec.resources().ranks_per_node(), cpus,
                           options_.slurm_options);
    if (!id.ok()) return id.status();
    auto a = std::make_unique<SlurmAttempt>();
    a->job_id = request.job_id;
    a->attempt = request.attempt;
    a->attempt_dir = AttemptDirOf(request);
    a->slurm_id = *id;
    return a;
  }

  std::string StartedEvent(const AttemptHandle& handle,
                           v1::Attempt* attempt) const override {
    const SlurmAttempt& a = static_cast<const SlurmAttempt&>(handle);
    attempt->set_slurm_job_id(a.slurm_id);
    return absl::StrCat("attempt ", a.attempt, " is Slurm job ", a.slurm_id,
                        " (", SlurmJobName(a.job_id, a.attempt), ")");
  }

  Adopted Adopt(const AdoptRequest& r) override {
    auto a = std::make_unique<SlurmAttempt>();
    a->job_id = r.job_id;
    a->attempt = r.attempt;
    a->attempt_dir = r.attempt_dir;
    // Found by its name: also an attempt whose id never reached the store
    // (ptcoord died right after sbatch).
    absl::StatusOr<std::string> id =
        FindSlurmJob(SlurmJobName(r.job_id, r.attempt));
    if (!id.ok()) {
      spdlog::warn("{}: cannot ask Slurm for attempt {}: {}", r.job_id,
                   r.attempt, std::string(id.status().message()));
    }
    if (id.ok() && !id->empty()) {
      a->slurm_id = *id;
      return Adopted{std::move(a), true};
    }
    a->orphan.emplace(r.key, r.attempt_dir, 0, /*is_child=*/false);
    return Adopted{std::move(a), false};
  }

  AttemptStatus Poll(AttemptHandle& handle, absl::Time now,
                     bool ending) override {
    SlurmAttempt& a = Slurm(handle);
    if (a.orphan.has_value()) return a.orphan->Poll(ending);
    AttemptStatus status;
    // Between queries, what the last one said of a job Slurm still queues.
    if (a.state == "PENDING" || a.state == "CONFIGURING") {
      status.state = AttemptStatus::kQueued;
    }
    if (now < a.next_poll) return status;
    a.next_poll = now + kPollEvery;
    absl::StatusOr<SlurmJob> job = QuerySlurmJob(a.slurm_id);
    if (!job.ok() && job.status().code() != absl::StatusCode::kNotFound) {
      return status;  // slurmctld unreachable: ask again later
    }
    if (job.ok() && !SlurmJobEnded(job->state)) {
      // Queued by Slurm is not a hang: the timer starts when it runs.
      if (job->state == "PENDING" || job->state == "CONFIGURING") {
        status.state = AttemptStatus::kQueued;
      }
      if (job->state != a.state) {
        a.state = job->state;
        status.event = StateEvent(a.slurm_id, *job);
      }
      return status;
    }
    if (!job.ok()) {  // purged: only the exit_code file can tell
      const std::optional<int> rc = ReadExitCode(a.attempt_dir);
      status.state = AttemptStatus::kEnded;
      status.exit_code = rc.value_or(-1);
      status.lost = !rc.has_value() && !ending;
      return status;
    }
    a.state = job->state;
    a.nodes = job->nodes;
    return EndOf(a, *job, ending);
  }

  // Pause and preemption: SIGUSR1 to the ranks (srun's tasks) only, as
  // for a dump; they save the step they are in and exit 3, which srun and
  // the batch script pass on.
  bool CanAskToStop() const override { return true; }
  bool AskToStop(AttemptHandle& handle) override {
    SlurmAttempt& a = Slurm(handle);
    if (a.orphan.has_value()) return a.orphan->SignalLauncher(SIGUSR1);
    return CancelSlurmJob(a.slurm_id, "USR1", /*batch_too=*/false).ok();
  }

  bool QueuesItself() const override { return true; }

  // The partition's up CPUs as one-CPU tasks; asked of Slurm at most once a
  // second.
  int TotalSlots() override {
    const absl::Time now = absl::Now();
    if (now < slots_asked_ + kPollEvery) return slots_;
    slots_asked_ = now;
    absl::StatusOr<std::vector<int>> cpus =
        SlurmUpNodeCpus(options_.slurm_options.partition);
    slots_ = cpus.ok() ? SlurmTaskCapacity(*cpus, 1, 0) : -1;
    return slots_;
  }

  // The partition's up nodes, each as many ranks as its CPUs hold of
  // resources.threads_per_rank.
  ClusterShape Shape(const v1::JobSpec& spec) override {
    absl::StatusOr<std::vector<int>> cpus =
        SlurmUpNodeCpus(options_.slurm_options.partition);
    if (!cpus.ok()) return {};
    const int per_rank = std::max(1, spec.resources().threads_per_rank());
    std::vector<int> ranks;
    for (int c : *cpus) ranks.push_back(c / per_rank);
    return ShapeOf(ranks, spec.resources().ranks_per_node());
  }

  bool AskToDump(AttemptHandle& handle, const v1::Job& /*job*/,
                 const std::string& /*attempt_uid*/,
                 ProcessStates* /*seen*/) override {
    SlurmAttempt& a = Slurm(handle);
    if (a.orphan.has_value()) return a.orphan->SignalLauncher(SIGUSR2);
    // The ranks (srun's tasks) only: the batch script would die of it.
    return CancelSlurmJob(a.slurm_id, "USR2", /*batch_too=*/false).ok();
  }

  void Terminate(AttemptHandle& handle) override {
    SlurmAttempt& a = Slurm(handle);
    if (a.orphan.has_value()) {
      a.orphan->Signal(SIGTERM);
      return;
    }
    // Slurm signals the batch script and every step (SIGTERM, then
    // SIGKILL after its KillWait).
    if (absl::Status s = CancelSlurmJob(a.slurm_id, ""); !s.ok()) {
      spdlog::warn("{}: {}", a.job_id, std::string(s.message()));
    }
  }

  void Kill(AttemptHandle& handle) override {
    SlurmAttempt& a = Slurm(handle);
    if (a.orphan.has_value()) {
      a.orphan->Signal(SIGKILL);
      return;
    }
    CancelSlurmJob(a.slurm_id, "KILL").IgnoreError();
  }

  // The failure counts as the job's own only once Slurm has had the grace
  // to report one of its nodes down, failing or not responding.
  NodeVerdict CheckNodes(AttemptHandle& handle, const v1::Job& job,
                         absl::Time /*ended_at*/, absl::Time now) override {
    SlurmAttempt& a = Slurm(handle);
    NodeVerdict verdict;
    if (now < a.next_node_check) return verdict;
    a.next_node_check = now + kPollEvery;
    absl::StatusOr<std::vector<std::string>> lost = SlurmLostNodes(a.nodes);
    if (lost.ok() && !lost->empty()) {
      verdict.lost = absl::StrCat(
          "attempt ", job.attempts(), " lost a node: Slurm reports ",
          absl::StrJoin(*lost, ","), " down or not responding (Slurm job ",
          a.slurm_id, " ended ", a.state, ")");
    }
    return verdict;
  }

  absl::Duration NodeGrace() const override {
    return options_.slurm_options.node_grace;
  }

 private:
  const CoordinatorOptions& options_;
  int slots_ = -1;
  absl::Time slots_asked_ = absl::InfinitePast();
};

}  // namespace

std::unique_ptr<AttemptBackend> NewSlurmBackend(
    const CoordinatorOptions& options) {
  return std::make_unique<SlurmBackend>(options);
}

}  // namespace ptrain
