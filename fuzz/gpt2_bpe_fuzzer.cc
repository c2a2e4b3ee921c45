// Fuzzes GPT-2's encoder (common/gpt2_bpe.h, the built-in vocabulary).
// Input: any bytes, invalid UTF-8 and NULs included. They encode to ids of
// the vocabulary (never <|endoftext|>), the same with a word cache as
// without (one cache kept across inputs, so its hits and its starting over
// when full are reached too), and decode back to themselves; their words
// put back together are the input. The pre-tokenizer is hand-written: on
// the input's valid UTF-8 (its ill-formed bytes dropped) it must split as
// GPT-2's pattern does when RE2 runs it, which is this target's oracle.
//
// Seed corpus: fuzz/corpus/gpt2_bpe/ (prose, code, contractions,
// whitespace runs, scripts and emoji, a few ill-formed bytes).
#include <re2/re2.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/gpt2_bpe.h"

namespace {

using ptrain::Gpt2Bpe;

void Fail(const char* what) {
  std::fprintf(stderr, "gpt2_bpe_fuzzer: %s\n", what);
  std::abort();
}

// `s` less the bytes that are not part of well-formed UTF-8 (no overlong
// forms, surrogates or code points past U+10FFFF).
std::string WellFormed(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c < 0x80) {
      n = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) {
      const unsigned char d = s[i + k];
      ok = k == 1 ? d >= lo && d <= hi : (d & 0xC0) == 0x80;
    }
    if (ok) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      ++i;
    }
  }
  return out;
}

// GPT-2's pattern through RE2, with JavaScript's \s as the reference
// encoders have it. RE2 has no lookahead: group 1 is a whitespace run, which
// leaves its last character to the next word when something else follows.
std::vector<std::string_view> SplitWithRe2(std::string_view text) {
  static const RE2* const pattern = [] {
    const std::string space =
        R"(\t\n\x0B\f\r \x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029})"
        R"(\x{202f}\x{205f}\x{3000}\x{feff})";
    auto* re = new RE2("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" +
                       space + "\\p{L}\\p{N}]+|([" + space + "]+)");
    if (!re->ok()) Fail("the oracle's pattern does not compile");
    return re;
  }();
  std::vector<std::string_view> words;
  const re2::StringPiece all(text.data(), text.size());
  for (size_t pos = 0; pos < text.size();) {
    re2::StringPiece m[2];
    if (!pattern->Match(all, pos, text.size(), RE2::ANCHOR_START, m, 2) ||
        m[0].empty()) {
      Fail("the oracle matches nothing in well-formed UTF-8");
    }
    size_t len = m[0].size();
    if (!m[1].empty() && pos + len < text.size()) {
      size_t last = len - 1;
      while (last > 0 &&
             (static_cast<unsigned char>(text[pos + last]) & 0xC0) == 0x80) {
        --last;
      }
      if (last > 0) len = last;
    }
    words.push_back(text.substr(pos, len));
    pos += len;
  }
  return words;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const Gpt2Bpe& bpe = Gpt2Bpe::Builtin();
  static Gpt2Bpe::Cache* const cache = new Gpt2Bpe::Cache();

  const std::vector<int32_t> ids = bpe.Encode(text);
  if (bpe.Encode(text, cache) != ids) Fail("the cache changes the ids");
  if (cache->size() > Gpt2Bpe::Cache::kMaxWords) Fail("the cache outgrew");
  for (const int32_t id : ids) {
    if (id < 0 || id >= Gpt2Bpe::kEndOfText) Fail("an id outside the text's");
  }
  const absl::StatusOr<std::string> back = bpe.Decode(ids);
  if (!back.ok() || *back != text) Fail("decode(encode(x)) is not x");
  if (text.size() > 0 && ids.empty()) Fail("no ids for a text");

  std::string joined;
  for (const std::string_view w : bpe.Split(text)) {
    if (w.empty()) Fail("an empty word");
    joined.append(w);
  }
  if (joined != text) Fail("the words put back together are not the text");

  const std::string valid = WellFormed(text);
  if (bpe.Split(valid) != SplitWithRe2(valid)) {
    Fail("the pre-tokenizer splits otherwise than GPT-2's pattern in RE2");
  }
  return 0;
}
