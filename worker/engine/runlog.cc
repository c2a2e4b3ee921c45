#include "worker/engine/runlog.h"

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ptrain {

RunLog::~RunLog() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::StatusOr<std::unique_ptr<RunLog>> RunLog::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "--log-json: cannot open '", path, "': ", std::strerror(errno)));
  }
  auto log = std::make_unique<RunLog>();
  log->file_ = f;
  return log;
}

void RunLog::Write(const nlohmann::json& record) {
  if (file_ == nullptr) return;
  // nlohmann prints doubles with max_digits10 significant digits, so every
  // float reads back exactly.
  const std::string line = record.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace ptrain
