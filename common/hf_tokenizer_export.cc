#include "common/hf_tokenizer_export.h"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"
#include "common/byte_level.h"
#include "common/gpt2_bpe.h"
#include "common/sentencepiece_model.h"
#include "nlohmann/json.hpp"

namespace ptrain {

namespace {

// Keys in the order written: the order Hugging Face's own files have.
using json = nlohmann::ordered_json;

// Limits on what is read: a tokenizer.json (Llama 3's is about 9 MB), a
// SentencePiece model (a few MB), a tokenizer_config.json (kilobytes; a
// chat template or thousands of added tokens make it larger).
constexpr size_t kMaxTokenizerJsonBytes = size_t{256} << 20;
constexpr size_t kMaxModelBytes = size_t{1} << 30;
constexpr size_t kMaxConfigBytes = size_t{64} << 20;

constexpr char kGpt2EndOfText[] = "<|endoftext|>";
// U+2581, SentencePiece's mark of a space.
constexpr char kSpaceMark[] = "\xE2\x96\x81";

// `bytes` in byte-level characters, as a byte-level vocabulary spells it.
std::string Spelled(const std::string& bytes) {
  std::string s;
  for (const char b : bytes) s += ByteLevelChar(static_cast<unsigned char>(b));
  return s;
}

json ByteLevelStep(bool add_prefix_space, bool trim_offsets) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", trim_offsets},
          {"use_regex", true}};
}

std::string Gpt2Config(int max_length) {
  const json config = {{"tokenizer_class", "GPT2Tokenizer"},
                       {"bos_token", kGpt2EndOfText},
                       {"eos_token", kGpt2EndOfText},
                       {"unk_token", kGpt2EndOfText},
                       {"add_bos_token", false},
                       {"add_prefix_space", false},
                       {"clean_up_tokenization_spaces", false},
                       {"model_max_length", max_length},
                       {"added_tokens_decoder",
                        {{std::to_string(Gpt2Bpe::kEndOfText),
                          {{"content", kGpt2EndOfText},
                           {"lstrip", false},
                           {"normalized", true},
                           {"rstrip", false},
                           {"single_word", false},
                           {"special", true}}}}}};
  return config.dump(2) + "\n";
}

// The tokenizer_config.json of SentencePiece model `model`.
std::string SentencePieceConfig(const SentencePieceModel& model,
                                int max_length) {
  const auto piece = [&](int id) -> json {
    if (id < 0 || id >= model.size()) return nullptr;
    return model.IdToPiece(id);
  };
  // Whether the model puts a space in front of a text (its normalizer's
  // add_dummy_prefix): then the first piece of "a" begins with the mark.
  const std::vector<int> a = model.Encode("a");
  const bool prefix =
      !a.empty() && absl::StartsWith(model.IdToPiece(a[0]), kSpaceMark);
  const json config = {{"tokenizer_class", "LlamaTokenizer"},
                       {"bos_token", piece(model.begin_of_sentence())},
                       {"eos_token", piece(model.end_of_sentence())},
                       {"unk_token", piece(model.unknown())},
                       {"pad_token", nullptr},
                       {"add_bos_token", false},
                       {"add_eos_token", false},
                       {"add_prefix_space", prefix},
                       {"legacy", true},
                       {"sp_model_kwargs", json::object()},
                       {"clean_up_tokenization_spaces", false},
                       {"model_max_length", max_length}};
  return config.dump(2) + "\n";
}

}  // namespace

std::string Gpt2TokenizerJson() {
  const Gpt2Bpe& bpe = Gpt2Bpe::Builtin();
  json vocab = json::object();
  std::vector<std::string> spelled(Gpt2Bpe::kVocabSize);
  for (int32_t id = 0; id < Gpt2Bpe::kVocabSize; ++id) {
    spelled[id] = Spelled(bpe.TokenBytes(id));
    vocab[spelled[id]] = id;
  }
  json merges = json::array();
  for (const auto& [left, right] : bpe.Merges()) {
    merges.push_back(absl::StrCat(spelled[left], " ", spelled[right]));
  }
  const json tokenizer = {{"version", "1.0"},
                          {"truncation", nullptr},
                          {"padding", nullptr},
                          {"added_tokens",
                           {{{"id", Gpt2Bpe::kEndOfText},
                             {"content", kGpt2EndOfText},
                             {"single_word", false},
                             {"lstrip", false},
                             {"rstrip", false},
                             {"normalized", true},
                             {"special", true}}}},
                          {"normalizer", nullptr},
                          {"pre_tokenizer", ByteLevelStep(false, true)},
                          {"post_processor", ByteLevelStep(true, false)},
                          {"decoder", ByteLevelStep(true, true)},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", nullptr},
                            {"continuing_subword_prefix", ""},
                            {"end_of_word_suffix", ""},
                            {"fuse_unk", false},
                            {"byte_fallback", false},
                            {"vocab", std::move(vocab)},
                            {"merges", std::move(merges)}}}};
  return tokenizer.dump(2) + "\n";
}

absl::StatusOr<std::vector<HfFile>> HfTokenizerFiles(absl::string_view name,
                                                     int max_length,
                                                     absl::string_view field,
                                                     const ReadFile& read_file,
                                                     HfTokenIds* ids) {
  const bool want_ids = ids != nullptr;
  HfTokenIds unused;
  if (!want_ids) ids = &unused;
  const auto read = [&](const std::string& path,
                        size_t limit) -> absl::StatusOr<std::string> {
    if (read_file) return read_file(path);
    return ReadBoundedFile(field, path, limit);
  };
  if (name == "gpt2") {
    *ids = {Gpt2Bpe::kEndOfText, Gpt2Bpe::kEndOfText};
    return std::vector<HfFile>{
        {"tokenizer.json", Gpt2TokenizerJson()},
        {"tokenizer_config.json", Gpt2Config(max_length)}};
  }
  if (!IsTokenizerName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, "='", name,
        "' is not a tokenizer: use gpt2, spm:MODEL_PATH or hf:TOKENIZER_JSON"));
  }
  if (absl::StartsWith(name, "hf:")) {
    const std::string path = HfTokenizerFile(name.substr(3));
    auto text = read(path, kMaxTokenizerJsonBytes);
    if (!text.ok()) return text.status();
    // Its end of text as the tokenizer reads it, from the text read here
    // (only when asked: the files themselves are copied as they are).
    if (want_ids) {
      auto tokenizer = OpenTokenizer(
          name, field, [&](const std::string&) -> absl::StatusOr<std::string> {
            return *text;
          });
      if (!tokenizer.ok()) return tokenizer.status();
      *ids = {-1, (*tokenizer)->end_of_text()};
    }
    std::vector<HfFile> files = {{"tokenizer.json", std::move(*text)}};
    const std::string config =
        (std::filesystem::path(path).parent_path() / "tokenizer_config.json")
            .string();
    auto config_text = read(config, kMaxConfigBytes);
    if (config_text.ok()) {
      files.push_back({"tokenizer_config.json", std::move(*config_text)});
    } else if (config_text.status().code() != absl::StatusCode::kNotFound) {
      return config_text.status();
    }
    return files;
  }
  const std::string path(name.substr(4));  // spm:
  auto bytes = read(path, kMaxModelBytes);
  if (!bytes.ok()) return bytes.status();
  std::string error;
  const std::unique_ptr<SentencePieceModel> model =
      LoadSentencePieceModel(*bytes, &error);
  if (model == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": spm:", path,
                     ": not a SentencePiece model that loads (", error, ")"));
  }
  *ids = {model->begin_of_sentence(), model->end_of_sentence()};
  std::string config = SentencePieceConfig(*model, max_length);
  return std::vector<HfFile>{{"tokenizer.model", std::move(*bytes)},
                             {"tokenizer_config.json", std::move(config)}};
}

}  // namespace ptrain
