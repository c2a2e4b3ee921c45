// The audit log over spdlog's rotating file sink; see audit.h.
#include "coordinator/audit.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/rotating_file_sink.h"
#include "spdlog/spdlog.h"

namespace ptrain {

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(
    const std::string& path, size_t max_bytes, size_t keep) {
  if (max_bytes < 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--audit-max-bytes=", max_bytes, " must be >= 4096"));
  }
  if (keep < 1 || keep > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--audit-keep=", keep, " must be in [1, 1000]"));
  }
  try {
    auto sink = std::make_shared<spdlog::sinks::rotating_file_sink_mt>(
        path, max_bytes, keep);
    auto logger = std::make_shared<spdlog::logger>("audit", std::move(sink));
    logger->set_pattern("%v");
    logger->set_level(spdlog::level::info);
    logger->flush_on(spdlog::level::info);
    return std::unique_ptr<AuditLog>(new AuditLog(std::move(logger)));
  } catch (const spdlog::spdlog_ex& e) {
    return absl::UnavailableError(
        absl::StrCat("audit log ", path, ": ", e.what()));
  }
}

AuditLog::AuditLog(std::shared_ptr<spdlog::logger> logger)
    : logger_(std::move(logger)) {}

AuditLog::~AuditLog() = default;

void AuditLog::Write(const AuditRecord& r) {
  // In this order, `time` first, for a reader of the raw file.
  nlohmann::ordered_json j = {
      {"time",
       absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(r.unix_ms),
                        absl::UTCTimeZone())},
      {"unix_ms", r.unix_ms},
      {"user", r.user},
      {"role", r.role},
      {"peer", r.peer},
      {"rpc", r.action},
      {"target", r.target},
      {"result", r.result.ok() ? std::string("OK")
                               : absl::StatusCodeToString(r.result.code())},
  };
  if (!r.result.ok()) j["error"] = std::string(r.result.message());
  try {
    // Replacement of bad bytes (a job id is not checked before the rule):
    // the line stays JSON.
    logger_->info(j.dump(-1, ' ', false,
                         nlohmann::ordered_json::error_handler_t::replace));
  } catch (const spdlog::spdlog_ex& e) {
    spdlog::error("audit log: {}", e.what());
  }
}

}  // namespace ptrain
