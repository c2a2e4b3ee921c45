// Runs a command line for process-level tests and captures its stderr.
#ifndef PTRAIN_TESTS_TESTING_SHELL_H_
#define PTRAIN_TESTS_TESTING_SHELL_H_

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ptrain::testing {

struct ShellResult {
  int code = -1;    // exit status, -1 when killed by a signal
  std::string err;  // everything written to stderr
};

// Runs `command` through /bin/sh, stdout discarded, stderr kept in
// `err_file` and returned.
inline ShellResult RunShell(const std::string& command,
                            const std::string& err_file) {
  const int status =
      std::system((command + " 2>" + err_file + " >/dev/null").c_str());
  ShellResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  return r;
}

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_TESTING_SHELL_H_
