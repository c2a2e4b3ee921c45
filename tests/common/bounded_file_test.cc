// ReadBoundedFile: a path a flag names reads as a regular file of at most
// the limit, or fails at once with one line naming the flag, the path and
// the rule; nothing it can name hangs, exhausts memory or aborts. And the
// readers of files in a folder others write (BoundedFile, ReadFirstLine,
// ReadFileTail with Symlinks::kRefuse): a link, a FIFO or a device there is
// refused without a wait, and a read takes a bounded part of any file.
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

// Runs `read` on a thread and gives its result, or fails the test when it
// has not returned within a minute (a FIFO's open waits for a writer
// forever): the FIFO at `fifo` then gets one that opens and closes.
template <typename T, typename Read>
T WithoutBlocking(const std::string& fifo, Read read) {
  std::promise<T> done;
  std::future<T> result = done.get_future();
  std::thread reader([&] { done.set_value(read()); });
  if (result.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "the read blocked on " << fifo;
    ::close(::open(fifo.c_str(), O_WRONLY | O_NONBLOCK));
  }
  reader.join();
  return result.get();
}

TEST_F(ReadBoundedFileTest, RefusedSymlinkIsNotFollowedEvenToARegularFile) {
  const std::string target = Write("target", "pem");
  const std::string link = (dir_ / "link").string();
  fs::create_symlink(target, link);
  ExpectRefused(ReadBoundedFile("--flag", link, 64, Symlinks::kRefuse), link,
                "is a symbolic link, not a regular file");
  const std::string zero = (dir_ / "zero").string();
  fs::create_symlink("/dev/zero", zero);
  ExpectRefused(ReadBoundedFile("--flag", zero, 64, Symlinks::kRefuse), zero,
                "is a symbolic link, not a regular file");
  absl::StatusOr<std::string> line =
      ReadFirstLine("--flag", zero, 64, Symlinks::kRefuse);
  ASSERT_FALSE(line.ok());
  EXPECT_TRUE(absl::StrContains(line.status().message(), "symbolic link"))
      << line.status();
  absl::StatusOr<FileTail> tail =
      ReadFileTail("--flag", zero, 0, 64, Symlinks::kRefuse);
  ASSERT_FALSE(tail.ok());
  EXPECT_TRUE(absl::StrContains(tail.status().message(), "symbolic link"))
      << tail.status();
}

TEST_F(ReadBoundedFileTest, EveryReaderRefusesAFifoWithoutBlocking) {
  const std::string path = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  const absl::Status line =
      WithoutBlocking<absl::StatusOr<std::string>>(path, [&] {
        return ReadFirstLine("", path, 64, Symlinks::kRefuse);
      }).status();
  EXPECT_TRUE(absl::StrContains(line.message(), "is a FIFO")) << line;
  const absl::Status tail =
      WithoutBlocking<absl::StatusOr<FileTail>>(path, [&] {
        return ReadFileTail("", path, 0, 64, Symlinks::kRefuse);
      }).status();
  EXPECT_TRUE(absl::StrContains(tail.message(), "is a FIFO")) << tail;
  // A name without `what`: the message starts with the path.
  EXPECT_TRUE(absl::StartsWith(tail.message(), path + ": ")) << tail;
}

TEST_F(ReadBoundedFileTest, FirstLineIsReadAloneAndALongerOneRefused) {
  const std::string path = Write("dump", "{\"a\":1}\nsecond\n");
  absl::StatusOr<std::string> line =
      ReadFirstLine("dump", path, 64, Symlinks::kRefuse);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "{\"a\":1}");
  const std::string last = Write("last", "no newline");
  line = ReadFirstLine("dump", last, 64, Symlinks::kRefuse);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "no newline");
  // A gigabyte of zero bytes and no line break (sparse: no disk used).
  const std::string endless = Write("endless", "");
  fs::resize_file(endless, uintmax_t{1} << 30);
  line = ReadFirstLine("dump", endless, 64 << 10, Symlinks::kRefuse);
  ASSERT_FALSE(line.ok());
  EXPECT_EQ(line.status().message(),
            "dump " + endless + ": first line longer than 64 KiB");
}

TEST_F(ReadBoundedFileTest, TailIsTheEndFromAnOffsetAndNeverMore) {
  const std::string path = Write("log", "0123456789");
  absl::StatusOr<FileTail> t = ReadFileTail("", path, 0, 4, Symlinks::kRefuse);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bytes, "6789");
  EXPECT_EQ(t->start, 6);
  EXPECT_EQ(t->size, 10);
  t = ReadFileTail("", path, 8, 4, Symlinks::kRefuse);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bytes, "89");
  EXPECT_EQ(t->start, 8);
  t = ReadFileTail("", path, 20, 4, Symlinks::kRefuse);  // past its end
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bytes, "");
  EXPECT_EQ(t->start, 10);
  const std::string huge = Write("huge", "");
  fs::resize_file(huge, uintmax_t{1} << 40);  // a terabyte, sparse
  t = ReadFileTail("", huge, 0, 100, Symlinks::kRefuse);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bytes, std::string(100, '\0'));
  EXPECT_EQ(t->start, (int64_t{1} << 40) - 100);
}

TEST_F(ReadBoundedFileTest, OpenIsRelativeToAFolderAndReadsPartsOfTheFile) {
  Write("part", "abcdef");
  const UniqueFd folder(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY));
  ASSERT_TRUE(folder.valid());
  absl::StatusOr<BoundedFile> f =
      BoundedFile::Open("", "part", Symlinks::kRefuse, folder.get());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), 6);
  EXPECT_EQ(f->ReadAt(2, 3).value_or("?"), "cde");
  EXPECT_EQ(f->ReadAt(4, 100).value_or("?"), "ef");
  EXPECT_EQ(f->ReadAll(6).value_or("?"), "abcdef");
  absl::StatusOr<std::string> all = f->ReadAll(5);
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().message(),
            "part: larger than 5 bytes (6 bytes); is it the right file?");
}

}  // namespace
}  // namespace ptrain
