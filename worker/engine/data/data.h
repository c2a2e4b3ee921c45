// Training data: text files tokenized at start (the char tokenizer, or
// data.tokenizer's: gpt2, spm:MODEL, hf:TOKENIZER_JSON), llm.c token files
// (.bin) with the tokenizer that decodes their samples, a text's
// train/validation split (pieces drawn across the whole text, LoadTokenData),
// and the sampler whose global batch at step s is a pure function of (seed, s)
// — the same in every parallel layout.
#ifndef PTRAIN_WORKER_ENGINE_DATA_DATA_H_
#define PTRAIN_WORKER_ENGINE_DATA_DATA_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/confined_fs.h"
#include "common/tokenizer.h"
#include "ptrain/v1/job.pb.h"

struct XXH64_state_s;  // xxhash.h's streaming state

namespace ptrain {

// Maps each distinct Unicode code point of a UTF-8 text to an id, in code
// point order: a character of several UTF-8 bytes (é, 中, 😀) is one token,
// so whatever ids a model samples decode to whole characters.
class CharTokenizer : public Tokenizer {
 public:
  // The most distinct characters: ids travel as uint16 in a TokenStream.
  static constexpr int kMaxSize = 65535;

  CharTokenizer() = default;
  // The tokenizer whose characters, in id order, are the UTF-8 text `vocab`
  // (vocab() of another, as a checkpoint records it; FromVocab checks one).
  explicit CharTokenizer(std::string_view vocab);
  // The tokenizer of `text`. InvalidArgument naming `field` and `path` when
  // the text is not UTF-8 (with the byte offset and line of the first byte
  // that is not) or has more than kMaxSize distinct characters.
  static absl::StatusOr<CharTokenizer> FromText(std::string_view text,
                                                absl::string_view field,
                                                absl::string_view path);
  // The tokenizer of a recorded vocabulary; InvalidArgument saying why
  // when `vocab` is not UTF-8 or its characters are not strictly
  // increasing code points (at most kMaxSize).
  static absl::StatusOr<CharTokenizer> FromVocab(std::string_view vocab);

  // The characters in id order, as UTF-8.
  const std::string& vocab() const { return vocab_; }
  int size() const override { return static_cast<int>(chars_.size()); }
  // Characters outside the vocabulary, and bytes that are not UTF-8, are
  // dropped.
  std::vector<int32_t> Encode(std::string_view text) const override;
  // UTF-8 whatever the ids: each id is a whole character; ids outside the
  // vocabulary are dropped.
  std::string Decode(const std::vector<int32_t>& ids) const override;
  std::string Piece(int32_t id) const override;

 private:
  void Add(char32_t c);  // the next id's character

  std::string vocab_;
  std::vector<char32_t> chars_;  // chars_[id]
  // (character, id) sorted by character: what Encode looks up.
  std::vector<std::pair<char32_t, int32_t>> index_;
};

// Appends the character of code point `c` (a Unicode scalar value) to *out
// as UTF-8.
void AppendChar(char32_t c, std::string* out);

// The digest of a job's tokens (TokenData::digest, which checkpoints
// record): XXH64 over the training split's tokens as they lie in their
// files, in order, then its token count (uint64), then the same of the
// validation split.
class DataDigest {
 public:
  DataDigest();
  ~DataDigest();
  DataDigest(const DataDigest&) = delete;
  DataDigest& operator=(const DataDigest&) = delete;
  void Add(const void* bytes, size_t n);
  // The end of a split of `tokens` tokens.
  void EndSplit(int64_t tokens);
  uint64_t value() const;

 private:
  XXH64_state_s* state_;
};

// A read-only run of tokens: a vector of its own (text data), or the body
// of an llm.c token file mapped read-only, whose pages the kernel shares
// among every rank of the machine that maps the file and reads only where
// batches are drawn. Rewriting a mapped file in place is undefined for the
// run that maps it; truncating it ends the rank (exit 1, a message naming
// the file, from a SIGBUS handler) and the job restarts from its last
// checkpoint. Data tools write a new file and rename it, which a running
// job does not see.
class TokenStream {
 public:
  TokenStream() = default;
  // A narrow stream (uint16 ids) and a wide one (uint32 ids: vocabularies
  // of more than 65536 tokens).
  explicit TokenStream(std::vector<uint16_t> tokens);
  explicit TokenStream(std::vector<uint32_t> tokens);
  TokenStream(TokenStream&& o) noexcept;
  TokenStream& operator=(TokenStream&& o) noexcept;
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;
  ~TokenStream();

  // The llm.c token file open as `fd` (`field` and `path` name it in
  // errors): its header checked as ParseTokenFile checks it, its body
  // mapped (version 1: narrow, version 2: wide) and read once, in pieces
  // (not through the mapping, so that none of it stays resident: a corpus
  // larger than memory loads), every token checked to be below vocab_size
  // and, with `digest`, added to it.
  static absl::StatusOr<TokenStream> MapTokenFile(int fd,
                                                  absl::string_view field,
                                                  absl::string_view path,
                                                  int vocab_size,
                                                  DataDigest* digest = nullptr);

  size_t size() const { return size_; }
  bool wide() const { return wide_; }
  // Token i (i < size()).
  int32_t operator[](size_t i) const {
    return wide_ ? static_cast<int32_t>(data32_[i]) : data_[i];
  }
  // A narrow stream's ids (null for a wide one).
  const uint16_t* data() const { return data_; }
  const uint16_t* begin() const { return data_; }
  const uint16_t* end() const { return data_ + size_; }
  // A wide stream's ids (null for a narrow one).
  const uint32_t* data32() const { return data32_; }
  // The ids as they lie in memory (2 or 4 bytes each).
  const void* bytes() const {
    return wide_ ? static_cast<const void*>(data32_) : data_;
  }
  size_t token_bytes() const { return wide_ ? 4 : 2; }
  bool mapped() const { return map_ != nullptr; }

  // A sequence of T tokens from `at` (at + T < size()): inputs the tokens
  // at..at+T-1, targets at+1..at+T, as int32.
  void CopyWindow(size_t at, int T, int32_t* inputs, int32_t* targets) const;
  // A mapped stream that CopyWindow read since the last call: its pages
  // leave this process's resident memory (MADV_DONTNEED; they stay in the
  // page cache, shared by the machine's ranks, and a later read faults
  // them back in). The step feed calls it after each batch, so that a
  // rank's resident memory does not grow with the corpus it has read.
  void ReleasePages() const;

 private:
  void Reset();

  std::vector<uint16_t> owned_;
  std::vector<uint32_t> owned32_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  int guard_ = -1;  // the mapping's slot in the SIGBUS handler's table
  const uint16_t* data_ = nullptr;
  const uint32_t* data32_ = nullptr;
  bool wide_ = false;
  size_t size_ = 0;
  // CopyWindow read it since ReleasePages (which a const stream may do).
  mutable std::atomic<bool> read_{false};
};

// The tokens of a split: the runs of a text that belong to it, in order
// (data.path), or one token file, or the shards of a corpus in order
// (data.train_bin: 'fineweb_train_*.bin').
using TokenShards = std::vector<TokenStream>;
int64_t TokenCount(const TokenShards& shards);

// A source of a blend (data.blend): its shards are train[train_begin,
// train_end) and val[val_begin, val_end) of the TokenData.
struct BlendPart {
  std::string name;
  double weight = 0;  // its share of the training sequences (sum 1)
  size_t train_begin = 0, train_end = 0, val_begin = 0, val_end = 0;
};

struct TokenData {
  // A blend's shards: every source's in the order of data.blend.
  TokenShards train, val;
  // data.blend's sources; empty for one source (data.path, train_bin).
  std::vector<BlendPart> blend;
  int vocab_size = 0;
  // Set for text data under the char tokenizer: the vocabulary recorded
  // with the model.
  bool has_tokenizer = false;
  CharTokenizer tokenizer;
  // data.tokenizer's otherwise (gpt2, spm:MODEL, hf:TOKENIZER_JSON, or the
  // llm.c tokenizer
  // file beside the token files, which only decodes); null when there is
  // none (samples are printed as ids).
  std::shared_ptr<const Tokenizer> words;
  // The tokenizer of prompts and samples, if any.
  const Tokenizer* text_tokenizer() const {
    return has_tokenizer ? &tokenizer : words.get();
  }
  // XXH64 of the train split's tokens and count, then the validation
  // split's: the same only for the same tokens in the same split, wherever
  // the files lie. Recorded in checkpoints, for `latest` to tell them apart.
  uint64_t digest = 0;
};

// Narrow token streams (uint16 ids) hold vocabularies of at most this
// many tokens; larger ones are wide (uint32).
constexpr int kMaxTokenStreamVocab = 65536;

// Text data tokenized at start is at most this large; larger corpora are
// prepared into token files once (`ptworker prepare`).
constexpr int64_t kMaxTokenizedTextBytes = int64_t{64} << 20;

// data.path's validation pieces are about this many tokens, or two
// sequences and their targets (2·(block_size+1)) when that is more.
constexpr int64_t kValPieceTokens = 256;

// data.tokenizer's tokenizer for the data of `spec` (read through `fs`):
// null for the char tokenizer and for token files without a tokenizer.
// "auto" (or empty) means the char tokenizer for data.path, and for
// data.train_bin what `ptworker prepare` wrote beside it, named by the
// pattern's file name up to its last "_train" (data/c/c_train_*.bin:
// data/c/c_…): the SentencePiece model it trained (c_spm.model), else
// llm.c's tokenizer file (c_tokenizer.bin) — GPT-2's tokenizer when its
// pieces are GPT-2's, else a tokenizer that only decodes. "char" with
// token files is read as "auto" (token files carry no text to take
// characters from).
absl::StatusOr<std::shared_ptr<const Tokenizer>> OpenDataTokenizer(
    const v1::DataSpec& spec, const ConfinedFs& fs = ConfinedFs());
// The name of the tokenizer OpenDataTokenizer opens: data.tokenizer where
// it is one OpenTokenizer takes (gpt2, spm:PATH, hf:PATH); for token files,
// "spm:PREFIX_spm.model", "gpt2" (llm.c's tokenizer file of GPT-2's
// pieces) or "llmc:PREFIX_tokenizer.bin" (another, which only decodes);
// "" where it opens none.
absl::StatusOr<std::string> DataTokenizerName(
    const v1::DataSpec& spec, const ConfinedFs& fs = ConfinedFs());

// Loads the data of `spec` through `fs` (confined to the data roots),
// checking it against the model's vocabulary (model_vocab_size 0: take the
// data's) and the context length. data.path's tokens (n of them) are
// split so that validation samples the whole text: floor(n·val_fraction)
// tokens in m pieces (that count over the piece length, kValPieceTokens
// or 2·(block_size+1), rounded; at least one), one in each m-th of the
// text at an offset drawn from a fixed seed (the same whatever
// train.seed, so runs compare); each run of tokens between pieces is a
// train shard and each run of pieces a validation shard, so that no
// sequence spans a seam. Errors name the spec field:
// "data.train_bin: bad magic 1234 (expected 20240520)". data.train_bin and
// data.val_bin are a file, or a pattern of shards with wildcards (* ? [..])
// in the file name only, matched in sorted order (a file whose name is
// the pattern itself is that file).
absl::StatusOr<TokenData> LoadTokenData(const v1::DataSpec& spec,
                                        int model_vocab_size, int block_size,
                                        const ConfinedFs& fs = ConfinedFs());

// The tokens of an llm.c token file's bytes (256 × int32 header: magic
// 20240520, version 1 or 2, token count; then uint16 tokens, version 1, or
// uint32, version 2), each checked to be below vocab_size. `field` and
// `path` name the file in errors.
absl::StatusOr<std::vector<int32_t>> ParseTokenFile(absl::string_view bytes,
                                                    absl::string_view field,
                                                    absl::string_view path,
                                                    int vocab_size);

// Writes an llm.c token file (for tests and tools): version 1 of uint16
// tokens, version 2 of uint32.
absl::Status WriteTokenFile(const std::string& path,
                            const std::vector<uint16_t>& tokens);
absl::Status WriteTokenFile(const std::string& path,
                            const std::vector<uint32_t>& tokens);

// Batch b of a split: sequence i starts at a position drawn from (seed,
// stream, b·global_batch + i) among the positions of every shard that
// leave T+1 tokens in that shard (a sequence never spans two shards). A
// rank fills only its own sequences.
class BatchSampler {
 public:
  BatchSampler(absl::Span<const TokenStream> shards, int T, int global_batch,
               uint64_t seed, std::string_view stream);
  BatchSampler(const TokenShards* shards, int T, int global_batch,
               uint64_t seed, std::string_view stream)
      : BatchSampler(absl::MakeConstSpan(*shards), T, global_batch, seed,
                     stream) {}
  // inputs and targets are (count,T): sequences [first, first+count) of
  // batch b; targets are inputs shifted by one token.
  void Fill(int64_t b, int first, int count, int32_t* inputs,
            int32_t* targets) const;

 private:
  absl::Span<const TokenStream> shards_;
  // starts_[k]: the sequence starts in shards before k (size + 1 entries).
  std::vector<uint64_t> starts_;
  const int T_, global_batch_;
  const uint64_t seed_, stream_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_DATA_DATA_H_
