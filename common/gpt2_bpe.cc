#include "common/gpt2_bpe.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"
#include "common/byte_level.h"
#include "common/check.h"
#include "common/incbin.h"
#include "nlohmann/json.hpp"

// The vocabulary of data/tokenizers/gpt2, bytes as they are in the files
// (PTRAIN_GPT2_VOCAB_DIR comes from common/CMakeLists.txt, which also makes
// this file rebuild when they change).
PT_INCBIN(ptrain_gpt2_encoder_json, PTRAIN_GPT2_VOCAB_DIR "/encoder.json");
PT_INCBIN(ptrain_gpt2_vocab_bpe, PTRAIN_GPT2_VOCAB_DIR "/vocab.bpe");
PT_INCBIN_DECLARE(ptrain_gpt2_encoder_json);
PT_INCBIN_DECLARE(ptrain_gpt2_vocab_bpe);

namespace ptrain {

namespace {

// The vocabulary's files are about 1 MB; well under this.
constexpr size_t kMaxVocabFileBytes = size_t{64} << 20;

// --- The pre-tokenizer -----------------------------------------------------
//
// GPT-2's pattern, as the reference encoders run it (JavaScript, u flag):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// The first alternative that matches at a position wins. A byte that is not
// part of valid UTF-8 matches nothing: it is a word alone, and ends the run
// before it (for the lookahead it is not whitespace).

enum CharClass : uint8_t { kOther, kLetter, kNumber, kSpace, kInvalid };

constexpr std::array<uint8_t, 128> AsciiClasses() {
  std::array<uint8_t, 128> c{};
  for (int b = 0; b < 128; ++b) {
    if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z')) {
      c[b] = kLetter;
    } else if (b >= '0' && b <= '9') {
      c[b] = kNumber;
    } else if (b == ' ' || (b >= '\t' && b <= '\r')) {
      c[b] = kSpace;
    } else {
      c[b] = kOther;
    }
  }
  return c;
}
constexpr std::array<uint8_t, 128> kAscii = AsciiClasses();

// JavaScript's \s beyond ASCII (WhiteSpace and LineTerminator): what the
// reference encoders split on. Not U+0085, which Unicode's White_Space has.
bool IsJsSpace(UChar32 cp) {
  return cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000 || cp == 0xFEFF;
}

CharClass IcuClass(UChar32 cp) {
  if (IsJsSpace(cp)) return kSpace;
  const uint32_t mask = U_MASK(u_charType(cp));
  if (mask & U_GC_L_MASK) return kLetter;
  if (mask & U_GC_N_MASK) return kNumber;
  return kOther;
}

// The class of every BMP code point (surrogates are never decoded).
const uint8_t* BmpClasses() {
  static const uint8_t* const table = [] {
    auto* t = new uint8_t[0x10000];
    for (UChar32 cp = 0; cp < 0x10000; ++cp) {
      t[cp] = cp < 0x80 ? kAscii[cp] : static_cast<uint8_t>(IcuClass(cp));
    }
    return t;
  }();
  return table;
}

// Reads the character at p (p < end, *p >= 0x80): its class and its
// length in bytes; a byte that does not start valid UTF-8 (overlong forms,
// surrogates and code points past U+10FFFF included) is kInvalid of
// length 1.
CharClass NonAscii(const uint8_t* bmp, const unsigned char* p,
                   const unsigned char* end, int* len) {
  const unsigned char c = p[0];
  const size_t left = end - p;
  auto cont = [&](size_t k) { return k < left && (p[k] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF && cont(1)) {
    *len = 2;
    return static_cast<CharClass>(bmp[((c & 0x1F) << 6) | (p[1] & 0x3F)]);
  }
  if (c >= 0xE0 && c <= 0xEF && cont(1) && cont(2)) {
    const UChar32 cp =
        ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) {
      *len = 3;
      return static_cast<CharClass>(bmp[cp]);
    }
  } else if (c >= 0xF0 && c <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    const UChar32 cp = ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) |
                       ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    if (cp >= 0x10000 && cp <= 0x10FFFF) {
      *len = 4;
      return IcuClass(cp);
    }
  }
  *len = 1;
  return kInvalid;
}

inline CharClass ClassAt(const uint8_t* bmp, const unsigned char* p,
                         const unsigned char* end, int* len) {
  if (*p < 0x80) {
    *len = 1;
    return static_cast<CharClass>(kAscii[*p]);
  }
  return NonAscii(bmp, p, end, len);
}

// The end of the run of class `cls` that starts at p.
inline const unsigned char* RunEnd(const uint8_t* bmp, CharClass cls,
                                   const unsigned char* p,
                                   const unsigned char* end) {
  while (p < end) {
    if (*p < 0x80) {
      if (kAscii[*p] != cls) break;
      ++p;
      continue;
    }
    int len;
    if (NonAscii(bmp, p, end, &len) != cls) break;
    p += len;
  }
  return p;
}

// The end of the word that starts at p (p < end).
const unsigned char* WordEnd(const uint8_t* bmp, const unsigned char* p,
                             const unsigned char* end) {
  if (*p == '\'' && end - p >= 2) {
    const unsigned char a = p[1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
    if (end - p >= 3) {
      const unsigned char b = p[2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
          (a == 'l' && b == 'l')) {
        return p + 3;
      }
    }
  }
  int len;
  CharClass cls = ClassAt(bmp, p, end, &len);
  if (*p == ' ' && end - p >= 2) {  // " ?" before a letter, digit or other
    int next_len;
    const CharClass next = ClassAt(bmp, p + 1, end, &next_len);
    if (next != kSpace && next != kInvalid) {
      return RunEnd(bmp, next, p + 1 + next_len, end);
    }
  }
  if (cls == kSpace) {
    // \s+(?!\S): a run followed by something else leaves its last
    // character to the next word (" word"), unless it is one character.
    const unsigned char* last = p;
    const unsigned char* q = p + len;
    while (q < end) {
      int n;
      if (ClassAt(bmp, q, end, &n) != kSpace) break;
      last = q;
      q += n;
    }
    return q < end && last > p ? last : q;
  }
  if (cls == kInvalid) return p + 1;
  return RunEnd(bmp, cls, p + len, end);
}

// --- Merges ------------------------------------------------------------------

// Ids and ranks both fit 16 bits: a pair of ids is one 32-bit key, and a
// merge one 32-bit value, rank above the merged id, so that the smaller
// value is the merge of lower rank.
static_assert(Gpt2Bpe::kVocabSize <= 0x10000);
constexpr uint32_t kNoMerge = std::numeric_limits<uint32_t>::max();
inline uint32_t PairKey(int32_t left, int32_t right) {
  return static_cast<uint32_t>(left) << 16 | static_cast<uint32_t>(right);
}

// Debian's Abseil has its own string_view, the one its maps look up by.
inline absl::string_view Key(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

}  // namespace

struct Gpt2Bpe::Tables {
  std::array<int32_t, 256> byte_id;  // a byte's own token
  std::vector<std::string> bytes;    // id → its bytes
  // (left id, right id) → rank << 16 | merged id.
  absl::flat_hash_map<uint32_t, uint32_t> merges;
  // The tokens that a word of their bytes merges into (nearly all): the
  // bytes (views of `bytes`) → id.
  absl::flat_hash_map<absl::string_view, int32_t> whole;
  const uint8_t* bmp = BmpClasses();

  // Only while loading: a token's stand-ins → its id.
  absl::flat_hash_map<std::string, int32_t> ids;

  absl::Status ParseEncoder(std::string_view json, const std::string& name);
  absl::Status ParseMerges(std::string_view text, const std::string& name);
  void Finish();

  uint32_t Merge(int32_t left, int32_t right) const {
    const auto it = merges.find(PairKey(left, right));
    return it == merges.end() ? kNoMerge : it->second;
  }
  // `word`'s bytes merged by rank, appended to out: MergeShort for words
  // of at most kShortWord bytes, MergeLong (the same merges in
  // O(n log n), not O(n²)) beyond.
  static constexpr size_t kShortWord = 64;
  void MergeBytes(std::string_view word, std::vector<int32_t>* out) const {
    if (word.size() <= kShortWord) {
      MergeShort(word, out);
    } else {
      MergeLong(word, out);
    }
  }
  void MergeShort(std::string_view word, std::vector<int32_t>* out) const;
  void MergeLong(std::string_view word, std::vector<int32_t>* out) const;
};

absl::Status Gpt2Bpe::Tables::ParseEncoder(std::string_view json,
                                           const std::string& name) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_object() || j.size() != kVocabSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not GPT-2's vocabulary (want a JSON object of ",
                     kVocabSize, " tokens)"));
  }
  bytes.assign(kVocabSize, std::string());
  std::vector<bool> seen(kVocabSize, false);
  for (const auto& [token, id_json] : j.items()) {
    if (!id_json.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": the id of '", token, "' is not a number"));
    }
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= kVocabSize || seen[id]) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": id ", id, " of '", token, "' is out of range or twice"));
    }
    seen[id] = true;
    if (!ByteLevelBytes(token, &bytes[id])) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": token ", id,
          " is not spelled in byte-level characters (each stands for a "
          "byte)"));
    }
    ids.emplace(token, static_cast<int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    const std::string symbol = ByteLevelChar(static_cast<unsigned char>(b));
    const auto it = ids.find(symbol);
    if (it == ids.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": byte ", b, " has no token of its own"));
    }
    byte_id[b] = it->second;
  }
  return absl::OkStatus();
}

absl::Status Gpt2Bpe::Tables::ParseMerges(std::string_view text,
                                          const std::string& name) {
  int rank = 0;
  for (int n = 0; !text.empty(); ++n) {
    const size_t eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    if (n == 0 && line.substr(0, 8) == "#version") continue;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const auto merged =
        space == std::string_view::npos
            ? ids.end()
            : ids.find(absl::StrCat(Key(line.substr(0, space)),
                                    Key(line.substr(space + 1))));
    if (space == std::string_view::npos || space == 0 ||
        space + 1 >= line.size() ||
        line.find(' ', space + 1) != std::string_view::npos ||
        merged == ids.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ":", n + 1, ": not a merge of two tokens into one"));
    }
    // A pair whose halves are not both tokens can never be merged: the
    // parts of a word always are tokens.
    const auto left = ids.find(Key(line.substr(0, space)));
    const auto right = ids.find(Key(line.substr(space + 1)));
    if (left != ids.end() && right != ids.end()) {
      // The first of a pair listed twice is the one of lower rank.
      merges.emplace(PairKey(left->second, right->second),
                     static_cast<uint32_t>(rank) << 16 |
                         static_cast<uint32_t>(merged->second));
    }
    ++rank;
  }
  if (rank != kVocabSize - 257) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", rank, " merges, GPT-2 has ", kVocabSize - 257));
  }
  return absl::OkStatus();
}

void Gpt2Bpe::Tables::Finish() {
  ids = {};
  std::vector<int32_t> got;
  for (int32_t id = 0; id < kVocabSize; ++id) {
    got.clear();
    MergeBytes(bytes[id], &got);
    if (got.size() == 1 && got[0] == id) whole.emplace(Key(bytes[id]), id);
  }
}

void Gpt2Bpe::Tables::MergeShort(std::string_view word,
                                 std::vector<int32_t>* out) const {
  // parts[i] is an id; pair[i] the merge of parts i and i+1.
  int32_t parts[kShortWord];
  uint32_t pair[kShortWord];
  size_t n = word.size();
  for (size_t i = 0; i < n; ++i) {
    parts[i] = byte_id[static_cast<unsigned char>(word[i])];
  }
  for (size_t i = 0; i + 1 < n; ++i) pair[i] = Merge(parts[i], parts[i + 1]);
  // Merge the pair of lowest rank everywhere it occurs (left to right,
  // without overlap), until no adjacent pair has a rank. Parts move left in
  // place; only the pairs beside a merged part are looked up again.
  while (n > 1) {
    const uint32_t best = *std::min_element(pair, pair + n - 1);
    if (best == kNoMerge) break;
    const int32_t merged = static_cast<int32_t>(best & 0xFFFF);
    size_t w = 0;
    bool last_merged = false;  // whether parts[w - 1] was just made
    for (size_t i = 0; i < n; ++w) {
      if (i + 1 < n && pair[i] == best) {
        parts[w] = merged;
        if (w > 0) pair[w - 1] = Merge(parts[w - 1], merged);
        last_merged = true;
        i += 2;
      } else {
        parts[w] = parts[i];
        if (w > 0) {
          pair[w - 1] =
              last_merged ? Merge(parts[w - 1], parts[w]) : pair[i - 1];
        }
        last_merged = false;
        i += 1;
      }
    }
    n = w;
  }
  out->insert(out->end(), parts, parts + n);
}

void Gpt2Bpe::Tables::MergeLong(std::string_view word,
                                std::vector<int32_t>* out) const {
  // The parts as a list (a merged part keeps the index of its left half;
  // the right half's id becomes -1), and a heap of (merge, index) for each
  // adjacent pair that has a merge. An entry goes stale when a merge
  // beside it changes its pair: it is checked when it comes up.
  const int32_t n = static_cast<int32_t>(word.size());
  std::vector<int32_t> id(n), prev(n), next(n);
  std::vector<uint64_t> heap;
  heap.reserve(n);
  const auto push = [&](int32_t i) {
    const uint32_t m = Merge(id[i], id[next[i]]);
    if (m == kNoMerge) return;
    heap.push_back(uint64_t{m} << 32 | static_cast<uint32_t>(i));
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i < n; ++i) {
    id[i] = byte_id[static_cast<unsigned char>(word[i])];
    prev[i] = i - 1;
    next[i] = i + 1;  // n: none
  }
  for (int32_t i = 0; i + 1 < n; ++i) {
    const uint32_t m = Merge(id[i], id[i + 1]);
    if (m != kNoMerge) heap.push_back(uint64_t{m} << 32 | i);
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  // One round: every occurrence of the pair of lowest rank, left to right
  // (the heap gives them in index order), merged where still there.
  std::vector<int32_t> at;
  while (!heap.empty()) {
    const uint32_t best = static_cast<uint32_t>(heap.front() >> 32);
    at.clear();
    while (!heap.empty() && heap.front() >> 32 == best) {
      at.push_back(static_cast<int32_t>(heap.front() & 0xFFFFFFFF));
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      heap.pop_back();
    }
    for (const int32_t i : at) {
      if (id[i] < 0 || next[i] == n || Merge(id[i], id[next[i]]) != best) {
        continue;
      }
      const int32_t right = next[i];
      id[i] = static_cast<int32_t>(best & 0xFFFF);
      id[right] = -1;
      next[i] = next[right];
      if (next[i] < n) prev[next[i]] = i;
      // The pairs beside the merged part are new; they come up in a later
      // round (none of them is `best` again).
      if (prev[i] >= 0) push(prev[i]);
      if (next[i] < n) push(i);
    }
  }
  for (int32_t i = 0; i < n; i = next[i]) out->push_back(id[i]);
}

Gpt2Bpe::Gpt2Bpe(std::unique_ptr<const Tables> tables)
    : t_(std::move(tables)) {}
Gpt2Bpe::Gpt2Bpe(Gpt2Bpe&&) noexcept = default;
Gpt2Bpe& Gpt2Bpe::operator=(Gpt2Bpe&&) noexcept = default;
Gpt2Bpe::~Gpt2Bpe() = default;

Gpt2Bpe::Cache::Cache() = default;
Gpt2Bpe::Cache::Cache(Cache&&) noexcept = default;
Gpt2Bpe::Cache& Gpt2Bpe::Cache::operator=(Cache&&) noexcept = default;
Gpt2Bpe::Cache::~Cache() = default;

absl::StatusOr<Gpt2Bpe> Gpt2Bpe::Load(const std::string& dir) {
  auto t = std::make_unique<Tables>();
  const std::string enc_path = dir + "/encoder.json";
  absl::StatusOr<std::string> enc =
      ReadBoundedFile("GPT-2 vocabulary", enc_path, kMaxVocabFileBytes);
  if (!enc.ok()) return enc.status();
  if (absl::Status s = t->ParseEncoder(*enc, enc_path); !s.ok()) return s;
  const std::string bpe_path = dir + "/vocab.bpe";
  absl::StatusOr<std::string> bpe =
      ReadBoundedFile("GPT-2 merges", bpe_path, kMaxVocabFileBytes);
  if (!bpe.ok()) return bpe.status();
  if (absl::Status s = t->ParseMerges(*bpe, bpe_path); !s.ok()) return s;
  t->Finish();
  return Gpt2Bpe(std::move(t));
}

const Gpt2Bpe& Gpt2Bpe::Builtin() {
  static const Gpt2Bpe* const builtin = [] {
    auto t = std::make_unique<Tables>();
    absl::Status s = t->ParseEncoder(PT_INCBIN_VIEW(ptrain_gpt2_encoder_json),
                                     "built-in encoder.json");
    if (s.ok()) {
      s = t->ParseMerges(PT_INCBIN_VIEW(ptrain_gpt2_vocab_bpe),
                         "built-in vocab.bpe");
    }
    PT_CHECK(s.ok(), std::string(s.message()).c_str());
    t->Finish();
    return new Gpt2Bpe(std::move(t));
  }();
  return *builtin;
}

std::vector<std::string_view> Gpt2Bpe::Split(std::string_view text) const {
  std::vector<std::string_view> words;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char* const end = p + text.size();
  while (p < end) {
    const unsigned char* e = WordEnd(t_->bmp, p, end);
    words.emplace_back(reinterpret_cast<const char*>(p), e - p);
    p = e;
  }
  return words;
}

void Gpt2Bpe::EncodeWord(std::string_view word, Cache* cache,
                         std::vector<int32_t>* out) const {
  if (word.size() == 1) {
    out->push_back(t_->byte_id[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (const auto it = t_->whole.find(Key(word)); it != t_->whole.end()) {
    out->push_back(it->second);
    return;
  }
  if (cache == nullptr || word.size() > Cache::kMaxWordBytes) {
    t_->MergeBytes(word, out);
    return;
  }
  if (const auto it = cache->words_.find(Key(word));
      it != cache->words_.end()) {
    const int32_t* from = cache->ids_.data() + it->second.begin;
    out->insert(out->end(), from, from + it->second.size);
    return;
  }
  const size_t begin = out->size();
  t_->MergeBytes(word, out);
  if (cache->words_.size() >= Cache::kMaxWords) {
    cache->words_.clear();
    cache->ids_.clear();
  }
  cache->words_.emplace(
      std::string(word),
      Cache::Span{static_cast<uint32_t>(cache->ids_.size()),
                  static_cast<uint32_t>(out->size() - begin)});
  cache->ids_.insert(cache->ids_.end(), out->begin() + begin, out->end());
}

std::vector<int32_t> Gpt2Bpe::Encode(std::string_view text,
                                     Cache* cache) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4);
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char* const end = p + text.size();
  while (p < end) {
    const unsigned char* e = WordEnd(t_->bmp, p, end);
    EncodeWord(std::string_view(reinterpret_cast<const char*>(p), e - p), cache,
               &ids);
    p = e;
  }
  return ids;
}

absl::StatusOr<std::string> Gpt2Bpe::Decode(
    const std::vector<int32_t>& ids) const {
  size_t size = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= kVocabSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", i, " is ", ids[i],
                       ", outside GPT-2's vocabulary of ", kVocabSize));
    }
    size += t_->bytes[ids[i]].size();
  }
  std::string text;
  text.reserve(size);
  for (int32_t id : ids) text += t_->bytes[id];
  return text;
}

const std::string& Gpt2Bpe::TokenBytes(int32_t id) const {
  PT_CHECK(id >= 0 && id < kVocabSize, "GPT-2 id outside the vocabulary");
  return t_->bytes[id];
}

std::vector<std::pair<int32_t, int32_t>> Gpt2Bpe::Merges() const {
  // By value: rank above the merged id.
  std::vector<std::pair<uint32_t, uint32_t>> by_rank;
  by_rank.reserve(t_->merges.size());
  for (const auto& [pair, merge] : t_->merges) {
    by_rank.emplace_back(merge, pair);
  }
  std::sort(by_rank.begin(), by_rank.end());
  std::vector<std::pair<int32_t, int32_t>> out;
  out.reserve(by_rank.size());
  for (const auto& [merge, pair] : by_rank) {
    out.emplace_back(static_cast<int32_t>(pair >> 16),
                     static_cast<int32_t>(pair & 0xFFFF));
  }
  return out;
}

}  // namespace ptrain
