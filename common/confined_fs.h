// File access confined to data roots (DESIGN.md §8): a rank opens every data
// file, checkpoint file and folder through a ConfinedFs, so that a path the
// coordinator checked at submit cannot be turned into a way out later (a
// file or folder swapped for a symlink). Not a sandbox for hostile code: it
// confines the paths this process is told to use.
//
// How: every lookup starts at a root's directory fd and resolves the rest
// with openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), so the kernel
// refuses any step (absolute symlink, ".." or a symlink that climbs) that
// leaves the root, at the moment of the lookup. Changes — mkdir, rename,
// unlink, fsync, listing — are made relative to a directory fd obtained that
// way (mkdirat, renameat, unlinkat, fdopendir), never by path string.
//
// With no roots it is plain file access (ptworker standalone). Thread-safe:
// every method is const and holds no state besides the roots.
#ifndef PTRAIN_COMMON_CONFINED_FS_H_
#define PTRAIN_COMMON_CONFINED_FS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptrain {

// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

class ConfinedFs {
 public:
  // The environment variable the coordinator sets: absolute, already
  // resolved roots separated by ':'.
  static constexpr char kRootsEnv[] = "PTRAIN_DATA_ROOTS";

  ConfinedFs() = default;  // unconfined: plain file access
  // `roots` must be absolute; symlinks in a root itself are trusted. An empty
  // list is unconfined. InvalidArgument naming `source` for a relative or
  // empty entry.
  static absl::StatusOr<ConfinedFs> Create(
      const std::vector<std::string>& roots,
      absl::string_view source = kRootsEnv);
  // From $PTRAIN_DATA_ROOTS; unconfined when it is unset or empty.
  static absl::StatusOr<ConfinedFs> FromEnvironment();

  bool confined() const { return !roots_.empty(); }
  const std::vector<std::string>& roots() const { return roots_; }

  // Every method takes `field`, the spec field or flag the path came from;
  // errors name it, the path and (when confined) the roots. A path lexically
  // outside every root, or whose resolution leaves its root, is
  // PermissionDenied; a missing one NotFound; a symlink loop
  // InvalidArgument; an I/O failure Internal. Relative paths are relative to
  // the working directory.

  // open(2) flags (O_CLOEXEC is added); `mode` applies with O_CREAT.
  absl::StatusOr<UniqueFd> Open(absl::string_view path, int flags,
                                absl::string_view field,
                                mode_t mode = 0644) const;
  // The whole file; ResourceExhausted when larger than max_bytes.
  absl::StatusOr<std::string> ReadFile(absl::string_view path,
                                       absl::string_view field,
                                       int64_t max_bytes = INT64_MAX) const;
  // ReadFile as a function of the path (files small enough to read whole:
  // a model's config.json for the spec).
  std::function<absl::StatusOr<std::string>(const std::string&)> Reader(
      std::string field, int64_t max_bytes) const {
    return [fs = *this, field = std::move(field),
            max_bytes](const std::string& path) {
      return fs.ReadFile(path, field, max_bytes);
    };
  }
  // Whether `path` would stay inside the roots: it, or the longest part of
  // it that exists, resolves beneath a root. Creates nothing. Ok when
  // unconfined.
  absl::Status Check(absl::string_view path, absl::string_view field) const;
  // Whether `path` exists (following symlinks, confined).
  absl::StatusOr<bool> Exists(absl::string_view path,
                              absl::string_view field) const;
  // Creates `path` and its missing parents (0755); existing ones are fine.
  absl::Status MakeDirs(absl::string_view path, absl::string_view field) const;
  // rename(2): `from` and `to` name the entries themselves (a symlink is
  // renamed, not followed).
  absl::Status Rename(absl::string_view from, absl::string_view to,
                      absl::string_view field) const;
  // Removes a file or symlink; a missing one is fine.
  absl::Status Remove(absl::string_view path, absl::string_view field) const;
  // Removes a folder and everything in it without following any symlink
  // inside (a symlink is unlinked, its target untouched); missing is fine.
  absl::Status RemoveAll(absl::string_view path, absl::string_view field) const;
  struct Entry {
    std::string name;
    bool is_dir = false;  // a real folder, not a symlink to one
  };
  // The entries of folder `path` ("." and ".." left out), unsorted.
  absl::StatusOr<std::vector<Entry>> List(absl::string_view path,
                                          absl::string_view field) const;
  // fsync(2) of a folder, so that entries created or renamed in it persist.
  absl::Status SyncDir(absl::string_view path, absl::string_view field) const;

 private:
  explicit ConfinedFs(std::vector<std::string> roots)
      : roots_(std::move(roots)) {}
  // Where a path is looked up: a directory fd (a root, "/" or the working
  // directory) and the path relative to it.
  struct Base {
    UniqueFd owned;
    int fd = -1;
    std::string rel;
  };
  absl::StatusOr<Base> Locate(absl::string_view path,
                              absl::string_view field) const;
  // openat2 beneath base.fd when confined, openat otherwise. Returns -errno.
  int OpenAt(int dirfd, const std::string& rel, int flags, mode_t mode) const;
  absl::StatusOr<UniqueFd> OpenRel(const Base& base, const std::string& rel,
                                   int flags, mode_t mode,
                                   absl::string_view path,
                                   absl::string_view field) const;
  // The folder holding `path` (opened O_PATH) and the last component.
  absl::Status OpenParent(absl::string_view path, absl::string_view field,
                          UniqueFd* parent, std::string* leaf) const;
  absl::Status Error(int err, absl::string_view what, absl::string_view path,
                     absl::string_view field) const;

  std::vector<std::string> roots_;
};

}  // namespace ptrain

#endif  // PTRAIN_COMMON_CONFINED_FS_H_
