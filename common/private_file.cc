// See private_file.h.
#include "common/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace ptrain {

namespace {

absl::Status Errno(const char* what, const std::string& path, int err) {
  return absl::UnavailableError(
      absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(err)));
}

}  // namespace

absl::Status ReplaceFileAt(int dirfd, const std::string& dir,
                           const std::string& name, std::string_view bytes,
                           mode_t mode) {
  const std::string tmp = absl::StrCat(name, ".", getpid(), ".tmp");
  const std::string path = absl::StrCat(dir, "/", name);
  unlinkat(dirfd, tmp.c_str(), 0);  // a stale one of this pid's
  const int fd =
      openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return Errno("create", absl::StrCat(dir, "/", tmp), errno);
  int err = 0;
  // The umask may take bits from the owner too; a private file keeps its.
  if ((mode & 077) == 0 && fchmod(fd, mode) != 0) err = errno;
  for (size_t done = 0; err == 0 && done < bytes.size();) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) err = n < 0 ? errno : ENOSPC;
    if (n > 0) done += static_cast<size_t>(n);
  }
  if (err == 0 && fsync(fd) != 0) err = errno;
  if (close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && renameat(dirfd, tmp.c_str(), dirfd, name.c_str()) != 0) {
    err = errno;
  }
  if (err != 0) {
    unlinkat(dirfd, tmp.c_str(), 0);
    return Errno("write", path, err);
  }
  // The rename itself persists only once the folder is synced.
  if (fsync(dirfd) != 0) return Errno("sync", dir, errno);
  return absl::OkStatus();
}

absl::Status ReplaceFile(const std::string& path, std::string_view bytes,
                         mode_t mode) {
  const std::filesystem::path p(path);
  const std::string dir =
      p.has_parent_path() ? p.parent_path().string() : std::string(".");
  const int dirfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return Errno("open", dir, errno);
  absl::Status s =
      ReplaceFileAt(dirfd, dir, p.filename().string(), bytes, mode);
  close(dirfd);
  return s;
}

absl::Status ReplacePrivateFile(const std::string& path,
                                const std::string& text) {
  return ReplaceFile(path, text, 0600);
}

bool IsReplaceTemporary(std::string_view entry, std::string_view name) {
  if (entry.size() <= name.size() + 5 || entry.substr(0, name.size()) != name ||
      entry[name.size()] != '.' || !entry.ends_with(".tmp")) {
    return false;
  }
  const std::string_view pid =
      entry.substr(name.size() + 1, entry.size() - name.size() - 5);
  return std::all_of(pid.begin(), pid.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace ptrain
