// See bounded_file.h.
#include "common/bounded_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/confined_fs.h"

namespace ptrain {
namespace {

// The path as it goes into a one-line message: a line break in a path
// (it came from the command line or the environment) would split it.
std::string Shown(const std::string& path) {
  const bool printable = std::all_of(path.begin(), path.end(), [](char c) {
    return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
  });
  return printable ? path : absl::CHexEscape(path);
}

// The limit as people state it: "1 MiB", "64 KiB", "100 bytes".
std::string Limit(size_t bytes) {
  constexpr size_t kKiB = 1024, kMiB = kKiB * kKiB;
  if (bytes >= kMiB && bytes % kMiB == 0)
    return absl::StrCat(bytes / kMiB, " MiB");
  if (bytes >= kKiB && bytes % kKiB == 0)
    return absl::StrCat(bytes / kKiB, " KiB");
  return absl::StrCat(bytes, " bytes");
}

const char* Kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

absl::Status SystemError(int err, absl::string_view what,
                         const std::string& path, absl::string_view verb) {
  const std::string message = absl::StrCat(what, " ", Shown(path), ": cannot ",
                                           verb, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InvalidArgumentError(message);
  }
}

absl::Status CheckKindAndSize(const struct stat& st, absl::string_view what,
                              const std::string& path, size_t max_bytes) {
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Shown(path),
                                                   ": is ", Kind(st.st_mode),
                                                   ", not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Shown(path), ": larger than ", Limit(max_bytes),
                     " (", st.st_size, " bytes); is it the right file?"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadBoundedFile(absl::string_view what,
                                            const std::string& path,
                                            size_t max_bytes) {
  // A stat before the open: opening a device can itself do something (a
  // tape rewinds, a watchdog arms), and a FIFO is refused without a wait.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return SystemError(errno, what, path, "open");
  }
  if (absl::Status s = CheckKindAndSize(st, what, path, max_bytes); !s.ok()) {
    return s;
  }
  // O_NONBLOCK: the path may have been swapped for a FIFO since the stat,
  // and opening a FIFO for reading waits for a writer without it.
  const UniqueFd fd(
      ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (fd.get() < 0) return SystemError(errno, what, path, "open");
  // What was opened is what counts.
  if (::fstat(fd.get(), &st) != 0) {
    return SystemError(errno, what, path, "stat");
  }
  if (absl::Status s = CheckKindAndSize(st, what, path, max_bytes); !s.ok()) {
    return s;
  }
  // A regular file, so reads may block as reads of files do (a network
  // filesystem), rather than fail with EAGAIN.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return SystemError(errno, what, path, "read");
  }
  // Up to one byte past the limit, whatever st_size said: the file may grow
  // meanwhile, and some files (/proc) report a size of 0.
  const size_t cap = max_bytes < SIZE_MAX ? max_bytes + 1 : max_bytes;
  std::string text(std::min(cap, std::max<size_t>(st.st_size + 1, 4096)), '\0');
  size_t got = 0;
  while (true) {
    if (got == text.size()) {
      if (text.size() == cap) break;
      text.resize(std::min(cap, 2 * text.size()));
    }
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return SystemError(errno, what, path, "read");
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Shown(path), ": larger than ", Limit(max_bytes),
                     "; is it the right file?"));
  }
  text.resize(got);
  return text;
}

}  // namespace ptrain
