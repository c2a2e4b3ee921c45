// Attempts as Slurm jobs (ptcoord --launcher slurm): one sbatch per attempt
// whose batch script starts the ranks with `srun --mpi=pmix` (Debian's
// OpenMPI speaks PMIx to Slurm), supervised through `scontrol show job`,
// stopped with `scancel`. The pure parts (the sbatch line, the script, the
// parsing of scontrol's answer) are separate from running them, for tests.
#ifndef PTRAIN_COORDINATOR_SLURM_H_
#define PTRAIN_COORDINATOR_SLURM_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/launcher.h"

namespace ptrain {

struct SlurmOptions {
  std::string partition;           // --partition; "" = Slurm's default
  std::string account;             // --account; ""
  std::vector<std::string> extra;  // more sbatch arguments, as given
  // A failed attempt waits this long for slurmctld to report one of its
  // nodes down or not responding before the failure counts as the job's
  // own (a dead node usually fails the job seconds before Slurm notices).
  absl::Duration node_grace = absl::Seconds(30);
};

// The Slurm job name of an attempt: how ptcoord finds it again after a
// restart (`squeue --name`).
std::string SlurmJobName(const std::string& job_id, int attempt);

// The batch script: srun --mpi=pmix of ptworker over every task, each
// task on `cpus_per_task` cores of its own (--cpus-per-task, which srun
// does not inherit from sbatch, and --cpu-bind=cores), then the exit code
// into attempt-N/exit_code (as the local wrapper writes it).
std::string SlurmBatchScript(const LaunchRequest& r,
                             const std::string& attempt_dir, int cpus_per_task);

// sbatch's argv for the attempt (script path last). Tasks = world size;
// with resources.ranks_per_node > 0 (`ranks_per_node`), --ntasks-per-node
// = it and --nodes = the fewest nodes that hold the tasks;
// --cpus-per-task = threads per rank; stdout/stderr to the attempt's logs.
std::vector<std::string> SbatchCommand(const LaunchRequest& r,
                                       const std::string& attempt_dir,
                                       int ranks_per_node, int cpus_per_task,
                                       const SlurmOptions& o);

// A Slurm job as `scontrol show job -o ID` describes it.
struct SlurmJob {
  std::string state;   // PENDING, RUNNING, COMPLETING, COMPLETED, FAILED,
                       // CANCELLED, NODE_FAIL, TIMEOUT, ...
  std::string reason;  // why it is pending or ended ("Resources", "None")
  int exit_code = 0;   // of the batch script
  int signal = 0;      // that ended it, 0 if none
  std::string nodes;   // NodeList
};
// Parses one line of `scontrol show job -o`; nullopt when it has no
// JobState.
std::optional<SlurmJob> ParseScontrolJob(const std::string& text);

// True for a state in which the job will run no more.
bool SlurmJobEnded(const std::string& state);

// Submits the attempt (writes attempt-N/slurm.sh, runs sbatch with the
// ranks' environment); returns the Slurm job id. Errors carry sbatch's
// message.
absl::StatusOr<std::string> SubmitSlurmAttempt(const LaunchRequest& r,
                                               int ranks_per_node,
                                               int cpus_per_task,
                                               const SlurmOptions& o);

// The job's state now. NotFound when Slurm no longer knows it (purged
// after MinJobAge), Unavailable when scontrol cannot reach slurmctld.
absl::StatusOr<SlurmJob> QuerySlurmJob(const std::string& id);

// The id of the (newest) Slurm job named `name` that is still queued or
// running, "" when none.
absl::StatusOr<std::string> FindSlurmJob(const std::string& name);

// The CPUs of each node of `partition` ("" = every partition) that is up
// (not down, drained or failing), as `sinfo -N` reports them: what a job
// could get once the queue ahead of it is gone.
absl::StatusOr<std::vector<int>> SlurmUpNodeCpus(const std::string& partition);

// One node as `sinfo -h -N -o "%N %t %c"` lists it.
struct SlurmNode {
  std::string name;
  std::string state;  // compact: idle, mix, alloc, down*, idle*, ...
  int cpus = 0;
};
std::vector<SlurmNode> ParseSinfoNodes(const std::string& out);

// Up and responding: what a job can run on.
bool SlurmNodeUsable(const std::string& state);
// Down, failing or not responding (a trailing '*'): what a dead node
// becomes. Drained nodes are neither lost nor usable.
bool SlurmNodeLost(const std::string& state);

// The nodes of `nodelist` (Slurm's form, e.g. "node[1-2]") that slurmctld
// reports lost (SlurmNodeLost).
absl::StatusOr<std::vector<std::string>> SlurmLostNodes(
    const std::string& nodelist);

// How many tasks of `cpus_per_task` CPUs, at most `per_node` on a node
// (0: no limit), nodes of `node_cpus` CPUs hold.
int SlurmTaskCapacity(const std::vector<int>& node_cpus, int cpus_per_task,
                      int per_node);

// scancel, with `signal` ("" = Slurm's own: SIGTERM, then SIGKILL after
// KillWait) sent to every step and, with `batch_too`, the batch script.
absl::Status CancelSlurmJob(const std::string& id, const std::string& signal,
                            bool batch_too = true);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_SLURM_H_
