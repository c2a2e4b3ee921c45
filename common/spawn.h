// Starting a program in a child process (fork, then exec), the one way
// ptcoord starts an attempt's launcher and its Slurm commands and ptworkerd
// starts what OpenMPI asks of it. Linux only. Not waiting for the child nor
// signalling it: the callers' own. Both callers are multithreaded, so
// between fork and exec the child calls only async-signal-safe functions
// (and, with SpawnOptions::search_path, execvpe's search of PATH).
#ifndef PTRAIN_COMMON_SPAWN_H_
#define PTRAIN_COMMON_SPAWN_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ptrain {

struct SpawnOptions {
  // What runs: argv[0] is a path to the program, or with `search_path` a
  // name looked up on this process's PATH.
  std::vector<std::string> argv;
  bool search_path = false;
  // The program's whole environment.
  std::map<std::string, std::string> env;
  // Where its stdout and stderr go: a file appended to (created 0600), or,
  // when its path is "", a descriptor of this process (a pipe's write end).
  // Its stdin is /dev/null.
  std::string stdout_path, stderr_path;
  int stdout_fd = -1, stderr_fd = -1;
  // The folder it starts in; "" for this process's.
  std::string work_dir;
  // Leader of a process group of its own (set from both sides, so a signal
  // to the group right after Spawn returns reaches it).
  bool own_process_group = false;
  // Killed (SIGKILL) when this process dies, and never started when this
  // process died before the child could say so.
  bool die_with_parent = false;
  // Which of this process's descriptors above stderr the program inherits.
  enum class Fds {
    kInherit,  // those not marked close-on-exec
    // None, but those marked close-on-exec stay open until the exec (a lock
    // held across it, say).
    kCloseInheritable,
    kCloseAll,  // none, closed before the exec
  };
  Fds fds = Fds::kInherit;
  // The child's exit code when it cannot be set up (stdin, stdout or stderr
  // not opened, `work_dir` not entered, this process already gone); 127 when
  // the program cannot be executed.
  int setup_failed_exit = 127;
};

// Starts `o.argv` as set out in `o`; returns the child's pid, or Internal
// "fork: REASON" when no child could be made. Signals the child blocked are
// unblocked before the exec.
absl::StatusOr<pid_t> Spawn(const SpawnOptions& o);

// A pipe whose two ends are close-on-exec; what is still open of it is
// closed when it is destroyed.
class Pipe {
 public:
  // Internal "pipe: REASON" when the system has no pipe to give.
  static absl::StatusOr<Pipe> Open();
  Pipe(Pipe&& other) noexcept;
  Pipe& operator=(Pipe&&) = delete;
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  ~Pipe();

  int read_fd() const { return fds_[0]; }
  int write_fd() const { return fds_[1]; }
  void CloseRead();
  void CloseWrite();

 private:
  Pipe(int read_fd, int write_fd) : fds_{read_fd, write_fd} {}
  int fds_[2];
};

// The exit code of a child whose waitpid status is `status`: its own when
// it exited, 128 + the signal's number when a signal ended it (as a shell
// reports it).
int ExitCodeOf(int status);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_SPAWN_H_
