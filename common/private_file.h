// Files written whole and replaced atomically (a reader sees the old file
// or the new one, never a part), some only their owner reads (0600).
// Not for large data: the bytes are one string.
#ifndef PTRAIN_COMMON_PRIVATE_FILE_H_
#define PTRAIN_COMMON_PRIVATE_FILE_H_

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ptrain {

// Replaces `name` in the open folder `dirfd` (whose path `dir` names it in
// errors) by a file holding `bytes`, created with permissions `mode` (less
// the umask; a mode for the owner only is kept whatever the umask): written
// and synced beside it as NAME.PID.tmp (processes
// replacing one file at once do not share a temporary; IsReplaceTemporary
// knows the name), renamed over it, the folder synced. On failure the
// file is as it was and no temporary is left.
absl::Status ReplaceFileAt(int dirfd, const std::string& dir,
                           const std::string& name, std::string_view bytes,
                           mode_t mode);

// ReplaceFileAt for `path` in its folder.
absl::Status ReplaceFile(const std::string& path, std::string_view bytes,
                         mode_t mode);

// ReplaceFile, 0600 whatever the umask. Unavailable naming the path and the
// system's reason on failure.
absl::Status ReplacePrivateFile(const std::string& path,
                                const std::string& text);

// Whether `entry` is the temporary a replacement of `name` leaves when it
// is stopped mid-write (NAME.PID.tmp).
bool IsReplaceTemporary(std::string_view entry, std::string_view name);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_PRIVATE_FILE_H_
