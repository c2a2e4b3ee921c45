// A Hugging Face tokenizer.json's byte-level BPE, as GPT-2, Llama 3 and
// Qwen2 publish theirs: model BPE (vocab, merges in either form,
// ignore_merges), the NFC normalizer (Qwen2's; alone or in a Sequence of
// NFC steps), a pre-tokenizer of Split steps (a regular expression,
// behaviour Isolated) and ByteLevel (with or without GPT-2's pattern), the
// ByteLevel decoder, and the added tokens. Not the other models
// (WordPiece, Unigram, ...), normalizers, or pre-tokenizers, which are
// refused by name when a file has them; not the post-processor: Encode adds
// no special token of its own (ptworker prepare puts the end of text
// between documents).
//
// The file's regular expressions run as written in PCRE2 (UTF, Unicode
// properties, JIT where the machine has it), lookahead included, which
// Llama 3's pattern needs. PCRE2 classifies characters by its own Unicode
// tables, and its \s is Unicode's white space (U+0085 included, U+FEFF
// not), where GPT-2's reference encoders use JavaScript's.
//
// Text is bytes, not always UTF-8. Added tokens (special or not) are found
// first, in the text as given, the longest where several start at one
// place, and are their ids. Under NFC each stretch of well-formed UTF-8
// between them (and between bytes that are not UTF-8, which stay as they
// are) is then put in Unicode's NFC (ICU's), so "e\u0301" encodes as "é".
// The text between them is split into words: a byte that is not part of
// well-formed UTF-8 is a word alone, and a pattern runs on each stretch of
// well-formed text between such bytes, seeing after a stretch's end a
// character that is neither space, letter nor digit (so "a \xff" splits as
// "a", " ", "\xff", as GPT-2's hand-written pre-tokenizer does). Each word's
// bytes are merged by rank. Any bytes encode and decode back to their
// normalized form (Normalize): to themselves without a normalizer, and
// under NFC when they are in NFC already.
// A match that runs past PCRE2's limits (a pathological pattern) leaves the
// rest of that stretch one word.
#ifndef PTRAIN_COMMON_HF_TOKENIZER_H_
#define PTRAIN_COMMON_HF_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer.h"

namespace ptrain {

class HfTokenizer : public Tokenizer {
 public:
  // A tokenizer.json's bytes (`path` names it in errors; OpenTokenizer's
  // "hf:PATH" reads the file). InvalidArgument naming the field and what
  // is wrong: not JSON, a model, normalizer (but NFC), pre-tokenizer or
  // decoder that is not implemented (named), a merge of tokens not in the
  // vocabulary, an id given twice or outside [0, number of tokens) (ids
  // number the tokens without gaps), a regular expression that does not
  // compile.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Parse(
      std::string_view json, absl::string_view path);
  ~HfTokenizer() override;
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;

  // One more than the largest id of the vocabulary and the added tokens.
  int size() const override;
  // The added special token that separates documents, by its content, the
  // first of <|end_of_text|> (Llama 3), <|endoftext|> (GPT-2, Qwen2), </s>,
  // <|im_end|> that the file has; -1 when none.
  int32_t end_of_text() const override;
  // Thread-safe.
  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string Decode(const std::vector<int32_t>& ids) const override;
  // A token's bytes, an added token's content; 0 <= id < size() (aborts
  // otherwise).
  std::string Piece(int32_t id) const override;

  // `text` as Encode sees it: under NFC, the text between added tokens in
  // NFC (stretches of well-formed UTF-8; other bytes as they are); without
  // a normalizer, `text`. Decode(Encode(text)) is this.
  std::string Normalize(std::string_view text) const;
  // The words Encode merges within, in order (added tokens whole); put
  // back together they are Normalize(text).
  std::vector<std::string> Split(std::string_view text) const;

 private:
  struct Tables;
  explicit HfTokenizer(std::unique_ptr<const Tables> tables);
  std::unique_ptr<const Tables> t_;
};

}  // namespace ptrain

#endif  // PTRAIN_COMMON_HF_TOKENIZER_H_
