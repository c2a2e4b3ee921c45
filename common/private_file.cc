// See private_file.h.
#include "common/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
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

absl::Status WritePrivateFile(const std::string& path, const std::string& text,
                              bool sync) {
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("write", path, errno);
  fchmod(fd, 0600);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      close(fd);
      return Errno("write", path, err);
    }
    done += static_cast<size_t>(n);
  }
  if (sync && fsync(fd) != 0) {
    const int err = errno;
    close(fd);
    return Errno("sync", path, err);
  }
  if (close(fd) != 0) return Errno("write", path, errno);
  return absl::OkStatus();
}

absl::Status ReplacePrivateFile(const std::string& path,
                                const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".", getpid(), ".tmp");
  if (absl::Status s = WritePrivateFile(tmp, text, /*sync=*/true); !s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return Errno("rename", tmp, err);
  }
  // The rename itself persists only once the folder is synced.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open", dir, errno);
  const bool synced = fsync(fd) == 0;
  const int err = errno;
  close(fd);
  return synced ? absl::OkStatus() : Errno("sync", dir, err);
}

}  // namespace ptrain
