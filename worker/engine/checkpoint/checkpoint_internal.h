// What the checkpoint's units share and nobody else uses: the format's
// names and limits, small helpers, the chunk-hashing file writer, and the
// steps of a save (prepare, write this rank's shard, commit) that
// SaveCheckpoint and BackgroundSave both take. Not a public interface:
// callers include checkpoint.h.
//
// The units: checkpoint.cc (these helpers, folders and their owners,
// CheckpointReader's reads), checkpoint_json.cc (typed access to manifest
// fields), checkpoint_manifest.cc (CheckpointReader::Open: the digest and
// the run's record), checkpoint_index.cc (the manifest's files and tensors),
// checkpoint_writer.cc (SaveCheckpoint), checkpoint_async.cc
// (BackgroundSave), llmc_format.cc (llm.c's GPT-2 files).
#ifndef PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_INTERNAL_H_
#define PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_INTERNAL_H_

#include <xxhash.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/checkpoint_commit.h"
#include "common/confined_fs.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/comm/comm.h"

namespace ptrain {

// Checksum granularity: a reader verifies whole chunks, so this bounds how
// much it reads beyond the slices it needs.
inline constexpr int64_t kChunkBytes = 64 << 10;
// The format written: 4 records the char tokenizer's vocabulary as the
// UTF-8 of its code points. 3, read too, recorded one byte per character
// (docs/checkpoints.md has the history).
inline constexpr char kFormat[] = "ptrain-checkpoint-4";
inline constexpr char kByteVocabFormat[] = "ptrain-checkpoint-3";
inline constexpr const char* kManifest = kManifestFile;
inline constexpr const char* kDigestFile = kManifestDigestFile;
inline constexpr char kField[] = "checkpoint.dir";

// Limits on what a reader accepts that more than one unit uses (the rest
// are in checkpoint_manifest.cc and checkpoint_index.cc; docs/checkpoints.md
// lists them all).
inline constexpr int64_t kMaxStep = int64_t{1} << 48;
inline constexpr int64_t kMaxWorld = 1 << 20;
inline constexpr size_t kMaxUidLength = 128;

std::string Errno(const std::string& what, const std::string& path);
// pread(2) of `bytes` at offset `at` into out, retried until all are read;
// false at a failure (errno says which) or the file's end.
bool PreadAll(int fd, char* out, int64_t bytes, int64_t at);
std::string Hex(uint64_t h);
std::string Join(const std::string& dir, const std::string& name);
// A name from a manifest, shortened for an error message.
std::string Quote(absl::string_view s);
// "step-NNNNNNNN" (8 or more digits) -> N, or -1.
int64_t StepNumber(absl::string_view name);
std::string StepName(int64_t step);
std::string ShapeString(const std::vector<int64_t>& shape);

// Writes a file through a buffer, hashing each kChunkBytes chunk
// (checkpoint_writer.cc).
class ChunkedWriter {
 public:
  ChunkedWriter() = default;
  ChunkedWriter(const ChunkedWriter&) = delete;
  ChunkedWriter& operator=(const ChunkedWriter&) = delete;
  ~ChunkedWriter();
  absl::Status Open(const ConfinedFs& fs, const std::string& path,
                    const std::string& field);
  absl::Status Write(const char* data, int64_t bytes);
  // Flushes, fsyncs and closes.
  absl::Status Finish();
  int64_t total() const { return total_; }
  const std::vector<uint64_t>& chunks() const { return chunks_; }

 private:
  static constexpr int64_t kBuffer = 8 << 20;
  void CloseChunk();
  absl::Status Flush();

  std::string path_;
  UniqueFd fd_;
  XXH64_state_t* state_ = nullptr;
  std::vector<char> buffer_;
  std::vector<uint64_t> chunks_;
  int64_t in_chunk_ = 0, total_ = 0;
};

// Writes `path` whole or not at all: `write` fills a ChunkedWriter on
// path + ".tmp", which is renamed to path once it succeeds and removed
// otherwise (checkpoint_writer.cc). Errors name `field`.
absl::Status WriteReplacing(
    const ConfinedFs& fs, const std::string& path, const std::string& field,
    const std::function<absl::Status(ChunkedWriter&)>& write);

// Sum of x over the world (x itself without one): how ranks agree.
double Agree(Communicator* world, double x);

// A save's folders: root/step-N, written as root/step-N.tmp.
struct SaveFolders {
  std::string root, final_dir, tmp;
};
SaveFolders FoldersOf(const std::string& root, int64_t step);

// The steps of a save (checkpoint_writer.cc), in order.
//
// Collective. Rank 0 prepares a clean step-N.tmp/ (a crashed save may have
// left one). True when this job committed the step already (nothing to
// write); FailedPrecondition when another job did.
absl::StatusOr<bool> PrepareSave(const SaveFolders& f,
                                 const CheckpointMeta& meta,
                                 Communicator* world, const ConfinedFs& cfs);
// Not collective: rank `rank` writes its runs to step-N.tmp/shard-R.bin,
// then a small index of what it wrote (shard-R.json).
absl::Status WriteShard(const SaveFolders& f, int rank,
                        const std::vector<ShardRun>& runs,
                        const SaveOptions& options);
// Collective, once every rank's WriteShard has returned (`wrote`, this
// rank's): rank 0 merges the indexes into the manifest, writes its digest
// last, commits by rename and prunes.
absl::Status CommitSave(const SaveFolders& f, const CheckpointMeta& meta,
                        const absl::Status& wrote, Communicator* world,
                        const SaveOptions& options);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_INTERNAL_H_
