// The state dir's checks and lock; see state_dir.h.
#include "coordinator/state_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace fs = std::filesystem;

absl::Status CheckPrivateDir(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("state dir ", dir, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat("state dir ", dir, " is not a directory"));
  }
  if (st.st_uid != geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "state dir ", dir, " is owned by uid ", st.st_uid,
        ", not by this user (uid ", geteuid(),
        "); it holds the job database, so ptcoord uses only its own"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "state dir %s is writable by group or others (mode %04o); another "
        "user could replace the job database: chmod 700 %s",
        dir, st.st_mode & 07777, dir));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> LockStateDir(const std::string& dir) {
  const std::string path = (fs::path(dir) / "lock").string();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  // A child we forked just before a restart shares the lock until its exec
  // closes it (microseconds, longer on a loaded host): wait a little before
  // calling the dir taken.
  int locked = -1;
  for (int i = 0; i < 60; ++i) {
    locked = flock(fd, LOCK_EX | LOCK_NB);
    if (locked == 0 || errno != EWOULDBLOCK) break;
    usleep(50 * 1000);
  }
  if (locked != 0) {
    const int err = errno;
    char buf[32] = "";
    const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    close(fd);
    const std::string holder(absl::StripAsciiWhitespace(
        absl::string_view(buf, n > 0 ? static_cast<size_t>(n) : 0)));
    if (err != EWOULDBLOCK) {
      return absl::UnavailableError(
          absl::StrCat("cannot lock ", path, ": ", std::strerror(err)));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("state dir ", dir, " is in use by another ptcoord",
                     holder.empty() ? "" : absl::StrCat(" (pid ", holder, ")"),
                     "; one state dir serves one coordinator at a time"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) !=
                                   static_cast<ssize_t>(pid.size())) {
    spdlog::warn("cannot record our pid in {}: {}", path, std::strerror(errno));
  }
  return fd;
}

void TightenStateDir(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    spdlog::warn("state dir {} was mode {:04o}; making it 0700", dir,
                 st.st_mode & 07777);
    chmod(dir.c_str(), 0700);
  }
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(dir, ec)) {
    struct stat f;
    if (lstat(d.path().c_str(), &f) != 0 || f.st_uid != geteuid()) continue;
    if (S_ISREG(f.st_mode) && (f.st_mode & 077) != 0) {
      chmod(d.path().c_str(), 0600);
    } else if (S_ISDIR(f.st_mode) && (f.st_mode & 077) != 0) {
      chmod(d.path().c_str(), 0700);
    }
  }
}

}  // namespace ptrain
