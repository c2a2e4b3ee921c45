// PEM files named by a command-line flag (TLS certificates, keys, CAs).
#ifndef PTRAIN_COMMON_PEM_H_
#define PTRAIN_COMMON_PEM_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptrain {

// The file's text; InvalidArgument naming the flag and the path when it
// cannot be read or holds no PEM block.
absl::StatusOr<std::string> ReadPemFile(absl::string_view flag,
                                        const std::string& path);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_PEM_H_
