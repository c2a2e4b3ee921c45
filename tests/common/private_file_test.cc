// Whole files replaced atomically (common/private_file.h): the new bytes
// or the old file, never a part, never a temporary left behind; private
// ones readable by their owner only; the temporaries' names recognised.
#include "common/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

class ReplaceFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("private_file_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::set<std::string> Entries() {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) {
      names.insert(e.path().filename().string());
    }
    return names;
  }

  fs::path dir_;
};

TEST_F(ReplaceFileTest, ReplacesTheWholeFileAndLeavesNoTemporary) {
  const std::string path = (dir_ / "a.json").string();
  ASSERT_TRUE(ReplaceFile(path, "first, and longer\n", 0644).ok());
  ASSERT_TRUE(ReplaceFile(path, std::string("se\0cond", 7), 0644).ok());
  EXPECT_EQ(Read(path), std::string("se\0cond", 7));
  EXPECT_EQ(Entries(), std::set<std::string>{"a.json"});
}

TEST_F(ReplaceFileTest, AStaleTemporaryOfThisProcessIsNotReadBack) {
  const std::string tmp = absl::StrCat("a.json.", ::getpid(), ".tmp");
  std::ofstream(dir_ / tmp) << "stale bytes, more of them than the new";
  const std::string path = (dir_ / "a.json").string();
  ASSERT_TRUE(ReplaceFile(path, "new", 0644).ok());
  EXPECT_EQ(Read(path), "new");
  EXPECT_EQ(Entries(), std::set<std::string>{"a.json"});
}

TEST_F(ReplaceFileTest, PrivateFilesAreTheOwnersOnly) {
  const std::string path = (dir_ / "secret").string();
  std::ofstream(path) << "old";
  ::chmod(path.c_str(), 0644);
  ASSERT_TRUE(ReplacePrivateFile(path, "token").ok());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(Read(path), "token");
  // Whatever the umask, even one that takes the owner's bits.
  const mode_t old = ::umask(0377);
  const absl::Status s = ReplacePrivateFile(path, "second");
  ::umask(old);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(Read(path), "second");
}

TEST_F(ReplaceFileTest, AFailureNamesThePathAndLeavesTheOldFile) {
  // A folder where the file should be: the rename fails.
  fs::create_directories(dir_ / "taken" / "inside");
  absl::Status s = ReplaceFile((dir_ / "taken").string(), "x", 0644);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), (dir_ / "taken").string())) << s;
  EXPECT_TRUE(fs::is_directory(dir_ / "taken" / "inside"));
  EXPECT_EQ(Entries(), std::set<std::string>{"taken"});
  // No folder at all.
  s = ReplaceFile((dir_ / "none" / "a").string(), "x", 0644);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), (dir_ / "none").string())) << s;
}

TEST(IsReplaceTemporaryTest, KnowsTheNameAndNothingElse) {
  EXPECT_TRUE(IsReplaceTemporary("m.json.123.tmp", "m.json"));
  EXPECT_TRUE(IsReplaceTemporary("m.json.1.tmp", "m.json"));
  EXPECT_FALSE(IsReplaceTemporary("m.json..tmp", "m.json"));
  EXPECT_FALSE(IsReplaceTemporary("m.json.tmp", "m.json"));
  EXPECT_FALSE(IsReplaceTemporary("m.json.12x.tmp", "m.json"));
  EXPECT_FALSE(IsReplaceTemporary("m.json.12.tmpx", "m.json"));
  EXPECT_FALSE(IsReplaceTemporary("n.json.12.tmp", "m.json"));
  EXPECT_FALSE(IsReplaceTemporary("m.json", "m.json"));
  EXPECT_FALSE(IsReplaceTemporary("xm.json.12.tmp", "m.json"));
}

}  // namespace
}  // namespace ptrain
