// Process management for job attempts; see launcher.h. Linux only (/proc).
// Between fork and exec the child calls only async-signal-safe functions:
// ptcoord is multithreaded.
#include "coordinator/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/spec.h"

extern char** environ;

namespace ptrain {
namespace {

namespace fs = std::filesystem;

// $0 of the wrapper: its command line then names the attempt folder, which is
// how a re-adopting ptcoord recognises it.
constexpr const char* kWrapper =
    "\"$@\"; rc=$?; echo $rc > \"$0/exit_code.tmp\" && mv \"$0/exit_code.tmp\" "
    "\"$0/exit_code\"; exit $rc";

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> PrepareJobDir(const std::string& state_dir,
                                          const std::string& job_id,
                                          const v1::JobSpec& spec,
                                          int world_size) {
  const fs::path dir = fs::path(state_dir) / "jobs" / job_id;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  absl::Status s = WriteFile((dir / "spec.yaml").string(), JobSpecToYaml(spec));
  if (!s.ok()) return s;
  s = WriteFile((dir / "hostfile").string(),
                absl::StrCat("localhost slots=", world_size, "\n"));
  if (!s.ok()) return s;
  return dir.string();
}

std::vector<std::string> AttemptCommand(const LaunchRequest& r,
                                        const std::string& attempt_dir) {
  std::vector<std::string> argv = {
      "/bin/sh",
      "-c",
      kWrapper,
      attempt_dir,
      r.mpirun,
      "--allow-run-as-root",
      "--oversubscribe",
      "--mca",
      "btl",
      "self,vader,tcp",
      "-n",
      absl::StrCat(r.world_size),
      "-x",
      "PTRAIN_COORDINATOR",
      "-x",
      "PTRAIN_JOB_ID",
      "-x",
      "PTRAIN_JOB_TOKEN",
      "-x",
      "PTRAIN_ATTEMPT",
      "-x",
      "OMP_NUM_THREADS",
      "-x",
      "PTRAIN_METRICS_BIND",
      r.ptworker,
      "--config",
      (fs::path(r.job_dir) / "spec.yaml").string(),
      "--log-json",
      (fs::path(attempt_dir) / "run.jsonl").string()};
  if (r.resume_flag) {
    argv.push_back("--resume-from");
    argv.push_back("latest");
  }
  return argv;
}

absl::StatusOr<Launched> LaunchAttempt(const LaunchRequest& r) {
  const std::string attempt_dir =
      (fs::path(r.job_dir) / absl::StrCat("attempt-", r.attempt)).string();
  std::error_code ec;
  fs::create_directories(attempt_dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create ", attempt_dir));
  fs::remove(fs::path(attempt_dir) / "exit_code", ec);

  // Environment: ours, with the job's variables replaced.
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, eq - *e)] = eq + 1;
  }
  env["PTRAIN_COORDINATOR"] = r.coordinator_address;
  env["PTRAIN_JOB_ID"] = r.job_id;
  env["PTRAIN_JOB_TOKEN"] = r.token;
  env["PTRAIN_ATTEMPT"] = absl::StrCat(r.attempt);
  env["OMP_NUM_THREADS"] =
      absl::StrCat(std::max(1, r.cores / std::max(1, r.world_size)));
  env["OMPI_MCA_mpi_yield_when_idle"] = "1";
  env["PTRAIN_METRICS_BIND"] = r.rank_metrics_bind;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(absl::StrCat(k, "=", v));

  const std::vector<std::string> argv_strings = AttemptCommand(r, attempt_dir);
  std::vector<char*> argv, envp;
  for (const std::string& a : argv_strings)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env_strings)
    envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string out_path = (fs::path(attempt_dir) / "stdout.log").string();
  const std::string err_path = (fs::path(attempt_dir) / "stderr.log").string();
  const std::string work_dir = r.work_dir.empty() ? attempt_dir : r.work_dir;

  const pid_t pid = fork();
  if (pid < 0)
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    const int in = open("/dev/null", O_RDONLY);
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (in < 0 || out < 0 || err < 0) _exit(127);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    for (int fd = 3; fd < 1024; ++fd) close(fd);
    if (chdir(work_dir.c_str()) != 0) _exit(127);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  // Also from the parent: no race between the child's setpgid and a signal.
  setpgid(pid, pid);
  return Launched{pid, attempt_dir};
}

std::vector<pid_t> ProcessesWithEnv(const std::vector<std::string>& vars) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator("/proc", ec)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    std::ifstream env(e.path() / "environ");
    std::string text((std::istreambuf_iterator<char>(env)),
                     std::istreambuf_iterator<char>());
    const std::vector<absl::string_view> have = absl::StrSplit(text, '\0');
    bool all = true;
    for (const std::string& v : vars) {
      all = all && std::find(have.begin(), have.end(), v) != have.end();
    }
    if (!all) continue;
    std::ifstream stat(e.path() / "stat");
    std::string st((std::istreambuf_iterator<char>(stat)),
                   std::istreambuf_iterator<char>());
    const size_t close = st.rfind(')');
    if (close != std::string::npos && close + 2 < st.size() &&
        st[close + 2] == 'Z')
      continue;
    out.push_back(pid);
  }
  return out;
}

std::vector<pid_t> AttemptProcesses(const std::string& token) {
  if (token.empty()) return {};
  return ProcessesWithEnv({absl::StrCat("PTRAIN_JOB_TOKEN=", token)});
}

void SignalAttempt(pid_t pgid, const std::string& token, int sig) {
  if (pgid > 0) kill(-pgid, sig);
  for (pid_t p : AttemptProcesses(token)) kill(p, sig);
}

std::optional<int> ReapChild(pid_t pid) {
  int status = 0;
  const pid_t r = waitpid(pid, &status, WNOHANG);
  if (r == 0) return std::nullopt;
  if (r < 0) return -1;  // not our child any more (already reaped)
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

bool AttemptAlive(pid_t pid, const std::string& attempt_dir) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)),
                   std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close != std::string::npos && close + 2 < text.size() &&
      text[close + 2] == 'Z') {
    return false;  // a zombie nobody reaped has still ended
  }
  std::ifstream cmd(absl::StrCat("/proc/", pid, "/cmdline"));
  std::string cmdline((std::istreambuf_iterator<char>(cmd)),
                      std::istreambuf_iterator<char>());
  for (absl::string_view arg : absl::StrSplit(cmdline, '\0')) {
    if (arg == attempt_dir) return true;
  }
  return false;
}

std::optional<int> ReadExitCode(const std::string& attempt_dir) {
  std::ifstream in(fs::path(attempt_dir) / "exit_code");
  int rc = 0;
  if (in >> rc) return rc;
  return std::nullopt;
}

std::string TailLines(const std::string& path, int n) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > n) lines.pop_front();
  }
  std::string out;
  for (const std::string& l : lines) absl::StrAppend(&out, l, "\n");
  return out;
}

}  // namespace ptrain
