// See process.h.
#include "common/process.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ptrain {

namespace fs = std::filesystem;

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

// The fields after the command name in /proc/PID/stat start with the state
// letter; 'Z' is a zombie, which has ended.
std::string ProcessState(pid_t pid) {
  const std::string st =
      ReadWholeFile("/proc/" + std::to_string(pid) + "/stat");
  // "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
  const size_t close = st.rfind(')');
  if (close == std::string::npos || close + 2 >= st.size()) return "gone";
  return st.substr(close + 2, 1);
}

bool IsZombie(pid_t pid) { return ProcessState(pid) == "Z"; }

std::string ProcessEnv(pid_t pid, absl::string_view name) {
  const std::string env =
      ReadWholeFile("/proc/" + std::to_string(pid) + "/environ");
  const std::string prefix = absl::StrCat(name, "=");
  for (absl::string_view v : absl::StrSplit(env, '\0')) {
    if (absl::StartsWith(v, prefix))
      return std::string(v.substr(prefix.size()));
  }
  return "";
}

std::vector<pid_t> ZombieChildren() {
  std::vector<pid_t> out;
  const pid_t me = getpid();
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator("/proc", ec)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    const std::string st = ReadWholeFile((e.path() / "stat").string());
    // "PID (COMM) STATE PPID ...": COMM may hold anything but ends at the
    // last ')'.
    const size_t close = st.rfind(')');
    if (close == std::string::npos || close + 2 >= st.size()) continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(absl::string_view(st).substr(close + 2), ' ');
    int ppid = 0;
    if (fields.size() > 1 && fields[0] == "Z" &&
        absl::SimpleAtoi(fields[1], &ppid) && ppid == me) {
      out.push_back(pid);
    }
  }
  return out;
}

std::vector<pid_t> ScanProcesses(
    const std::function<bool(const std::vector<absl::string_view>&)>& match) {
  std::vector<pid_t> out;
  const uid_t me = geteuid();
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator("/proc", ec)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    struct stat st;
    if (stat(e.path().c_str(), &st) != 0 || st.st_uid != me) continue;
    const std::string text = ReadWholeFile((e.path() / "environ").string());
    const std::vector<absl::string_view> env = absl::StrSplit(text, '\0');
    if (!match(env) || IsZombie(pid)) continue;
    out.push_back(pid);
  }
  return out;
}

std::vector<pid_t> ProcessesWithEnv(const std::vector<std::string>& vars) {
  return ScanProcesses([&](const std::vector<absl::string_view>& env) {
    for (const std::string& v : vars) {
      if (std::find(env.begin(), env.end(), v) == env.end()) return false;
    }
    return true;
  });
}

int64_t HostMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

double HostLoad1() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  in >> load;
  return in ? load : 0.0;
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

}  // namespace ptrain
