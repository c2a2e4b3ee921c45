#include "common/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "tests/testing/files.h"

namespace ptrain {
namespace {

std::string TempDir(const std::string& name) {
  return testing::FreshTempDir("tokenizer", name);
}

using testing::ReadAll;

// Lines of the repository's Shakespeare, up to `bytes`.
std::vector<std::string> ShakespeareLines(size_t bytes) {
  std::ifstream in("data/tinyshakespeare.txt");
  std::vector<std::string> lines;
  size_t n = 0;
  for (std::string line; n < bytes && std::getline(in, line);) {
    n += line.size() + 1;
    lines.push_back(line);
  }
  return lines;
}

// Trains a SentencePiece model of `vocab` pieces on ~200 KB of Shakespeare.
std::string TrainModel(const std::string& dir, const std::string& type,
                       int vocab) {
  const std::vector<std::string> lines = ShakespeareLines(200000);
  size_t next = 0;
  const std::string path = absl::StrCat(dir, "/", type, ".model");
  const absl::Status s = TrainSentencePiece(
      [&](std::string* line) {
        if (next == lines.size()) return false;
        *line = lines[next++];
        return true;
      },
      vocab, type, path);
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

TEST(Tokenizer, Gpt2ByName) {
  auto t = OpenTokenizer("gpt2", "--tokenizer");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->size(), 50257);
  EXPECT_EQ((*t)->end_of_text(), 50256);
  EXPECT_TRUE((*t)->can_encode());
  // Ids of GPT-2's published vocabulary.
  EXPECT_EQ((*t)->Encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ((*t)->Decode({15496, 995, -1, 50257}), "Hello world");
  EXPECT_EQ((*t)->Piece(995), " world");
  EXPECT_EQ((*t)->Piece(50256), "<|endoftext|>");
}

TEST(Tokenizer, UnknownNamesAreRefusedNamingTheField) {
  EXPECT_FALSE(IsTokenizerName("bpe"));
  EXPECT_FALSE(IsTokenizerName("spm:"));
  EXPECT_TRUE(IsTokenizerName("spm:a.model"));
  auto t = OpenTokenizer("bpe", "--tokenizer");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("--tokenizer='bpe'"), std::string::npos)
      << t.status();
}

TEST(Tokenizer, SentencePieceModelThatDoesNotLoadIsRefused) {
  const std::string dir = TempDir("bad_model");
  const std::string path = dir + "/bad.model";
  std::ofstream(path) << "not a model";
  auto t = OpenTokenizer("spm:" + path, "data.tokenizer");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("data.tokenizer: spm:" + path),
            std::string::npos)
      << t.status();
  auto missing = OpenTokenizer("spm:" + dir + "/none.model", "data.tokenizer");
  EXPECT_FALSE(missing.ok());
  std::filesystem::remove_all(dir);
}

// A trained model keeps any text as written: characters it never saw go
// through its byte pieces, whitespace runs stay; the same lines give the
// same model.
TEST(Tokenizer, SentencePieceTrainsAndRoundTrips) {
  const std::string dir = TempDir("spm");
  for (const char* type : {"bpe", "unigram"}) {
    SCOPED_TRACE(type);
    const std::string path = TrainModel(dir, type, 400);
    auto t = OpenTokenizer("spm:" + path, "data.tokenizer");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->size(), 400);
    EXPECT_EQ((*t)->end_of_text(), 2);
    const std::string text =
        "First Citizen:\n  Before we proceed any further, hear me speak.\n\t"
        "\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 caf\xC3\xA9 1234";
    const std::vector<int32_t> ids = (*t)->Encode(text);
    ASSERT_FALSE(ids.empty());
    EXPECT_LT(ids.size(), text.size());  // pieces longer than a byte
    for (int32_t id : ids) ASSERT_LT(id, 400);
    EXPECT_EQ((*t)->Decode(ids), text);
    // Pieces one after the other are the text too (llm.c's decoding).
    std::string pieces;
    for (int32_t id : ids) pieces += (*t)->Piece(id);
    EXPECT_EQ(pieces, text);

    const std::string again = dir + "/again.model";
    std::filesystem::rename(path, again);
    TrainModel(dir, type, 400);
    EXPECT_EQ(ReadAll(path), ReadAll(again));
  }
  std::filesystem::remove_all(dir);
}

TEST(Tokenizer, SentencePieceTrainingRefusesABadType) {
  const std::string dir = TempDir("spm_type");
  const absl::Status s = TrainSentencePiece([](std::string*) { return false; },
                                            100, "word", dir + "/m.model");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir + "/m.model"));
  std::filesystem::remove_all(dir);
}

// llm.c's tokenizer file: its header, and pieces that decode as the
// tokenizer does.
TEST(Tokenizer, LlmcTokenizerFileDecodesAsTheTokenizer) {
  const std::string dir = TempDir("llmc");
  auto gpt2 = OpenTokenizer("gpt2", "--tokenizer");
  ASSERT_TRUE(gpt2.ok());
  const std::string path = dir + "/gpt2_tokenizer.bin";
  ASSERT_TRUE(WriteLlmcTokenizer(**gpt2, path).ok());
  const std::string bytes = ReadAll(path);
  int32_t header[4];
  ASSERT_GE(bytes.size(), 1024u);
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240328);
  EXPECT_EQ(header[1], 2);
  EXPECT_EQ(header[2], 50257);
  EXPECT_EQ(header[3], 50256);
  auto file = ReadLlmcTokenizer(path, "data.tokenizer");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE((*file)->can_encode());
  EXPECT_EQ((*file)->size(), 50257);
  EXPECT_EQ((*file)->end_of_text(), 50256);
  const std::string text =
      "It's 2026: \xE4\xBD\xA0\xE5\xA5\xBD, \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD!";
  const std::vector<int32_t> ids = (*gpt2)->Encode(text);
  EXPECT_EQ((*file)->Decode(ids), text);
  EXPECT_EQ((*file)->Decode(ids), (*gpt2)->Decode(ids));

  // Damaged files: named, with the rule broken.
  std::string bad = bytes;
  bad[0] = 1;
  auto magic = ParseLlmcTokenizer(bad, "data.tokenizer", "t.bin");
  ASSERT_FALSE(magic.ok());
  EXPECT_NE(magic.status().message().find("data.tokenizer: t.bin: bad magic"),
            std::string::npos)
      << magic.status();
  auto cut = ParseLlmcTokenizer(bytes.substr(0, bytes.size() - 3),
                                "data.tokenizer", "t.bin");
  EXPECT_FALSE(cut.ok());
  auto tail = ParseLlmcTokenizer(bytes + "x", "data.tokenizer", "t.bin");
  EXPECT_FALSE(tail.ok());
  EXPECT_FALSE(ParseLlmcTokenizer(bytes.substr(0, 100), "f", "t.bin").ok());
  std::filesystem::remove_all(dir);
}

TEST(Tokenizer, ToValidUtf8ReplacesOnlyStrayBytes) {
  EXPECT_EQ(ToValidUtf8("caf\xC3\xA9 \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_EQ(ToValidUtf8("a\xFF"
                        "b"),
            "a\xEF\xBF\xBD"
            "b");
  // A character cut short (a sampled token ending mid-character).
  EXPECT_EQ(ToValidUtf8("x\xF0\x9F"), "x\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(ToValidUtf8(""), "");
}

}  // namespace
}  // namespace ptrain
