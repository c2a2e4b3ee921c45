// See attempts.h.
#include "worker/daemon/attempts.h"

#include <signal.h>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "common/process.h"
#include "spdlog/spdlog.h"

namespace ptrain {

void Attempts::Started(const std::string& uid) {
  absl::MutexLock lock(&mu_);
  if (!first_.count(uid)) first_[uid] = std::chrono::steady_clock::now();
}

void Attempts::KeepOnly(const std::set<std::string>& keep,
                        std::chrono::steady_clock::time_point asked) {
  std::vector<std::string> gone;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [uid, t] : first_) {
      if (t < asked && !keep.count(uid)) gone.push_back(uid);
    }
    for (const std::string& uid : gone) first_.erase(uid);
  }
  for (const std::string& uid : gone) {
    const int n = Kill(uid, SIGKILL);
    if (n > 0) {
      spdlog::info("attempt {} no longer runs here: killed {} processes", uid,
                   n);
    }
  }
}

void Attempts::KillAll() {
  KeepOnly({}, std::chrono::steady_clock::time_point::max());
}

int Attempts::Processes() {
  int n = 0;
  for (const std::string& uid : Uids()) n += Pids(uid).size();
  return n;
}

std::vector<pid_t> Attempts::Pids(const std::string& uid) {
  return ProcessesWithEnv({"PTRAIN_ATTEMPT_UID=" + uid});
}

int Attempts::Kill(const std::string& uid, int sig) {
  int n = 0;
  for (pid_t p : Pids(uid)) n += kill(p, sig) == 0 ? 1 : 0;
  return n;
}

std::vector<AttemptRank> Attempts::Ranks(const std::string& uid) {
  std::vector<AttemptRank> out;
  for (pid_t p : Pids(uid)) {
    const std::string comm(absl::StripTrailingAsciiWhitespace(
        ReadWholeFile("/proc/" + std::to_string(p) + "/comm")));
    if (comm != "ptworker") continue;  // orted, the shell around it
    AttemptRank r;
    r.pid = p;
    if (!absl::SimpleAtoi(ProcessEnv(p, "OMPI_COMM_WORLD_RANK"), &r.rank)) {
      r.rank = -1;
    }
    r.state = ProcessState(p);
    out.push_back(r);
  }
  return out;
}

std::vector<std::string> Attempts::Uids() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [uid, t] : first_) out.push_back(uid);
  return out;
}

}  // namespace ptrain
