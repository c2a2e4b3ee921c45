#include "common/logging.h"

#include <string>

#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace ptrain {

void SetupLogging(std::string_view level) {
  auto logger = spdlog::get("ptrain");
  if (!logger) {
    logger = spdlog::stderr_color_mt("ptrain");
    spdlog::set_default_logger(logger);
  }
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
}

}  // namespace ptrain
