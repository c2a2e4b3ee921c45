// GPT-2's byte-level BPE tokenizer: its published vocabulary
// (data/tokenizers/gpt2: encoder.json, vocab.bpe, also compiled into the
// library as Builtin()), the pre-tokenization pattern (contractions, letter
// runs, digit runs, other runs, whitespace), bytes mapped to printable
// characters, and pair merges by rank. Any byte string encodes, invalid
// UTF-8 included (such bytes go alone through the merges), and decodes back
// to itself. Not the special tokens: "<|endoftext|>" in a text is text.
//
// Speed (bench/tokenizer_vs_tiktoken.sh): the pattern is matched
// by a hand-written pre-tokenizer, not by a regular expression (the fuzz
// target fuzz/gpt2_bpe_fuzzer.cc holds it to the pattern in RE2). On
// tests/common/gpt2/make_corpus.py's 1.3 MB, one core, RE2 (an anchored
// match a word, as before) split 2 MB/s, slower than the tiktoken package
// encodes (3 MB/s); the hand-written one splits ~200 MB/s and the whole
// encoder runs ~30 MB/s. ASCII is classified by a table, other characters
// by ICU's general categories (L, N) through a 64 Ki-entry table for the
// BMP, built once. Whitespace is JavaScript's \s, as the reference
// encoders' pattern has it. Characters assigned after ICU's Unicode version
// (15.0 on Debian 12) are neither letters nor digits here, where a reference
// with newer tables could split otherwise. Merges work on ids: (left,
// right) → (rank, merged id) in one hash table, O(n log n) for long words;
// a word that is a token (and merges into itself, checked for each token at
// load) is one lookup.
#ifndef PTRAIN_COMMON_GPT2_BPE_H_
#define PTRAIN_COMMON_GPT2_BPE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
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

  // The vocabulary of data/tokenizers/gpt2 as the library was built with
  // it: parsed on the first call (thread-safe), never destroyed. Needs no
  // file at run time; aborts if it does not parse (a build defect).
  static const Gpt2Bpe& Builtin();

  Gpt2Bpe(Gpt2Bpe&&) noexcept;
  Gpt2Bpe& operator=(Gpt2Bpe&&) noexcept;
  ~Gpt2Bpe();

  // Words already merged into several ids, by their bytes: one per thread
  // (Encode with a cache is not safe to call from several threads at once
  // on that cache), used with one vocabulary. Holds at most kMaxWords
  // words of at most kMaxWordBytes each (a few MB); full, it starts over.
  class Cache {
   public:
    static constexpr size_t kMaxWords = size_t{1} << 16;
    static constexpr size_t kMaxWordBytes = 256;

    Cache();
    Cache(Cache&&) noexcept;
    Cache& operator=(Cache&&) noexcept;
    ~Cache();

    size_t size() const { return words_.size(); }
    bool empty() const { return words_.empty(); }

   private:
    friend class Gpt2Bpe;
    struct Span {
      uint32_t begin;  // into ids_
      uint32_t size;
    };
    absl::flat_hash_map<std::string, Span> words_;
    std::vector<int32_t> ids_;
  };

  // The ids of `text` (its bytes as they are); `cache` may be null. The
  // vocabulary is read only: any number of threads may encode at once,
  // each with its own cache.
  std::vector<int32_t> Encode(std::string_view text,
                              Cache* cache = nullptr) const;
  // The bytes of `ids`; an error naming the first id outside the
  // vocabulary.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;
  // The bytes of one id; 0 <= id < kVocabSize (aborts otherwise).
  const std::string& TokenBytes(int32_t id) const;
  // The merges as (left id, right id), lowest rank first: those that can
  // apply (both halves tokens; all of GPT-2's), each pair once.
  std::vector<std::pair<int32_t, int32_t>> Merges() const;

  // Splits text into the words BPE merges within (GPT-2's pattern); the
  // words put back together are `text`.
  std::vector<std::string_view> Split(std::string_view text) const;

 private:
  struct Tables;
  explicit Gpt2Bpe(std::unique_ptr<const Tables> tables);
  // One word's ids, appended to out: the token it is (one byte, or a
  // token's bytes), else what `cache` (may be null) kept, else its bytes
  // merged (then kept).
  void EncodeWord(std::string_view word, Cache* cache,
                  std::vector<int32_t>* out) const;

  std::unique_ptr<const Tables> t_;
};

}  // namespace ptrain

#endif  // PTRAIN_COMMON_GPT2_BPE_H_
