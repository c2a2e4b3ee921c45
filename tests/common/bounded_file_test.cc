// ReadBoundedFile: a path a flag names reads as a regular file of at most
// the limit, or fails at once with one line naming the flag, the path and
// the rule; nothing it can name hangs, exhausts memory or aborts.
#include "common/bounded_file.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

class ReadBoundedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("bounded_file_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  // The error names where the path came from, the path, and says `rule`,
  // on one line.
  static void ExpectRefused(const absl::StatusOr<std::string>& r,
                            const std::string& path, const std::string& rule) {
    ASSERT_FALSE(r.ok()) << "read " << r->size() << " bytes of " << path;
    const std::string message(r.status().message());
    EXPECT_TRUE(absl::StartsWith(message, "--flag " + path + ": ")) << message;
    EXPECT_TRUE(absl::StrContains(message, rule)) << message;
    EXPECT_FALSE(absl::StrContains(message, "\n")) << message;
  }

  fs::path dir_;
};

TEST_F(ReadBoundedFileTest, ReadsARegularFileExactly) {
  const std::string bytes("line 1\r\nline\0 2\n\xff", 17);
  const std::string path = Write("plain", bytes);
  absl::StatusOr<std::string> r = ReadBoundedFile("--flag", path, 1024);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, bytes);
}

TEST_F(ReadBoundedFileTest, EmptyFileReadsAsEmpty) {
  absl::StatusOr<std::string> r =
      ReadBoundedFile("--flag", Write("empty", ""), 1024);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "");
}

TEST_F(ReadBoundedFileTest, FileOfExactlyTheLimitIsReadAndOneByteMoreRefused) {
  const std::string at = Write("at", std::string(4096, 'x'));
  absl::StatusOr<std::string> r = ReadBoundedFile("--flag", at, 4096);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), 4096u);

  const std::string over = Write("over", std::string(4097, 'x'));
  r = ReadBoundedFile("--flag", over, 4096);
  ExpectRefused(r, over, "larger than 4 KiB");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ReadBoundedFileTest, HugeSparseFileIsRefused) {
  const std::string path = (dir_ / "sparse").string();
  { std::ofstream out(path, std::ios::binary); }
  // 64 GiB of holes: reading it would take minutes and the memory with it.
  fs::resize_file(path, std::uintmax_t{64} << 30);
  ExpectRefused(ReadBoundedFile("--flag", path, 1 << 20), path,
                "larger than 1 MiB");
}

TEST_F(ReadBoundedFileTest, EndlessDeviceIsRefusedAsNotARegularFile) {
  ExpectRefused(ReadBoundedFile("--flag", "/dev/zero", 1 << 20), "/dev/zero",
                "is a character device, not a regular file");
}

TEST_F(ReadBoundedFileTest, DirectoryIsRefused) {
  ExpectRefused(ReadBoundedFile("--flag", dir_.string(), 1 << 20),
                dir_.string(), "is a directory, not a regular file");
}

TEST_F(ReadBoundedFileTest, FifoWithoutWriterIsRefusedWithoutBlocking) {
  const std::string path = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  std::promise<absl::StatusOr<std::string>> done;
  std::future<absl::StatusOr<std::string>> result = done.get_future();
  std::thread reader(
      [&] { done.set_value(ReadBoundedFile("--flag", path, 64)); });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "ReadBoundedFile blocked on a FIFO";
    // A writer that opens and closes ends the blocked read (EOF).
    ::close(::open(path.c_str(), O_WRONLY | O_NONBLOCK));
    reader.join();
    return;
  }
  reader.join();
  ExpectRefused(result.get(), path, "is a FIFO, not a regular file");
}

TEST_F(ReadBoundedFileTest, SocketIsRefused) {
  // sun_path is short: a relative name from inside the folder.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, "sock");
  const int bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  fs::current_path(cwd);
  ASSERT_EQ(bound, 0) << std::strerror(errno);
  const std::string path = (dir_ / "sock").string();
  ExpectRefused(ReadBoundedFile("--flag", path, 64), path,
                "is a socket, not a regular file");
  ::close(fd);
}

TEST_F(ReadBoundedFileTest, SymlinkToARegularFileIsFollowed) {
  const std::string target = Write("target", "pem");
  const std::string link = (dir_ / "link").string();
  fs::create_symlink(target, link);
  absl::StatusOr<std::string> r = ReadBoundedFile("--flag", link, 64);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "pem");
}

TEST_F(ReadBoundedFileTest, MissingFileIsNotFoundNamingFlagAndPath) {
  const std::string path = (dir_ / "missing").string();
  absl::StatusOr<std::string> r = ReadBoundedFile("--flag", path, 64);
  ExpectRefused(r, path, "cannot open: No such file or directory");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ReadBoundedFileTest, UnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  const std::string path = Write("secret", "x");
  fs::permissions(path, fs::perms::none);
  absl::StatusOr<std::string> r = ReadBoundedFile("--flag", path, 64);
  ExpectRefused(r, path, "cannot open: Permission denied");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
}

// A path from the command line may hold a line break; the message stays
// one line.
TEST_F(ReadBoundedFileTest, LineBreakInAPathIsEscapedInTheMessage) {
  absl::StatusOr<std::string> r =
      ReadBoundedFile("--flag", (dir_ / "a\nb").string(), 64);
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(absl::StrContains(r.status().message(), "\n"))
      << r.status().message();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "a\\nb"))
      << r.status().message();
}

}  // namespace
}  // namespace ptrain
