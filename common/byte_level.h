// Byte-level BPE's alphabet: each byte's printable stand-in character, in
// which byte-level vocabularies spell their tokens (GPT-2's encoder.json,
// a Hugging Face tokenizer.json whose pre-tokenizer is ByteLevel). Only the
// spelling: not the merges, not the pre-tokenizer.
#ifndef PTRAIN_COMMON_BYTE_LEVEL_H_
#define PTRAIN_COMMON_BYTE_LEVEL_H_

#include <array>
#include <string>
#include <string_view>

namespace ptrain {

// The code point that stands for each byte: the bytes that print as
// themselves ('!'..'~', '¡'..'¬', '®'..'ÿ') keep theirs, the others take
// 256, 257, ... in byte order (all below 0x144).
constexpr std::array<int, 256> ByteLevelCodePoints() {
  std::array<int, 256> cp{};
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool prints = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                        (b >= 0xAE && b <= 0xFF);
    cp[b] = prints ? b : next++;
  }
  return cp;
}

// The stand-in of byte `b` as UTF-8 (one or two bytes).
inline std::string ByteLevelChar(unsigned char b) {
  constexpr std::array<int, 256> kCodePoints = ByteLevelCodePoints();
  const int c = kCodePoints[b];
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// Appends to `bytes` the bytes that `spelled` (UTF-8 of stand-ins) stands
// for; false, `bytes` partly appended, where it has another character or is
// not UTF-8.
inline bool ByteLevelBytes(std::string_view spelled, std::string* bytes) {
  // Stand-in code point → byte + 1 (0: stands for none).
  static constexpr std::array<unsigned short, 0x144> kByteOf = [] {
    std::array<unsigned short, 0x144> of{};
    const std::array<int, 256> cp = ByteLevelCodePoints();
    for (int b = 0; b < 256; ++b)
      of[cp[b]] = static_cast<unsigned short>(b + 1);
    return of;
  }();
  for (size_t i = 0; i < spelled.size();) {
    const unsigned char c = spelled[i];
    int cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if (c >= 0xC2 && c <= 0xDF && i + 1 < spelled.size() &&
               (static_cast<unsigned char>(spelled[i + 1]) & 0xC0) == 0x80) {
      cp =
          (c & 0x1F) << 6 | (static_cast<unsigned char>(spelled[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;
    }
    if (cp >= static_cast<int>(kByteOf.size()) || kByteOf[cp] == 0) {
      return false;
    }
    *bytes += static_cast<char>(kByteOf[cp] - 1);
  }
  return true;
}

}  // namespace ptrain

#endif  // PTRAIN_COMMON_BYTE_LEVEL_H_
