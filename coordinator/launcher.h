// Starts and stops one job attempt on this host: writes the job folder, runs
// `mpirun ... ptworker` in its own process group with stdout/stderr to files,
// signals the group. Knows nothing of job states; Coordinator decides.
#ifndef PTRAIN_COORDINATOR_LAUNCHER_H_
#define PTRAIN_COORDINATOR_LAUNCHER_H_

#include <sys/types.h>

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/private_file.h"
#include "common/process.h"
#include "coordinator/scheduler.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

struct LaunchRequest {
  std::string job_id;
  std::string job_uid;  // PTRAIN_JOB_UID: unique across coordinators
  int attempt = 1;
  std::string job_dir;      // from PrepareJobDir
  std::string token;        // PTRAIN_JOB_TOKEN: secret, never stored
  std::string attempt_uid;  // PTRAIN_ATTEMPT_UID: not secret, finds processes
  std::string coordinator_address;  // PTRAIN_COORDINATOR
  // PTRAIN_DATA_ROOTS: the coordinator's resolved --data-root folders,
  // joined by ':'; the ranks open the spec's files confined to them.
  std::vector<std::string> data_roots;
  // PTRAIN_TLS_CA: PEM file the ranks trust for the coordinator's
  // certificate; "" = the coordinator serves plain text.
  std::string tls_ca_file;
  int world_size = 1;
  int cores = 1;  // OMP_NUM_THREADS = max(1, cores / world_size)
  std::string mpirun = "mpirun";
  std::string ptworker;
  std::string work_dir;     // the ranks' working directory
  bool resume_flag = true;  // pass --resume-from latest
  // With resume_flag: --fork-from this checkpoint folder
  // (Lineage.from_checkpoint).
  std::string fork_from;
  // PTRAIN_METRICS_BIND for every rank ("" = ranks serve no metrics).
  std::string rank_metrics_bind;
  // PTRAIN_COORDINATOR_GRACE_S: a rank that has not reached the
  // coordinator for this many seconds stops at the end of its step, after
  // its checkpoint (exit 3); 0: never.
  double coordinator_grace_s = 0;
  // OMP_NUM_THREADS; 0 = max(1, cores / world_size).
  int threads = 0;
  // On nodes (not empty): the ranks' nodes in rank order; mpirun reads the
  // job folder's hostfile and starts them through `rsh_agent` (ptrsh),
  // which finds each node's daemon in `nodes_file` (PTRAIN_NODES_FILE).
  std::vector<NodeRanks> placement;
  // PTRAIN_RANK_GPUS: on nodes, a GPU job's GPU for each rank, in rank
  // order (Placement.gpus); empty otherwise.
  std::vector<int> rank_gpus;
  // Each rank's CPUs on its host (this one, or its node), in rank order
  // (Placement.cpus), which the attempt's rankfile binds it to;
  // OMP_NUM_THREADS (unless `threads`) is the fewest a rank has. Empty:
  // ranks are not bound (mpirun --bind-to none) and share their host's
  // cores.
  std::vector<std::vector<int>> rank_cpus;
  std::string rsh_agent;
  std::string nodes_file;
  std::string cluster_network;  // CIDR for OpenMPI's TCP; "" = any
};

struct Launched {
  pid_t pid = 0;  // group leader (a /bin/sh that waits for mpirun)
  std::string attempt_dir;
};

// Creates `state_dir`/jobs/`job_id`/ (0700) with spec.yaml (JobSpecToYaml),
// a hostfile (`placement`'s nodes, or localhost with `world_size` slots)
// and, when `tls_ca_pem` is not empty, tls-ca.pem holding it (files 0600);
// returns the folder.
absl::StatusOr<std::string> PrepareJobDir(
    const std::string& state_dir, const std::string& job_id,
    const v1::JobSpec& spec, int world_size, const std::string& tls_ca_pem = "",
    const std::vector<NodeRanks>& placement = {});

// The hostfile of a placement: "NODE slots=N max_slots=N" per node, in
// rank order (mpirun fills each node's slots before the next).
std::string Hostfile(const std::vector<NodeRanks>& placement);

// The rankfile that binds each rank of `r` to its CPUs (r.rank_cpus; CPU
// numbers as the kernel's, mpirun told so): "rank R=HOST slot=C,C", HOST
// the rank's node as the hostfile names it (r.placement), or localhost.
std::string Rankfile(const LaunchRequest& r);

// The argv that runs one attempt (exposed for tests and logs).
std::vector<std::string> AttemptCommand(const LaunchRequest& r,
                                        const std::string& attempt_dir);

// The attempt's folder: `job_dir`/attempt-N.
std::string AttemptDirOf(const LaunchRequest& r);

// Creates the attempt's folder (AttemptDirOf, 0700) with an exit_code file
// that says it is pending; returns it.
absl::StatusOr<std::string> MakeAttemptDir(const LaunchRequest& r);

// This process's environment.
std::map<std::string, std::string> CurrentEnvironment();

// The environment an attempt's ranks get: ptcoord's own, with the job's
// PTRAIN_* variables, OMP_NUM_THREADS and OpenMPI's settings.
std::map<std::string, std::string> AttemptEnvironment(const LaunchRequest& r);

// What a short command printed and how it ended.
struct CommandResult {
  int exit_code = -1;  // 128+N when killed by signal N; 127: not found
  std::string out, err;
};
// Runs `argv` (argv[0] looked up on the PATH of `env`) with environment
// `env` in folder `dir` ("" = ours), stdin /dev/null, and waits for it.
absl::StatusOr<CommandResult> RunCommand(
    const std::vector<std::string>& argv,
    const std::map<std::string, std::string>& env, const std::string& dir = "");

// Forks the attempt: attempt-N/ (0700) gets stdout.log, stderr.log,
// run.jsonl, a rankfile when its ranks are bound and, when mpirun ends,
// exit_code (written by the wrapping shell,
// so the outcome survives a ptcoord crash). The child leads its own process
// group.
absl::StatusOr<Launched> LaunchAttempt(const LaunchRequest& r);

// How an attempt's processes are recognised: PTRAIN_ATTEMPT_UID=`attempt_uid`
// in their environment, or, for an attempt an older ptcoord launched (no
// attempt uid), a PTRAIN_JOB_TOKEN whose Sha256Hex is `token_sha256`.
struct AttemptKey {
  std::string attempt_uid;
  std::string token_sha256;
};

// Every live (not zombie) process of an attempt, of this user. The key is
// unique per attempt and inherited by mpirun's ranks even when they leave
// the process group or outlive ptcoord, so this finds them all. Empty for an
// empty key.
std::vector<pid_t> AttemptProcesses(const AttemptKey& key);

// The attempt's wrapper shell among its processes (its command line names
// `attempt_dir` as an argument of its own), 0 when it is gone.
pid_t AttemptLeader(const AttemptKey& key, const std::string& attempt_dir);

// Sends `sig` to the group `pgid` (when > 0) and to every process of the
// attempt.
void SignalAttempt(pid_t pgid, const AttemptKey& key, int sig);

// Sends `sig` to the attempt's mpirun only (which forwards SIGUSR1 and
// SIGUSR2 to every rank, on every node): not to the wrapper shell or the
// rsh agents, which the signal would end. False when it has none.
bool SignalLauncher(const AttemptKey& key, int sig);

// For a child of this process: the exit code once it has ended (128+signal
// when killed), nullopt while it runs. Reaps it.
std::optional<int> ReapChild(pid_t pid);

// For a process this ptcoord did not start (re-adopted after a restart):
// alive and still the attempt's wrapper shell (its command line names
// `attempt_dir`), so a recycled pid is not mistaken for it.
bool AttemptAlive(pid_t pid, const std::string& attempt_dir);

// What an attempt's exit_code file says. ptcoord writes it before the
// attempt starts (pending) and the attempt's wrapper overwrites it in place
// with its exit code (RecordExitCode), which takes no new space on a full
// disk.
struct AttemptExit {
  enum Kind {
    kCode,     // the wrapper wrote `code`
    kPending,  // as ptcoord wrote it: the wrapper did not get to write
    kUnknown,  // missing, empty or unreadable: ask the attempt's records
  } kind = kUnknown;
  int code = -1;
};
AttemptExit ReadAttemptExit(const std::string& attempt_dir);
// The code ReadAttemptExit found, if it found one.
std::optional<int> ReadExitCode(const std::string& attempt_dir);

// The shell command that records `$rc` in `quoted_dir`/exit_code (a folder
// already quoted for the shell), for the wrapper and Slurm's batch script.
std::string RecordExitCode(absl::string_view quoted_dir);

// The last `n` lines of a log (for error messages), found in its last
// kMaxTailBytes (a line cut by that window is left out), each cut to
// kMaxTailLineBytes. The log is a rank's: a link or anything but a regular
// file is not read, and said so in one line in parentheses; a missing one
// is "".
inline constexpr size_t kMaxTailBytes = size_t{64} << 10;
inline constexpr size_t kMaxTailLineBytes = 1024;
std::string TailLines(const std::string& path, int n);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_LAUNCHER_H_
