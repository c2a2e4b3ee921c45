#include "common/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/byte_level.h"
#include "common/check.h"
#include "nlohmann/json.hpp"

namespace ptrain {

namespace {

using json = nlohmann::json;

// Steps PCRE2 may take for one match (its default is 10 million): a word
// of a real pattern takes tens.
constexpr uint32_t kMatchLimit = 1 << 20;
// What a stretch of text followed by a byte that is not UTF-8 is matched
// with, then cut back: U+FFFD, neither space, letter nor digit.
constexpr std::string_view kStandIn = "\xEF\xBF\xBD";

// Debian's Abseil has its own string_view, the one its maps look up by.
inline absl::string_view Key(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

// The documents' separator, by content, in the order looked for.
constexpr std::string_view kEndOfTextContents[] = {
    "<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>"};

// (left id, right id) → rank << 32 | merged id; the smaller value is the
// merge of lower rank.
constexpr uint64_t kNoMerge = std::numeric_limits<uint64_t>::max();
inline uint64_t PairKey(int32_t left, int32_t right) {
  return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 |
         static_cast<uint32_t>(right);
}

// The length of the well-formed UTF-8 character at s[i], 0 when s[i] does
// not start one (overlong forms, surrogates and code points past U+10FFFF
// are not, as PCRE2 has it).
size_t Utf8CharLength(std::string_view s, size_t i) {
  const auto at = [&](size_t k) -> unsigned {
    return static_cast<unsigned char>(s[k]);
  };
  const unsigned c = at(i);
  if (c < 0x80) return 1;
  const size_t left = s.size() - i;
  const auto cont = [&](size_t k, unsigned lo, unsigned hi) {
    return k < left && at(i + k) >= lo && at(i + k) <= hi;
  };
  if (c >= 0xC2 && c <= 0xDF) return cont(1, 0x80, 0xBF) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80;
    const unsigned hi = c == 0xED ? 0x9F : 0xBF;
    return cont(1, lo, hi) && cont(2, 0x80, 0xBF) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2, 0x80, 0xBF) && cont(3, 0x80, 0xBF) ? 4
                                                                         : 0;
  }
  return 0;
}

// The end of the well-formed UTF-8 that starts at `from`.
size_t WellFormedEnd(std::string_view s, size_t from) {
  size_t i = from;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = Utf8CharLength(s, i);
    if (n == 0) break;
    i += n;
  }
  return i;
}

// `text` with each stretch of well-formed UTF-8 in Unicode's NFC; a byte
// that is not UTF-8 stays as it is and splits the stretches.
std::string Nfc(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  PT_CHECK(U_SUCCESS(status), "ICU's NFC data did not load");
  std::string out;
  out.reserve(text.size());
  icu::StringByteSink<std::string> sink(&out);
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = WellFormedEnd(text, at);
    if (end == at) {
      out.push_back(text[at++]);
      continue;
    }
    const icu::StringPiece stretch(text.data() + at,
                                   static_cast<int32_t>(end - at));
    status = U_ZERO_ERROR;
    if (nfc->isNormalizedUTF8(stretch, status) && U_SUCCESS(status)) {
      out.append(text.substr(at, end - at));
    } else {
      status = U_ZERO_ERROR;
      nfc->normalizeUTF8(0, stretch, sink, nullptr, status);
      PT_CHECK(U_SUCCESS(status), "ICU's NFC failed on well-formed UTF-8");
    }
    at = end;
  }
  return out;
}

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* m) const { pcre2_match_context_free(m); }
};

// A field's value as the errors show it: JSON, cut short.
std::string Shown(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// GPT-2's pattern, which ByteLevel's use_regex stands for.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

struct HfTokenizer::Tables {
  std::string path;                // in errors
  std::vector<std::string> bytes;  // id → its bytes, an added token's content
  std::array<int32_t, 256> byte_id{};  // a byte's own token
  absl::flat_hash_map<uint64_t, uint64_t> merges;
  // Words that are one token, by their bytes: with ignore_merges every
  // token of the vocabulary; else the tokens a word of their bytes merges
  // into (nearly all).
  absl::flat_hash_map<std::string, int32_t> whole;
  // The pre-tokenizer's patterns, applied one after the other.
  std::vector<std::unique_ptr<pcre2_code, CodeDeleter>> patterns;
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> match_context;
  uint32_t max_captures = 0;
  // normalizer NFC (alone or in a Sequence): the text between added
  // tokens is put in NFC before it is split.
  bool nfc = false;
  // Added tokens, longest first; whether a byte starts one.
  std::vector<std::pair<std::string, int32_t>> added;
  std::array<bool, 256> starts_added{};
  int32_t end_of_text = -1;

  absl::Status Load(const json& j);
  absl::Status LoadModel(const json& model, size_t added_count,
                         absl::flat_hash_map<std::string, int32_t>* vocab);
  absl::Status LoadMerges(const json& merges,
                          const absl::flat_hash_map<std::string, int32_t>& v);
  absl::Status LoadAdded(const json& added);
  absl::Status LoadPreTokenizer(const json& pre);
  absl::Status LoadNormalizer(const json& normalizer);
  absl::Status LoadStep(const json& step, const std::string& field);
  absl::Status Compile(const std::string& pattern, bool literal,
                       const std::string& field);

  template <typename... Parts>
  absl::Status Bad(const Parts&... parts) const {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", parts...));
  }

  uint64_t Merge(int32_t left, int32_t right) const {
    const auto it = merges.find(PairKey(left, right));
    return it == merges.end() ? kNoMerge : it->second;
  }
  void MergeBytes(std::string_view word, std::vector<int32_t>* out) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  // Calls plain(part) for the text between added tokens (normalized) and
  // added(content, id) for each added token, in order.
  template <typename Plain, typename Added>
  void ForEachPart(std::string_view text, Plain&& plain, Added&& added) const;
  // Calls emit(word, id) for each word of `text` in order: id is an added
  // token's, else -1.
  template <typename Emit>
  void ForEachWord(std::string_view text, Emit&& emit) const;
  // The words of `text` (no added tokens in it) under patterns[k..].
  template <typename Emit>
  void PreTokenize(std::string_view text, size_t k, pcre2_match_data* md,
                   Emit&& emit) const;
};

absl::Status HfTokenizer::Tables::Compile(const std::string& pattern,
                                          bool literal,
                                          const std::string& field) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2_LITERAL takes no other options of these.
  const uint32_t options =
      literal ? PCRE2_UTF | PCRE2_LITERAL
              : PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C;
  std::unique_ptr<pcre2_code, CodeDeleter> code(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()),
                    pattern.size(), options, &error, &offset, nullptr));
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Bad(field, ": the pattern ", Shown(json(pattern)),
               " does not compile (at offset ", offset, ": ",
               reinterpret_cast<const char*>(message), ")");
  }
  // Without JIT (a machine that lacks it) the interpreter runs it.
  pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);
  uint32_t captures = 0;
  pcre2_pattern_info(code.get(), PCRE2_INFO_CAPTURECOUNT, &captures);
  max_captures = std::max(max_captures, captures);
  patterns.push_back(std::move(code));
  return absl::OkStatus();
}

absl::Status HfTokenizer::Tables::LoadStep(const json& step,
                                           const std::string& field) {
  const auto type = step.find("type");
  if (!step.is_object() || type == step.end() || !type->is_string()) {
    return Bad(field, ": not an object with a type");
  }
  const std::string& t = type->get_ref<const std::string&>();
  const auto flag = [&](const char* name, bool absent) -> std::optional<bool> {
    const auto it = step.find(name);
    if (it == step.end() || it->is_null()) return absent;
    if (!it->is_boolean()) return std::nullopt;
    return it->get<bool>();
  };
  if (t == "ByteLevel") {
    // A ByteLevel step maps bytes to their stand-ins, which the vocabulary
    // is spelled in and which Encode does by reading bytes; with use_regex
    // (its default) it splits by GPT-2's pattern first.
    const auto prefix = step.find("add_prefix_space");
    if (prefix == step.end() || !prefix->is_boolean() || prefix->get<bool>()) {
      return Bad(field,
                 ".add_prefix_space: must be false (a space put in front of "
                 "text is not implemented)");
    }
    const std::optional<bool> use_regex = flag("use_regex", true);
    if (!use_regex) return Bad(field, ".use_regex: not true or false");
    if (*use_regex) return Compile(kGpt2Pattern, false, field);
    return absl::OkStatus();
  }
  if (t == "Split") {
    const auto pattern = step.find("pattern");
    const bool has_regex = pattern != step.end() && pattern->is_object() &&
                           pattern->size() == 1 && pattern->contains("Regex") &&
                           (*pattern)["Regex"].is_string();
    const bool has_string =
        pattern != step.end() && pattern->is_object() && pattern->size() == 1 &&
        pattern->contains("String") && (*pattern)["String"].is_string();
    if (!has_regex && !has_string) {
      return Bad(field,
                 ".pattern: not {\"Regex\": PATTERN} or {\"String\": TEXT}");
    }
    const auto behavior = step.find("behavior");
    if (behavior == step.end() || *behavior != "Isolated") {
      return Bad(field, ".behavior: ",
                 behavior == step.end() ? "missing" : Shown(*behavior),
                 " is not implemented (only Isolated)");
    }
    const std::optional<bool> invert = flag("invert", false);
    if (!invert || *invert) {
      return Bad(field,
                 ".invert: must be false (inverted splits are not "
                 "implemented)");
    }
    const std::string& p =
        has_regex ? (*pattern)["Regex"].get_ref<const std::string&>()
                  : (*pattern)["String"].get_ref<const std::string&>();
    if (p.empty()) return Bad(field, ".pattern: empty");
    return Compile(p, has_string, field + ".pattern");
  }
  return Bad(field, ": type ", Shown(*type),
             " is not implemented (Split, ByteLevel, Sequence are)");
}

absl::Status HfTokenizer::Tables::LoadPreTokenizer(const json& pre) {
  if (!pre.is_object()) {
    return Bad("pre_tokenizer: ", Shown(pre),
               " is not implemented (byte-level BPE needs ByteLevel)");
  }
  std::vector<std::pair<const json*, std::string>> steps;
  const auto type = pre.find("type");
  if (type != pre.end() && *type == "Sequence") {
    const auto list = pre.find("pretokenizers");
    if (list == pre.end() || !list->is_array()) {
      return Bad("pre_tokenizer.pretokenizers: not a list");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      steps.emplace_back(&(*list)[i],
                         absl::StrCat("pre_tokenizer.pretokenizers[", i, "]"));
    }
  } else {
    steps.emplace_back(&pre, "pre_tokenizer");
  }
  bool byte_level = false;
  for (const auto& [step, field] : steps) {
    if (absl::Status s = LoadStep(*step, field); !s.ok()) return s;
    byte_level = byte_level || (*step)["type"] == "ByteLevel";
  }
  if (!byte_level) {
    return Bad(
        "pre_tokenizer: has no ByteLevel step (only byte-level BPE "
        "is implemented)");
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::Tables::LoadAdded(const json& added_json) {
  if (added_json.is_null()) return absl::OkStatus();
  if (!added_json.is_array()) return Bad("added_tokens: not a list");
  absl::flat_hash_map<std::string, int32_t> seen;
  for (size_t i = 0; i < added_json.size(); ++i) {
    const json& a = added_json[i];
    const std::string field = absl::StrCat("added_tokens[", i, "]");
    if (!a.is_object()) return Bad(field, ": not an object");
    const auto content = a.find("content");
    if (content == a.end() || !content->is_string() ||
        content->get_ref<const std::string&>().empty()) {
      return Bad(field, ".content: not a string of at least one byte");
    }
    const std::string& text = content->get_ref<const std::string&>();
    for (const char* name : {"lstrip", "rstrip", "single_word"}) {
      const auto it = a.find(name);
      if (it != a.end() && !it->is_null() && *it != false) {
        return Bad(field, " ", Shown(*content), ": ", name,
                   " is not implemented (must be false)");
      }
    }
    const auto special = a.find("special");
    if (special != a.end() && !special->is_boolean()) {
      return Bad(field, ".special: not true or false");
    }
    // Ids were checked with the vocabulary's (LoadModel).
    const int32_t id = (*a.find("id")).get<int32_t>();
    if (!seen.emplace(text, id).second) {
      return Bad(field, ": ", Shown(*content), " is an added token twice");
    }
    added.emplace_back(text, id);
    starts_added[static_cast<unsigned char>(text[0])] = true;
  }
  // The end of text: the first of kEndOfTextContents the file has as a
  // special token.
  for (const std::string_view eot : kEndOfTextContents) {
    for (size_t i = 0; i < added_json.size() && end_of_text < 0; ++i) {
      const json& a = added_json[i];
      const auto special = a.find("special");
      if (special != a.end() && special->get<bool>() &&
          a["content"].get_ref<const std::string&>() == eot) {
        end_of_text = a["id"].get<int32_t>();
      }
    }
  }
  std::stable_sort(added.begin(), added.end(),
                   [](const auto& a, const auto& b) {
                     return a.first.size() > b.first.size();
                   });
  return absl::OkStatus();
}

absl::Status HfTokenizer::Tables::LoadModel(
    const json& model, size_t added_count,
    absl::flat_hash_map<std::string, int32_t>* vocab) {
  if (!model.is_object()) return Bad("model: not an object");
  const auto type = model.find("type");
  if (type == model.end()) {
    return Bad("model.type: missing (only BPE is implemented)");
  }
  if (*type != "BPE") {
    return Bad("model.type: ", Shown(*type),
               " is not implemented (only BPE is)");
  }
  const auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0)) {
    return Bad("model.dropout: ", Shown(*dropout),
               " is not implemented (must be null)");
  }
  for (const char* name : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = model.find(name);
    if (it != model.end() && !it->is_null() && *it != "") {
      return Bad("model.", name, ": ", Shown(*it),
                 " is not implemented (must be null)");
    }
  }
  const auto fallback = model.find("byte_fallback");
  if (fallback != model.end() && !fallback->is_null() && *fallback != false) {
    return Bad(
        "model.byte_fallback: must be false (byte-level BPE has "
        "every byte)");
  }
  const auto ignore = model.find("ignore_merges");
  if (ignore != model.end() && !ignore->is_null() && !ignore->is_boolean()) {
    return Bad("model.ignore_merges: not true or false");
  }
  const auto v = model.find("vocab");
  if (v == model.end() || !v->is_object()) {
    return Bad("model.vocab: not an object of tokens and ids");
  }
  // Ids number the tokens without gaps: each below the count of tokens.
  const size_t limit = v->size() + added_count;
  bytes.assign(limit, std::string());
  std::vector<bool> taken(limit, false);
  for (const auto& [token, id_json] : v->items()) {
    const std::string shown = Shown(json(token));
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() >= static_cast<int64_t>(limit) ||
        (id_json.is_number_unsigned() && id_json.get<uint64_t>() >= limit)) {
      return Bad("model.vocab: the id of ", shown, " is ", Shown(id_json),
                 ", not in [0, ", limit, ") (ids number the tokens)");
    }
    const int32_t id = id_json.get<int32_t>();
    if (taken[id]) {
      return Bad("model.vocab: id ", id, " is given to ", shown,
                 " and to another token");
    }
    taken[id] = true;
    if (token.empty() || !ByteLevelBytes(token, &bytes[id])) {
      return Bad("model.vocab: token ", id, " ", shown,
                 " is not spelled in byte-level characters (each stands for "
                 "a byte)");
    }
    vocab->emplace(token, id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab->find(ByteLevelChar(static_cast<unsigned char>(b)));
    if (it == vocab->end()) {
      return Bad("model.vocab: byte ", b, " (",
                 Shown(json(ByteLevelChar(static_cast<unsigned char>(b)))),
                 ") has no token (byte-level BPE needs all 256)");
    }
    byte_id[b] = it->second;
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::Tables::LoadMerges(
    const json& merges_json,
    const absl::flat_hash_map<std::string, int32_t>& vocab) {
  if (!merges_json.is_array()) return Bad("model.merges: not a list");
  if (merges_json.size() >= (uint64_t{1} << 32)) {
    return Bad("model.merges: too many");
  }
  for (size_t rank = 0; rank < merges_json.size(); ++rank) {
    const json& m = merges_json[rank];
    std::string left, right;
    if (m.is_string()) {  // "a b"
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos ||
          s.find(' ', space + 1) != std::string::npos) {
        return Bad("model.merges[", rank, "] ", Shown(m),
                   ": not two tokens apart by one space");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() &&
               m[1].is_string()) {  // ["a", "b"]
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return Bad("model.merges[", rank, "] ", Shown(m),
                 ": not \"a b\" or [\"a\", \"b\"]");
    }
    const auto l = vocab.find(left);
    const auto r = vocab.find(right);
    const auto merged = vocab.find(left + right);
    for (const auto& [it, text] : {std::pair{l, &left}, std::pair{r, &right}}) {
      if (it == vocab.end()) {
        return Bad("model.merges[", rank, "] ", Shown(m), ": ",
                   Shown(json(*text)), " is not in model.vocab");
      }
    }
    if (merged == vocab.end()) {
      return Bad("model.merges[", rank, "] ", Shown(m), ": the merged token ",
                 Shown(json(left + right)), " is not in model.vocab");
    }
    // The first of a pair listed twice is the one of lower rank.
    merges.emplace(PairKey(l->second, r->second),
                   static_cast<uint64_t>(rank) << 32 |
                       static_cast<uint32_t>(merged->second));
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::Tables::LoadNormalizer(const json& normalizer) {
  if (normalizer.is_null()) return absl::OkStatus();
  // NFC, or a Sequence of nothing but NFC (NFC twice is NFC once).
  const auto refuse = [&](const json& step, const std::string& field) {
    const auto type = step.is_object() ? step.find("type") : step.end();
    return Bad(
        field, ": ",
        type == step.end() ? Shown(step) : absl::StrCat("type ", Shown(*type)),
        " is not implemented (NFC is, alone or in a Sequence)");
  };
  const auto is = [](const json& step, const char* type) {
    return step.is_object() && step.contains("type") && step["type"] == type;
  };
  if (is(normalizer, "NFC")) {
    nfc = true;
    return absl::OkStatus();
  }
  if (!is(normalizer, "Sequence")) return refuse(normalizer, "normalizer");
  const auto steps = normalizer.find("normalizers");
  if (steps == normalizer.end() || !steps->is_array()) {
    return Bad("normalizer.normalizers: not a list");
  }
  for (size_t i = 0; i < steps->size(); ++i) {
    if (!is((*steps)[i], "NFC")) {
      return refuse((*steps)[i],
                    absl::StrCat("normalizer.normalizers[", i, "]"));
    }
    nfc = true;
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::Tables::Load(const json& j) {
  if (!j.is_object()) return Bad("not a JSON object (not a tokenizer.json)");
  const auto field = [&](const char* name) -> const json& {
    static const json kNull;
    const auto it = j.find(name);
    return it == j.end() ? kNull : *it;
  };
  if (absl::Status s = LoadNormalizer(field("normalizer")); !s.ok()) {
    return s;
  }
  const json& decoder = field("decoder");
  if (!decoder.is_object() || !decoder.contains("type") ||
      decoder["type"] != "ByteLevel") {
    const auto type =
        decoder.is_object() ? decoder.find("type") : decoder.end();
    return Bad("decoder: ",
               type == decoder.end() ? Shown(decoder)
                                     : absl::StrCat("type ", Shown(*type)),
               " is not implemented (only ByteLevel is)");
  }

  // Added tokens' ids first: the vocabulary's bound counts them.
  const json& added_json = field("added_tokens");
  if (!added_json.is_null() && !added_json.is_array()) {
    return Bad("added_tokens: not a list");
  }
  const size_t added_count = added_json.is_array() ? added_json.size() : 0;
  absl::flat_hash_map<std::string, int32_t> vocab;
  if (absl::Status s = LoadModel(field("model"), added_count, &vocab);
      !s.ok()) {
    return s;
  }
  const size_t limit = bytes.size();
  std::vector<bool> taken(limit, false);
  for (const auto& [token, id] : vocab) taken[id] = true;
  for (size_t i = 0; i < added_count; ++i) {
    const json& a = added_json[i];
    const std::string field_name = absl::StrCat("added_tokens[", i, "]");
    const auto id = a.is_object() ? a.find("id") : a.end();
    const auto content = a.is_object() ? a.find("content") : a.end();
    if (id == a.end() || content == a.end() || !content->is_string() ||
        !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() >= static_cast<int64_t>(limit) ||
        (id->is_number_unsigned() && id->get<uint64_t>() >= limit)) {
      return Bad(field_name, ": not an object with an id in [0, ", limit,
                 ") (ids number the tokens) and a content");
    }
    const int32_t n = id->get<int32_t>();
    const std::string& text = content->get_ref<const std::string&>();
    if (taken[n] && bytes[n] != text) {
      return Bad(field_name, " ", Shown(*content), ": id ", n,
                 " is another token's");
    }
    taken[n] = true;
    bytes[n] = text;
  }
  // Ids number the tokens: the largest bounds them.
  size_t size = limit;
  while (size > 0 && !taken[size - 1]) --size;
  for (size_t id = 0; id < size; ++id) {
    if (!taken[id]) {
      return Bad("model.vocab: id ", id,
                 " has no token (ids number the "
                 "tokens from 0 without gaps)");
    }
  }
  bytes.resize(size);
  if (absl::Status s = LoadAdded(added_json); !s.ok()) return s;

  const json& model = field("model");
  const auto merges_json = model.find("merges");
  if (merges_json == model.end()) return Bad("model.merges: missing");
  if (absl::Status s = LoadMerges(*merges_json, vocab); !s.ok()) return s;

  if (absl::Status s = LoadPreTokenizer(field("pre_tokenizer")); !s.ok()) {
    return s;
  }
  match_context.reset(pcre2_match_context_create(nullptr));
  if (match_context == nullptr) return Bad("out of memory");
  pcre2_set_match_limit(match_context.get(), kMatchLimit);

  const auto ignore = model.find("ignore_merges");
  const bool ignore_merges = ignore != model.end() && *ignore == true;
  std::vector<int32_t> got;
  for (const auto& [token, id] : vocab) {
    const std::string& b = bytes[id];
    if (!ignore_merges) {
      got.clear();
      MergeBytes(b, &got);
      if (got.size() != 1 || got[0] != id) continue;
    }
    whole.emplace(b, id);
  }
  return absl::OkStatus();
}

void HfTokenizer::Tables::MergeBytes(std::string_view word,
                                     std::vector<int32_t>* out) const {
  // The parts as a list (a merged part keeps the index of its left half,
  // the right half's id becomes -1) and a heap of (rank, index) for each
  // adjacent pair that has a merge. The pair of lowest rank merges first,
  // and of equal ranks the leftmost; an entry goes stale when a merge
  // beside it changes its pair, which is checked when it comes up.
  const uint32_t n = static_cast<uint32_t>(word.size());
  std::vector<int32_t> id(n);
  std::vector<uint32_t> prev(n), next(n);
  std::vector<uint64_t> heap;
  const auto push = [&](uint32_t i) {
    const uint64_t m = Merge(id[i], id[next[i]]);
    if (m == kNoMerge) return;
    heap.push_back((m >> 32) << 32 | i);
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (uint32_t i = 0; i < n; ++i) {
    id[i] = byte_id[static_cast<unsigned char>(word[i])];
    prev[i] = i - 1;  // wraps for the first: checked against n
    next[i] = i + 1;  // n: none
  }
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const uint64_t top = heap.front();
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    heap.pop_back();
    const uint32_t i = static_cast<uint32_t>(top & 0xFFFFFFFF);
    if (id[i] < 0 || next[i] >= n) continue;
    const uint64_t m = Merge(id[i], id[next[i]]);
    if (m == kNoMerge || m >> 32 != top >> 32) continue;
    const uint32_t right = next[i];
    id[i] = static_cast<int32_t>(m & 0xFFFFFFFF);
    id[right] = -1;
    next[i] = next[right];
    if (next[i] < n) prev[next[i]] = i;
    if (prev[i] < n) push(prev[i]);
    if (next[i] < n) push(i);
  }
  for (uint32_t i = 0; i < n; i = next[i]) out->push_back(id[i]);
}

void HfTokenizer::Tables::EncodeWord(std::string_view word,
                                     std::vector<int32_t>* out) const {
  if (word.size() == 1) {
    out->push_back(byte_id[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (const auto it = whole.find(Key(word)); it != whole.end()) {
    out->push_back(it->second);
    return;
  }
  MergeBytes(word, out);
}

template <typename Emit>
void HfTokenizer::Tables::PreTokenize(std::string_view text, size_t k,
                                      pcre2_match_data* md, Emit&& emit) const {
  if (text.empty()) return;
  if (k == patterns.size()) {
    emit(text);
    return;
  }
  const pcre2_code* code = patterns[k].get();
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = WellFormedEnd(text, at);
    if (end == at) {  // a byte that is not UTF-8: a word alone
      emit(text.substr(at, 1));
      ++at;
      continue;
    }
    // The stretch [at, end) is matched alone; followed by a byte that is
    // not UTF-8, with kStandIn after it for what follows to look at.
    std::string_view subject = text.substr(at, end - at);
    const size_t stretch = subject.size();
    std::string copy;
    if (end < text.size()) {
      copy = absl::StrCat(Key(subject), Key(kStandIn));
      subject = copy;
    }
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    // Words are the matches and the text between them.
    size_t word = 0, from = 0;
    while (from < stretch) {
      const int rc = pcre2_match(code, s, subject.size(), from,
                                 PCRE2_NO_UTF_CHECK, md, match_context.get());
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) break;  // past the limits: the rest is one word
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t m_begin = ov[0];
      const size_t m_end = std::min<size_t>(ov[1], stretch);
      if (m_begin >= stretch) break;
      if (m_end == m_begin) {  // empty: try from the next character
        from = m_begin + Utf8CharLength(subject, m_begin);
        continue;
      }
      if (m_begin > word) {
        PreTokenize(text.substr(at + word, m_begin - word), k + 1, md, emit);
      }
      PreTokenize(text.substr(at + m_begin, m_end - m_begin), k + 1, md, emit);
      word = from = m_end;
    }
    if (word < stretch) {
      PreTokenize(text.substr(at + word, stretch - word), k + 1, md, emit);
    }
    at = end;
  }
}

template <typename Plain, typename Added>
void HfTokenizer::Tables::ForEachPart(std::string_view text, Plain&& plain,
                                      Added&& added_token) const {
  // Added tokens are found in the text as given; the normalizer sees only
  // the text between them.
  const auto between = [&](std::string_view part) {
    if (part.empty()) return;
    if (!nfc) {
      plain(part);
      return;
    }
    const std::string normalized = Nfc(part);
    plain(std::string_view(normalized));
  };
  size_t from = 0;  // where the text since the last added token starts
  for (size_t i = 0; i < text.size();) {
    if (!starts_added[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const std::pair<std::string, int32_t>* found = nullptr;
    for (const auto& a : added) {
      if (text.compare(i, a.first.size(), a.first) == 0) {
        found = &a;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    between(text.substr(from, i - from));
    added_token(text.substr(i, found->first.size()), found->second);
    i += found->first.size();
    from = i;
  }
  between(text.substr(from));
}

template <typename Emit>
void HfTokenizer::Tables::ForEachWord(std::string_view text,
                                      Emit&& emit) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
      pcre2_match_data_create(max_captures + 1, nullptr));
  PT_CHECK(md != nullptr, "out of memory for PCRE2's match data");
  ForEachPart(
      text,
      [&](std::string_view part) {
        PreTokenize(part, 0, md.get(),
                    [&](std::string_view w) { emit(w, -1); });
      },
      [&](std::string_view content, int32_t id) { emit(content, id); });
}

HfTokenizer::HfTokenizer(std::unique_ptr<const Tables> tables)
    : t_(std::move(tables)) {}
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Parse(
    std::string_view text, absl::string_view path) {
  auto t = std::make_unique<Tables>();
  t->path = std::string(path);
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return t->Bad("not JSON (not a tokenizer.json)");
  if (absl::Status s = t->Load(j); !s.ok()) return s;
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(t)));
}

int HfTokenizer::size() const { return static_cast<int>(t_->bytes.size()); }

int32_t HfTokenizer::end_of_text() const { return t_->end_of_text; }

std::vector<int32_t> HfTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4);
  t_->ForEachWord(text, [&](std::string_view word, int32_t added) {
    if (added >= 0) {
      ids.push_back(added);
    } else {
      t_->EncodeWord(word, &ids);
    }
  });
  return ids;
}

std::vector<std::string> HfTokenizer::Split(std::string_view text) const {
  std::vector<std::string> words;
  t_->ForEachWord(
      text, [&](std::string_view word, int32_t) { words.emplace_back(word); });
  return words;
}

std::string HfTokenizer::Normalize(std::string_view text) const {
  if (!t_->nfc) return std::string(text);
  std::string out;
  const auto append = [&](std::string_view part) { out.append(part); };
  t_->ForEachPart(text, append,
                  [&](std::string_view content, int32_t) { append(content); });
  return out;
}

std::string HfTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id >= 0 && id < size()) text += t_->bytes[id];
  }
  return text;
}

std::string HfTokenizer::Piece(int32_t id) const {
  PT_CHECK(id >= 0 && id < size(), "token id outside the vocabulary");
  return t_->bytes[id];
}

}  // namespace ptrain
