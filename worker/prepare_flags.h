// The flags of `ptworker prepare`, its limits and what it returns
// (worker/prepare.h runs it; its units read the flags).
#ifndef PTRAIN_WORKER_PREPARE_FLAGS_H_
#define PTRAIN_WORKER_PREPARE_FLAGS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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
  std::string
      tokenizer;  // gpt2 | spm:MODEL | hf:TOKENIZER_JSON | spm-train:VOCAB
  std::string spm_type;             // bpe (default) | unigram; spm-train only
  std::vector<std::string> inputs;  // files or glob(3) patterns
  std::string out;                  // the output folder
  double val_fraction = 0.005;      // [0, 0.5]; 0: no validation shard
  int64_t shard_tokens = 100'000'000;
  int threads = 0;  // encoding threads; 0: the cores this process may use
  // JSON lines: the field that holds a document's text, a dotted path
  // into nested objects ("meta.text"); and whether a line that is not
  // JSON or lacks it is left out and counted (else it is refused).
  std::string field = "text";
  bool skip_bad_lines = false;

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

}  // namespace ptrain

#endif  // PTRAIN_WORKER_PREPARE_FLAGS_H_
