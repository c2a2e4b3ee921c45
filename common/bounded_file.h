// Reading a small file that a flag or an environment variable names (a TLS
// certificate, a token file, a job spec, a node list). Not for data under
// the data roots: ranks read those through ConfinedFs.
//
// Such a path is input, not trust: /dev/zero, a FIFO nobody writes, a
// directory or a multi-gigabyte file must end in one clear error, never in
// a hang, an exhausted heap or an abort.
#ifndef PTRAIN_COMMON_BOUNDED_FILE_H_
#define PTRAIN_COMMON_BOUNDED_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptrain {

// The whole content of the regular file `path`, at most `max_bytes` bytes.
// `what` names where the path came from, the flag or variable ("--tls-ca",
// "PTRAIN_NODES_FILE"), and leads every message, followed by the path and
// the rule broken, e.g. "--tls-ca /dev/zero: not a regular file (a
// character device)".
//
// Refused: anything but a regular file once symlinks are followed (a
// directory, a device, a FIFO, a socket; checked before the open, so no
// device is opened and a FIFO never blocks, and again on the open file), a
// file larger than `max_bytes` (by its size, and by reading at most one byte
// more, so a file that grows meanwhile is refused too). Errors: NotFound
// when the path does not exist, PermissionDenied when it may not be read,
// InvalidArgument otherwise. Thread-safe.
absl::StatusOr<std::string> ReadBoundedFile(absl::string_view what,
                                            const std::string& path,
                                            size_t max_bytes);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_BOUNDED_FILE_H_
