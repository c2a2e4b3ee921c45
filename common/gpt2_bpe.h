// GPT-2's byte-level BPE tokenizer: its published vocabulary
// (data/tokenizers/gpt2: encoder.json, vocab.bpe), the pre-tokenization
// pattern (contractions, letter runs, digit runs, other runs, whitespace),
// bytes mapped to printable characters, and pair merges by rank. Any byte
// string encodes, invalid UTF-8 included (such bytes go alone through the
// merges), and decodes back to itself.
#ifndef PTRAIN_COMMON_GPT2_BPE_H_
#define PTRAIN_COMMON_GPT2_BPE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace ptrain {

class Gpt2Bpe {
 public:
  // <|endoftext|>, which separates documents; never produced by Encode.
  static constexpr int32_t kEndOfText = 50256;
  static constexpr int32_t kVocabSize = 50257;

  // The vocabulary in `dir` (encoder.json and vocab.bpe); an error naming
  // the file and what is wrong with it.
  static absl::StatusOr<Gpt2Bpe> Load(const std::string& dir);

  Gpt2Bpe(Gpt2Bpe&&) noexcept;
  Gpt2Bpe& operator=(Gpt2Bpe&&) noexcept;
  ~Gpt2Bpe();

  // Words already merged, by their bytes: one per thread (Encode with a
  // cache is not safe to call from several threads at once).
  using Cache = std::unordered_map<std::string, std::vector<int32_t>>;

  // The ids of `text` (its bytes as they are); `cache` may be null.
  std::vector<int32_t> Encode(std::string_view text,
                              Cache* cache = nullptr) const;
  // The bytes of `ids`; an error naming the first id outside the
  // vocabulary.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;

  // Splits text into the words BPE merges within (GPT-2's pattern); the
  // words put back together are `text`.
  std::vector<std::string_view> Split(std::string_view text) const;

 private:
  struct Tables;
  explicit Gpt2Bpe(std::unique_ptr<Tables> tables);
  // One word's ids (its bytes, merged).
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  std::unique_ptr<Tables> t_;
};

}  // namespace ptrain

#endif  // PTRAIN_COMMON_GPT2_BPE_H_
