// Reading files whose path is input, not trust: a small file a flag or an
// environment variable names (a TLS certificate, a token file, a job spec, a
// node list), and the files of a folder others write (an attempt's folder,
// where its ranks and, with --launcher nodes, every node write: dumps, logs,
// the run log). Not for data under the data roots: ranks read those through
// ConfinedFs.
//
// /dev/zero, a FIFO nobody writes, a directory, a link to any of them or a
// multi-gigabyte file must end in one clear error or a read of a bounded
// part, never in a hang, an exhausted heap or an abort.
#ifndef PTRAIN_COMMON_BOUNDED_FILE_H_
#define PTRAIN_COMMON_BOUNDED_FILE_H_

#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/confined_fs.h"

namespace ptrain {

// What a symbolic link at the path itself is. kFollow: the way to the file
// (the path a flag names is the operator's choice). kRefuse: an error, "is a
// symbolic link, not a regular file" (a folder others write: a link there may
// lead to /dev/zero or to a file of ours), checked before the open and by
// the open itself (O_NOFOLLOW), so a link swapped in meanwhile is refused
// too. Links in the folders above the file are followed either way.
enum class Symlinks { kFollow, kRefuse };

// A regular file opened for bounded reads. Refused: anything but a regular
// file (a directory, a device, a FIFO, a socket; with Symlinks::kRefuse a
// symbolic link), checked before the open, so that no device is opened and
// no FIFO waits for a writer, and again on the open file (O_NONBLOCK: a
// FIFO swapped in after the check does not block the open). Errors name
// `what` (where the path came from: "--tls-ca", "PTRAIN_NODES_FILE", "dump";
// "" for none), the path and the rule, on one line: NotFound when the path
// does not exist, PermissionDenied when it may not be read, InvalidArgument
// otherwise. Reads may block as reads of a file do (a network filesystem).
// Movable, not copyable; one object is not for concurrent use.
class BoundedFile {
 public:
  // `path` is relative to the folder open at `dir_fd` (AT_FDCWD: the
  // working directory) unless absolute.
  static absl::StatusOr<BoundedFile> Open(absl::string_view what,
                                          const std::string& path,
                                          Symlinks symlinks,
                                          int dir_fd = AT_FDCWD);

  // The file's size when it was opened.
  int64_t size() const { return size_; }

  // Up to `n` bytes from `offset`: fewer at the end of the file (it may have
  // shrunk or grown since the open; a read past its end is empty).
  absl::StatusOr<std::string> ReadAt(int64_t offset, size_t n) const;

  // Everything from the start to the end of the file, at most `max_bytes`:
  // a file larger than that by its size at the open, or by reading up to
  // one byte more (it grew meanwhile, or reports a size of 0 like /proc),
  // is refused: "larger than 1 MiB ...; is it the right file?".
  absl::StatusOr<std::string> ReadAll(size_t max_bytes) const;

 private:
  BoundedFile(std::string lead, UniqueFd fd, int64_t size)
      : lead_(std::move(lead)), fd_(std::move(fd)), size_(size) {}

  std::string lead_;  // "what path", how every message starts
  UniqueFd fd_;
  int64_t size_ = 0;
};

// The whole content of the regular file `path`, at most `max_bytes` bytes
// (BoundedFile::Open, then ReadAll), e.g. "--tls-ca /dev/zero: is a
// character device, not a regular file". Symlinks are followed unless
// `symlinks` says otherwise. Thread-safe.
absl::StatusOr<std::string> ReadBoundedFile(
    absl::string_view what, const std::string& path, size_t max_bytes,
    Symlinks symlinks = Symlinks::kFollow);

// The first line of the file (without its '\n'; the whole file when it
// holds none), reading at most `max_line_bytes` + 1 bytes: a longer first
// line is InvalidArgument ("first line longer than 64 KiB"). Opened as
// BoundedFile::Open does. Thread-safe.
absl::StatusOr<std::string> ReadFirstLine(absl::string_view what,
                                          const std::string& path,
                                          size_t max_line_bytes,
                                          Symlinks symlinks,
                                          int dir_fd = AT_FDCWD);

// The end of a file that grows (a log): its bytes from `from` to its end,
// but at most its last `max_bytes`. `start` is where `bytes` begin, `size`
// the file's size when read (bytes = [start, size)).
struct FileTail {
  std::string bytes;
  int64_t start = 0;
  int64_t size = 0;
};
// Opened as BoundedFile::Open does. Thread-safe.
absl::StatusOr<FileTail> ReadFileTail(absl::string_view what,
                                      const std::string& path, int64_t from,
                                      size_t max_bytes, Symlinks symlinks);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_BOUNDED_FILE_H_
