#include "common/gpt2_bpe.h"

#include <re2/re2.h>

#include <array>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"
#include "nlohmann/json.hpp"

namespace ptrain {

namespace {

// GPT-2's printable stand-ins for bytes: the bytes that print as themselves
// ('!'..'~', '¡'..'¬', '®'..'ÿ') keep their code point, the others take
// 256, 257, ... in byte order. Returns the code point of each byte.
std::array<int, 256> ByteCodePoints() {
  std::array<int, 256> cp{};
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool prints = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                        (b >= 0xAE && b <= 0xFF);
    cp[b] = prints ? b : next++;
  }
  return cp;
}

std::string Utf8(int cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// The code points of a vocabulary entry (valid UTF-8 of at most three
// bytes a character, as the stand-ins are); false where it is not.
bool CodePoints(std::string_view s, std::vector<int>* out) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    int n = 0, cp = 0;
    if (c < 0x80) {
      n = 1, cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      n = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 3, cp = c & 0x0F;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (int k = 1; k < n; ++k) {
      const unsigned char d = s[i + k];
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    out->push_back(cp);
    i += n;
  }
  return true;
}

// The vocabulary's files are about 1 MB; well under this.
constexpr size_t kMaxVocabFileBytes = size_t{64} << 20;

// JavaScript's \s (the reference encoders' whitespace): RE2's \s is ASCII
// only.
constexpr char kSpace[] =
    R"(\t\n\x0B\f\r \x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029})"
    R"(\x{202f}\x{205f}\x{3000}\x{feff})";

}  // namespace

struct Gpt2Bpe::Tables {
  std::array<std::string, 256> byte_symbol;        // a byte's stand-in
  std::unordered_map<std::string, int32_t> ids;    // token (stand-ins) → id
  std::vector<std::string> bytes;                  // id → its bytes
  std::unordered_map<std::string, int32_t> ranks;  // "a b" → merge rank
  // GPT-2's pattern, whose last alternative (a whitespace run) RE2 cannot
  // stop one character short of a non-space as the reference's lookahead
  // does: Split does that (group 1 is the run).
  std::unique_ptr<RE2> pattern;
};

Gpt2Bpe::Gpt2Bpe(std::unique_ptr<Tables> tables) : t_(std::move(tables)) {}
Gpt2Bpe::Gpt2Bpe(Gpt2Bpe&&) noexcept = default;
Gpt2Bpe& Gpt2Bpe::operator=(Gpt2Bpe&&) noexcept = default;
Gpt2Bpe::~Gpt2Bpe() = default;

absl::StatusOr<Gpt2Bpe> Gpt2Bpe::Load(const std::string& dir) {
  auto t = std::make_unique<Tables>();
  const std::array<int, 256> cp = ByteCodePoints();
  std::unordered_map<int, int> byte_of;  // stand-in code point → byte
  for (int b = 0; b < 256; ++b) {
    t->byte_symbol[b] = Utf8(cp[b]);
    byte_of[cp[b]] = b;
  }

  const std::string enc_path = dir + "/encoder.json";
  absl::StatusOr<std::string> enc =
      ReadBoundedFile("GPT-2 vocabulary", enc_path, kMaxVocabFileBytes);
  if (!enc.ok()) return enc.status();
  const nlohmann::json j = nlohmann::json::parse(*enc, nullptr, false);
  if (!j.is_object() || j.size() != kVocabSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        enc_path, ": not GPT-2's vocabulary (want a JSON object of ",
        kVocabSize, " tokens)"));
  }
  t->bytes.assign(kVocabSize, std::string());
  std::vector<bool> seen(kVocabSize, false);
  for (const auto& [token, id_json] : j.items()) {
    if (!id_json.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(enc_path, ": the id of '", token, "' is not a number"));
    }
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= kVocabSize || seen[id]) {
      return absl::InvalidArgumentError(absl::StrCat(
          enc_path, ": id ", id, " of '", token, "' is out of range or twice"));
    }
    seen[id] = true;
    std::vector<int> points;
    if (!CodePoints(token, &points)) {
      return absl::InvalidArgumentError(
          absl::StrCat(enc_path, ": token ", id, " is not valid UTF-8"));
    }
    std::string& raw = t->bytes[id];
    for (int p : points) {
      const auto it = byte_of.find(p);
      if (it == byte_of.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(enc_path, ": token ", id,
                         " has a character that stands for no byte"));
      }
      raw += static_cast<char>(it->second);
    }
    t->ids.emplace(token, static_cast<int32_t>(id));
  }

  const std::string bpe_path = dir + "/vocab.bpe";
  absl::StatusOr<std::string> bpe =
      ReadBoundedFile("GPT-2 merges", bpe_path, kMaxVocabFileBytes);
  if (!bpe.ok()) return bpe.status();
  std::istringstream lines(*bpe);
  std::string line;
  int rank = 0;
  for (int n = 0; std::getline(lines, line); ++n) {
    if (n == 0 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 >= line.size() ||
        line.find(' ', space + 1) != std::string::npos ||
        t->ids.count(line.substr(0, space) + line.substr(space + 1)) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          bpe_path, ":", n + 1, ": not a merge of two tokens into one"));
    }
    t->ranks.emplace(line, rank++);
  }
  if (rank != kVocabSize - 257) {
    return absl::InvalidArgumentError(absl::StrCat(
        bpe_path, ": ", rank, " merges, GPT-2 has ", kVocabSize - 257));
  }

  RE2::Options options;
  options.set_log_errors(false);
  const std::string space = kSpace;
  t->pattern =
      std::make_unique<RE2>("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" +
                                space + "\\p{L}\\p{N}]+|([" + space + "]+)",
                            options);
  if (!t->pattern->ok()) {
    return absl::InternalError(t->pattern->error());
  }
  return Gpt2Bpe(std::move(t));
}

std::vector<std::string_view> Gpt2Bpe::Split(std::string_view text) const {
  std::vector<std::string_view> words;
  const re2::StringPiece all(text.data(), text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    re2::StringPiece m[2];
    size_t len = 0;
    if (t_->pattern->Match(all, pos, text.size(), RE2::ANCHOR_START, m, 2)) {
      len = m[0].size();
      // A whitespace run followed by something else leaves its last
      // character to start the next word (" word"), unless it is one.
      if (!m[1].empty() && pos + len < text.size()) {
        size_t last = len - 1;
        while (last > 0 &&
               (static_cast<unsigned char>(text[pos + last]) & 0xC0) == 0x80) {
          --last;
        }
        if (last > 0) len = last;
      }
    }
    if (len == 0) len = 1;  // a byte the pattern cannot take (bad UTF-8)
    words.push_back(text.substr(pos, len));
    pos += len;
  }
  return words;
}

void Gpt2Bpe::EncodeWord(std::string_view word,
                         std::vector<int32_t>* out) const {
  std::vector<std::string> parts;
  parts.reserve(word.size());
  for (unsigned char b : word) parts.push_back(t_->byte_symbol[b]);
  // Merge the pair of lowest rank everywhere it occurs (left to right,
  // without overlap), until no adjacent pair has a rank.
  while (parts.size() > 1) {
    int best = std::numeric_limits<int>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = t_->ranks.find(parts[i] + " " + parts[i + 1]);
      if (it != t_->ranks.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == std::numeric_limits<int>::max()) break;
    const std::string first = parts[at], second = parts[at + 1];
    std::vector<std::string> merged;
    merged.reserve(parts.size());
    for (size_t i = 0; i < parts.size();) {
      if (i + 1 < parts.size() && parts[i] == first && parts[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(std::move(parts[i]));
        i += 1;
      }
    }
    parts = std::move(merged);
  }
  for (const std::string& p : parts) out->push_back(t_->ids.at(p));
}

std::vector<int32_t> Gpt2Bpe::Encode(std::string_view text,
                                     Cache* cache) const {
  std::vector<int32_t> ids;
  for (std::string_view word : Split(text)) {
    if (cache == nullptr) {
      EncodeWord(word, &ids);
      continue;
    }
    auto it = cache->find(std::string(word));
    if (it == cache->end()) {
      std::vector<int32_t> w;
      EncodeWord(word, &w);
      it = cache->emplace(std::string(word), std::move(w)).first;
    }
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
  return ids;
}

absl::StatusOr<std::string> Gpt2Bpe::Decode(
    const std::vector<int32_t>& ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= kVocabSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", i, " is ", ids[i],
                       ", outside GPT-2's vocabulary of ", kVocabSize));
    }
    text += t_->bytes[ids[i]];
  }
  return text;
}

}  // namespace ptrain
