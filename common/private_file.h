// Files only their owner reads (0600): written whole, and replaced
// atomically (a reader sees the old file or the new one, never a part).
// Not for large data: the text is one string.
#ifndef PTRAIN_COMMON_PRIVATE_FILE_H_
#define PTRAIN_COMMON_PRIVATE_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace ptrain {

// Writes `text` to `path` created 0600 (replacing it), whatever the umask;
// with `sync`, on the disk (fsync) before it returns. Unavailable naming
// the path and the system's reason on failure.
absl::Status WritePrivateFile(const std::string& path, const std::string& text,
                              bool sync = false);

// Replaces `path` by a file holding `text` (0600): written and synced
// beside it under a name of this process (so that processes replacing one
// file at once do not share a temporary), renamed over it, the folder
// synced. On failure `path` is as it was and no temporary is left.
absl::Status ReplacePrivateFile(const std::string& path,
                                const std::string& text);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_PRIVATE_FILE_H_
