// See node_secret.h.
#include "worker/daemon/node_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"
#include "common/header_value.h"

namespace ptrain {

namespace {

namespace fs = std::filesystem;

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

// Writes `text` to a new file `path` (0600) and syncs it.
absl::Status WriteSynced(const std::string& path, const std::string& text) {
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("write", path);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const absl::Status s = Errno("write", path);
      close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    const absl::Status s = Errno("sync", path);
    close(fd);
    return s;
  }
  if (close(fd) != 0) return Errno("write", path);
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open", dir);
  const bool ok = fsync(fd) == 0;
  close(fd);
  return ok ? absl::OkStatus() : Errno("sync", dir);
}

}  // namespace

absl::StatusOr<NodeSecretFile> NodeSecretFile::Open(
    const std::string& state_dir, const std::string& name) {
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state-dir ", state_dir, ": ", why,
                     " (ptworkerd keeps its node secret there)"));
  };
  if (state_dir.empty()) return refuse("must not be empty");
  // ptcoord checks the name's full rule; the file's name only needs it to
  // stay a plain name.
  if (name.empty() || name[0] == '.' || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--name ", name,
        ": must be a node name (a-z, 0-9, '-' and '.', starting with a "
        "letter or digit)"));
  }
  std::error_code ec;
  if (!fs::exists(state_dir, ec)) {
    fs::create_directories(state_dir, ec);
    if (ec) return refuse(ec.message());
    chmod(state_dir.c_str(), 0700);
  }
  if (!fs::is_directory(state_dir, ec)) return refuse("not a folder");
  const std::string path = (fs::path(state_dir) / (name + ".secret")).string();
  const std::string probe = path + ".probe";
  if (absl::Status s = WriteSynced(probe, "probe\n"); !s.ok()) {
    return refuse(std::string(s.message()));
  }
  unlink(probe.c_str());
  return NodeSecretFile(path);
}

absl::StatusOr<std::string> NodeSecretFile::Load() const {
  struct stat st;
  if (lstat(path_.c_str(), &st) != 0 && errno == ENOENT) return std::string();
  absl::StatusOr<std::string> text =
      ReadBoundedFile("node secret file", path_, 4096);
  if (!text.ok()) return text.status();
  const std::string secret(absl::StripAsciiWhitespace(*text));
  if (absl::Status s = CheckHeaderValue(path_, secret); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("node secret file ", s.message()));
  }
  return secret;
}

absl::Status NodeSecretFile::Store(const std::string& secret) const {
  const std::string tmp = path_ + ".tmp";
  if (absl::Status s = WriteSynced(tmp, secret + "\n"); !s.ok()) return s;
  if (rename(tmp.c_str(), path_.c_str()) != 0) return Errno("rename", tmp);
  return SyncDir(fs::path(path_).parent_path().string());
}

}  // namespace ptrain
