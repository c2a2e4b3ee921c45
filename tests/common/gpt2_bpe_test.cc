// GPT-2's byte-level BPE (common/gpt2_bpe.h) against a reference encoder's
// ids (tests/common/gpt2: fixture.txt of prose, code, numbers, scripts,
// emoji, CJK and whitespace runs; ids.json made by reference.js with the
// gpt-3-encoder package), and its round trip over any bytes.
#include "common/gpt2_bpe.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace ptrain
