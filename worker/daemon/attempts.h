// The attempts whose processes ptworkerd started on its node, found again by
// the PTRAIN_ATTEMPT_UID their processes inherit (common/process.h), and
// killed when ptcoord no longer runs them here. Not the starting of them
// (daemon.h).
#ifndef PTRAIN_WORKER_DAEMON_ATTEMPTS_H_
#define PTRAIN_WORKER_DAEMON_ATTEMPTS_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ptrain {

// A rank of an attempt on this node, as /proc shows it.
struct AttemptRank {
  pid_t pid = 0;
  int rank = -1;      // its world rank (OMPI_COMM_WORLD_RANK); -1: unknown
  std::string state;  // /proc state letter
};

// Thread-safe: Exec calls and the heartbeat loop share one.
class Attempts {
 public:
  // Attempt `uid` starts a process here now (remembered from its first).
  void Started(const std::string& uid);
  // Kills (SIGKILL) the processes of every attempt started before `asked`
  // that is not in `keep`, and forgets them.
  void KeepOnly(const std::set<std::string>& keep,
                std::chrono::steady_clock::time_point asked);
  // Kills the processes of every attempt, and forgets them.
  void KillAll();
  // The live processes of the attempts remembered.
  int Processes();

  // The live processes of this user that belong to attempt `uid`.
  static std::vector<pid_t> Pids(const std::string& uid);
  // Sends `sig` to them; returns how many it reached.
  static int Kill(const std::string& uid, int sig);
  // Those of them that are ranks (ptworker), with their state.
  static std::vector<AttemptRank> Ranks(const std::string& uid);

 private:
  std::vector<std::string> Uids();

  absl::Mutex mu_;
  std::map<std::string, std::chrono::steady_clock::time_point> first_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_DAEMON_ATTEMPTS_H_
