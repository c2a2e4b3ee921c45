// The local backend (ptcoord --launcher local): mpirun on ptcoord's host, its
// ranks there too, FIFO over --local-slots and --local-gpus. Also what every
// mpirun attempt shares (backend_mpirun.h): watching and signalling the
// processes of an attempt on this host.
#include <signal.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/gpu_inventory.h"
#include "common/net.h"
#include "coordinator/backend_mpirun.h"
#include "coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace {

// How an attempt ended when only its exit_code file can say.
AttemptStatus EndFromExitFile(const std::string& attempt_dir) {
  const AttemptExit ex = ReadAttemptExit(attempt_dir);
  AttemptStatus end;
  end.state = AttemptStatus::kEnded;
  end.exit_code = ex.kind == AttemptExit::kCode ? ex.code : -1;
  // Still pending: its processes died with the host or were killed, which
  // is not the job's fault, so it does not use up a restart.
  end.lost = ex.kind == AttemptExit::kPending;
  end.exit_unknown = ex.kind == AttemptExit::kUnknown;
  return end;
}

ProcessAttempt& Processes(AttemptHandle& handle) {
  return static_cast<ProcessAttempt&>(handle);
}

}  // namespace

ProcessAttempt::ProcessAttempt(AttemptKey key, std::string attempt_dir,
                               pid_t pgid, bool is_child)
    : key_(std::move(key)),
      attempt_dir_(std::move(attempt_dir)),
      pgid_(pgid),
      is_child_(is_child) {}

AttemptStatus ProcessAttempt::Poll(bool ending) {
  // The wrapper shell ends after mpirun; the attempt has ended once no
  // process of it is left (ranks may outlive mpirun briefly).
  if (!leader_end_.has_value()) {
    if (is_child_ && pgid_ > 0) {
      if (std::optional<int> rc = ReapChild(pgid_); rc.has_value()) {
        if (*rc >= 0) {
          leader_end_.emplace().exit_code = *rc;
        } else {
          leader_end_ = EndFromExitFile(attempt_dir_);
        }
      }
    } else if (!AttemptAlive(pgid_, attempt_dir_)) {
      leader_end_ = EndFromExitFile(attempt_dir_);
      if (leader_end_->exit_code < 0 && ending) {
        leader_end_->exit_code = 128 + SIGKILL;
        leader_end_->lost = leader_end_->exit_unknown = false;
      }
    }
  }
  AttemptStatus status;
  if (!leader_end_.has_value()) return status;
  if (!AttemptProcesses(key_).empty()) {
    status.state = AttemptStatus::kEnding;
    return status;
  }
  status = *leader_end_;
  status.state = AttemptStatus::kEnded;
  return status;
}

void ProcessAttempt::Signal(int sig) { SignalAttempt(pgid_, key_, sig); }

bool ProcessAttempt::SignalLauncher(int sig) {
  return ptrain::SignalLauncher(key_, sig);
}

absl::StatusOr<std::unique_ptr<AttemptHandle>> MpirunBackend::Start(
    LaunchRequest request, const v1::JobSpec& /*spec*/) {
  request.mpirun = options_.mpirun;
  absl::StatusOr<Launched> launched = LaunchAttempt(request);
  if (!launched.ok()) return launched.status();
  spdlog::info("{}: attempt {} is pid {}", request.job_id, request.attempt,
               launched->pid);
  return std::make_unique<ProcessAttempt>(
      AttemptKey{request.attempt_uid, Sha256Hex(request.token)},
      launched->attempt_dir, launched->pid, /*is_child=*/true);
}

Adopted MpirunBackend::Adopt(const AdoptRequest& r) {
  const bool alive = !AttemptProcesses(r.key).empty();
  const pid_t leader = alive ? AttemptLeader(r.key, r.attempt_dir) : 0;
  return Adopted{std::make_unique<ProcessAttempt>(r.key, r.attempt_dir, leader,
                                                  /*is_child=*/false),
                 alive};
}

AttemptStatus MpirunBackend::Poll(AttemptHandle& handle, absl::Time /*now*/,
                                  bool ending) {
  return Processes(handle).Poll(ending);
}

bool MpirunBackend::AskToStop(AttemptHandle& handle) {
  return Processes(handle).SignalLauncher(SIGUSR1);
}

bool MpirunBackend::AskToDump(AttemptHandle& handle, const v1::Job& /*job*/,
                              const std::string& /*attempt_uid*/,
                              ProcessStates* /*seen*/) {
  return Processes(handle).SignalLauncher(SIGUSR2);
}

void MpirunBackend::Terminate(AttemptHandle& handle) {
  Processes(handle).Signal(SIGTERM);
}

void MpirunBackend::Kill(AttemptHandle& handle) {
  Processes(handle).Signal(SIGKILL);
}

namespace {

class LocalBackend : public MpirunBackend {
 public:
  explicit LocalBackend(const CoordinatorOptions& o)
      : MpirunBackend(o),
        scheduler_(o.local_slots,
                   o.local_gpus >= 0 ? o.local_gpus : GpuCount()),
        slot_cpus_(SlotCpus(o.cpus, o.local_slots)) {}

  std::string Name() const override { return "local"; }

  absl::Status Admit(const v1::JobSpec& spec, int world) const override {
    if (absl::Status s = scheduler_.CheckFits(world); !s.ok()) return s;
    if (!OnGpus(spec)) return absl::OkStatus();
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
    return absl::OkStatus();
  }

  ClusterShape Shape(const v1::JobSpec& spec) override {
    return ShapeOf(
        {OnGpus(spec) ? scheduler_.total_gpus() : scheduler_.total_slots()}, 0);
  }

  std::optional<AttemptPlace> Place(const v1::Job& job,
                                    const RunningJobs& running) override {
    const bool gpus = TakesLocalGpus(job.spec());
    int used = 0;
    for (const v1::Job* r : running) used += r->world_size();
    const int gpus_used =
        static_cast<int>(GpusHeld(running)[HostName()].size());
    const QueuedJob queued{job.id(), job.world_size(),
                           gpus ? job.world_size() : 0};
    if (scheduler_.Pick({queued}, used, gpus_used).empty()) return std::nullopt;
    AttemptPlace place;
    // The ranks' slots (their CPUs) and a GPU job's GPUs are kept as a
    // placement on this host (mpirun still runs it locally, without a
    // hostfile of nodes).
    place.placement =
        PlacementOf({{HostName(), job.world_size()}}, running, gpus);
    if (!slot_cpus_.empty()) {
      // Slots no running job's CPUs touch: as many are free as the count
      // above says, but for attempts of an older ptcoord that recorded
      // none (then this one runs unbound).
      for (int cpu : TakeSlotCpus(slot_cpus_, CpusHeld(running)[HostName()],
                                  job.world_size())) {
        place.placement[0].add_cpus(cpu);
      }
    }
    return place;
  }

  int FreeSlotCount(const RunningJobs& running) const override {
    int used = 0;
    for (const v1::Job* r : running) used += r->world_size();
    return std::max(0, scheduler_.total_slots() - used);
  }

  std::string FreeSlots(const RunningJobs& running) const override {
    int used = 0;
    for (const v1::Job* r : running) used += r->world_size();
    const int total = scheduler_.total_slots();
    std::string out =
        absl::StrCat("more slots than the ", std::max(0, total - used), " of ",
                     total, " free on this host (--local-slots)");
    if (scheduler_.total_gpus() > 0) {
      absl::StrAppend(
          &out, ", or, on resources.device=cuda, more GPUs than the ",
          scheduler_.total_gpus() -
              static_cast<int>(GpusHeld(running)[HostName()].size()),
          " free");
    }
    return out;
  }

 private:
  // A GPU job run here takes GPUs of this host, one per rank, unless
  // PTRAIN_CUDA_SHARE_GPUS lets its ranks share.
  static bool TakesLocalGpus(const v1::JobSpec& spec) {
    return OnGpus(spec) && !RanksShareGpus();
  }

  const Scheduler scheduler_;
  // Each local slot's CPUs (SlotCpus); empty: ranks are not bound.
  const std::vector<std::vector<int>> slot_cpus_;
};

}  // namespace

std::unique_ptr<AttemptBackend> NewLocalBackend(
    const CoordinatorOptions& options) {
  return std::make_unique<LocalBackend>(options);
}

}  // namespace ptrain
