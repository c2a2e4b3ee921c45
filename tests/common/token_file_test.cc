// LoadTokenFile: a token file is read bounded, and a token that could not
// go into a header as is is refused naming the flag, the file and the line,
// never the token.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/auth_token.h"
#include "gtest/gtest.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::path(::testing::TempDir()) /
             ("token_file_test_" + std::to_string(::getpid())))
                .string();
  }
  void TearDown() override { fs::remove(path_); }
  void Write(const std::string& text) {
    std::ofstream(path_, std::ios::binary) << text;
  }
  std::string path_;
};

TEST_F(TokenFileTest, ControlByteInATokenIsRefusedNamingFileAndLine) {
  Write("# users\nalice-token\n\nsecret\x01more\nbob\n");
  absl::StatusOr<std::vector<std::string>> tokens =
      LoadTokenFile(path_, "--token-file");
  ASSERT_FALSE(tokens.ok());
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(tokens.status().message());
  EXPECT_TRUE(
      absl::StartsWith(message, "--token-file " + path_ + ": line 4: token: "))
      << message;
  EXPECT_TRUE(absl::StrContains(message, "byte 7 is 0x01")) << message;
  EXPECT_FALSE(absl::StrContains(message, "secret")) << message;
}

TEST_F(TokenFileTest, NonAsciiTokenIsRefused) {
  Write("t\xc3\xa9st\n");
  absl::StatusOr<std::vector<std::string>> tokens = LoadTokenFile(path_);
  ASSERT_FALSE(tokens.ok());
  EXPECT_TRUE(absl::StrContains(tokens.status().message(), "line 1"))
      << tokens.status().message();
}

// Line ends and surrounding blanks are not part of a token: files written
// on Windows still load.
TEST_F(TokenFileTest, CrlfLinesAndBlanksAroundTokensLoad) {
  Write("# users\r\n  alice-token \r\n\tbob\r\ncarol");
  absl::StatusOr<std::vector<std::string>> tokens = LoadTokenFile(path_);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::vector<std::string>{"alice-token", "bob", "carol"}));
}

TEST_F(TokenFileTest, EndlessDeviceIsRefusedNamingTheFlag) {
  absl::StatusOr<std::vector<std::string>> tokens =
      LoadTokenFile("/dev/zero", "--join-token-file");
  ASSERT_FALSE(tokens.ok());
  EXPECT_EQ(tokens.status().message(),
            "--join-token-file /dev/zero: is a character device, not a "
            "regular file");
}

TEST_F(TokenFileTest, FileOverTheLimitIsRefused) {
  Write(std::string(kMaxTokenFileBytes + 1, 'a'));
  absl::StatusOr<std::vector<std::string>> tokens = LoadTokenFile(path_);
  ASSERT_FALSE(tokens.ok());
  EXPECT_TRUE(
      absl::StrContains(tokens.status().message(), "larger than 64 KiB"))
      << tokens.status().message();
}

TEST_F(TokenFileTest, FileWithoutATokenIsRefused) {
  Write("# nobody\n\n");
  absl::StatusOr<std::vector<std::string>> tokens =
      LoadTokenFile(path_, "--token-file");
  ASSERT_FALSE(tokens.ok());
  EXPECT_EQ(tokens.status().message(),
            "--token-file " + path_ + ": holds no token");
}

}  // namespace
}  // namespace ptrain
