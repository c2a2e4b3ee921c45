// Auth: only "Bearer <known token>" passes; everything else is
// UNAUTHENTICATED.
#include "coordinator/auth.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/auth_token.h"
#include "gtest/gtest.h"

namespace ptrain {
namespace {

TEST(AuthTest, KnownBearerTokenPasses) {
  EXPECT_TRUE(CheckBearer("Bearer abc", {"x", "abc"}).ok());
  EXPECT_TRUE(CheckBearer("bearer abc", {"abc"}).ok());
}

TEST(AuthTest, MissingWrongOrMalformedIsUnauthenticated) {
  for (const std::optional<std::string>& h :
       {std::optional<std::string>(), std::optional<std::string>(""),
        std::optional<std::string>("abc"),
        std::optional<std::string>("Bearer "),
        std::optional<std::string>("Bearer abd"),
        std::optional<std::string>("Bearer ab"),
        std::optional<std::string>("Basic abc")}) {
    EXPECT_EQ(CheckBearer(h, {"abc"}).code(),
              absl::StatusCode::kUnauthenticated)
        << h.value_or("<none>");
  }
}

TEST(AuthTest, TokenFileSkipsBlanksAndComments) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("tokens_" + std::to_string(getpid()));
  std::ofstream(path) << "# users\n\n  alice-token  \nbob\n";
  auto tokens = LoadTokenFile(path.string());
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(*tokens, (std::vector<std::string>{"alice-token", "bob"}));
  std::ofstream(path) << "# nobody\n";
  EXPECT_FALSE(LoadTokenFile(path.string()).ok());
  std::filesystem::remove(path);
}

TEST(AuthTest, GeneratedTokensAreLongAndDistinct) {
  const std::string a = GenerateToken(), b = GenerateToken();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace ptrain
