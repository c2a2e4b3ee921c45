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
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ptrain {
namespace {

// The path as it goes into a one-line message: a line break in a path
// (it came from the command line, the environment or a rank) would split it.
std::string Shown(const std::string& path) {
  const bool printable = std::all_of(path.begin(), path.end(), [](char c) {
    return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
  });
  return printable ? path : absl::CHexEscape(path);
}

// How every message starts: "--tls-ca /etc/ca.pem", or the path alone.
std::string Lead(absl::string_view what, const std::string& path) {
  return what.empty() ? Shown(path) : absl::StrCat(what, " ", Shown(path));
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
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

absl::Status SystemError(int err, const std::string& lead,
                         absl::string_view verb) {
  const std::string message =
      absl::StrCat(lead, ": cannot ", verb, ": ", std::strerror(err));
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

absl::Status CheckKind(mode_t mode, const std::string& lead) {
  if (S_ISREG(mode)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(lead, ": is ", Kind(mode), ", not a regular file"));
}

absl::Status TooLarge(const std::string& lead, size_t max_bytes, int64_t size) {
  return absl::InvalidArgumentError(
      absl::StrCat(lead, ": larger than ", Limit(max_bytes),
                   size >= 0 ? absl::StrCat(" (", size, " bytes)") : "",
                   "; is it the right file?"));
}

}  // namespace

absl::StatusOr<BoundedFile> BoundedFile::Open(absl::string_view what,
                                              const std::string& path,
                                              Symlinks symlinks, int dir_fd) {
  std::string lead = Lead(what, path);
  const bool refuse_links = symlinks == Symlinks::kRefuse;
  // A look before the open: opening a device can itself do something (a
  // tape rewinds, a watchdog arms), and a FIFO is refused without a wait.
  struct stat st;
  if (::fstatat(dir_fd, path.c_str(), &st,
                refuse_links ? AT_SYMLINK_NOFOLLOW : 0) != 0) {
    return SystemError(errno, lead, "open");
  }
  if (absl::Status s = CheckKind(st.st_mode, lead); !s.ok()) return s;
  // O_NONBLOCK: the path may have been swapped for a FIFO since the look,
  // and opening a FIFO for reading waits for a writer without it.
  UniqueFd fd(::openat(dir_fd, path.c_str(),
                       O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK |
                           (refuse_links ? O_NOFOLLOW : 0)));
  if (fd.get() < 0) {
    if (errno == ELOOP && refuse_links) {
      return absl::InvalidArgumentError(
          absl::StrCat(lead, ": is a symbolic link, not a regular file"));
    }
    return SystemError(errno, lead, "open");
  }
  // What was opened is what counts.
  if (::fstat(fd.get(), &st) != 0) return SystemError(errno, lead, "stat");
  if (absl::Status s = CheckKind(st.st_mode, lead); !s.ok()) return s;
  // A regular file, so reads may block as reads of files do (a network
  // filesystem), rather than fail with EAGAIN.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return SystemError(errno, lead, "read");
  }
  return BoundedFile(std::move(lead), std::move(fd),
                     static_cast<int64_t>(st.st_size));
}

absl::StatusOr<std::string> BoundedFile::ReadAt(int64_t offset,
                                                size_t n) const {
  std::string bytes(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd_.get(), bytes.data() + got, n - got,
                              static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return SystemError(errno, lead_, "read");
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  bytes.resize(got);
  return bytes;
}

absl::StatusOr<std::string> BoundedFile::ReadAll(size_t max_bytes) const {
  if (static_cast<uint64_t>(size_) > max_bytes) {
    return TooLarge(lead_, max_bytes, size_);
  }
  // Up to one byte past the limit, whatever the size said: the file may
  // grow meanwhile, and some files (/proc) report a size of 0.
  const size_t cap = max_bytes < SIZE_MAX ? max_bytes + 1 : max_bytes;
  std::string text(std::min(cap, std::max<size_t>(size_ + 1, 4096)), '\0');
  size_t got = 0;
  while (true) {
    if (got == text.size()) {
      if (text.size() == cap) break;
      text.resize(std::min(cap, 2 * text.size()));
    }
    const ssize_t n = ::pread(fd_.get(), text.data() + got, text.size() - got,
                              static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return SystemError(errno, lead_, "read");
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes) return TooLarge(lead_, max_bytes, -1);
  text.resize(got);
  return text;
}

absl::StatusOr<std::string> ReadBoundedFile(absl::string_view what,
                                            const std::string& path,
                                            size_t max_bytes,
                                            Symlinks symlinks) {
  absl::StatusOr<BoundedFile> f = BoundedFile::Open(what, path, symlinks);
  if (!f.ok()) return f.status();
  return f->ReadAll(max_bytes);
}

absl::StatusOr<std::string> ReadFirstLine(absl::string_view what,
                                          const std::string& path,
                                          size_t max_line_bytes,
                                          Symlinks symlinks, int dir_fd) {
  absl::StatusOr<BoundedFile> f =
      BoundedFile::Open(what, path, symlinks, dir_fd);
  if (!f.ok()) return f.status();
  // In pieces: the first line of a dump is short, and its file may not be.
  constexpr size_t kPiece = 4096;
  std::string line;
  while (line.size() <= max_line_bytes) {
    const size_t want = std::min(kPiece, max_line_bytes + 1 - line.size());
    absl::StatusOr<std::string> piece = f->ReadAt(line.size(), want);
    if (!piece.ok()) return piece.status();
    const size_t nl = piece->find('\n');
    if (nl != std::string::npos) {
      line.append(*piece, 0, nl);
      return line;
    }
    line += *piece;
    if (piece->size() < want) break;  // the end of the file
  }
  if (line.size() > max_line_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Lead(what, path), ": first line longer than ", Limit(max_line_bytes)));
  }
  return line;
}

absl::StatusOr<FileTail> ReadFileTail(absl::string_view what,
                                      const std::string& path, int64_t from,
                                      size_t max_bytes, Symlinks symlinks) {
  absl::StatusOr<BoundedFile> f = BoundedFile::Open(what, path, symlinks);
  if (!f.ok()) return f.status();
  FileTail tail;
  tail.size = f->size();
  const int64_t window =
      tail.size > static_cast<int64_t>(max_bytes) ? tail.size - max_bytes : 0;
  tail.start = std::min(tail.size, std::max(from, window));
  absl::StatusOr<std::string> bytes =
      f->ReadAt(tail.start, static_cast<size_t>(tail.size - tail.start));
  if (!bytes.ok()) return bytes.status();
  tail.bytes = *std::move(bytes);
  return tail;
}

}  // namespace ptrain
