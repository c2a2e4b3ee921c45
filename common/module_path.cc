#include "common/module_path.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace ptrain {

std::vector<std::string> ModuleCandidates(const char* env, const char* module,
                                          const char* subdir) {
  std::vector<std::string> paths;
  if (const char* value = std::getenv(env)) paths.push_back(value);
  std::error_code ec;
  const std::filesystem::path exe =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path dir = exe.parent_path();
    paths.push_back((dir / module).string());
    paths.push_back((dir.parent_path() / subdir / module).string());
    paths.push_back(
        (dir.parent_path().parent_path() / subdir / module).string());
  }
  paths.push_back(module);
  return paths;
}

}  // namespace ptrain
