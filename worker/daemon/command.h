// What OpenMPI asks a node to run through its launch agent (ptrsh), parsed
// without a shell. OpenMPI calls the agent as `AGENT HOST WORD...`, words
// quoted for a remote shell that runs them joined by spaces, as sshd would:
//
//   orted --daemonize -mca ess "env" -mca orte_hnp_uri "1.0;tcp://..." ...
//   PATH=/usr/bin:$PATH ; export PATH ; LD_LIBRARY_PATH=/usr/lib:${...:-} ;
//     export LD_LIBRARY_PATH ; ... ; /usr/bin/orted -mca ...   (--prefix)
//
// The node daemon must not run that through `sh -c`: a token would then be
// a remote shell. ParseNodeCommand accepts exactly this shape — assignments
// and exports of PATH, LD_LIBRARY_PATH and DYLD_LIBRARY_PATH separated by
// ';', then one command whose program is on an allow-list — and refuses
// anything else a shell would interpret (pipes, redirections,
// substitutions, globs, other commands, other variables such as
// LD_PRELOAD), naming what it refused. Where a bare program name is looked
// up is the caller's choice (its own PATH, not the one assigned here).
#ifndef PTRAIN_WORKER_DAEMON_COMMAND_H_
#define PTRAIN_WORKER_DAEMON_COMMAND_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptrain {

struct NodeCommand {
  // Assignments in order, their $NAME references expanded; `exported`
  // ones go into the program's environment.
  struct Assignment {
    std::string name, value;
    bool exported = false;
  };
  std::vector<Assignment> assignments;
  std::vector<std::string> argv;  // the program (as written) and its words
};

// Parses the agent's command line (its words after HOST joined by spaces).
// `allowed`: the program names it may run (the basename of argv[0], e.g.
// "orted", "ptworker"); `env`: the values $NAME refers to before any
// assignment (unset names expand to ""). PermissionDenied for a program not
// allowed, InvalidArgument for any other shape.
absl::StatusOr<NodeCommand> ParseNodeCommand(
    absl::string_view line, const std::vector<std::string>& allowed,
    const std::map<std::string, std::string>& env);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_DAEMON_COMMAND_H_
