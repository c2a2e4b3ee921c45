// Finding processes by their environment, through /proc (Linux). ptcoord
// finds an attempt's processes by the PTRAIN_ATTEMPT_UID its ranks inherit;
// ptworkerd finds what it started on its node the same way.
#ifndef PTRAIN_COMMON_PROCESS_H_
#define PTRAIN_COMMON_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ptrain {

// The whole content of a (small) file, "" when unreadable.
std::string ReadWholeFile(const std::string& path);

// The CPUs this process may run on (its affinity), ascending; empty when
// the kernel does not say.
std::vector<int> AllowedCpus();

// MemTotal of /proc/meminfo in bytes (0 when unreadable).
int64_t HostMemoryBytes();

// The host's load average over the last minute (/proc/loadavg; 0 when
// unreadable).
double HostLoad1();

// The state letter of /proc/`pid`/stat (R, S, D, T, t, Z, ...), "gone"
// when there is no such process.
std::string ProcessState(pid_t pid);

// True when /proc/`pid` is a zombie (ended, not yet reaped).
bool IsZombie(pid_t pid);

// The value of `name` in /proc/`pid`/environ (the environment it started
// with), "" when absent or unreadable.
std::string ProcessEnv(pid_t pid, absl::string_view name);

// This process's children that have ended and wait to be reaped.
std::vector<pid_t> ZombieChildren();

// Live (not zombie) processes of this user (the effective uid) whose
// NUL-separated environment satisfies `match`. Another user's process is
// never ours to signal, whatever its environment claims.
std::vector<pid_t> ScanProcesses(
    const std::function<bool(const std::vector<absl::string_view>&)>& match);

// Live processes of this user whose environment holds every "NAME=value"
// entry of `vars`.
std::vector<pid_t> ProcessesWithEnv(const std::vector<std::string>& vars);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_PROCESS_H_
