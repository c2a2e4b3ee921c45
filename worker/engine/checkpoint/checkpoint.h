// Checkpoints (DESIGN.md §6, docs/checkpoints.md): one folder per step with
// manifest.json, its SHA-256 in manifest.sha256 and one shard file per rank,
// written into step-N.tmp/, fsynced, then renamed — a crash leaves the old
// set or the new set, never half of one. The manifest indexes every tensor
// (weights and Adam moments) by name, global shape and the global boxes
// (n-dimensional slices) each rank wrote, so any layout — any dp, tp, pp
// and ZeRO stage — reads exactly the slices it holds. Shard files carry an
// xxHash64 per 64 KiB chunk: a reader verifies what it reads without reading
// whole files. The digest makes the manifest tamper-evident; independently,
// every number in it is checked against the shard files and the model before
// any shard is read, so not even a manifest with a correct digest can make
// a reader crash, overflow or hang.
//
// All file access goes through a ConfinedFs (common/confined_fs.h).
//
// Also the llm.c GPT-2 weight format (export, and import via init_from).
//
// One header over several units: checkpoint_internal.h says which .cc
// holds what.
#ifndef PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_H_
#define PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/confined_fs.h"
#include "nlohmann/json_fwd.hpp"
#include "worker/engine/comm/comm.h"
#include "worker/engine/model/plan.h"

namespace ptrain {

// Names of the optimizer state of parameter `name` in the tensor index.
std::string ExpAvgName(const std::string& name);    // "optimizer.exp_avg.X"
std::string ExpAvgSqName(const std::string& name);  // "optimizer.exp_avg_sq.X"

// Everything a checkpoint records besides tensors.
struct CheckpointMeta {
  int64_t step = 0;  // optimizer steps completed
  int64_t tokens_seen = 0;
  int64_t optimizer_step = 0;  // AdamW's t (bias correction)
  uint64_t seed = 0;  // data sampler and sampling: pure in (seed, step)
  // Steps of data the run skipped (rollbacks, train.anomaly): step s reads
  // the batch of s + skipped_steps. 0 in checkpoints written before.
  int64_t skipped_steps = 0;
  GptConfig model;
  // The char tokenizer's characters in id order, as UTF-8 (CharTokenizer::
  // vocab()); "" for token files.
  std::string vocab;
  // TokenData::digest of the data it was trained on; unset when not
  // recorded (format 3), and then not written.
  std::optional<uint64_t> data_digest;
  std::string spec_yaml;  // the JobSpec that wrote it
  // The layout that wrote it: each mesh dimension's degree by name
  // (common/mesh.h). One not given is 1: the writer writes every
  // dimension, and one missing from an older checkpoint reads 1.
  std::map<std::string, int> degrees;
  int zero = 0, world = 1;
  // Whose it is: the coordinator's globally unique id of the job that wrote
  // it ($PTRAIN_JOB_UID), or the id of the standalone run that did
  // (NewRunUid); "" when a standalone run wrote it before runs had ids.
  std::string job_uid;
};

// A piece of a rank's state: the global box `box` of tensor `name`, its
// box.numel() elements at `data` in the box's row-major order.
struct ShardRun {
  std::string name;
  Box box;
  const float* data = nullptr;
};

// Reads boxes of named tensors (a checkpoint, an llm.c file).
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The box `box` of tensor `name` (global coordinates) into dst, in the
  // box's row-major order.
  virtual absl::Status Read(const std::string& name, const Box& box,
                            float* dst) = 0;
};

struct SaveOptions {
  // Prune to this many committed checkpoints of this job or run
  // (meta.job_uid); 0 keeps all. Another's checkpoints are never removed.
  int keep_last = 0;
  // Test hook, set only from the environment: sleep this long halfway
  // through writing the shard, so a test can kill the process mid-save.
  std::optional<double> pause_mid_write_s;
  ConfinedFs fs;  // where root may be (field "checkpoint.dir")
};

// The folder of step `step`'s checkpoint under root: root/step-NNNNNNNN.
std::string CheckpointFolder(const std::string& root, int64_t step);

// Collective over `world` (null for a single rank without MPI): every rank
// writes its runs to root/step-NNNNNNNN.tmp/shard-RRRRR.bin; rank 0 writes
// the manifest (every tensor of meta.model, whichever ranks hold it), then
// its digest, and commits. Returns the committed folder. A step already
// committed by this job is left as it is; one committed by another job (another
// job_uid) is FailedPrecondition.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& root,
                                           const CheckpointMeta& meta,
                                           const std::vector<ShardRun>& runs,
                                           Communicator* world,
                                           const SaveOptions& options);

// One checkpoint written in the background while training goes on
// (checkpoint.async_save): the same folder, files and commit as
// SaveCheckpoint, split where the writing is. Start copies the state into
// host memory the object keeps (and reuses), prepares the folder and
// starts a thread that writes this rank's shard; the thread makes no MPI
// call. Finish waits for it and commits. A process that dies in between
// leaves step-N.tmp/, as a crash during SaveCheckpoint does: the previous
// checkpoint stays the newest. At most one save is pending.
class BackgroundSave {
 public:
  BackgroundSave() = default;
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;
  // Waits for the thread; commits nothing.
  ~BackgroundSave();

  // Collective over `world`, as SaveCheckpoint. True when this job
  // committed meta.step already (nothing is pending then); errors as
  // SaveCheckpoint's preparation. The runs' data is copied before it
  // returns.
  absl::StatusOr<bool> Start(const std::string& root,
                             const CheckpointMeta& meta,
                             std::vector<ShardRun> runs, Communicator* world,
                             const SaveOptions& options);
  // Started and not finished.
  bool pending() const { return writer_.joinable(); }
  int64_t step() const { return meta_.step; }
  // Collective: whether every rank's thread has written its shard; never
  // waits for one.
  bool AllWritten(Communicator* world);
  // Collective: waits for this rank's thread, then commits as
  // SaveCheckpoint does (an error if any rank failed to write). Returns
  // the committed folder. Not pending afterwards, whatever the outcome.
  absl::StatusOr<std::string> Finish(Communicator* world);
  // Seconds the last finished thread took to write this rank's shard.
  double write_seconds() const { return write_seconds_; }

 private:
  CheckpointMeta meta_;
  SaveOptions options_;
  std::string root_;
  std::vector<float> snapshot_;
  std::vector<ShardRun> runs_;  // into snapshot_
  std::thread writer_;
  absl::Status wrote_;                // the thread's result
  std::atomic<bool> written_{false};  // set by the thread when done
  double write_seconds_ = 0;
};

// Committed checkpoint folders (step-N, N of 8 or more digits) under root,
// newest first; step-N.tmp, symlinks and anything else ignored. Empty when
// root does not exist; an error when it cannot be listed (or is outside the
// data roots).
absl::StatusOr<std::vector<std::string>> ListCheckpoints(
    const std::string& root, const ConfinedFs& fs = ConfinedFs());

// The job_uid recorded in checkpoint `dir`'s manifest ("" for none), read
// without verifying the rest: for deciding whose a checkpoint is.
absl::StatusOr<std::string> CheckpointJobUid(
    const std::string& dir, const ConfinedFs& fs = ConfinedFs());

// A new id for a run outside a coordinator, "run-YYYYMMDD-HHMMSS-xxxxxxxx"
// (UTC start, 32 random bits): its checkpoints' job_uid, so that it prunes
// only what it wrote. Collective over `world` (null: one rank): every rank
// gets rank 0's.
std::string NewRunUid(Communicator* world);

// The committed checkpoints under root, oldest first, whose step
// `will_save` accepts and whose manifest names another owner than
// `run_uid`: "step-N ('OWNER')". A run cannot save those steps (SaveCheckpoint
// refuses to overwrite another's), which a run can say at its start.
absl::StatusOr<std::vector<std::string>> OtherRunsCheckpointsAt(
    const std::string& root, const std::string& run_uid,
    const std::function<bool(int64_t)>& will_save,
    const ConfinedFs& fs = ConfinedFs());

class CheckpointReader : public TensorSource {
 public:
  // Reads the manifest, verifies it against manifest.sha256 and validates
  // every number in it against the shard files' sizes (docs/checkpoints.md
  // lists the rules). A folder without manifest.json is FailedPrecondition
  // "not a committed checkpoint"; anything else wrong is DataLoss
  // "checkpoint DIR is damaged: ...". Keeps the shard files open; touches
  // nothing on disk. `field` names where dir came from in errors.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& dir, const ConfinedFs& fs = ConfinedFs(),
      const std::string& field = "checkpoint");

  // What Open would say of `manifest_text` as the manifest of `dir`, whose
  // shard files are written but which is not committed yet: the writer's
  // last check, so that no checkpoint is committed that its reader refuses.
  static absl::Status Verify(const std::string& dir,
                             const std::string& manifest_text,
                             const ConfinedFs& fs, const std::string& field);

  const CheckpointMeta& meta() const { return meta_; }
  const std::string& dir() const { return dir_; }
  // FailedPrecondition naming the first tensor whose global shape differs
  // from the model's (or that is missing), else the first model setting
  // (n_head...) that differs from `model`.
  absl::Status CheckCompatible(const GptConfig& model,
                               const std::vector<ParamInfo>& layout) const;
  // Verifies the checksum of every chunk it reads: DataLoss on mismatch.
  // InvalidArgument for a box outside the tensor.
  absl::Status Read(const std::string& name, const Box& box,
                    float* dst) override;
  // Bytes read from shard files so far (chunks included).
  int64_t bytes_read() const { return bytes_read_; }

 private:
  struct Entry {
    std::string file;
    int64_t offset = 0;  // bytes into the file
    Box box;             // its elements, row-major from offset
  };
  struct FileInfo {
    int64_t bytes = 0, chunk_bytes = 0;
    std::vector<uint64_t> chunks;
    std::shared_ptr<UniqueFd> fd;  // opened (confined) by Open
  };
  // Checks the parsed manifest and fills the reader from it, in these
  // steps (checkpoint_manifest.cc, checkpoint_index.cc).
  absl::Status Load(const nlohmann::json& m);
  // True for format 3 (a vocabulary of one byte a character).
  absl::StatusOr<bool> CheckFormat(const nlohmann::json& m) const;
  absl::Status LoadProgressAndModel(const nlohmann::json& m);
  absl::Status LoadVocabAndSpec(const nlohmann::json& m, bool byte_vocab);
  absl::Status LoadOwnerAndDataDigest(const nlohmann::json& m);
  absl::Status LoadLayout(const nlohmann::json& m);
  absl::Status LoadFiles(const nlohmann::json& m);
  absl::StatusOr<FileInfo> LoadFileInfo(const nlohmann::json& f,
                                        const std::string& where) const;
  absl::Status LoadTensors(const nlohmann::json& m);
  absl::Status LoadTensor(const std::string& name, const nlohmann::json& t);
  absl::StatusOr<std::vector<int64_t>> LoadShape(
      const nlohmann::json& t, const std::string& where) const;
  absl::StatusOr<Entry> LoadShard(const nlohmann::json& e,
                                  const std::string& at,
                                  const std::vector<int64_t>& dims) const;
  absl::Status CheckFilesTiled() const;
  absl::Status CheckOwnModel() const;
  absl::Status OpenShardFiles();
  // DataLoss "checkpoint DIR is damaged: what" (or the field error's
  // message).
  absl::Status Damaged(const std::string& what) const;
  absl::Status Damaged(const absl::Status& field_error) const;
  absl::Status ReadFileRange(const std::string& file, int64_t offset,
                             int64_t bytes, char* dst);
  // Chunk c of `file`, read and verified once.
  absl::StatusOr<const std::vector<char>*> Chunk(const std::string& file,
                                                 const FileInfo& info,
                                                 int64_t c);
  static constexpr size_t kCachedChunks = 16;

  std::string dir_;
  ConfinedFs fs_;
  std::string field_;
  CheckpointMeta meta_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::string, std::vector<Entry>> entries_;
  std::map<std::string, FileInfo> files_;
  int64_t bytes_read_ = 0;
  std::map<std::pair<std::string, int64_t>, std::vector<char>> cache_;
};

// llm.c's GPT-2 checkpoint: int32[256] header (magic 20240326, version 3,
// maxT, V, L, NH, C, Vp), then fp32 tensors grouped by kind across layers,
// wte padded to Vp rows. Written beside `path` and renamed into place.
absl::Status ExportLlmc(TensorSource& source, const GptConfig& config,
                        const std::string& path,
                        const ConfinedFs& fs = ConfinedFs(),
                        const std::string& field = "--llmc");
class LlmcSource : public TensorSource {
 public:
  // Checks the header against `config` (wpe may hold more positions than
  // config.block_size; the first block_size are used) and the file's size
  // against the header. Errors name `field`. Keeps the file open.
  static absl::StatusOr<std::unique_ptr<LlmcSource>> Open(
      const std::string& path, const GptConfig& config,
      const ConfinedFs& fs = ConfinedFs(),
      const std::string& field = "model.init_from");
  absl::Status Read(const std::string& name, const Box& box,
                    float* dst) override;

 private:
  std::string path_;
  UniqueFd fd_;
  std::map<std::string, int64_t> offsets_;  // tensor name -> byte offset
  std::map<std::string, std::vector<int64_t>> shapes_;  // as stored
  // The model's global shapes (wte without the padding rows, wpe without
  // positions past block_size): what Read serves.
  std::map<std::string, std::vector<int64_t>> bounds_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_H_
