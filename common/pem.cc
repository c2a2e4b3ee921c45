// See pem.h.
#include "common/pem.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace ptrain {

absl::StatusOr<std::string> ReadPemFile(absl::string_view flag,
                                        const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": not a readable PEM file"));
  }
  return text.str();
}

}  // namespace ptrain
