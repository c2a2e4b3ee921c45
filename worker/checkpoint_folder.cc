// See checkpoint_folder.h.
#include "worker/checkpoint_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "worker/engine/checkpoint/checkpoint.h"

namespace ptrain {

namespace {

// The pid /proc/locks gives for the flock held on the file `st` describes
// (its device and inode); 0 when none is listed (or /proc is not there).
pid_t FlockHolder(const struct stat& st) {
  std::ifstream locks("/proc/locks");
  const std::string file = absl::StrFormat("%02x:%02x:%u", major(st.st_dev),
                                           minor(st.st_dev), st.st_ino);
  for (std::string line; std::getline(locks, line);) {
    // "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF"; a waiter's line
    // starts "1: -> FLOCK".
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int pid = 0;
    if (f.size() >= 6 && f[1] == "FLOCK" && f[5] == file &&
        absl::SimpleAtoi(f[4], &pid)) {
      return pid;
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<UniqueFd> HoldCheckpointFolder(const std::string& dir,
                                              const ConfinedFs& fs) {
  if (absl::Status s = fs.MakeDirs(dir, "checkpoint.dir"); !s.ok()) return s;
  absl::StatusOr<UniqueFd> fd =
      fs.Open(dir, O_RDONLY | O_DIRECTORY, "checkpoint.dir");
  if (!fd.ok()) return fd.status();
  if (flock(fd->get(), LOCK_EX | LOCK_NB) == 0) return fd;
  if (errno != EWOULDBLOCK) {
    return absl::InternalError(absl::StrCat("checkpoint.dir: flock '", dir,
                                            "': ", std::strerror(errno)));
  }
  struct stat st {};
  const pid_t holder = fstat(fd->get(), &st) == 0 ? FlockHolder(st) : 0;
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint.dir '", dir, "' is in use by another run (",
      holder > 0 ? absl::StrCat("pid ", holder) : "a process of this machine",
      "), which saves its checkpoints there: two runs in one folder would "
      "have this one fail at its first save. Give this run a folder of its "
      "own (--set checkpoint.dir=...), or wait for that run to end"));
}

std::string EarlierCheckpointsNotice(const std::string& dir,
                                     const ConfinedFs& fs) {
  absl::StatusOr<std::vector<std::string>> listed = ListCheckpoints(dir, fs);
  if (!listed.ok() || listed->empty()) return "";
  const std::string& newest = listed->front();
  absl::StatusOr<std::string> owner = CheckpointJobUid(newest, fs);
  return absl::StrCat(
      "checkpoint.dir '", dir, "' holds ", listed->size(),
      " checkpoint(s) of an earlier run, the newest ",
      std::filesystem::path(newest).filename().string(),
      owner.ok() && !owner->empty() ? absl::StrCat(" (run '", *owner, "')")
                                    : "",
      "; this run starts fresh beside them (no --resume-from). To go on from "
      "there instead, run with --resume-from latest");
}

}  // namespace ptrain
