// What a preparation will do, found before anything is written: its flags
// checked, the tokenizer they name, the input files resolved and cut into
// chunks (the plan); and the error and read helpers every unit of prepare
// uses. Not a public interface (callers include worker/prepare.h), but for
// the cut points, which tests read too.
//
// The units: prepare_plan.cc (this, and prepare.h's cut points),
// prepare_decode.cc (JSON lines and compressed inputs into text files),
// prepare_output.cc (the output folder, shard files, the manifest),
// prepare.cc (encoding, the Preparation that runs it, Prepare).
#ifndef PTRAIN_WORKER_PREPARE_PLAN_H_
#define PTRAIN_WORKER_PREPARE_PLAN_H_

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/confined_fs.h"
#include "worker/prepare_flags.h"

namespace ptrain {

// The first position p >= `from` at which `text` may be cut so that
// GPT-2's pre-tokenizer splits both pieces as it splits the whole (so
// their ids, one after the other, are the whole's): text[p-1] is '\n',
// with a printable ASCII character other than space on each side; or
// text[p-1..p] is "\r\n" (cut between them), with such a character before
// the '\r' and after the '\n'. The pattern ends a word at such a '\n' (or
// '\r') whatever follows, and starts one after it whatever came before.
// text.size() when there is none.
size_t NextCutPoint(std::string_view text, size_t from);

// NextCutPoint over the bytes of file `fd` (`size` of them), reading
// `block` bytes at a time: the same answer whatever the block. `path`
// names the file in errors.
absl::StatusOr<int64_t> NextCutPointInFile(int fd, int64_t size, int64_t from,
                                           std::string_view path,
                                           int64_t block = 64 << 10);

// A window holds a whole UTF-8 character at least.
inline constexpr size_t kCutMinWindow = 4;

// Where prepare cuts `text` at or after `from`, at most `window` bytes
// (kCutMinWindow at least) past it, so that no chunk grows with the
// length of a line:
//  - the first line cut point (NextCutPoint) in [from, from + window];
//    when the text ends within the window without one, text.size();
//  - else the first space cut point there: p with text[p] == ' ' and a
//    printable ASCII character other than space at p - 1 and p + 1, cut
//    before the space. GPT-2's pre-tokenizer ends a word before such a
//    space and starts one at it whatever surrounds them, so the ids do
//    not change there either;
//  - else the first character start there (a byte that is not a UTF-8
//    continuation byte): a word may be cut in two;
//  - else from + window (bytes that belong to no character).
size_t CutPoint(std::string_view text, size_t from, size_t window);

// CutPoint over the bytes of file `fd` (`size` of them), reading at most
// the window and a few bytes around it: the same answer.
absl::StatusOr<int64_t> CutPointInFile(int fd, int64_t size, int64_t from,
                                       int64_t window, std::string_view path,
                                       int64_t block = 64 << 10);

// Where the chunks of `text` end as prepare cuts a file of chunk size
// `chunk_bytes`: each at CutPoint(text, start + chunk_bytes, window)
// (prepare's window is the chunk size: a chunk is at most twice it), the
// last at text.size().
std::vector<size_t> ChunkEnds(std::string_view text, size_t chunk_bytes,
                              size_t window);

}  // namespace ptrain

namespace ptrain::prepare_internal {

absl::Status Bad(auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

absl::Status Errno(absl::string_view what, absl::string_view path);

// pread until `n` bytes or the end of the file; the count read.
absl::StatusOr<int64_t> ReadAt(int fd, char* buf, int64_t n, int64_t at,
                               absl::string_view path);

// ---------------------------------------------------------------- flags

enum class TokenizerKind { kGpt2, kSpm, kSpmTrain, kHf };

struct TokenizerChoice {
  TokenizerKind kind = TokenizerKind::kGpt2;
  std::string model;  // spm: the model's path; hf: its tokenizer.json
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
  // Documents separated by NUL bytes, end of text between them (decoded
  // JSON lines, prepare_decode.h); else the file is one document.
  bool documents = false;
  // The input it was decoded from, as named in messages; "": `path`.
  std::string shown;
  const std::string& name() const { return shown.empty() ? path : shown; }
};

// A file's modification time in nanoseconds, as InputFile records it.
int64_t MtimeNs(const struct stat& st);

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
