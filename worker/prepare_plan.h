// What a preparation will do, found before anything is written: its flags
// checked, the tokenizer they name, the input files resolved and cut into
// chunks (the plan); and the error and read helpers every unit of prepare
// uses. Not a public interface: callers include worker/prepare.h.
//
// The units: prepare_plan.cc (this, and prepare.h's cut points),
// prepare_output.cc (the output folder, shard files, the manifest),
// prepare.cc (encoding, the Preparation that runs it, Prepare).
#ifndef PTRAIN_WORKER_PREPARE_PLAN_H_
#define PTRAIN_WORKER_PREPARE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/confined_fs.h"
#include "worker/prepare.h"

namespace ptrain::prepare_internal {

absl::Status Bad(auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

absl::Status Errno(absl::string_view what, absl::string_view path);

// pread until `n` bytes or the end of the file; the count read.
absl::StatusOr<int64_t> ReadAt(int fd, char* buf, int64_t n, int64_t at,
                               absl::string_view path);

// ---------------------------------------------------------------- flags

enum class TokenizerKind { kGpt2, kSpm, kSpmTrain };

struct TokenizerChoice {
  TokenizerKind kind = TokenizerKind::kGpt2;
  std::string model;  // spm: the model's path
  int vocab = 0;      // spm-train
  std::string type;   // spm-train: bpe | unigram
};

absl::StatusOr<TokenizerChoice> ParseTokenizer(const PrepareFlags& f);

absl::Status CheckNumbers(const PrepareFlags& f);

// ---------------------------------------------------------------- inputs

struct InputFile {
  std::string path;      // as matched
  std::string absolute;  // what the manifest records
  int64_t size = 0;
  int64_t mtime_ns = 0;
};

// Every --input's files in order: a pattern's matches sorted (glob(3)),
// each file once (the first time it is named).
absl::StatusOr<std::vector<InputFile>> ResolveInputs(
    const std::vector<std::string>& patterns, const ConfinedFs& fs);

// ---------------------------------------------------------------- plan

struct Chunk {
  int file = 0;  // index into the inputs
  int64_t begin = 0, end = 0;
  // End of text goes before it: the document's start, or the first chunk
  // after text that went to the other split.
  bool first = false;
  bool val = false;
};

// The chunks in the order they are written: the validation chunks, then
// the train chunks, each in stream order.
struct Plan {
  std::vector<Chunk> chunks;
  int64_t val_chunks = 0;  // the first ones
  int64_t val_bytes = 0;
  int64_t total_bytes = 0;
};

absl::StatusOr<Plan> MakePlan(const std::vector<InputFile>& inputs,
                              const PrepareFlags& f, const ConfinedFs& fs);

}  // namespace ptrain::prepare_internal

#endif  // PTRAIN_WORKER_PREPARE_PLAN_H_
