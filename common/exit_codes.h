// The exit codes ptrain's processes give and read: what ptworker's code tells
// ptcoord about an attempt, and what ptctl's and the daemons' codes tell a
// script. Codes other processes read keep their numbers across releases.
#ifndef PTRAIN_COMMON_EXIT_CODES_H_
#define PTRAIN_COMMON_EXIT_CODES_H_

namespace ptrain {

// Anything else that failed: an RPC error, a training that broke, a job
// ptctl watched that FAILED.
inline constexpr int kExitFailed = 1;
// Deterministic bad input (usage, flags, a spec, data): the same input fails
// again. An attempt of ptworker's that ends with it fails its job at once,
// without a restart; ptctl and ptworkerd give it for input they refuse.
inline constexpr int kExitBadInput = 2;
// ptworker stopped as asked (SIGUSR1) after saving a checkpoint: ptcoord
// requeues the job to resume from it, without using up a restart.
inline constexpr int kExitStopped = 3;
// ptctl: the job it watched was CANCELLED.
inline constexpr int kExitCancelled = 3;
// ptctl: Ctrl-C while watching, as a shell reports a command SIGINT ended.
inline constexpr int kExitInterrupted = 130;

}  // namespace ptrain

#endif  // PTRAIN_COMMON_EXIT_CODES_H_
