// The inputs of `ptworker prepare` that are not plain text as they lie:
// JSON lines (.jsonl, .json; a document in one field of each line) and
// files compressed with gzip (.gz) or zstd (.zst). Each is decoded once,
// streaming, into a text file of its own in --out/NAME_decoded/ (its
// documents separated by a NUL byte, which JSON text cannot hold: '\0' in
// a document is left out and counted), written under a temporary name and
// renamed: a resumed preparation reuses each one whole and decodes the
// rest. The plan (prepare_plan.h) then cuts these files as it cuts text
// files, and the encoder puts end of text between their documents. The
// folder goes once the shards are complete. Not a public interface:
// prepare_plan.h lists the units.
#ifndef PTRAIN_WORKER_PREPARE_DECODE_H_
#define PTRAIN_WORKER_PREPARE_DECODE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/confined_fs.h"
#include "worker/prepare_flags.h"
#include "worker/prepare_plan.h"

namespace ptrain::prepare_internal {

// A JSON line longer than this is bad input (refused, or skipped with
// --skip-bad-lines): decoding holds one line and its parse at a time.
inline constexpr int64_t kPrepareMaxJsonLineBytes = int64_t{64} << 20;

// JSON lines are decoded in pieces of about this many bytes of whole
// lines, on several threads, and written in input order: the decoded file
// is the same whatever the threads and the piece size.
inline constexpr int64_t kDecodePieceBytes = int64_t{4} << 20;

// The sizes above; tests make them small.
struct DecodeLimits {
  int64_t piece_bytes = kDecodePieceBytes;
  int64_t max_line_bytes = kPrepareMaxJsonLineBytes;
};

enum class Codec { kNone, kGzip, kZstd };

// What an input holds, by its name's ending: .gz or .zst compressed;
// then .jsonl or .json JSON lines, anything else text.
struct InputKind {
  Codec codec = Codec::kNone;
  bool json_lines = false;
  bool decoded() const { return codec != Codec::kNone || json_lines; }
};
InputKind KindOf(std::string_view path);

// Whether a file found in a folder given as --input is one prepare reads:
// .txt, .jsonl or .json, each also as .gz or .zst. Others (README.md,
// .parquet, ...) are left out of a folder, not of a name given alone.
bool IsCorpusFileName(std::string_view name);

// The bytes of a file as its codec decompresses them, a block at a time.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Up to `cap` bytes into `dst`; 0 at the end. InvalidArgument, naming
  // the file, for a compressed stream that is corrupt or ends early.
  virtual absl::StatusOr<size_t> Read(char* dst, size_t cap) = 0;
};

// `fd` (owned) read as `codec` decodes it; `name` names it in errors.
std::unique_ptr<ByteSource> OpenByteSource(UniqueFd fd, Codec codec,
                                           std::string name);

inline constexpr size_t kJsonLinePadding = 64;

// The text of one field of JSON lines, line by line: `field` is "text",
// or a dotted path into nested objects ("meta.body"). Parsed with
// simdjson, the whole line checked (UTF-8 included). Not thread-safe: one
// a thread.
class JsonField {
 public:
  explicit JsonField(const std::string& field);
  ~JsonField();
  // Appends the field's text in `line` to `out`; InvalidArgument saying
  // why not (not JSON, no such field, not a string), `out` unchanged. NUL
  // characters are left out and counted in `nuls`. The kJsonLinePadding
  // bytes past `line`'s end must be readable, whatever they hold (the
  // parser reads ahead in blocks): the rest of a buffer, or its capacity.
  absl::Status AppendText(std::string_view line, std::string* out,
                          int64_t* nuls);

 private:
  struct Parser;
  std::vector<std::string> path_;
  std::unique_ptr<Parser> parser_;
};

// What decoding one input found.
struct DecodeCounts {
  int64_t documents = 0;
  int64_t bad_lines = 0;  // skipped (--skip-bad-lines)
  int64_t first_bad = 0;  // the first skipped line's number
  std::string first_why;  // and why
  int64_t empty = 0;      // documents whose text is empty, left out
  int64_t nuls = 0;       // NUL characters left out
};

// Decodes the inputs that need it (KindOf) into `dir` (made if missing)
// on up to `threads` threads: files side by side, and the pieces of a
// file's JSON lines (`limits`) when there are fewer files than threads.
// A file already there under its name (a digest of the input's path, size,
// mtime and the flags that change its text) is reused. Returns the inputs as
// the plan reads them: text files as they are, the others' decoded files (their
// `documents` set for JSON lines, `shown` the input's name). Bad input (a bad
// line without --skip-bad-lines, a corrupt or truncated stream, a line too
// long) is InvalidArgument naming the file and line; the first in input
// order is returned whatever the threads did. `warn` gets one line a file
// for what was skipped or left out.
absl::StatusOr<std::vector<InputFile>> DecodeInputs(
    const std::vector<InputFile>& inputs, const PrepareFlags& f,
    const std::string& dir, int threads, const ConfinedFs& fs,
    const std::function<void(const std::string&)>& warn,
    const DecodeLimits& limits = {});

}  // namespace ptrain::prepare_internal

#endif  // PTRAIN_WORKER_PREPARE_DECODE_H_
