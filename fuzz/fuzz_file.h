// A file of a fuzz target's own, for the readers that take a path: in a
// folder made at the first call (on /dev/shm where there is one) and
// removed, with the file, when the process exits.
#ifndef PTRAIN_FUZZ_FUZZ_FILE_H_
#define PTRAIN_FUZZ_FUZZ_FILE_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace ptrain::fuzz {

// The path `name` in the target's folder (`target`: its name, in the
// folder's name). Aborts when the folder cannot be made.
inline const std::string& FuzzFile(const char* target, const char* name) {
  static std::string* path = [&] {
    namespace fs = std::filesystem;
    const std::string base = fs::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string tmpl = base + "/ptrain_" + target + "_fuzz_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    auto* p = new std::string(tmpl + "/" + name);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(fs::path(*path).parent_path(), ec);
    });
    return p;
  }();
  return *path;
}

}  // namespace ptrain::fuzz

#endif  // PTRAIN_FUZZ_FUZZ_FILE_H_
