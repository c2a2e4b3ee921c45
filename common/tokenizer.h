// Tokenizers by name, as a job's data.tokenizer and `ptworker prepare
// --tokenizer` give them: "gpt2" (GPT-2's byte-level BPE, its vocabulary
// compiled in), "spm:PATH" (a SentencePiece model), "hf:PATH" (a Hugging
// Face tokenizer.json's byte-level BPE, hf_tokenizer.h), and llm.c's tokenizer
// file (decode only: each id's bytes), which `ptworker prepare` writes
// beside its shards so that jobs and llm.c decode samples. The char
// tokenizer, whose vocabulary is a text's, is the data loader's
// (worker/engine/data/data.h) and implements the same interface.
#ifndef PTRAIN_COMMON_TOKENIZER_H_
#define PTRAIN_COMMON_TOKENIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptrain {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The vocabulary's size: ids are [0, size()).
  virtual int size() const = 0;
  // Whether Encode works (llm.c's tokenizer file only decodes).
  virtual bool can_encode() const { return true; }
  // The id that separates documents (GPT-2's <|endoftext|>, a
  // SentencePiece model's end of sentence); -1 when there is none.
  virtual int32_t end_of_text() const { return -1; }
  // The ids of `text`; safe to call from several threads at once.
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // The text of `ids` (bytes, not always UTF-8: a sampled id may end in
  // the middle of a character); ids outside the vocabulary are dropped.
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;
  // What id `id` shows alone (llm.c's tokenizer file: the text of a
  // sequence is its ids' pieces one after the other); never empty.
  virtual std::string Piece(int32_t id) const = 0;
};

// Reads a whole file (a job reads through its ConfinedFs); null: read it
// directly.
using ReadFile =
    std::function<absl::StatusOr<std::string>(const std::string& path)>;

// "gpt2", "spm:PATH" or "hf:PATH" (`field` names the flag or spec field
// in errors: "data.tokenizer: spm:/x.model: cannot load ..."). InvalidArgument
// for another name or a model that does not load.
absl::StatusOr<std::unique_ptr<Tokenizer>> OpenTokenizer(
    absl::string_view name, absl::string_view field,
    const ReadFile& read_file = nullptr);

// Whether `name` has the form OpenTokenizer takes ("gpt2", "spm:PATH",
// "hf:PATH").
bool IsTokenizerName(absl::string_view name);

// The file that "hf:PATH" reads: PATH when its name ends in ".json", else
// PATH/tokenizer.json (PATH is a model's folder).
inline std::string HfTokenizerFile(absl::string_view path) {
  const bool file = path.size() >= 5 && path.substr(path.size() - 5) == ".json";
  if (file) return std::string(path);
  std::string folder(path);
  if (folder.back() != '/') folder += '/';
  return folder + "tokenizer.json";
}

// Trains a SentencePiece model of `vocab_size` pieces (`type`: "bpe" or
// "unigram") on the lines `next_line` yields (false: no more), writing
// it to `model_path`. The model keeps text as it is (no normalization,
// whitespace as written), falls back to bytes for characters it lacks,
// and has <unk>=0, <s>=1, </s>=2 (the end of text). Deterministic: the
// same lines give the same model whatever the machine.
absl::Status TrainSentencePiece(
    const std::function<bool(std::string*)>& next_line, int vocab_size,
    absl::string_view type, const std::string& model_path);
// The same, the model's bytes returned, nothing written.
absl::StatusOr<std::string> TrainSentencePiece(
    const std::function<bool(std::string*)>& next_line, int vocab_size,
    absl::string_view type);

// llm.c's tokenizer file: 256 int32 (magic 20240328, version 2, the
// vocabulary's size, the end-of-text id), then each id's piece as a
// length byte and the bytes. Written to a temporary beside `path` and
// renamed. InvalidArgument when the tokenizer has no end of text or a
// piece is longer than 255 bytes.
absl::Status WriteLlmcTokenizer(const Tokenizer& tokenizer,
                                const std::string& path);
// The bytes WriteLlmcTokenizer writes (`path` names the file in errors).
absl::StatusOr<std::string> LlmcTokenizerBytes(const Tokenizer& tokenizer,
                                               absl::string_view path);
// The tokenizer of such a file (versions 1 and 2), which decodes only;
// `field` names it in errors.
absl::StatusOr<std::unique_ptr<Tokenizer>> ReadLlmcTokenizer(
    const std::string& path, absl::string_view field,
    const ReadFile& read_file = nullptr);
// The same from the file's bytes.
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseLlmcTokenizer(
    std::string_view bytes, absl::string_view field, absl::string_view path);

// Whether `a` and `b` show every id alike (size, end of text, pieces).
bool SamePieces(const Tokenizer& a, const Tokenizer& b);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_TOKENIZER_H_
