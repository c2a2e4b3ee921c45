// CheckHeaderValue: only what gRPC accepts in a header passes, so no input
// can make a call abort the process; the message never shows the value.
#include "common/header_value.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ptrain {
namespace {

TEST(CheckHeaderValue, PrintableAsciiTokensPass) {
  EXPECT_TRUE(CheckHeaderValue("--token", "integration-token").ok());
  EXPECT_TRUE(CheckHeaderValue("--token", std::string(64, 'f')).ok());
  // Every printable byte, the space and the tilde at the ends included.
  std::string all;
  for (char c = 0x20; c <= 0x7e; ++c) all.push_back(c);
  EXPECT_TRUE(CheckHeaderValue("--token", all).ok());
  EXPECT_TRUE(
      CheckHeaderValue("--token", std::string(kMaxHeaderValueBytes, 'a')).ok());
}

struct BadValue {
  const char* name;
  std::string value;
  const char* reason;  // part of the message
};

class CheckHeaderValueRefuses : public ::testing::TestWithParam<BadValue> {};

TEST_P(CheckHeaderValueRefuses, NamingTheSourceAndTheRuleButNotTheValue) {
  const BadValue& bad = GetParam();
  const absl::Status s = CheckHeaderValue("PTCTL_TOKEN", bad.value);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(s.message());
  EXPECT_TRUE(absl::StartsWith(message, "PTCTL_TOKEN: ")) << message;
  EXPECT_TRUE(absl::StrContains(message, bad.reason)) << message;
  EXPECT_TRUE(absl::StrContains(message,
                                "printable ASCII characters "
                                "(0x20-0x7E)"))
      << message;
  EXPECT_FALSE(absl::StrContains(message, "secret")) << message;
}

INSTANTIATE_TEST_SUITE_P(
    Bytes, CheckHeaderValueRefuses,
    ::testing::Values(
        BadValue{"LineFeed", "secret\nX: y", "byte 7 is 0x0a"},
        BadValue{"CarriageReturn", "secret\r", "byte 7 is 0x0d"},
        BadValue{"ControlByte", "secret\x01", "byte 7 is 0x01"},
        BadValue{"Nul", std::string("secret\0", 7), "byte 7 is 0x00"},
        BadValue{"Tab", "secret\tx", "byte 7 is 0x09"},
        BadValue{"Delete", "secret\x7f", "byte 7 is 0x7f"},
        BadValue{"Latin1", "secret\xe9", "byte 7 is 0xe9"},
        BadValue{"Utf8", "secret\xc3\xa9", "byte 7 is 0xc3"},
        BadValue{"Empty", "", "empty"},
        BadValue{"TooLong", "secret" + std::string(kMaxHeaderValueBytes, 'a'),
                 "4102 bytes long"}),
    [](const ::testing::TestParamInfo<BadValue>& info) {
      return std::string(info.param.name);
    });

}  // namespace
}  // namespace ptrain
