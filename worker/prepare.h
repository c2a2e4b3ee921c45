// `ptworker prepare`: a folder of text files becomes llm.c token shards
// (gpt2, a SentencePiece model, or one it trains), the tokenizer file
// beside them, and a manifest that lets an interrupted run continue. Not a
// data loader (worker/engine/data.h reads what this writes) and not a
// tokenizer (common/tokenizer.h).
//
// Output, in --out (NAME is its last part):
//   NAME_val_000000.bin …, NAME_train_000000.bin …  llm.c token files
//   NAME_tokenizer.bin   llm.c's tokenizer file (jobs and llm.c decode)
//   NAME_spm.model       the model spm-train:VOCAB trained
//   NAME_prepare.json    the manifest (settings, inputs, shards, progress)
// Each file is written under a temporary name (or none: O_TMPFILE),
// fsynced, then renamed: a shard's name never shows a half-written file.
//
// The token stream: each input file is one document, <|endoftext|> (or
// the SentencePiece model's </s>) before it. Files are cut into chunks of
// 1 to 2 MiB (SentencePiece: 64 to 128 KiB) at content-defined points
// (CutPoint: a line start, else a space, else a character start; GPT-2's
// ids change only at the last kind; SentencePiece's may, a chunk being
// encoded as a sentence of its own), so that memory does not grow with a
// line's length; encoded by worker threads, written by the calling thread
// in chunk order: the bytes depend on the inputs and flags, never on the
// thread count.
//
// The validation split samples the whole stream, every file of at least
// kPrepareMinValShareBytes / val_fraction bytes included: the stream is
// divided into spans (such a file, or consecutive smaller files up to that
// size; a smaller rest joins the span before it); a span holds out
// val_fraction of its bytes in m pieces of at most kPrepareValPieceBytes,
// one in each m-th of the span at an offset drawn from a fixed seed, each
// end moved to the next cut point (CutPoint; a piece that starts a file
// starts there). Validation chunks are written first, then the train
// chunks, each split in stream order; end of text goes before each
// document and before text that follows a piece of the other split. The
// plan depends on the inputs and flags only.
#ifndef PTRAIN_WORKER_PREPARE_H_
#define PTRAIN_WORKER_PREPARE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/threads.h"

namespace ptrain {

// Chunks of this size to twice it (CutPoint): GPT-2's encoder goes as fast
// on any; SentencePiece's takes longer per byte the longer its input.
inline constexpr int64_t kPrepareChunkBytes = int64_t{1} << 20;
inline constexpr int64_t kPrepareSpmChunkBytes = int64_t{64} << 10;
inline constexpr int64_t kPrepareMinShardTokens = 1024;
// Validation pieces are planned at most this long (before their ends move
// to cut points); a span of the stream holds out its share of at least
// kPrepareMinValShareBytes in pieces of its own.
inline constexpr int64_t kPrepareValPieceBytes = 4096;
inline constexpr int64_t kPrepareMinValShareBytes = 512;
// llm.c's header counts a shard's tokens in an int32.
inline constexpr int64_t kPrepareMaxShardTokens = 2147483647;
// 256 bytes, 3 special pieces and one more: below that SentencePiece's
// byte fallback leaves no room for a single learned piece.
inline constexpr int kPrepareMinSpmVocab = 260;

// The flags of `ptworker prepare` (docs/data.md).
struct PrepareFlags {
  std::string tokenizer;            // gpt2 | spm:MODEL | spm-train:VOCAB
  std::string spm_type;             // bpe (default) | unigram; spm-train only
  std::vector<std::string> inputs;  // files or glob(3) patterns
  std::string out;                  // the output folder
  double val_fraction = 0.005;      // [0, 0.5]; 0: no validation shard
  int64_t shard_tokens = 100'000'000;
  int threads = 0;  // encoding threads; 0: the cores this process may use

  // Not flags. The chunk size, 0: the tokenizer's (kPrepareChunkBytes for
  // gpt2, kPrepareSpmChunkBytes for SentencePiece); tests make it small.
  // Recorded in the manifest: a resume must use the same.
  int64_t chunk_bytes = 0;
  // Test hook: stop once this many shards were completed by this run
  // (0: never), as a crash would: `stop_exits` exits the process with 1
  // at once, else Prepare returns Aborted.
  int64_t stop_after_shards = 0;
  bool stop_exits = false;
  // No progress lines (tests); warnings and the summary still come.
  bool quiet = false;
  // Shards under NAME.tmp as where O_TMPFILE does not work (tests).
  bool named_temporaries = false;
  // Test hook: runs when --out is about to be created (it was not there),
  // as another run would create it at that moment.
  std::function<void()> before_create;
};

// What a preparation holds once Prepare returns.
struct PrepareResult {
  bool already_complete = false;  // nothing was written this time
  int64_t input_bytes = 0;
  int64_t tokens = 0;
  int val_shards = 0, train_shards = 0;
  int64_t bytes_this_run = 0;  // input encoded by this run (a resume: less)
  double seconds = 0;          // of this run
};

// Runs a preparation, or continues the one --out holds with the same
// settings. InvalidArgument, NotFound, PermissionDenied or
// FailedPrecondition for bad input (each naming the flag, nothing written
// or left behind); other codes for failures at run time. Warnings (input
// that is not UTF-8) and progress go to stderr.
absl::StatusOr<PrepareResult> Prepare(const PrepareFlags& flags);

// `ptworker prepare`: Prepare, its summary on stdout, one error line on
// stderr; returns ptworker's exit code (0, 2 bad input, 1 otherwise).
// Reads the test hook PTRAIN_TEST_PREPARE_STOP_AFTER_SHARDS when set.
int RunPrepare(PrepareFlags flags, const NodeShare& node);

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

#endif  // PTRAIN_WORKER_PREPARE_H_
