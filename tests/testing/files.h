// Files for tests: a fresh folder, a whole file's bytes.
#ifndef PTRAIN_TESTS_TESTING_FILES_H_
#define PTRAIN_TESTS_TESTING_FILES_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace ptrain::testing {

// An empty folder of the test's temporary folder, named by `prefix`,
// `name` and the process (what an earlier run left there removed).
inline std::string FreshTempDir(const std::string& prefix,
                                const std::string& name) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/", prefix, "_", name, "_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The bytes of the file at `path` ("" if it cannot be read).
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_TESTING_FILES_H_
