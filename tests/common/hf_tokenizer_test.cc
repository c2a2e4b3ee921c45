// Hugging Face tokenizer.json files (common/hf_tokenizer.h): GPT-2's
// vocabulary written as one encodes as the built-in Gpt2Bpe does; a small
// Llama-3-style file splits by Llama 3's pattern (digits in threes,
// contractions of any case, newline runs, a letter run taking the
// character before it), finds added tokens, takes its end of text from the
// file and honours ignore_merges; any bytes round-trip; each kind of bad
// file is refused naming the field. Runs in the source tree (reads
// data/tokenizers/gpt2 and tests/common/gpt2).
#include "common/hf_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/byte_level.h"
#include "common/gpt2_bpe.h"
#include "common/tokenizer.h"
#include "nlohmann/json.hpp"

namespace ptrain {
namespace {

using json = nlohmann::json;
using Words = std::vector<std::string>;
using Ids = std::vector<int32_t>;

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json SplitStep(const std::string& pattern) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", pattern}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

json ByteLevelStep(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}

json Added(int id, const std::string& content, bool special) {
  return {{"id", id},          {"content", content}, {"single_word", false},
          {"lstrip", false},   {"rstrip", false},    {"normalized", false},
          {"special", special}};
}

// GPT-2's vocabulary (data/tokenizers/gpt2) as a tokenizer.json: merges as
// "a b" or as pairs, its pattern as a Split before ByteLevel or as
// ByteLevel's own, <|endoftext|> added and special.
json Gpt2Json(bool pairs, bool split_step) {
  json merges = json::array();
  std::istringstream lines(Read("data/tokenizers/gpt2/vocab.bpe"));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t space = line.find(' ');
    if (pairs) {
      merges.push_back({line.substr(0, space), line.substr(space + 1)});
    } else {
      merges.push_back(line);
    }
  }
  json pre = split_step
                 ? json{{"type", "Sequence"},
                        {"pretokenizers",
                         {SplitStep(kGpt2Pattern), ByteLevelStep(false)}}}
                 : ByteLevelStep(true);
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", {Added(50256, "<|endoftext|>", true)}},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"post_processor", ByteLevelStep(false)},
          {"decoder", ByteLevelStep(true)},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", json::parse(Read("data/tokenizers/gpt2/encoder.json"))},
            {"merges", merges}}}};
}

// Ids of the synthetic Llama-3-style file.
constexpr int32_t kAb = 256, kAbc = 257, kSpaces = 258, kNewlines = 259,
                  kXyz = 260, kBegin = 261, kEnd = 262, kEndPrefix = 263;

// Every byte as its own token (id = byte), a few merges, "xyz" a token no
// merge makes, Llama 3's pattern, and added tokens above the vocabulary.
json Llama3Json(bool ignore_merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[ByteLevelChar(static_cast<unsigned char>(b))] = b;
  }
  vocab["ab"] = kAb;
  vocab["abc"] = kAbc;
  vocab["ĠĠ"] = kSpaces;
  vocab["ĊĊ"] = kNewlines;
  vocab["xyz"] = kXyz;
  return {
      {"version", "1.0"},
      {"added_tokens",
       {Added(kBegin, "<|begin_of_text|>", true),
        Added(kEnd, "<|end_of_text|>", true),
        Added(kEndPrefix, "<|end", false)}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", {SplitStep(kLlama3Pattern), ByteLevelStep(false)}}}},
      {"post_processor", nullptr},
      {"decoder", ByteLevelStep(true)},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", ignore_merges},
        {"vocab", vocab},
        {"merges", {"a b", {"ab", "c"}, "Ġ Ġ", "Ċ Ċ"}}}}};
}

std::unique_ptr<HfTokenizer> Load(const json& j) {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t =
      HfTokenizer::Parse(j.dump(), "test/tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// The message of loading `j`, which must fail.
std::string Refusal(const std::string& text) {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t =
      HfTokenizer::Parse(text, "bad/tokenizer.json");
  EXPECT_FALSE(t.ok());
  if (t.ok()) return "";
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message().rfind("bad/tokenizer.json: ", 0), 0u)
      << t.status();
  return std::string(t.status().message());
}

// Text that both sides take alike: the fixture less U+0085 (white space to
// PCRE2, not to JavaScript's \s), U+FEFF (the other way) and
// <|endoftext|> (text to Gpt2Bpe, the added token here).
std::string Gpt2Corpus() {
  std::string text = absl::StrReplaceAll(Read("tests/common/gpt2/fixture.txt"),
                                         {{"\xC2\x85", ""},
                                          {"\xEF\xBB\xBF", ""},
                                          {"<|endoftext|>", "<|endoftext|"}});
  text +=
      "I'm sure it's 12345678 o'clock; they'll say WE'RE late, she'd've "
      "known.\n\n\n  \t x  y\r\n\r\n  \n end 3.14159 1,000,000 ２０２４年 "
      "naïve café Ωmega ελληνικά русский 中文 日本語 한국어 العربية "
      "emoji 👍🏽🎉 tabs\t\t\tand   spaces    \n";
  return text;
}

TEST(HfTokenizer, Gpt2FileEncodesAsTheBuiltInGpt2Bpe) {
  const Gpt2Bpe& builtin = Gpt2Bpe::Builtin();
  const std::string corpus = Gpt2Corpus();
  ASSERT_GT(corpus.size(), 5000u);
  for (const bool pairs : {false, true}) {
    for (const bool split_step : {true, false}) {
      SCOPED_TRACE(absl::StrCat("pairs ", pairs, " split_step ", split_step));
      const std::unique_ptr<HfTokenizer> hf = Load(Gpt2Json(pairs, split_step));
      ASSERT_NE(hf, nullptr);
      EXPECT_EQ(hf->size(), Gpt2Bpe::kVocabSize);
      EXPECT_EQ(hf->end_of_text(), Gpt2Bpe::kEndOfText);
      const Ids got = hf->Encode(corpus);
      const Ids want = builtin.Encode(corpus);
      size_t i = 0;
      while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
      EXPECT_EQ(got.size(), want.size());
      if (i < want.size()) {
        ADD_FAILURE() << "first difference at id " << i << ": got "
                      << (i < got.size() ? got[i] : -1) << ", want " << want[i];
      }
      // Line by line too: each line's words split at its ends alike.
      std::istringstream lines(corpus);
      for (std::string line; std::getline(lines, line);) {
        ASSERT_EQ(hf->Encode(line), builtin.Encode(line)) << line;
      }
      EXPECT_EQ(hf->Decode(got), corpus);
    }
  }
}

TEST(HfTokenizer, Gpt2FileAgreesWithTheBuiltInOnInvalidUtf8) {
  const std::unique_ptr<HfTokenizer> hf = Load(Gpt2Json(false, true));
  ASSERT_NE(hf, nullptr);
  for (const std::string& text :
       {std::string("a \xff"), std::string("  \xfe\xff x"),
        std::string("it's\x80's \xc3 ok!!\xff!!"), std::string("\xed\xa0\x80x"),
        std::string("\xf4\x90\x80\x80  \n\xc0\xaf")}) {
    const std::vector<std::string_view> builtin =
        Gpt2Bpe::Builtin().Split(text);
    EXPECT_EQ(hf->Split(text), Words(builtin.begin(), builtin.end())) << text;
    EXPECT_EQ(hf->Encode(text), Gpt2Bpe::Builtin().Encode(text)) << text;
  }
}

TEST(HfTokenizer, EndOfTextInTextIsItsId) {
  const std::unique_ptr<HfTokenizer> hf = Load(Gpt2Json(false, true));
  ASSERT_NE(hf, nullptr);
  const Ids ids = hf->Encode("Hello world<|endoftext|>Hello");
  EXPECT_EQ(ids, (Ids{15496, 995, 50256, 15496}));
  EXPECT_EQ(hf->Decode(ids), "Hello world<|endoftext|>Hello");
  EXPECT_EQ(hf->Piece(50256), "<|endoftext|>");
  EXPECT_EQ(hf->Piece(15496), "Hello");
}

TEST(HfTokenizer, Llama3PatternSplitsDigitsInThrees) {
  const std::unique_ptr<HfTokenizer> llama = Load(Llama3Json(false));
  const std::unique_ptr<HfTokenizer> gpt2 = Load(Gpt2Json(false, true));
  ASSERT_NE(llama, nullptr);
  ASSERT_NE(gpt2, nullptr);
  EXPECT_EQ(llama->Split("12345678"), (Words{"123", "456", "78"}));
  EXPECT_EQ(gpt2->Split("12345678"), (Words{"12345678"}));
}

TEST(HfTokenizer, Llama3PatternTakesContractionsOfAnyCase) {
  const std::unique_ptr<HfTokenizer> llama = Load(Llama3Json(false));
  const std::unique_ptr<HfTokenizer> gpt2 = Load(Gpt2Json(false, true));
  ASSERT_NE(llama, nullptr);
  ASSERT_NE(gpt2, nullptr);
  EXPECT_EQ(llama->Split("IT'S WE'LL"), (Words{"IT", "'S", " WE", "'LL"}));
  EXPECT_EQ(gpt2->Split("IT'S"), (Words{"IT", "'", "S"}));
}

TEST(HfTokenizer, Llama3PatternKeepsNewlineRunsAndPunctuationBeforeLetters) {
  const std::unique_ptr<HfTokenizer> llama = Load(Llama3Json(false));
  const std::unique_ptr<HfTokenizer> gpt2 = Load(Gpt2Json(false, true));
  ASSERT_NE(llama, nullptr);
  ASSERT_NE(gpt2, nullptr);
  EXPECT_EQ(llama->Split("a\n\nb"), (Words{"a", "\n\n", "b"}));
  EXPECT_EQ(gpt2->Split("a\n\nb"), (Words{"a", "\n", "\n", "b"}));
  EXPECT_EQ(llama->Split("  x"), (Words{" ", " x"}));
  EXPECT_EQ(llama->Split("a  \n\n  x"), (Words{"a", "  \n\n", " ", " x"}));
  EXPECT_EQ(llama->Split("(x"), (Words{"(x"}));
  EXPECT_EQ(gpt2->Split("(x"), (Words{"(", "x"}));
  EXPECT_EQ(llama->Split("!!\n\nz"), (Words{"!!\n\n", "z"}));
  // Two newlines, one token.
  EXPECT_EQ(llama->Encode("\n\n"), (Ids{kNewlines}));
  EXPECT_EQ(llama->Encode("  x"), (Ids{' ', ' ', 'x'}));
  EXPECT_EQ(llama->Encode("   \n"), (Ids{kSpaces, ' ', '\n'}));
}

TEST(HfTokenizer, MergesApplyByRank) {
  const std::unique_ptr<HfTokenizer> t = Load(Llama3Json(false));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("abc"), (Ids{kAbc}));
  EXPECT_EQ(t->Encode("abcab"), (Ids{kAbc, kAb}));
  EXPECT_EQ(t->Encode("bc"), (Ids{'b', 'c'}));
  // A word longer than any short path: the same merges.
  std::string long_word;
  Ids want;
  for (int i = 0; i < 200; ++i) {
    long_word += "abc";
    want.push_back(kAbc);
  }
  EXPECT_EQ(t->Encode(long_word), want);
}

TEST(HfTokenizer, IgnoreMergesTakesAWordThatIsAToken) {
  const std::unique_ptr<HfTokenizer> merging = Load(Llama3Json(false));
  const std::unique_ptr<HfTokenizer> ignoring = Load(Llama3Json(true));
  ASSERT_NE(merging, nullptr);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_EQ(merging->Encode("xyz"), (Ids{'x', 'y', 'z'}));
  EXPECT_EQ(ignoring->Encode("xyz"), (Ids{kXyz}));
  // Not a token: merged as before.
  EXPECT_EQ(ignoring->Encode("xyzab"), (Ids{'x', 'y', 'z', kAb}));
}

TEST(HfTokenizer, AddedTokensAreFoundLongestFirst) {
  const std::unique_ptr<HfTokenizer> t = Load(Llama3Json(false));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->size(), kEndPrefix + 1);
  EXPECT_EQ(t->end_of_text(), kEnd);
  EXPECT_EQ(t->Encode("<|begin_of_text|>ab<|end_of_text|>"),
            (Ids{kBegin, kAb, kEnd}));
  EXPECT_EQ(t->Encode("<|endab"), (Ids{kEndPrefix, kAb}));
  EXPECT_EQ(t->Encode("<|en"), (Ids{'<', '|', 'e', 'n'}));
  // The text either side is split on its own.
  EXPECT_EQ(t->Split("x <|end_of_text|> y"),
            (Words{"x", " ", "<|end_of_text|>", " y"}));
  EXPECT_EQ(t->Piece(kEnd), "<|end_of_text|>");
  EXPECT_EQ(t->Decode({kBegin, 'h', 'i', kEnd, -1, 99999}),
            "<|begin_of_text|>hi<|end_of_text|>");
}

TEST(HfTokenizer, EndOfTextIsTheFirstKnownSpecialToken) {
  const auto eot = [](const json& added) {
    json j = Llama3Json(false);
    j["added_tokens"] = added;
    const std::unique_ptr<HfTokenizer> t = Load(j);
    return t == nullptr ? -2 : t->end_of_text();
  };
  EXPECT_EQ(eot(json::array(
                {Added(261, "</s>", true), Added(262, "<|endoftext|>", true)})),
            262);
  EXPECT_EQ(eot(json::array({Added(261, "<|endoftext|>", true),
                             Added(262, "<|end_of_text|>", true)})),
            262);
  EXPECT_EQ(eot(json::array(
                {Added(261, "<|im_end|>", true), Added(262, "</s>", true)})),
            262);
  EXPECT_EQ(eot(json::array({Added(261, "<|im_end|>", true)})), 261);
  EXPECT_EQ(eot(json::array({Added(261, "<|endoftext|>", false)})), -1);
  EXPECT_EQ(eot(json::array()), -1);
}

// Any bytes, invalid UTF-8 and NULs included, decode back to themselves;
// a byte that is not UTF-8 is a word alone.
TEST(HfTokenizer, AnyBytesRoundTripAndInvalidBytesAreWordsAlone) {
  const std::unique_ptr<HfTokenizer> t = Load(Llama3Json(false));
  ASSERT_NE(t, nullptr);
  std::mt19937 rng(11);
  for (int n = 0; n < 500; ++n) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) {
      const uint32_t r = rng() % 8;
      c = static_cast<char>(r < 3   ? 'a' + rng() % 4
                            : r < 5 ? " \n1'"[rng() % 4]
                                    : rng());
    }
    EXPECT_EQ(t->Decode(t->Encode(bytes)), bytes);
    std::string joined;
    for (const std::string& w : t->Split(bytes)) joined += w;
    EXPECT_EQ(joined, bytes);
  }
  EXPECT_EQ(t->Split("a \xff"), (Words{"a", " ", "\xff"}));
  EXPECT_EQ(t->Split("ab\xc3(x"), (Words{"ab", "\xc3", "(x"}));
  EXPECT_EQ(t->Split("12\xed\xa0\x80"
                     "34"),
            (Words{"12", "\xed", "\xa0", "\x80", "34"}));
}

// "é" decomposed (e, U+0301 COMBINING ACUTE ACCENT) and precomposed
// (U+00E9).
constexpr char kDecomposed[] = "cafe\xCC\x81";
constexpr char kPrecomposed[] = "caf\xC3\xA9";

json WithNormalizer(json normalizer) {
  json j = Llama3Json(false);
  j["normalizer"] = std::move(normalizer);
  return j;
}

// Under NFC (Qwen2's normalizer) text is composed before it is split:
// decomposed "é" encodes as the precomposed one does; without a
// normalizer the two are different bytes and different ids. A Sequence
// of NFC steps is NFC; an empty one, none.
TEST(HfTokenizer, NfcEncodesDecomposedTextAsItsComposedForm) {
  const std::unique_ptr<HfTokenizer> plain = Load(Llama3Json(false));
  const std::unique_ptr<HfTokenizer> nfc =
      Load(WithNormalizer({{"type", "NFC"}}));
  const std::unique_ptr<HfTokenizer> sequence = Load(WithNormalizer(
      {{"type", "Sequence"},
       {"normalizers", {{{"type", "NFC"}}, {{"type", "NFC"}}}}}));
  const std::unique_ptr<HfTokenizer> empty = Load(
      WithNormalizer({{"type", "Sequence"}, {"normalizers", json::array()}}));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(nfc, nullptr);
  ASSERT_NE(sequence, nullptr);
  ASSERT_NE(empty, nullptr);
  const Ids composed = plain->Encode(kPrecomposed);
  EXPECT_NE(plain->Encode(kDecomposed), composed);
  EXPECT_EQ(nfc->Encode(kDecomposed), composed);
  EXPECT_EQ(nfc->Encode(kPrecomposed), composed);
  EXPECT_EQ(sequence->Encode(kDecomposed), composed);
  EXPECT_EQ(empty->Encode(kDecomposed), plain->Encode(kDecomposed));
  EXPECT_EQ(nfc->Normalize(kDecomposed), kPrecomposed);
  EXPECT_EQ(plain->Normalize(kDecomposed), kDecomposed);
  EXPECT_EQ(nfc->Split(std::string(kDecomposed) + " x"),
            (Words{kPrecomposed, " x"}));
  // Two marks on one letter are put in canonical order (below before
  // above) and composed where a precomposed character exists: A, U+030A
  // RING ABOVE, U+0323 DOT BELOW is U+1EA0 (Ạ), U+030A.
  EXPECT_EQ(nfc->Normalize("A\xCC\x8A\xCC\xA3"), "\xE1\xBA\xA0\xCC\x8A");
}

// What round-trips under NFC: decode(encode(x)) is x in NFC, which is x for
// text in NFC already. Bytes that are not UTF-8 stay as they are, and split
// the well-formed stretches each side (a mark after one has no letter to
// join); added tokens are found in the text as given and the text either
// side is normalized on its own.
TEST(HfTokenizer, NfcRoundTripsTextInNfcAndKeepsInvalidBytes) {
  const std::unique_ptr<HfTokenizer> nfc =
      Load(WithNormalizer({{"type", "NFC"}}));
  ASSERT_NE(nfc, nullptr);
  const std::string mixed = std::string("\xFF") + kDecomposed + "\xC3(\xCC\x81";
  const std::string want = std::string("\xFF") + kPrecomposed + "\xC3(\xCC\x81";
  EXPECT_EQ(nfc->Normalize(mixed), want);
  EXPECT_EQ(nfc->Decode(nfc->Encode(mixed)), want);
  EXPECT_EQ(nfc->Decode(nfc->Encode(want)), want);
  EXPECT_EQ(nfc->Normalize("e\xFF\xCC\x81"), "e\xFF\xCC\x81");
  const std::string split = "e<|end_of_text|>\xCC\x81";
  EXPECT_EQ(nfc->Normalize(split), split);
  EXPECT_EQ(nfc->Encode(split), (Ids{'e', kEnd, 0xCC, 0x81}));
  std::mt19937 rng(12);
  for (int n = 0; n < 500; ++n) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) {
      const uint32_t r = rng() % 8;
      c = static_cast<char>(r < 3   ? "ae "[rng() % 3]
                            : r < 5 ? "\xCC\x81"[rng() % 2]
                                    : rng());
    }
    const std::string normalized = nfc->Normalize(bytes);
    EXPECT_EQ(nfc->Decode(nfc->Encode(bytes)), normalized);
    EXPECT_EQ(nfc->Normalize(normalized), normalized);
    std::string joined;
    for (const std::string& w : nfc->Split(bytes)) joined += w;
    EXPECT_EQ(joined, normalized);
  }
}

TEST(HfTokenizer, EncodesFromSeveralThreadsAlike) {
  const std::unique_ptr<HfTokenizer> t = Load(Gpt2Json(false, true));
  ASSERT_NE(t, nullptr);
  const std::string corpus = Gpt2Corpus();
  const Ids want = t->Encode(corpus);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (Ids& g : got) {
    threads.emplace_back([&] { g = t->Encode(corpus); });
  }
  for (std::thread& th : threads) th.join();
  for (const Ids& g : got) EXPECT_EQ(g, want);
}

TEST(HfTokenizer, OpenTokenizerTakesAFileOrItsFolder) {
  EXPECT_TRUE(IsTokenizerName("hf:/m/tokenizer.json"));
  EXPECT_TRUE(IsTokenizerName("hf:/m"));
  EXPECT_FALSE(IsTokenizerName("hf:"));
  EXPECT_EQ(HfTokenizerFile("/m"), "/m/tokenizer.json");
  EXPECT_EQ(HfTokenizerFile("/m/"), "/m/tokenizer.json");
  EXPECT_EQ(HfTokenizerFile("/m/tok.json"), "/m/tok.json");

  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/hf_tokenizer_", getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << Llama3Json(false).dump();
  for (const std::string& name :
       {"hf:" + dir, "hf:" + dir + "/tokenizer.json"}) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = OpenTokenizer(name, "test");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->Encode("abc<|end_of_text|>"), (Ids{kAbc, kEnd}));
  }
  // Read through read_file when given.
  std::string asked;
  absl::StatusOr<std::unique_ptr<Tokenizer>> read = OpenTokenizer(
      "hf:/nowhere", "data.tokenizer",
      [&](const std::string& path) -> absl::StatusOr<std::string> {
        asked = path;
        return Llama3Json(false).dump();
      });
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(asked, "/nowhere/tokenizer.json");
  // Errors name the field, the file and the field of the file.
  std::ofstream(dir + "/bad.json") << R"({"model": {"type": "Unigram"}})";
  absl::StatusOr<std::unique_ptr<Tokenizer>> bad =
      OpenTokenizer("hf:" + dir + "/bad.json", "data.tokenizer");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(
                absl::StrCat("data.tokenizer: hf:", dir, "/bad.json: ")),
            std::string::npos)
      << bad.status();
  EXPECT_FALSE(OpenTokenizer("hf:" + dir + "/none.json", "test").ok());
  std::filesystem::remove_all(dir);
}

// --- Bad files ----------------------------------------------------------

// Llama3Json(false) changed by `edit`, refused with a message that has
// `want`.
void ExpectRefused(const std::function<void(json&)>& edit,
                   const std::string& want) {
  json j = Llama3Json(false);
  edit(j);
  const std::string message = Refusal(j.dump());
  EXPECT_NE(message.find(want), std::string::npos)
      << "message: " << message << "\nwant: " << want;
}

TEST(HfTokenizer, RefusesWhatIsNotJson) {
  EXPECT_NE(Refusal("{\"model\": ").find("not JSON"), std::string::npos);
  EXPECT_NE(Refusal("[1, 2]").find("not a JSON object"), std::string::npos);
}

TEST(HfTokenizer, RefusesAnotherModelNamingIt) {
  ExpectRefused([](json& j) { j["model"]["type"] = "WordPiece"; },
                R"(model.type: "WordPiece" is not implemented)");
  ExpectRefused([](json& j) { j["model"].erase("type"); },
                "model.type: missing");
  ExpectRefused([](json& j) { j["model"]["dropout"] = 0.1; },
                "model.dropout: 0.1 is not implemented");
  ExpectRefused([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
                R"(model.continuing_subword_prefix: "##" is not implemented)");
  ExpectRefused([](json& j) { j["model"]["byte_fallback"] = true; },
                "model.byte_fallback: must be false");
}

TEST(HfTokenizer, RefusesStepsItDoesNotImplementNamingFieldAndType) {
  ExpectRefused(
      [](json& j) {
        j["normalizer"] = {{"type", "NFKC"}};
      },
      R"(normalizer: type "NFKC" is not implemented (NFC is)");
  ExpectRefused(
      [](json& j) {
        j["normalizer"] = {
            {"type", "Sequence"},
            {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
      },
      R"(normalizer.normalizers[1]: type "Lowercase" is not implemented)");
  ExpectRefused(
      [](json& j) {
        j["normalizer"] = {{"type", "Sequence"}};
      },
      "normalizer.normalizers: not a list");
  ExpectRefused(
      [](json& j) {
        j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Whitespace"}};
      },
      R"(pre_tokenizer.pretokenizers[0]: type "Whitespace" is not implemented)");
  ExpectRefused(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}};
      },
      R"(pre_tokenizer: type "Metaspace" is not implemented)");
  ExpectRefused(
      [](json& j) {
        j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
      },
      R"(pre_tokenizer.pretokenizers[0].behavior: "Removed" is not implemented)");
  ExpectRefused(
      [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
      "pre_tokenizer.pretokenizers[0].invert: must be false");
  ExpectRefused(
      [](json& j) {
        j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
      },
      "pre_tokenizer.pretokenizers[1].add_prefix_space: must be false");
  ExpectRefused([](json& j) { j["pre_tokenizer"] = SplitStep(kLlama3Pattern); },
                "pre_tokenizer: has no ByteLevel step");
  ExpectRefused(
      [](json& j) {
        j["decoder"] = {{"type", "WordPiece"}};
      },
      R"(decoder: type "WordPiece" is not implemented)");
  ExpectRefused([](json& j) { j["decoder"] = nullptr; },
                "decoder: null is not implemented");
  ExpectRefused(
      [](json& j) { j["added_tokens"][0]["lstrip"] = true; },
      R"(added_tokens[0] "<|begin_of_text|>": lstrip is not implemented)");
}

TEST(HfTokenizer, RefusesMergesOfUnknownTokensNamingTheMerge) {
  ExpectRefused([](json& j) { j["model"]["merges"].push_back("ab zz"); },
                R"(model.merges[4] "ab zz": "zz" is not in model.vocab)");
  ExpectRefused(
      [](json& j) {
        j["model"]["merges"].push_back({"b", "c"});
      },
      R"(model.merges[4] ["b","c"]: the merged token "bc" is not in model.vocab)");
  ExpectRefused(
      [](json& j) { j["model"]["merges"].push_back("a b c"); },
      R"(model.merges[4] "a b c": not two tokens apart by one space)");
  ExpectRefused([](json& j) { j["model"]["merges"].push_back(7); },
                "model.merges[4] 7: not");
}

TEST(HfTokenizer, RefusesIdsTwiceOrOutsideTheTokensNamingThem) {
  ExpectRefused([](json& j) { j["model"]["vocab"]["zz"] = 5; },
                "model.vocab: id 5 is given to");
  ExpectRefused([](json& j) { j["model"]["vocab"]["zz"] = -1; },
                R"(model.vocab: the id of "zz" is -1, not in [0, )");
  ExpectRefused([](json& j) { j["model"]["vocab"]["zz"] = 99999999999; },
                R"(model.vocab: the id of "zz" is 99999999999, not in [0, )");
  ExpectRefused([](json& j) { j["model"]["vocab"]["zz"] = "1"; },
                R"(model.vocab: the id of "zz" is "1")");
  ExpectRefused([](json& j) { j["added_tokens"][0]["id"] = 4000000000; },
                "added_tokens[0]: not an object with an id in [0, ");
  ExpectRefused(
      [](json& j) { j["added_tokens"][0]["id"] = 5; },
      R"(added_tokens[0] "<|begin_of_text|>": id 5 is another token's)");
  // A gap: ids number the tokens.
  ExpectRefused(
      [](json& j) {
        j["added_tokens"][2] = Added('a', "a", false);
        j["added_tokens"][1]["id"] = kEndPrefix;
      },
      "model.vocab: id 262 has no token");
  ExpectRefused([](json& j) { j["model"]["vocab"].erase("Ā"); },
                "model.vocab: byte 0 (\"Ā\") has no token");
  ExpectRefused([](json& j) { j["model"]["vocab"]["a\xe2\x82\xac"] = 261; },
                "is not spelled in byte-level characters");
}

TEST(HfTokenizer, RefusesAPatternThatDoesNotCompileNamingIt) {
  ExpectRefused(
      [](json& j) {
        j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a|b";
      },
      R"(pre_tokenizer.pretokenizers[0].pattern: the pattern "(a|b" does not compile)");
}

TEST(HfTokenizer, SplitsOnALiteralStringPattern) {
  json j = Llama3Json(false);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", "."}};
  const std::unique_ptr<HfTokenizer> t = Load(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Split("a.b.c"), (Words{"a", ".", "b", ".", "c"}));
  EXPECT_EQ(t->Split("a*b"), (Words{"a*b"}));
}

}  // namespace
}  // namespace ptrain
