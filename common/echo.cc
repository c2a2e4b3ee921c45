// See echo.h.
#include "common/echo.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ptrain {
namespace {

// The length of the well-formed UTF-8 character of two or more bytes at
// the start of `s`, else 0 (an ASCII byte, a stray continuation byte, an
// overlong form, a surrogate, a code point beyond U+10FFFF, a cut one).
size_t Utf8CharLength(absl::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(0);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n || byte(1) < lo || byte(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
  }
  return n;
}

}  // namespace

std::string Echo(absl::string_view value) {
  const absl::string_view shown = value.substr(0, kMaxEchoBytes);
  std::string out;
  size_t i = 0;
  while (i < shown.size()) {
    if (const size_t n = Utf8CharLength(shown.substr(i)); n > 0) {
      out.append(shown.data() + i, n);
      i += n;
      continue;
    }
    // A character the cut would split ends the shown part rather than
    // showing as escaped bytes.
    if (shown.size() < value.size() &&
        Utf8CharLength(value.substr(i, 4)) > shown.size() - i) {
      break;
    }
    absl::StrAppend(&out, absl::CHexEscape(shown.substr(i, 1)));
    ++i;
  }
  if (value.size() > kMaxEchoBytes) {
    absl::StrAppend(&out, "… (", value.size(), " bytes)");
  }
  return out;
}

std::string EchoQuoted(absl::string_view value) {
  return absl::StrCat("'", Echo(value), "'");
}

}  // namespace ptrain
