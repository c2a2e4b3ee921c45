// `ptworker prepare`: a folder of text files becomes llm.c token shards
// (gpt2, a SentencePiece model, or one it trains), the tokenizer file
// beside them, and a manifest that lets an interrupted run continue. Not a
// data loader (worker/engine/data/data.h reads what this writes) and not a
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
#include "worker/prepare_flags.h"
#include "worker/threads.h"

namespace ptrain {

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

}  // namespace ptrain

#endif  // PTRAIN_WORKER_PREPARE_H_
