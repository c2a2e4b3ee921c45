// See spawn.h.
#include "common/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ptrain {

namespace {

// The child's side of Spawn, from fork to exec; never returns.
[[noreturn]] void SetUpAndExec(const SpawnOptions& o, pid_t parent,
                               char* const* argv, char* const* envp) {
  if (o.own_process_group) setpgid(0, 0);
  if (o.die_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(o.setup_failed_exit);  // already gone
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  const int in = open("/dev/null", O_RDONLY);
  const int out =
      o.stdout_path.empty()
          ? o.stdout_fd
          : open(o.stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  const int err =
      o.stderr_path.empty()
          ? o.stderr_fd
          : open(o.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (in < 0 || out < 0 || err < 0) _exit(o.setup_failed_exit);
  dup2(in, 0);
  dup2(out, 1);
  dup2(err, 2);
  if (o.fds != SpawnOptions::Fds::kInherit) {
    for (int fd = 3; fd < 1024; ++fd) {
      if (o.fds == SpawnOptions::Fds::kCloseInheritable) {
        const int flags = fcntl(fd, F_GETFD);
        if (flags < 0 || (flags & FD_CLOEXEC) != 0) continue;
      }
      close(fd);
    }
  }
  if (!o.work_dir.empty() && chdir(o.work_dir.c_str()) != 0) {
    _exit(o.setup_failed_exit);
  }
  if (o.search_path) {
    execvpe(argv[0], argv, envp);
  } else {
    execve(argv[0], argv, envp);
  }
  _exit(127);
}

}  // namespace

absl::StatusOr<pid_t> Spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return absl::InvalidArgumentError("no command");
  // Everything the child reads is made here: it may not allocate.
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : o.env) {
    env_strings.push_back(absl::StrCat(k, "=", v));
  }
  std::vector<char*> argv, envp;
  for (const std::string& a : o.argv)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env_strings) {
    envp.push_back(const_cast<char*>(e.c_str()));
  }
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) SetUpAndExec(o, parent, argv.data(), envp.data());
  // Also from the parent: no race between the child's setpgid and a signal.
  if (o.own_process_group) setpgid(pid, pid);
  return pid;
}

absl::StatusOr<Pipe> Pipe::Open() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  return Pipe(fds[0], fds[1]);
}

Pipe::Pipe(Pipe&& other) noexcept : fds_{other.fds_[0], other.fds_[1]} {
  other.fds_[0] = other.fds_[1] = -1;
}

Pipe::~Pipe() {
  CloseRead();
  CloseWrite();
}

void Pipe::CloseRead() {
  if (fds_[0] >= 0) close(fds_[0]);
  fds_[0] = -1;
}

void Pipe::CloseWrite() {
  if (fds_[1] >= 0) close(fds_[1]);
  fds_[1] = -1;
}

int ExitCodeOf(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace ptrain
