// ConfinedFs: with data roots, nothing reaches outside them — not through
// an absolute symlink, a ".." symlink, a folder swapped for a symlink after
// the fact, nor a symlink loop — while symlinks that stay inside work, and
// without roots it is plain file access.
#include "common/confined_fs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace ptrain {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ConfinedFsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() /
            ("ptrain_confined_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(base_);
    root_ = base_ / "root";
    outside_ = base_ / "outside";
    fs::create_directories(root_ / "sub");
    fs::create_directories(outside_ / "dir");
    std::ofstream(root_ / "sub" / "in.txt") << "inside";
    std::ofstream(outside_ / "secret.txt") << "secret";
    auto c = ConfinedFs::Create({root_.string()});
    ASSERT_TRUE(c.ok()) << c.status();
    cfs_ = *c;
  }
  void TearDown() override { fs::remove_all(base_); }

  // Every entry under outside_ with its contents.
  std::map<std::string, std::string> Outside() {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(outside_)) {
      out[e.path().string()] =
          e.is_regular_file() ? ReadAll(e.path()) : std::string("<dir>");
    }
    return out;
  }
  void ExpectEscapeRefused(const absl::Status& s, const std::string& path) {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_NE(s.message().find("field.x: '" + path +
                               "' leads outside the data roots (" +
                               root_.string() + ")"),
              std::string::npos)
        << s;
  }

  fs::path base_, root_, outside_;
  ConfinedFs cfs_;
};

TEST_F(ConfinedFsTest, FilesInsideTheRootReadWriteListAndRename) {
  auto text = cfs_.ReadFile((root_ / "sub/in.txt").string(), "field.x");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "inside");
  ASSERT_TRUE(cfs_.MakeDirs((root_ / "a/b/c").string(), "field.x").ok());
  auto fd = cfs_.Open((root_ / "a/b/c/f.tmp").string(),
                      O_WRONLY | O_CREAT | O_TRUNC, "field.x");
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_EQ(::write(fd->get(), "hi", 2), 2);
  ASSERT_TRUE(cfs_.SyncDir((root_ / "a/b/c").string(), "field.x").ok());
  ASSERT_TRUE(cfs_.Rename((root_ / "a/b/c/f.tmp").string(),
                          (root_ / "a/b/c/f").string(), "field.x")
                  .ok());
  EXPECT_EQ(ReadAll(root_ / "a/b/c/f"), "hi");
  auto list = cfs_.List((root_ / "a/b").string(), "field.x");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "c");
  EXPECT_TRUE((*list)[0].is_dir);
  EXPECT_TRUE(*cfs_.Exists((root_ / "a/b/c/f").string(), "field.x"));
  EXPECT_FALSE(*cfs_.Exists((root_ / "a/nope").string(), "field.x"));
  ASSERT_TRUE(cfs_.RemoveAll((root_ / "a").string(), "field.x").ok());
  EXPECT_FALSE(fs::exists(root_ / "a"));
  // Missing is NotFound, naming the field.
  auto missing = cfs_.ReadFile((root_ / "nope.txt").string(), "field.x");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("field.x: no such file"),
            std::string::npos);
}

TEST_F(ConfinedFsTest, PathLexicallyOutsideEveryRootIsRefused) {
  auto r = cfs_.ReadFile((outside_ / "secret.txt").string(), "field.x");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(r.status().message().find(
                "field.x: '" + (outside_ / "secret.txt").string() +
                "' is outside the data roots (" + root_.string() + ")"),
            std::string::npos)
      << r.status();
  // A root's name as a prefix of another folder's is not that root.
  fs::create_directories(base_ / "rootless");
  std::ofstream(base_ / "rootless" / "f") << "x";
  EXPECT_EQ(
      cfs_.ReadFile((base_ / "rootless/f").string(), "field.x").status().code(),
      absl::StatusCode::kPermissionDenied);
  // ".." that climbs out, written in the path itself.
  const std::string dotdot = (root_ / "../outside/secret.txt").string();
  ExpectEscapeRefused(cfs_.ReadFile(dotdot, "field.x").status(), dotdot);
}

TEST_F(ConfinedFsTest, AbsoluteSymlinkOutIsRefused) {
  fs::create_symlink(outside_ / "secret.txt", root_ / "abs.txt");
  const std::string p = (root_ / "abs.txt").string();
  ExpectEscapeRefused(cfs_.ReadFile(p, "field.x").status(), p);
  ExpectEscapeRefused(cfs_.Open(p, O_RDONLY, "field.x").status(), p);
  // Writing through it is refused too, and the target is untouched.
  ExpectEscapeRefused(cfs_.Open(p, O_WRONLY | O_TRUNC, "field.x").status(), p);
  EXPECT_EQ(ReadAll(outside_ / "secret.txt"), "secret");
}

TEST_F(ConfinedFsTest, RelativeDotDotSymlinkOutIsRefused) {
  fs::create_symlink("../../outside/secret.txt", root_ / "sub" / "rel.txt");
  const std::string p = (root_ / "sub/rel.txt").string();
  ExpectEscapeRefused(cfs_.ReadFile(p, "field.x").status(), p);
  // A dangling one, for a file to be created: refused, nothing created.
  fs::create_symlink("../../outside/new.txt", root_ / "sub" / "new.txt");
  const std::string n = (root_ / "sub/new.txt").string();
  ExpectEscapeRefused(
      cfs_.Open(n, O_WRONLY | O_CREAT | O_TRUNC, "field.x").status(), n);
  EXPECT_FALSE(fs::exists(outside_ / "new.txt"));
}

TEST_F(ConfinedFsTest, FolderSwappedForASymlinkOutIsRefusedForEveryOp) {
  fs::create_directories(root_ / "ck");
  ASSERT_TRUE(cfs_.MakeDirs((root_ / "ck/step.tmp").string(), "field.x").ok());
  // After the folder was checked and used, it becomes a symlink out.
  fs::remove_all(root_ / "ck");
  fs::create_symlink(outside_ / "dir", root_ / "ck");
  const auto before = Outside();
  const std::string ck = (root_ / "ck").string();
  const std::string tmp = (root_ / "ck/step.tmp").string();
  const std::string file = (root_ / "ck/step.tmp/shard.bin").string();
  ExpectEscapeRefused(cfs_.MakeDirs(tmp, "field.x"), tmp);
  ExpectEscapeRefused(
      cfs_.Open(file, O_WRONLY | O_CREAT | O_TRUNC, "field.x").status(), file);
  ExpectEscapeRefused(cfs_.List(ck, "field.x").status(), ck);
  ExpectEscapeRefused(cfs_.SyncDir(ck, "field.x"), ck);
  ExpectEscapeRefused(cfs_.Exists(tmp, "field.x").status(), tmp);
  ExpectEscapeRefused(cfs_.Check(tmp, "field.x"), tmp);
  ExpectEscapeRefused(cfs_.Rename(tmp, (root_ / "ck/step").string(), "field.x"),
                      tmp);
  ExpectEscapeRefused(cfs_.RemoveAll(tmp, "field.x"), tmp);
  ExpectEscapeRefused(cfs_.Remove(file, "field.x"), file);
  EXPECT_EQ(Outside(), before) << "something outside changed";
  // The symlink itself, as an entry of the root, may be removed.
  EXPECT_TRUE(cfs_.RemoveAll(ck, "field.x").ok());
  EXPECT_FALSE(fs::is_symlink(root_ / "ck"));
  EXPECT_EQ(Outside(), before);
}

TEST_F(ConfinedFsTest, RemoveAllNeverFollowsASymlinkInside) {
  fs::create_directories(root_ / "ck" / "step");
  std::ofstream(root_ / "ck" / "step" / "f") << "x";
  fs::create_directory_symlink(outside_ / "dir", root_ / "ck" / "step" / "l");
  std::ofstream(outside_ / "dir" / "keep") << "keep";
  const auto before = Outside();
  ASSERT_TRUE(cfs_.RemoveAll((root_ / "ck").string(), "field.x").ok());
  EXPECT_FALSE(fs::exists(root_ / "ck"));
  EXPECT_EQ(Outside(), before);
}

TEST_F(ConfinedFsTest, SymlinkLoopIsAnErrorNotAHang) {
  fs::create_symlink("b", root_ / "a");
  fs::create_symlink("a", root_ / "b");
  const std::string p = (root_ / "a").string();
  auto r = cfs_.ReadFile(p, "field.x");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
      << r.status();
  EXPECT_NE(r.status().message().find("too many levels of symbolic links"),
            std::string::npos)
      << r.status();
  EXPECT_FALSE(cfs_.MakeDirs((root_ / "a/x").string(), "field.x").ok());
}

TEST_F(ConfinedFsTest, SymlinksThatStayInsideWork) {
  fs::create_symlink("../sub/in.txt", root_ / "sub" / "alias.txt");
  fs::create_directory_symlink("sub", root_ / "subalias");
  auto text = cfs_.ReadFile((root_ / "sub/alias.txt").string(), "field.x");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "inside");
  ASSERT_TRUE(cfs_.MakeDirs((root_ / "subalias/new").string(), "field.x").ok());
  EXPECT_TRUE(fs::is_directory(root_ / "sub" / "new"));
  // A relative path under the working directory, inside the root.
  const fs::path cwd = fs::current_path();
  fs::current_path(root_);
  auto rel = cfs_.ReadFile("sub/in.txt", "field.x");
  fs::current_path(cwd);
  ASSERT_TRUE(rel.ok()) << rel.status();
}

TEST_F(ConfinedFsTest, WithoutRootsItIsPlainFileAccess) {
  ConfinedFs plain;
  EXPECT_FALSE(plain.confined());
  fs::create_symlink(outside_ / "secret.txt", root_ / "abs.txt");
  auto text = plain.ReadFile((root_ / "abs.txt").string(), "field.x");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "secret");
  ASSERT_TRUE(plain.MakeDirs((outside_ / "x/y").string(), "field.x").ok());
  EXPECT_TRUE(fs::is_directory(outside_ / "x/y"));
  EXPECT_TRUE(plain.Check((outside_ / "x/y").string(), "field.x").ok());
}

TEST_F(ConfinedFsTest, RootsMustBeAbsoluteAndResolved) {
  EXPECT_EQ(ConfinedFs::Create({"relative/dir"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConfinedFs::Create({"/a/../b"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ::setenv(ConfinedFs::kRootsEnv, (root_.string() + "::/x/").c_str(), 1);
  auto env = ConfinedFs::FromEnvironment();
  ::unsetenv(ConfinedFs::kRootsEnv);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->roots(), (std::vector<std::string>{root_.string(), "/x"}));
  auto none = ConfinedFs::FromEnvironment();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->confined());
}

TEST_F(ConfinedFsTest, FifoInPlaceOfAFileIsRefusedNotWaitedOn) {
  ASSERT_EQ(::mkfifo((root_ / "fifo").c_str(), 0600), 0);
  for (const ConfinedFs& c : {cfs_, ConfinedFs()}) {
    auto r = c.ReadFile((root_ / "fifo").string(), "field.x");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << r.status();
  }
}

TEST_F(ConfinedFsTest, ReadFileLimitIsResourceExhausted) {
  auto r = cfs_.ReadFile((root_ / "sub/in.txt").string(), "field.x", 3);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace ptrain
