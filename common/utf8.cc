#include "common/utf8.h"

#include <cstring>

namespace ptrain {

int64_t FirstInvalidUtf8(std::string_view text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // ASCII eight bytes at a time (large texts are mostly ASCII).
    for (uint64_t w; i + 8 <= n; i += 8) {
      std::memcpy(&w, b + i, 8);
      if (w & 0x8080808080808080u) break;
    }
    if (i == n) break;
    const unsigned char c = b[i];
    size_t len = 0;
    uint32_t min = 0, cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, min = 0x80, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, min = 0x800, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, min = 0x10000, cp = c & 0x07;
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t k = 1; k < len; ++k) {
      if ((b[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (b[i + k] & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are
    // not UTF-8.
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return static_cast<int64_t>(i);
    }
    i += len;
  }
  return -1;
}

std::string ToValidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  while (!bytes.empty()) {
    const int64_t bad = FirstInvalidUtf8(bytes);
    if (bad < 0) {
      out += bytes;
      break;
    }
    out += bytes.substr(0, static_cast<size_t>(bad));
    out += "\xEF\xBF\xBD";
    bytes.remove_prefix(static_cast<size_t>(bad) + 1);
  }
  return out;
}

}  // namespace ptrain
