// A job's tokenizer as a Hugging Face folder's files
// (common/hf_tokenizer_export.h): GPT-2's tokenizer.json, opened as hf:,
// encodes and decodes as the built-in "gpt2" does (its merges are the
// published vocab.bpe's, in order); a SentencePiece model goes as its own
// bytes with a config naming its pieces; a tokenizer.json goes as it is.
// Runs in the source tree (reads data/tokenizers/gpt2, tests/common/gpt2,
// data/tinyshakespeare.txt).
#include "common/hf_tokenizer_export.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/gpt2_bpe.h"
#include "common/sentencepiece_model.h"
#include "common/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/testing/files.h"

namespace ptrain {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

std::string TempDir(const std::string& name) {
  return testing::FreshTempDir("hf_tok_export", name);
}

using testing::ReadAll;

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The files by name.
std::map<std::string, std::string> ByName(const std::vector<HfFile>& files) {
  std::map<std::string, std::string> out;
  for (const HfFile& f : files) out[f.name] = f.bytes;
  return out;
}

// Text of every kind GPT-2's pattern splits: the reference fixture (less
// U+0085 and U+FEFF, white space to one side's \s and not the other's, and
// <|endoftext|>, which the two read differently: see below), and ASCII,
// punctuation, contractions, numbers, whitespace runs, non-ASCII letters,
// digits and symbols, emoji, and bytes that are not UTF-8.
std::string VariedText() {
  std::string text =
      absl::StrReplaceAll(ReadAll("tests/common/gpt2/fixture.txt"),
                          {{"\xC2\x85", ""},
                           {"\xEF\xBB\xBF", ""},
                           {"<|endoftext|>", "<|endoftext|"}});
  text +=
      "Hello, world! It's 3.14159 o'clock; they'll say WE'RE late, she'd've "
      "known...\n\n\n   \t\t x  y\r\n\r\n  \n 1,000,000 $12.50 (50%) "
      "a+b=c #hash @user ~tilde `tick` [x]{y}<z> ２０２４年 naïve café "
      "Ωmega ελληνικά русский 中文 日本語 한국어 العربية emoji "
      "👍🏽🎉 "
      "tabs\t\t\tand   spaces    \nend\xff mid\x80 \xc3 ok";
  return text;
}

TEST(HfTokenizerExport, Gpt2TokenizerJsonEncodesAndDecodesAsTheBuiltIn) {
  const std::string dir = TempDir("gpt2");
  auto files = HfTokenizerFiles("gpt2", 1024, "test");
  ASSERT_TRUE(files.ok()) << files.status();
  std::map<std::string, std::string> by_name = ByName(*files);
  ASSERT_EQ(by_name.size(), 2u);
  ASSERT_EQ(by_name.count("tokenizer.json"), 1u);
  ASSERT_EQ(by_name.count("tokenizer_config.json"), 1u);
  WriteAll(dir + "/tokenizer.json", by_name["tokenizer.json"]);

  auto exported = OpenTokenizer("hf:" + dir, "test");
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto builtin = OpenTokenizer("gpt2", "test");
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  EXPECT_EQ((*exported)->size(), (*builtin)->size());
  EXPECT_EQ((*exported)->end_of_text(), Gpt2Bpe::kEndOfText);
  EXPECT_TRUE(SamePieces(**exported, **builtin));

  const std::string text = VariedText();
  ASSERT_GT(text.size(), 5000u);
  const Ids want = (*builtin)->Encode(text);
  const Ids got = (*exported)->Encode(text);
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  EXPECT_EQ(i, want.size()) << "first difference at id " << i;
  EXPECT_EQ(got.size(), want.size());
  EXPECT_EQ((*exported)->Decode(got), text);
  EXPECT_EQ((*builtin)->Decode(got), text);
  // Line by line: each line's words split alike at its ends.
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    ASSERT_EQ((*exported)->Encode(line), (*builtin)->Encode(line)) << line;
  }
}

// "gpt2" reads <|endoftext|> inside a text as text (it never gives 50256);
// the exported file, as transformers does, as the added token. Both decode
// the id to the same text.
TEST(HfTokenizerExport, Gpt2EndOfTextInTextIsTheAddedTokenOnlyWhenExported) {
  const std::string dir = TempDir("eot");
  WriteAll(dir + "/tokenizer.json", Gpt2TokenizerJson());
  auto exported = OpenTokenizer("hf:" + dir + "/tokenizer.json", "test");
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto builtin = OpenTokenizer("gpt2", "test");
  ASSERT_TRUE(builtin.ok());
  const std::string text = "Hello world<|endoftext|>Hello";
  EXPECT_EQ((*exported)->Encode(text), (Ids{15496, 995, 50256, 15496}));
  const Ids as_text = (*builtin)->Encode(text);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 50256), 0);
  EXPECT_EQ((*builtin)->Decode(as_text), text);
  EXPECT_EQ((*builtin)->Decode({50256}), "<|endoftext|>");
  EXPECT_EQ((*exported)->Decode({50256}), "<|endoftext|>");
}

// The file is laid out as Hugging Face publishes GPT-2's: its merges are
// vocab.bpe's lines in their order (a merge's rank is its place), its
// vocabulary encoder.json's.
TEST(HfTokenizerExport, Gpt2TokenizerJsonIsThePublishedVocabularyInOrder) {
  const json j = json::parse(Gpt2TokenizerJson());
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(j["pre_tokenizer"]["add_prefix_space"], false);
  EXPECT_EQ(j["pre_tokenizer"]["use_regex"], true);
  EXPECT_EQ(j["decoder"]["type"], "ByteLevel");
  EXPECT_EQ(j["post_processor"]["type"], "ByteLevel");
  EXPECT_TRUE(j["normalizer"].is_null());
  ASSERT_EQ(j["added_tokens"].size(), 1u);
  EXPECT_EQ(j["added_tokens"][0]["id"], 50256);
  EXPECT_EQ(j["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(j["added_tokens"][0]["special"], true);
  EXPECT_EQ(j["model"]["vocab"],
            json::parse(ReadAll("data/tokenizers/gpt2/encoder.json")));
  std::vector<std::string> published;
  std::istringstream lines(ReadAll("data/tokenizers/gpt2/vocab.bpe"));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    published.push_back(line);
  }
  ASSERT_EQ(published.size(), 50000u);
  const std::vector<std::string> merges = j["model"]["merges"];
  ASSERT_EQ(merges.size(), published.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    ASSERT_EQ(merges[r], published[r]) << "merge of rank " << r;
  }

  auto files = HfTokenizerFiles("gpt2", 256, "test");
  ASSERT_TRUE(files.ok());
  const json config = json::parse(ByName(*files)["tokenizer_config.json"]);
  EXPECT_EQ(config["tokenizer_class"], "GPT2Tokenizer");
  EXPECT_EQ(config["eos_token"], "<|endoftext|>");
  EXPECT_EQ(config["bos_token"], "<|endoftext|>");
  EXPECT_EQ(config["add_bos_token"], false);
  EXPECT_EQ(config["model_max_length"], 256);
  EXPECT_EQ(config["added_tokens_decoder"]["50256"]["content"],
            "<|endoftext|>");
}

// Trains a SentencePiece model on Shakespeare's first lines with
// SentencePiece's flags `extra` (over a default of ptrain's settings).
std::string TrainModel(
    const std::vector<std::pair<std::string, std::string>>& extra) {
  std::ifstream in("data/tinyshakespeare.txt");
  std::vector<std::string> lines;
  for (std::string line; lines.size() < 3000 && std::getline(in, line);) {
    lines.push_back(line);
  }
  std::vector<std::pair<std::string, std::string>> args = {
      {"model_type", "bpe"},     {"vocab_size", "400"},
      {"byte_fallback", "true"}, {"normalization_rule_name", "identity"},
      {"num_threads", "1"},      {"minloglevel", "2"}};
  args.insert(args.end(), extra.begin(), extra.end());
  size_t next = 0;
  std::string model, error;
  EXPECT_TRUE(TrainSentencePieceModel(
      [&](std::string* line) {
        if (next == lines.size()) return false;
        *line = lines[next++];
        return true;
      },
      args, &model, &error))
      << error;
  return model;
}

// The model goes as its own bytes; the config names LlamaTokenizer and the
// pieces the model has for bos, eos and unk (null for one it lacks), and
// says whether it puts a space in front of a text.
TEST(HfTokenizerExport, SentencePieceModelGoesAsItsBytesWithItsPieces) {
  const std::string dir = TempDir("spm");
  struct Case {
    std::vector<std::pair<std::string, std::string>> flags;
    json bos, eos, unk;
    bool prefix;
  };
  for (const Case& k : {
           // ptrain's own (`ptworker prepare`, TrainSentencePiece).
           Case{{{"unk_id", "0"},
                 {"bos_id", "1"},
                 {"eos_id", "2"},
                 {"pad_id", "-1"},
                 {"add_dummy_prefix", "false"}},
                "<s>",
                "</s>",
                "<unk>",
                false},
           // Other pieces, no bos, a space put in front.
           Case{{{"unk_id", "2"},
                 {"bos_id", "-1"},
                 {"eos_id", "0"},
                 {"pad_id", "-1"},
                 {"unk_piece", "[UNK]"},
                 {"eos_piece", "[END]"},
                 {"add_dummy_prefix", "true"}},
                nullptr,
                "[END]",
                "[UNK]",
                true},
       }) {
    SCOPED_TRACE(k.prefix);
    const std::string model = TrainModel(k.flags);
    ASSERT_FALSE(model.empty());
    const std::string path = dir + "/m.model";
    WriteAll(path, model);
    auto files = HfTokenizerFiles("spm:" + path, 512, "test");
    ASSERT_TRUE(files.ok()) << files.status();
    std::map<std::string, std::string> by_name = ByName(*files);
    ASSERT_EQ(by_name.size(), 2u);
    EXPECT_TRUE(by_name["tokenizer.model"] == model);
    const json config = json::parse(by_name["tokenizer_config.json"]);
    EXPECT_EQ(config["tokenizer_class"], "LlamaTokenizer");
    EXPECT_EQ(config["bos_token"], k.bos);
    EXPECT_EQ(config["eos_token"], k.eos);
    EXPECT_EQ(config["unk_token"], k.unk);
    EXPECT_EQ(config["add_prefix_space"], k.prefix);
    EXPECT_EQ(config["add_bos_token"], false);
    EXPECT_EQ(config["add_eos_token"], false);
    EXPECT_EQ(config["legacy"], true);
    EXPECT_EQ(config["model_max_length"], 512);
  }
  WriteAll(dir + "/bad.model", "not a model");
  auto bad = HfTokenizerFiles("spm:" + dir + "/bad.model", 512, "test");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("test: spm:" + dir + "/bad.model"),
            std::string::npos)
      << bad.status();
}

// hf:PATH: the tokenizer.json, and the tokenizer_config.json beside it when
// there is one, as they are.
TEST(HfTokenizerExport, HfTokenizerGoesAsItIs) {
  const std::string dir = TempDir("hf");
  WriteAll(dir + "/tokenizer.json", "{\"any\": 1}");
  auto alone = HfTokenizerFiles("hf:" + dir, 64, "test");
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_EQ(alone->size(), 1u);
  EXPECT_EQ((*alone)[0].name, "tokenizer.json");
  EXPECT_EQ((*alone)[0].bytes, "{\"any\": 1}");
  WriteAll(dir + "/tokenizer_config.json", "{\"x\": 2}");
  auto both = HfTokenizerFiles("hf:" + dir + "/tokenizer.json", 64, "test");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(ByName(*both)["tokenizer_config.json"], "{\"x\": 2}");

  auto other = HfTokenizerFiles("char", 64, "test");
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("test='char'"), std::string::npos);
  auto missing = HfTokenizerFiles("hf:" + dir + "/nope", 64, "test");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope/tokenizer.json"),
            std::string::npos)
      << missing.status();
}

}  // namespace
}  // namespace ptrain
