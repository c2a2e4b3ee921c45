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

// A token short enough to guess loads, and is named by its line (never
// shown) so that ptcoord can warn of it.
TEST_F(TokenFileTest, ShortTokensLoadAndAreNamedByLine) {
  Write("# users\nx\n0123456789abcdef\n0123456789abcde\n");
  std::vector<std::string> short_tokens;
  absl::StatusOr<std::vector<std::string>> tokens =
      LoadTokenFile(path_, "--token-file", &short_tokens);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->size(), 3u);
  ASSERT_EQ(short_tokens.size(), 2u);
  EXPECT_EQ(short_tokens[0], "--token-file " + path_ +
                                 ": line 2: the token has 1 characters; one "
                                 "of fewer than 16 can be guessed (make one "
                                 "with: openssl rand -hex 32)");
  EXPECT_TRUE(absl::StartsWith(short_tokens[1], "--token-file " + path_ +
                                                    ": line 4: the token "
                                                    "has 15 characters"))
      << short_tokens[1];
  EXPECT_FALSE(absl::StrContains(short_tokens[1], "0123456789abcde"))
      << short_tokens[1];
}

}  // namespace
}  // namespace ptrain
