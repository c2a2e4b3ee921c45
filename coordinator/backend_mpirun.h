// What the local and nodes backends share (attempt_backend.h): an attempt is
// `mpirun ... ptworker` under a wrapper shell on ptcoord's host, found again
// by its key in /proc and signalled as a process group. Internal to the
// backends; the Slurm backend also watches an adopted attempt that Slurm no
// longer knows as a ProcessAttempt.
#ifndef PTRAIN_COORDINATOR_BACKEND_MPIRUN_H_
#define PTRAIN_COORDINATOR_BACKEND_MPIRUN_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>

#include "coordinator/attempt_backend.h"
#include "coordinator/launcher.h"

namespace ptrain {

// An attempt that runs as processes of this host: a wrapper shell that
// leads their process group and records mpirun's exit code, and whatever
// carries the attempt's key.
class ProcessAttempt : public AttemptHandle {
 public:
  // `pgid`: the wrapper shell (0: unknown, gone); `is_child`: we forked it
  // and may reap it (false for an attempt a previous ptcoord started).
  ProcessAttempt(AttemptKey key, std::string attempt_dir, pid_t pgid,
                 bool is_child);

  // kRunning while the wrapper runs; once it has ended, kEnding while other
  // processes of the attempt are left and kEnded when none is, with its
  // exit code, else what the exit_code file says. `ending`: ptcoord is
  // ending it, so a wrapper gone without a code was killed (128+SIGKILL).
  AttemptStatus Poll(bool ending);
  // `sig` to the process group and to every process of the attempt.
  void Signal(int sig);
  // `sig` to the attempt's mpirun only (SignalLauncher); false without one.
  bool SignalLauncher(int sig);

  pid_t pgid() const { return pgid_; }

 private:
  const AttemptKey key_;
  const std::string attempt_dir_;
  const pid_t pgid_;
  const bool is_child_;
  std::optional<AttemptStatus> leader_end_;  // once the wrapper has ended
};

// mpirun on this host, its ranks wherever its hostfile puts them. The
// local and nodes backends add placement and node checks.
class MpirunBackend : public AttemptBackend {
 public:
  explicit MpirunBackend(const CoordinatorOptions& options)
      : options_(options) {}

  absl::StatusOr<std::unique_ptr<AttemptHandle>> Start(
      LaunchRequest request, const v1::JobSpec& spec) override;
  Adopted Adopt(const AdoptRequest& request) override;
  AttemptStatus Poll(AttemptHandle& handle, absl::Time now,
                     bool ending) override;
  bool CanAskToStop() const override { return true; }
  bool AskToStop(AttemptHandle& handle) override;
  bool AskToDump(AttemptHandle& handle, const v1::Job& job,
                 const std::string& attempt_uid, ProcessStates* seen) override;
  void Terminate(AttemptHandle& handle) override;
  void Kill(AttemptHandle& handle) override;

 protected:
  const CoordinatorOptions& options_;
};

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_BACKEND_MPIRUN_H_
