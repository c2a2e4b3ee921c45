// Starts and runs the processes of process-level tests: a server in the
// background with its output in a file, a command line whose output the
// test reads.
#ifndef PTRAIN_TESTS_TESTING_PROCESS_H_
#define PTRAIN_TESTS_TESTING_PROCESS_H_

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ptrain::testing {

// Starts argv[0] with `argv`, its stdout and stderr appended to `log`;
// returns its pid (the caller ends and reaps it).
inline pid_t StartLogged(std::vector<std::string> argv,
                         const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    freopen(log.c_str(), "a", stdout);
    freopen(log.c_str(), "a", stderr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Runs `command` through /bin/sh: its exit status (-1 when a signal ended
// it) and its stdout and stderr together.
inline std::pair<int, std::string> RunCapturing(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Polls `done` every 200 ms until it holds or `seconds` pass; whether it
// held (asked once more at the deadline). A generous deadline, not a timing.
inline bool WaitFor(const std::function<bool()>& done, int seconds) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return done();
}

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_TESTING_PROCESS_H_
