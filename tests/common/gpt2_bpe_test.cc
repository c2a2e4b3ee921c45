// GPT-2's byte-level BPE (common/gpt2_bpe.h) against the reference
// encoders' ids (tests/common/gpt2: fixture.txt of prose, code, numbers,
// scripts, emoji, CJK, whitespace runs, contractions and words long enough
// for the other merge path; ids.json made by reference.js, the tiktoken and
// gpt-3-encoder packages agreeing), the built-in vocabulary against the
// files, the word cache against none, and the round trip over any bytes.
#include "common/gpt2_bpe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

constexpr char kVocab[] = "data/tokenizers/gpt2";

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const Gpt2Bpe& Bpe() {
  static const Gpt2Bpe* bpe = [] {
    absl::StatusOr<Gpt2Bpe> b = Gpt2Bpe::Load(kVocab);
    if (!b.ok()) {
      std::fprintf(stderr, "%s\n", std::string(b.status().message()).c_str());
      std::abort();
    }
    return new Gpt2Bpe(std::move(*b));
  }();
  return *bpe;
}

TEST(Gpt2Bpe, EncodesTheFixtureAsTheReferenceEncoderDoes) {
  const std::string text = Read("tests/common/gpt2/fixture.txt");
  const std::vector<int32_t> want =
      nlohmann::json::parse(Read("tests/common/gpt2/ids.json"))
          .get<std::vector<int32_t>>();
  ASSERT_GT(want.size(), 1000u);
  Gpt2Bpe::Cache cache;
  for (Gpt2Bpe::Cache* c : {static_cast<Gpt2Bpe::Cache*>(nullptr), &cache}) {
    const std::vector<int32_t> got = Bpe().Encode(text, c);
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    EXPECT_EQ(got.size(), want.size());
    if (i < want.size()) {
      ADD_FAILURE() << "first difference at id " << i << ": got "
                    << (i < got.size() ? got[i] : -1) << ", want " << want[i];
    }
  }
  EXPECT_FALSE(cache.empty());
  const absl::StatusOr<std::string> back = Bpe().Decode(want);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, text);
}

TEST(Gpt2Bpe, KnownWordsTakeTheirPublishedIds) {
  EXPECT_EQ(Bpe().Encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  // A whitespace run before a word leaves its last space to the word.
  EXPECT_EQ(Bpe().Encode("a   b"), (std::vector<int32_t>{64, 220, 220, 275}));
  EXPECT_EQ(Bpe().Decode({Gpt2Bpe::kEndOfText}).value(), "<|endoftext|>");
}

TEST(Gpt2Bpe, WordsPutBackTogetherAreTheText) {
  const std::string text = "It's  3.14\t\tok 日本語  \n";
  std::string joined;
  for (std::string_view w : Bpe().Split(text)) joined += w;
  EXPECT_EQ(joined, text);
  const std::vector<std::string_view> words = Bpe().Split("It's  3.14");
  ASSERT_EQ(words.size(), 6u);  // It, 's, " ", " 3", ., 14
  EXPECT_EQ(words[1], "'s");
  EXPECT_EQ(words[2], " ");
  EXPECT_EQ(words[3], " 3");
}

// Any byte string, invalid UTF-8 and NULs included, decodes back to itself.
TEST(Gpt2Bpe, AnyBytesRoundTrip) {
  std::mt19937 rng(7);
  Gpt2Bpe::Cache cache;
  for (int n = 0; n < 300; ++n) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) {
      // Mostly ASCII letters and spaces, some of every byte.
      const uint32_t r = rng() % 8;
      c = static_cast<char>(r < 4 ? 'a' + rng() % 26 : r < 5 ? ' ' : rng());
    }
    const absl::StatusOr<std::string> back =
        Bpe().Decode(Bpe().Encode(bytes, &cache));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, bytes);
  }
}

TEST(Gpt2Bpe, DecodeNamesAnIdOutsideTheVocabulary) {
  const absl::StatusOr<std::string> bad = Bpe().Decode({15496, 50257});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("token 1 is 50257"), std::string::npos)
      << bad.status();
  EXPECT_FALSE(Bpe().Decode({-1}).ok());
}

TEST(Gpt2Bpe, LoadNamesTheFileItCannotTake) {
  const fs::path dir = fs::temp_directory_path() / "ptrain_gpt2_bpe_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  absl::StatusOr<Gpt2Bpe> missing = Gpt2Bpe::Load(dir.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("encoder.json"), std::string::npos)
      << missing.status();
  std::ofstream(dir / "encoder.json") << R"({"a": 0})";
  absl::StatusOr<Gpt2Bpe> small = Gpt2Bpe::Load(dir.string());
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("not GPT-2's vocabulary"),
            std::string::npos)
      << small.status();
  fs::copy_file(std::string(kVocab) + "/encoder.json", dir / "encoder.json",
                fs::copy_options::overwrite_existing);
  std::ofstream(dir / "vocab.bpe") << "#version: 0.2\nĠ t\nnot-a-merge\n";
  absl::StatusOr<Gpt2Bpe> bad = Gpt2Bpe::Load(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("vocab.bpe:3"), std::string::npos)
      << bad.status();
  fs::remove_all(dir);
}

TEST(Gpt2Bpe, BuiltinVocabularyIsTheOneInDataTokenizersGpt2) {
  const Gpt2Bpe& builtin = Gpt2Bpe::Builtin();
  EXPECT_EQ(&builtin, &Gpt2Bpe::Builtin());  // parsed once
  for (int32_t id = 0; id < Gpt2Bpe::kVocabSize; ++id) {
    ASSERT_EQ(builtin.TokenBytes(id), Bpe().TokenBytes(id)) << "id " << id;
  }
  const std::string text = Read("tests/common/gpt2/fixture.txt");
  EXPECT_EQ(builtin.Encode(text), Bpe().Encode(text));
  EXPECT_EQ(builtin.Encode("Hello world"), (std::vector<int32_t>{15496, 995}));
}

TEST(Gpt2Bpe, TokenBytesAreWhatEachIdDecodesTo) {
  EXPECT_EQ(Bpe().TokenBytes(15496), "Hello");
  EXPECT_EQ(Bpe().TokenBytes(995), " world");
  EXPECT_EQ(Bpe().TokenBytes(220), " ");
  EXPECT_EQ(Bpe().TokenBytes(Gpt2Bpe::kEndOfText), "<|endoftext|>");
  std::vector<bool> single_byte(256, false);
  for (int32_t id = 0; id < Gpt2Bpe::kVocabSize; ++id) {
    const std::string& bytes = Bpe().TokenBytes(id);
    ASSERT_FALSE(bytes.empty()) << "id " << id;
    ASSERT_EQ(bytes, Bpe().Decode({id}).value()) << "id " << id;
    if (bytes.size() == 1) {
      single_byte[static_cast<unsigned char>(bytes[0])] = true;
    }
  }
  // Every byte has a token of its own: any text encodes.
  EXPECT_EQ(std::count(single_byte.begin(), single_byte.end(), true), 256);
}

TEST(Gpt2BpeDeathTest, TokenBytesOfAnIdOutsideTheVocabularyAborts) {
  EXPECT_DEATH(Bpe().TokenBytes(Gpt2Bpe::kVocabSize), "outside");
  EXPECT_DEATH(Bpe().TokenBytes(-1), "outside");
}

// One cache over texts that share words: the ids are the ones without it,
// and it holds at most kMaxWords words however many it has seen.
TEST(Gpt2Bpe, CacheGivesTheIdsOfNoCacheAndStaysBounded) {
  const std::string fixture = Read("tests/common/gpt2/fixture.txt");
  Gpt2Bpe::Cache cache;
  const std::vector<int32_t> plain = Bpe().Encode(fixture);
  EXPECT_EQ(Bpe().Encode(fixture, &cache), plain);
  EXPECT_FALSE(cache.empty());
  EXPECT_EQ(Bpe().Encode(fixture, &cache), plain);  // now from the cache

  // Words of several ids each, more distinct ones than the cache keeps:
  // " 7103925", " 7103926", ...
  std::string numbers;
  for (size_t i = 0; i < Gpt2Bpe::Cache::kMaxWords + 5000; ++i) {
    absl::StrAppend(&numbers, " ", 7103925 + i);
  }
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_EQ(Bpe().Encode(numbers, &cache), Bpe().Encode(numbers));
    EXPECT_LE(cache.size(), Gpt2Bpe::Cache::kMaxWords);
  }
  EXPECT_EQ(Bpe().Encode(fixture, &cache), plain);

  // A word longer than kMaxWordBytes is merged each time, not kept.
  Gpt2Bpe::Cache fresh;
  const std::string digits(Gpt2Bpe::Cache::kMaxWordBytes + 1, '7');
  EXPECT_EQ(Bpe().Encode(digits, &fresh), Bpe().Encode(digits));
  EXPECT_TRUE(fresh.empty());
  EXPECT_EQ(Bpe().Encode(digits.substr(1), &fresh),
            Bpe().Encode(digits.substr(1)));
  EXPECT_EQ(fresh.size(), 1u);
}

// The pre-tokenizer's choices where a regular expression leaves several:
// which alternative wins, where a whitespace run ends, and bytes that are
// not UTF-8 (each a word of its own).
TEST(Gpt2Bpe, SplitTakesTheFirstAlternativeThatMatches) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"it's", {"it", "'s"}},
      {"IT'S", {"IT", "'", "S"}},  // contractions are lower case only
      {"'ll'll", {"'ll", "'ll"}},
      {"'llama", {"'ll", "ama"}},
      {" 's", {" '", "s"}},
      {"''s", {"''", "s"}},
      {"it’s", {"it", "’", "s"}},
      {"a   b", {"a", "  ", " b"}},
      {"a\t\tb", {"a", "\t", "\t", "b"}},
      {"a \u00a0b", {"a", " ", "\u00a0", "b"}},  // NBSP is no " ?"
      {"x  ", {"x", "  "}},
      {" 42 -7", {" 42", " -", "7"}},
      {"e\u0301", {"e", "\u0301"}},  // a combining mark is other
      {"𝐀𝐁 ½x", {"𝐀𝐁", " ½", "x"}},  // letters beyond the BMP; ½ is N
      {"ab\377cd", {"ab", "\377", "cd"}},
      {" \xFF", {" ", "\xFF"}},
      {"  \xFF", {" ", " ", "\xFF"}},
      {"x\xE6\x97", {"x", "\xE6", "\x97"}},        // cut short
      {"\xED\xA0\x80", {"\xED", "\xA0", "\x80"}},  // a surrogate
      {"\xC0\x80", {"\xC0", "\x80"}},              // overlong
  };
  for (const auto& [text, want] : cases) {
    const std::vector<std::string_view> got = Bpe().Split(text);
    EXPECT_EQ(std::vector<std::string>(got.begin(), got.end()), want)
        << "splitting \"" << text << "\"";
  }
}

}  // namespace
}  // namespace ptrain
