#include "common/tokenizer.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/bounded_file.h"
#include "common/gpt2_bpe.h"
#include "common/hf_tokenizer.h"
#include "common/private_file.h"
#include "common/sentencepiece_model.h"
#include "common/spec.h"
#include "common/utf8.h"

namespace ptrain {

namespace {

constexpr int32_t kLlmcTokenizerMagic = 20240328;
constexpr int kLlmcHeaderInts = 256;
// GPT-2's file is about 0.5 MB; a vocabulary of a million pieces of 255
// bytes stays under this.
constexpr size_t kMaxLlmcTokenizerBytes = size_t{256} << 20;
// SentencePiece models are a few MB.
constexpr size_t kMaxModelBytes = size_t{1} << 30;
// A tokenizer.json: Llama 3's is about 9 MB, Qwen2's 7 MB.
constexpr size_t kMaxHfTokenizerBytes = size_t{256} << 20;

class Gpt2Tokenizer : public Tokenizer {
 public:
  Gpt2Tokenizer() : bpe_(Gpt2Bpe::Builtin()) {}
  int size() const override { return Gpt2Bpe::kVocabSize; }
  int32_t end_of_text() const override { return Gpt2Bpe::kEndOfText; }
  std::vector<int32_t> Encode(std::string_view text) const override {
    // Words this thread merged, for the one vocabulary compiled in (the
    // cache bounds itself).
    thread_local Gpt2Bpe::Cache cache;
    return bpe_.Encode(text, &cache);
  }
  std::string Decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id >= 0 && id < size()) text += bpe_.TokenBytes(id);
    }
    return text;
  }
  std::string Piece(int32_t id) const override { return bpe_.TokenBytes(id); }

 private:
  const Gpt2Bpe& bpe_;
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Open(
      const std::string& path, absl::string_view field,
      const ReadFile& read_file) {
    absl::StatusOr<std::string> bytes =
        read_file ? read_file(path)
                  : ReadBoundedFile(field, path, kMaxModelBytes);
    if (!bytes.ok()) return bytes.status();
    std::string error;
    std::unique_ptr<SentencePieceModel> model =
        LoadSentencePieceModel(*bytes, &error);
    if (model == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": spm:", path,
                       ": not a SentencePiece model that loads (", error, ")"));
    }
    return std::unique_ptr<Tokenizer>(
        new SentencePieceTokenizer(std::move(model)));
  }
  int size() const override { return sp_->size(); }
  int32_t end_of_text() const override { return sp_->end_of_sentence(); }
  std::vector<int32_t> Encode(std::string_view text) const override {
    const std::vector<int> ids = sp_->Encode(text);
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  std::string Decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> in;
    in.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < size()) in.push_back(id);
    }
    std::string text;
    if (!sp_->Decode(in, &text)) text.clear();
    return text;
  }
  std::string Piece(int32_t id) const override {
    const std::string piece = sp_->IdToPiece(id);
    if (sp_->IsByte(id)) {  // "<0xAB>"
      return std::string(
          1, static_cast<char>(std::strtol(piece.c_str() + 3, nullptr, 16)));
    }
    if (sp_->IsControl(id) || sp_->IsUnknown(id)) return piece;
    // U+2581, SentencePiece's mark of a space.
    std::string text = absl::StrReplaceAll(piece, {{"\xE2\x96\x81", " "}});
    return text.empty() ? piece : text;
  }

 private:
  explicit SentencePieceTokenizer(std::unique_ptr<SentencePieceModel> sp)
      : sp_(std::move(sp)) {}
  std::unique_ptr<SentencePieceModel> sp_;
};

class LlmcTokenizer : public Tokenizer {
 public:
  explicit LlmcTokenizer(std::vector<std::string> pieces, int32_t eot)
      : pieces_(std::move(pieces)), eot_(eot) {}
  int size() const override { return static_cast<int>(pieces_.size()); }
  bool can_encode() const override { return false; }
  int32_t end_of_text() const override { return eot_; }
  std::vector<int32_t> Encode(std::string_view) const override { return {}; }
  std::string Decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id >= 0 && id < size()) text += pieces_[id];
    }
    return text;
  }
  std::string Piece(int32_t id) const override { return pieces_[id]; }

 private:
  std::vector<std::string> pieces_;
  int32_t eot_;
};

}  // namespace

bool IsTokenizerName(absl::string_view name) {
  return name == "gpt2" || (name.size() > 4 && name.substr(0, 4) == "spm:") ||
         (name.size() > 3 && name.substr(0, 3) == "hf:");
}

absl::StatusOr<std::unique_ptr<Tokenizer>> OpenTokenizer(
    absl::string_view name, absl::string_view field,
    const ReadFile& read_file) {
  if (name == "gpt2") return std::unique_ptr<Tokenizer>(new Gpt2Tokenizer());
  if (IsTokenizerName(name) && name.substr(0, 3) == "hf:") {
    const std::string file = HfTokenizerFile(name.substr(3));
    absl::StatusOr<std::string> bytes =
        read_file ? read_file(file)
                  : ReadBoundedFile(field, file, kMaxHfTokenizerBytes);
    if (!bytes.ok()) return bytes.status();
    auto t = HfTokenizer::Parse(*bytes, file);
    if (!t.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": hf:", t.status().message()));
    }
    return std::unique_ptr<Tokenizer>(std::move(*t));
  }
  if (IsTokenizerName(name)) {
    return SentencePieceTokenizer::Open(std::string(name.substr(4)), field,
                                        read_file);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, "='", name,
      "' is not a tokenizer: use gpt2, spm:MODEL_PATH or hf:TOKENIZER_JSON"));
}

absl::Status TrainSentencePiece(
    const std::function<bool(std::string*)>& next_line, int vocab_size,
    absl::string_view type, const std::string& model_path) {
  auto model = TrainSentencePiece(next_line, vocab_size, type);
  if (!model.ok()) return model.status();
  return ReplaceFile(model_path, *model, 0644);
}

absl::StatusOr<std::string> TrainSentencePiece(
    const std::function<bool(std::string*)>& next_line, int vocab_size,
    absl::string_view type) {
  if (type != "bpe" && type != "unigram") {
    return absl::InvalidArgumentError(absl::StrCat(
        "SentencePiece model type '", type, "' is not one of bpe, unigram"));
  }
  // The model keeps text as written: no normalization, no space added in
  // front, whitespace as it is; digits one a piece.
  const std::vector<std::pair<std::string, std::string>> args = {
      {"model_type", std::string(type)},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", "0.9995"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"remove_extra_whitespaces", "false"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      // A fixed count: the model must not depend on the machine's cores.
      {"num_threads", "4"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      // Lines past these are not read: a sample of a large corpus is
      // enough.
      {"input_sentence_size", "2000000"},
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", "65536"},
      {"minloglevel", "2"},
  };
  std::string model, error;
  if (!TrainSentencePieceModel(next_line, args, &model, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SentencePiece training failed: ", error));
  }
  return model;
}

absl::Status WriteLlmcTokenizer(const Tokenizer& tokenizer,
                                const std::string& path) {
  auto bytes = LlmcTokenizerBytes(tokenizer, path);
  if (!bytes.ok()) return bytes.status();
  return ReplaceFile(path, *bytes, 0644);
}

absl::StatusOr<std::string> LlmcTokenizerBytes(const Tokenizer& tokenizer,
                                               absl::string_view path) {
  if (tokenizer.end_of_text() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": the tokenizer has no end-of-text token, which llm.c's "
        "tokenizer file needs (llm.c starts its samples with it)"));
  }
  std::string out(kLlmcHeaderInts * sizeof(int32_t), '\0');
  const int32_t header[4] = {kLlmcTokenizerMagic, 2, tokenizer.size(),
                             tokenizer.end_of_text()};
  std::memcpy(out.data(), header, sizeof(header));
  for (int32_t id = 0; id < tokenizer.size(); ++id) {
    const std::string piece = tokenizer.Piece(id);
    if (piece.empty() || piece.size() > 255) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": token ", id, " is ", piece.size(),
                       " bytes long; llm.c's tokenizer file holds 1 to 255"));
    }
    out += static_cast<char>(piece.size());
    out += piece;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseLlmcTokenizer(
    std::string_view bytes, absl::string_view field, absl::string_view path) {
  const auto bad = [&](auto&&... why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path, ": ", why...));
  };
  if (bytes.size() < kLlmcHeaderInts * sizeof(int32_t)) {
    return bad("shorter than llm.c's tokenizer header (1024 bytes)");
  }
  int32_t header[4];
  std::memcpy(header, bytes.data(), sizeof(header));
  if (header[0] != kLlmcTokenizerMagic) {
    return bad("bad magic ", header[0], " (expected ", kLlmcTokenizerMagic,
               ")");
  }
  if (header[1] != 1 && header[1] != 2) {
    return bad("version ", header[1], " (expected 1 or 2)");
  }
  const int32_t n = header[2];
  const int32_t eot = header[1] == 2 ? header[3] : -1;
  if (n <= 0 || eot < -1 || eot >= n) {
    return bad("vocabulary size ", n, " and end of text ", eot,
               " do not fit together");
  }
  std::vector<std::string> pieces;
  size_t at = kLlmcHeaderInts * sizeof(int32_t);
  for (int32_t id = 0; id < n; ++id) {
    if (at >= bytes.size()) return bad("ends at token ", id, " of ", n);
    const size_t len = static_cast<unsigned char>(bytes[at++]);
    if (len == 0 || at + len > bytes.size()) {
      return bad("token ", id, " has length ", len, " (1 to 255, in the file)");
    }
    pieces.emplace_back(bytes.substr(at, len));
    at += len;
  }
  if (at != bytes.size())
    return bad(bytes.size() - at, " bytes after the ", n, " tokens");
  return std::unique_ptr<Tokenizer>(new LlmcTokenizer(std::move(pieces), eot));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> ReadLlmcTokenizer(
    const std::string& path, absl::string_view field,
    const ReadFile& read_file) {
  auto bytes = read_file ? read_file(path)
                         : ReadBoundedFile(field, path, kMaxLlmcTokenizerBytes);
  if (!bytes.ok()) return bytes.status();
  return ParseLlmcTokenizer(*bytes, field, path);
}

bool SamePieces(const Tokenizer& a, const Tokenizer& b) {
  if (a.size() != b.size() || a.end_of_text() != b.end_of_text()) {
    return false;
  }
  for (int32_t id = 0; id < a.size(); ++id) {
    if (a.Piece(id) != b.Piece(id)) return false;
  }
  return true;
}

}  // namespace ptrain
