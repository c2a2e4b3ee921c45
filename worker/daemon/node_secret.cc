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
#include "common/private_file.h"

namespace ptrain {

namespace fs = std::filesystem;

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
  if (absl::Status s = ReplacePrivateFile(probe, "probe\n"); !s.ok()) {
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
  return ReplacePrivateFile(path_, secret + "\n");
}

}  // namespace ptrain
