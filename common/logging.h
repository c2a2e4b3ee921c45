// Logging setup shared by every binary: spdlog to stderr with one pattern.
#ifndef PTRAIN_COMMON_LOGGING_H_
#define PTRAIN_COMMON_LOGGING_H_

#include <string_view>

namespace ptrain {

// Installs the default logger ("[time] [level] msg"); `level` is one of
// spdlog's names (trace, debug, info, warn, error). Idempotent.
void SetupLogging(std::string_view level = "info");

}  // namespace ptrain

#endif  // PTRAIN_COMMON_LOGGING_H_
