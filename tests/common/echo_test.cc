// Echo: what an error message shows of a client's value is bounded, one
// line, valid UTF-8, and says how much was left out.
#include "common/echo.h"

#include <string>

#include "gtest/gtest.h"

namespace ptrain {
namespace {

// Whether `s` is well-formed UTF-8 (no stray, overlong or cut sequence).
bool IsUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    size_t n = c < 0x80                 ? 1
               : c >= 0xC2 && c <= 0xDF ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

TEST(Echo, ShortPlainValuesAreShownAsTheyAre) {
  EXPECT_EQ(Echo("job-0001"), "job-0001");
  EXPECT_EQ(Echo(""), "");
  EXPECT_EQ(Echo("/srv/data/tiny shakespeare.txt"),
            "/srv/data/tiny shakespeare.txt");
  EXPECT_EQ(EchoQuoted("node-7"), "'node-7'");
  EXPECT_EQ(Echo("naïve-日本"), "naïve-日本");  // UTF-8 kept
}

TEST(Echo, ControlBytesQuotesAndBrokenUtf8AreEscapedOntoOneLine) {
  EXPECT_EQ(Echo("a\nb\tc"), "a\\nb\\tc");
  EXPECT_EQ(Echo(std::string("x\0y", 3)), "x\\x00y");
  EXPECT_EQ(EchoQuoted("it's"), "'it\\'s'");
  EXPECT_EQ(Echo("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(Echo("\xc3"), "\\xc3");                    // a character cut short
  EXPECT_EQ(Echo("\xc0\xaf"), "\\xc0\\xaf");           // an overlong '/'
  EXPECT_EQ(Echo("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_TRUE(IsUtf8(Echo("\x80\xbf\xf5 ok \xe2\x82")));
}

TEST(Echo, LongValuesAreCutAndSayTheirSize) {
  const std::string id(100 * 1024, 'j');
  const std::string shown = Echo(id);
  EXPECT_EQ(shown, std::string(kMaxEchoBytes, 'j') + "… (102400 bytes)");
  EXPECT_EQ(Echo(std::string(kMaxEchoBytes, 'a')),
            std::string(kMaxEchoBytes, 'a'));  // exactly the limit: whole
  // Escaping grows a value at most fourfold; the bound holds.
  const std::string worst(100 * 1024, '\x01');
  EXPECT_LE(Echo(worst).size(), 4 * kMaxEchoBytes + 32);
  EXPECT_TRUE(IsUtf8(Echo(worst)));
}

TEST(Echo, ACutNeverSplitsACharacter) {
  // 199 bytes, then a 2-byte character across the limit.
  const std::string value = std::string(kMaxEchoBytes - 1, 'a') + "é" + "zzz";
  const std::string shown = Echo(value);
  EXPECT_EQ(shown, std::string(kMaxEchoBytes - 1, 'a') + "… (" +
                       std::to_string(value.size()) + " bytes)");
  EXPECT_TRUE(IsUtf8(shown));
  // A 4-byte character ending exactly at the limit stays whole.
  const std::string fits = std::string(kMaxEchoBytes - 4, 'b') + "😀" + "x";
  EXPECT_EQ(Echo(fits), std::string(kMaxEchoBytes - 4, 'b') + "😀… (" +
                            std::to_string(fits.size()) + " bytes)");
}

}  // namespace
}  // namespace ptrain
