// What `ptworker prepare` writes and finds in --out: the folder checked,
// the files' names, shard files, the manifest (its settings, how another
// run's differ, the shards it lists). Not a public interface: callers
// include worker/prepare.h; prepare_plan.h lists the units.
#ifndef PTRAIN_WORKER_PREPARE_OUTPUT_H_
#define PTRAIN_WORKER_PREPARE_OUTPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/confined_fs.h"
#include "nlohmann/json.hpp"
#include "worker/prepare_flags.h"
#include "worker/prepare_plan.h"

namespace ptrain::prepare_internal {

using nlohmann::json;

// 2: shards record where they end ("end"); text cut within a window
// (CutPoint). 3: validation pieces drawn across the stream (prepare.h).
inline constexpr char kFormat[] = "ptrain-prepare-3";
// The longest --out name whose files' names (NAME_tokenizer.bin.PID.tmp,
// NAME_train_NNNNNN.bin.tmp, …) stay within NAME_MAX (255) bytes.
inline constexpr size_t kMaxOutName = 255 - 32;
// Writes of a shard go by this.
inline constexpr size_t kWriteBuffer = size_t{1} << 20;

// ---------------------------------------------------------------- files

// ---------------------------------------------------------------- names

std::string ShardName(const std::string& name, bool val, int64_t index);

// What this command leaves when it is stopped mid-write: a shard's name +
// ".tmp" (where O_TMPFILE is refused), or the tokenizer file's, the
// SentencePiece model's or the manifest's + ".PID.tmp" (ReplaceFile).
bool IsOurTemporary(std::string_view entry, const std::string& name);

// ---------------------------------------------------------------- manifest

std::string Hex64(uint64_t v);

// The settings a preparation is made with: a rerun must have the same.
json Settings(const PrepareFlags& f, const TokenizerChoice& c,
              const std::string& model_sha256,
              const std::vector<InputFile>& inputs);

// How the settings `was` (a manifest's, its shape checked) differ from
// `now`, "" if not.
std::string Differences(const json& was, const json& now);

// ---------------------------------------------------------------- shards

// A shard being written: an unnamed file (O_TMPFILE) linked in once it is
// whole, or NAME.tmp renamed; either way its name shows it whole or not
// at all. A shard that is not committed leaves nothing (a named
// temporary is removed; one left by a kill is removed by the next run).
class ShardFile {
 public:
  // `version`: the token file's (token_file.h), 1 (uint16 tokens) or 2
  // (uint32).
  ShardFile(int dirfd, std::string dir, std::string name, int32_t version,
            bool unnamed)
      : dirfd_(dirfd),
        dir_(std::move(dir)),
        name_(std::move(name)),
        tmp_(name_ + ".tmp"),
        version_(version),
        unnamed_(unnamed) {}
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;
  ~ShardFile();

  absl::Status Open();

  int64_t tokens() const { return tokens_; }
  const std::string& name() const { return name_; }

  // Ids below the version's bound (65536 for version 1).
  absl::Status Append(const uint32_t* t, size_t n);

  // Header, fsync, the file's XXH64 (read back), then its name.
  absl::StatusOr<uint64_t> Commit();

 private:
  std::string Path() const { return dir_ + "/" + name_; }

  absl::Status Flush();

  absl::StatusOr<uint64_t> Digest();

  const int dirfd_;
  const std::string dir_, name_, tmp_;
  const int32_t version_;
  const bool unnamed_;
  int fd_ = -1;
  std::string buf_;
  int64_t written_ = 0;  // bytes in the file
  int64_t tokens_ = 0;
  bool linked_ = false, committed_ = false;
};

// Whether the output folder takes O_TMPFILE files that can be linked in
// (not every filesystem does; then shards are written as NAME.tmp).
bool UnnamedFilesWork(int dirfd, const std::string& probe);

// ---------------------------------------------------------------- output

// The output folder, checked before anything is written.
struct OutDir {
  std::string path;  // as given, without trailing slashes
  std::string name;  // its last part: the files' prefix
  bool exists = false;
};

absl::StatusOr<OutDir> CheckOut(const std::string& flag, const ConfinedFs& fs);

std::string StillYours(const OutDir& o);

// The manifest --out holds, null when none; errors when the folder is not
// one this command may continue (bad input): shards without a manifest, a
// file that is not JSON, a field missing or of another type than this
// version writes (the error names it and the rule).
absl::StatusOr<json> ReadManifest(const OutDir& o, const ConfinedFs& fs);

// The manifest `m` (ReadManifest's) agrees with itself and the folder:
// its shards named in order (val, then train, each from 0), each there
// and of its size, each ending (its "end") at or after the one before;
// `tokens` their sum; `next` where the last ends; `complete` only at the
// end; and no shard in the folder that it does not list. Else InvalidArgument
// (DataLoss for a shard missing or of another size) naming what disagrees:
// continuing would write data twice or over shards.
absl::Status CheckShards(const OutDir& o, const json& m, const ConfinedFs& fs);

// Counts of a manifest's shards by split.
int CountShards(const json& m, bool val);

}  // namespace ptrain::prepare_internal

#endif  // PTRAIN_WORKER_PREPARE_OUTPUT_H_
