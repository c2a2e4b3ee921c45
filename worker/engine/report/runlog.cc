#include "worker/engine/report/runlog.h"

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
  // float reads back exactly. A string that is not UTF-8 (a path, text a
  // caller did not decode) is written with U+FFFD for each bad byte
  // sequence, where the default would throw: no record ends a run.
  const std::string line =
      record.dump(-1, ' ', /*ensure_ascii=*/false,
                  nlohmann::json::error_handler_t::replace) +
      "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace ptrain
