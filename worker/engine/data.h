// Training data: the char tokenizer for text files, llm.c token files (.bin),
// the train/validation split, and the sampler whose global batch at step s is
// a pure function of (seed, s) — the same in every parallel layout.
#ifndef PTRAIN_WORKER_ENGINE_DATA_H_
#define PTRAIN_WORKER_ENGINE_DATA_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/confined_fs.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

// Maps each distinct byte of a text to an id in byte order.
class CharTokenizer {
 public:
  CharTokenizer() = default;
  explicit CharTokenizer(std::string vocab);  // vocab[id] is the character
  static CharTokenizer FromText(std::string_view text);

  const std::string& vocab() const { return vocab_; }
  int size() const { return static_cast<int>(vocab_.size()); }
  // Characters outside the vocabulary are dropped.
  std::vector<int32_t> Encode(std::string_view text) const;
  std::string Decode(const std::vector<int32_t>& ids) const;

 private:
  std::string vocab_;
  int id_of_[256];
};

struct TokenData {
  std::vector<uint16_t> train, val;
  int vocab_size = 0;
  // Set for text data: the tokenizer recorded with the model.
  bool has_tokenizer = false;
  CharTokenizer tokenizer;
};

// Loads the data of `spec` through `fs` (confined to the data roots),
// checking it against the model's vocabulary (model_vocab_size 0: take the
// data's) and the context length. Errors name the spec field:
// "data.train_bin: bad magic 1234 (expected 20240520)".
absl::StatusOr<TokenData> LoadTokenData(const v1::DataSpec& spec,
                                        int model_vocab_size, int block_size,
                                        const ConfinedFs& fs = ConfinedFs());

// The tokens of an llm.c token file's bytes (256 × int32 header: magic
// 20240520, version 1, token count; then uint16 tokens), each checked to be
// below vocab_size. `field` and `path` name the file in errors.
absl::StatusOr<std::vector<uint16_t>> ParseTokenFile(absl::string_view bytes,
                                                     absl::string_view field,
                                                     absl::string_view path,
                                                     int vocab_size);

// Writes an llm.c token file (for tests and tools).
absl::Status WriteTokenFile(const std::string& path,
                            const std::vector<uint16_t>& tokens);

// Batch b of a token stream: sequence i starts at a position drawn from
// (seed, stream, b·global_batch + i). A rank fills only its own sequences.
class BatchSampler {
 public:
  BatchSampler(const std::vector<uint16_t>* tokens, int T, int global_batch,
               uint64_t seed, std::string_view stream);
  // inputs and targets are (count,T): sequences [first, first+count) of
  // batch b; targets are inputs shifted by one token.
  void Fill(int64_t b, int first, int count, int32_t* inputs,
            int32_t* targets) const;

 private:
  const std::vector<uint16_t>* tokens_;
  const int T_, global_batch_;
  const uint64_t seed_, stream_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_DATA_H_
