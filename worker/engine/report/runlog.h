// The run log: one JSON object per line (DESIGN.md §5), floats at full
// precision. Tools, tests and plots read it; keys are never renamed.
#ifndef PTRAIN_WORKER_ENGINE_REPORT_RUNLOG_H_
#define PTRAIN_WORKER_ENGINE_REPORT_RUNLOG_H_

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ptrain {

class RunLog {
 public:
  RunLog() = default;  // a disabled log: Write does nothing
  ~RunLog();
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;

  // Opens (truncates) path; each Write appends one line and flushes it.
  // Write never throws: bytes of a string that are not UTF-8 are written
  // as U+FFFD, so every line is valid UTF-8 JSON.
  static absl::StatusOr<std::unique_ptr<RunLog>> Open(const std::string& path);
  void Write(const nlohmann::json& record);

 private:
  std::FILE* file_ = nullptr;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_REPORT_RUNLOG_H_
