// Where ptworkerd keeps its node secret: the proof, issued by ptcoord at the
// node's first registration, that later registrations of the node's name
// come from this node (coordinator/nodes.h). One file per node name in the
// daemon's state folder, 0600 in a 0700 folder, replaced atomically.
#ifndef PTRAIN_WORKER_DAEMON_NODE_SECRET_H_
#define PTRAIN_WORKER_DAEMON_NODE_SECRET_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ptrain {

class NodeSecretFile {
 public:
  // The secret of node `name` in `state_dir` (--state-dir): the folder is
  // created 0700 when missing and must be a folder this user can write (a
  // probe file is written and removed), so that a secret ptcoord issues is
  // never lost for want of a place to keep it. InvalidArgument naming
  // --state-dir and the rule otherwise.
  static absl::StatusOr<NodeSecretFile> Open(const std::string& state_dir,
                                             const std::string& name);

  // The kept secret, "" when there is none yet (a first registration).
  // InvalidArgument naming the file when it is not a regular file of at
  // most 4 KiB holding one printable token.
  absl::StatusOr<std::string> Load() const;
  // Replaces the kept secret: written to a temporary file, synced, renamed
  // over the old one and the folder synced. Unavailable naming the file.
  absl::Status Store(const std::string& secret) const;

  const std::string& path() const { return path_; }

 private:
  explicit NodeSecretFile(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_DAEMON_NODE_SECRET_H_
