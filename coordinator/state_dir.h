// ptcoord's state dir (docs/control-plane.md, "The state dir"): private to
// its user, locked by the one ptcoord that serves it.
#ifndef PTRAIN_COORDINATOR_STATE_DIR_H_
#define PTRAIN_COORDINATOR_STATE_DIR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ptrain {

// OK when `dir` is a folder owned by the effective user that neither group
// nor others may write; PermissionDenied naming it and the rule otherwise.
absl::Status CheckPrivateDir(const std::string& dir);

// Locks `dir`/lock (flock, released when the fd closes or we die) and
// writes our pid into it; returns the fd. FailedPrecondition naming the
// holder when another process has it.
absl::StatusOr<int> LockStateDir(const std::string& dir);

// Older ptcoords left the state dir 0755 and files 0644: tightens what we
// own to 0700/0600 (the directory's mode alone keeps others out).
void TightenStateDir(const std::string& dir);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_STATE_DIR_H_
