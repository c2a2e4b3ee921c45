// Writing a checkpoint (SaveCheckpoint, and the steps BackgroundSave shares):
// every rank writes its shard into step-N.tmp/ through a ChunkedWriter, rank
// 0 merges the ranks' indexes into manifest.json, writes its digest last,
// renames the folder into place and prunes. Not the reading
// (checkpoint_manifest.cc, checkpoint.cc).
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mesh.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_internal.h"
#include "worker/engine/checkpoint/checkpoint_json.h"

namespace ptrain {

using json = nlohmann::json;
using manifest_json::ParseJson;

namespace {

constexpr int64_t kMaxSideIndexBytes = 256 << 20;

absl::Status WriteSmallFile(const ConfinedFs& fs, const std::string& path,
                            const std::string& text) {
  ChunkedWriter w;
  if (auto s = w.Open(fs, path, kField); !s.ok()) return s;
  if (auto s = w.Write(text.data(), static_cast<int64_t>(text.size()));
      !s.ok()) {
    return s;
  }
  return w.Finish();
}

json MetaToJson(const CheckpointMeta& m) {
  json j = {{"step", m.step},
            {"tokens_seen", m.tokens_seen},
            {"optimizer_step", m.optimizer_step},
            {"sampler",
             {{"seed", m.seed},
              {"next_step", m.step},
              {"skipped_steps", m.skipped_steps}}},
            {"rng", {{"kind", "philox4x32-10"}, {"seed", m.seed}}},
            {"model",
             {{"n_layer", m.model.n_layer},
              {"n_head", m.model.n_head},
              {"n_embd", m.model.n_embd},
              {"block_size", m.model.block_size},
              {"vocab_size", m.model.vocab_size},
              {"tie_embeddings", m.model.tie_embeddings}}},
            {"vocab", m.vocab},
            {"spec", m.spec_yaml},
            {"job_uid", m.job_uid},
            {"layout", {{"zero", m.zero}, {"world", m.world}}}};
  if (m.model.arch != "gpt") {
    const GptConfig& c = m.model;
    json& model = j["model"];
    model["arch"] = c.arch;
    model["n_kv_head"] = c.kv_heads();
    model["ffn_hidden"] = c.hidden();
    // Written where set: a checkpoint without them has heads of the width
    // and no query/key norms.
    if (c.head_dim > 0) model["head_dim"] = c.head_dim;
    if (c.qk_norm) model["qk_norm"] = true;
    model["norm_eps"] = c.norm_eps;
    model["rope"] = {{"theta", c.rope.theta},
                     {"factor", c.rope.factor},
                     {"low_freq_factor", c.rope.low_freq_factor},
                     {"high_freq_factor", c.rope.high_freq_factor},
                     {"original_context", c.rope.original_context}};
  }
  if (m.model.has_moe()) {
    const GptConfig::Moe& e = m.model.moe;
    j["model"]["moe"] = {{"experts", e.experts},
                         {"top_k", e.top_k},
                         {"shared_experts", e.shared},
                         {"expert_hidden", e.hidden},
                         {"router", RouterName(e.router)},
                         {"capacity_factor", e.capacity_factor},
                         {"aux_loss_coef", e.aux_coef},
                         {"z_loss_coef", e.z_coef}};
    if (e.bias) j["model"]["moe"]["bias_update_rate"] = e.bias_rate;
    if (e.every > 1) j["model"]["moe"]["every"] = e.every;
  }
  // Every dimension of the mesh, 1 where meta does not give it.
  for (const MeshDimension& d : MeshDimensions()) {
    const std::string name(d.name);
    const auto it = m.degrees.find(name);
    j["layout"][name] = it != m.degrees.end() ? it->second : 1;
  }
  if (m.data_digest.has_value()) j["data_digest"] = Hex(*m.data_digest);
  return j;
}

json BoxToJson(const Box& b) {
  json out = json::array();
  for (size_t d = 0; d < b.lo.size(); ++d) out.push_back({b.lo[d], b.hi[d]});
  return out;
}

// Rank 0's manifest: meta, every tensor of meta.model (whichever ranks hold
// it) and the shard indexes of the `size` ranks merged in, each index
// removed once merged.
absl::StatusOr<json> MergeShardIndexes(const SaveFolders& f,
                                       const CheckpointMeta& meta, int size,
                                       const ConfinedFs& cfs) {
  json manifest = MetaToJson(meta);
  manifest["format"] = kFormat;
  json tensors = json::object(), files = json::object();
  for (const ParamInfo& p : GptTensors(meta.model)) {
    for (const std::string& n :
         {p.name, ExpAvgName(p.name), ExpAvgSqName(p.name)}) {
      tensors[n] = {{"shape", p.global_shape},
                    {"dtype", "float32"},
                    {"shards", json::array()}};
    }
  }
  for (int r = 0; r < size; ++r) {
    const std::string side = Join(f.tmp, absl::StrFormat("shard-%05d.json", r));
    auto text = cfs.ReadFile(side, kField, kMaxSideIndexBytes);
    if (!text.ok()) return text.status();
    // Written by this job's ranks a moment ago; still, a bad one is an
    // error, not an exception.
    const std::optional<json> index = ParseJson(*text);
    if (!index.has_value() || !index->is_object() || !index->contains("file") ||
        !index->contains("entries")) {
      return absl::InternalError(
          absl::StrCat("checkpoint: ", side, " is not a shard index"));
    }
    try {
      files[index->at("file").get<std::string>()] = {
          {"bytes", index->at("bytes")},
          {"chunk_bytes", index->at("chunk_bytes")},
          {"xxh64_chunks", index->at("xxh64_chunks")}};
      for (const json& e : index->at("entries")) {
        const std::string t = e.at("tensor");
        if (!tensors.contains(t)) {
          return absl::InternalError("checkpoint: unknown tensor " + t);
        }
        tensors[t]["shards"].push_back({{"file", index->at("file")},
                                        {"offset", e.at("offset")},
                                        {"box", e.at("box")}});
      }
    } catch (const json::exception& e) {
      return absl::InternalError(absl::StrCat(
          "checkpoint: ", side, " is not a shard index: ", e.what()));
    }
    if (auto s = cfs.Remove(side, kField); !s.ok()) return s;
  }
  manifest["tensors"] = tensors;
  manifest["files"] = files;
  return manifest;
}

// Rank 0: writes the manifest, then its digest, and renames step-N.tmp/
// into step-N/.
absl::Status WriteManifestAndRename(const SaveFolders& f, const json& manifest,
                                    const ConfinedFs& cfs) {
  const std::string text = manifest.dump(1);
  // Nothing is committed that a reader would refuse (a value out of its
  // range would make every later resume skip the folder as damaged).
  if (absl::Status s = CheckpointReader::Verify(f.tmp, text, cfs, kField);
      !s.ok()) {
    return absl::InternalError(
        absl::StrCat("checkpoint: not committing ", f.final_dir,
                     ", which its reader would refuse: ", s.message()));
  }
  if (auto s = WriteSmallFile(cfs, Join(f.tmp, kManifest), text); !s.ok()) {
    return s;
  }
  // The digest goes last: a folder with a valid one is complete.
  if (auto s = WriteSmallFile(cfs, Join(f.tmp, kDigestFile),
                              ManifestDigestLine(text));
      !s.ok()) {
    return s;
  }
  if (auto s = cfs.SyncDir(f.tmp, kField); !s.ok()) return s;
  if (auto s = cfs.Rename(f.tmp, f.final_dir, kField); !s.ok()) return s;
  return cfs.SyncDir(f.root, kField);
}

// Rank 0, once the new checkpoint is committed: keeps the newest
// options.keep_last of this job's, and only this job's: a checkpoint whose
// owner cannot be read is left alone.
absl::Status Prune(const std::string& root, const CheckpointMeta& meta,
                   const SaveOptions& options) {
  if (options.keep_last <= 0) return absl::OkStatus();
  auto all = ListCheckpoints(root, options.fs);
  if (!all.ok()) return all.status();
  int kept = 0;
  for (const std::string& dir : *all) {
    auto owner = CheckpointJobUid(dir, options.fs);
    if (!owner.ok() || *owner != meta.job_uid) continue;
    if (++kept <= options.keep_last) continue;
    if (auto s = options.fs.RemoveAll(dir, kField); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteReplacing(
    const ConfinedFs& fs, const std::string& path, const std::string& field,
    const std::function<absl::Status(ChunkedWriter&)>& write) {
  const std::string tmp = path + ".tmp";
  absl::Status s;
  {
    ChunkedWriter w;
    s = w.Open(fs, tmp, field);
    if (!s.ok()) return s;
    s = write(w);
    if (s.ok()) s = w.Finish();
  }
  if (s.ok()) s = fs.Rename(tmp, path, field);
  if (!s.ok()) (void)fs.Remove(tmp, field);
  return s;
}

ChunkedWriter::~ChunkedWriter() {
  if (state_ != nullptr) XXH64_freeState(state_);
}

absl::Status ChunkedWriter::Open(const ConfinedFs& fs, const std::string& path,
                                 const std::string& field) {
  path_ = path;
  auto fd =
      fs.Open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK, field, 0644);
  if (!fd.ok()) return fd.status();
  fd_ = std::move(*fd);
  state_ = XXH64_createState();
  XXH64_reset(state_, 0);
  buffer_.reserve(kBuffer);
  return absl::OkStatus();
}

absl::Status ChunkedWriter::Write(const char* data, int64_t bytes) {
  while (bytes > 0) {
    // Never let a hash chunk straddle two Write calls' bookkeeping: feed
    // the hash up to the chunk end, then roll over.
    const int64_t room = kChunkBytes - in_chunk_;
    const int64_t n = std::min(room, bytes);
    XXH64_update(state_, data, static_cast<size_t>(n));
    in_chunk_ += n;
    if (in_chunk_ == kChunkBytes) CloseChunk();
    buffer_.insert(buffer_.end(), data, data + n);
    if (static_cast<int64_t>(buffer_.size()) >= kBuffer) {
      if (auto s = Flush(); !s.ok()) return s;
    }
    data += n;
    bytes -= n;
    total_ += n;
  }
  return absl::OkStatus();
}

absl::Status ChunkedWriter::Finish() {
  if (in_chunk_ > 0) CloseChunk();
  if (auto s = Flush(); !s.ok()) return s;
  if (::fsync(fd_.get()) != 0) {
    return absl::InternalError(Errno("cannot fsync", path_));
  }
  if (::close(fd_.Release()) != 0) {
    return absl::InternalError(Errno("cannot close", path_));
  }
  return absl::OkStatus();
}

void ChunkedWriter::CloseChunk() {
  chunks_.push_back(XXH64_digest(state_));
  XXH64_reset(state_, 0);
  in_chunk_ = 0;
}

absl::Status ChunkedWriter::Flush() {
  const char* p = buffer_.data();
  size_t left = buffer_.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_.get(), p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(Errno("cannot write", path_));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  buffer_.clear();
  return absl::OkStatus();
}

double Agree(Communicator* world, double x) {
  if (world != nullptr && world->size() > 1) world->AllReduce(&x, 1);
  return x;
}

SaveFolders FoldersOf(const std::string& root, int64_t step) {
  SaveFolders f;
  f.root = root;
  f.final_dir = CheckpointFolder(root, step);
  f.tmp = f.final_dir + ".tmp";
  return f;
}

absl::StatusOr<bool> PrepareSave(const SaveFolders& f,
                                 const CheckpointMeta& meta,
                                 Communicator* world, const ConfinedFs& cfs) {
  const int rank = world != nullptr ? world->rank() : 0;
  absl::Status prep = absl::OkStatus();
  bool exists = false;
  if (rank == 0) {
    prep = [&]() -> absl::Status {
      auto committed = cfs.Exists(Join(f.final_dir, kManifest), kField);
      if (!committed.ok()) return committed.status();
      if (*committed) {
        // Ours already (a resumed run reaching a step it saved before), or
        // another job's, which is never touched.
        auto owner = CheckpointJobUid(f.final_dir, cfs);
        if (owner.ok() && *owner != meta.job_uid) {
          return absl::FailedPreconditionError(absl::StrCat(
              kField, ": ", f.final_dir, " belongs to job '", *owner,
              "', not to this job or run '", meta.job_uid,
              "'; two must not save the same step in one checkpoint folder "
              "(give this one a folder of its own: --set "
              "checkpoint.dir=...)"));
        }
        if (!owner.ok()) {
          spdlog::warn("checkpoint: leaving {} as it is: {}", f.final_dir,
                       std::string(owner.status().message()));
        }
        exists = true;
        return absl::OkStatus();
      }
      if (auto s = cfs.RemoveAll(f.tmp, kField); !s.ok()) return s;
      return cfs.MakeDirs(f.tmp, kField);
    }();
  }
  const double prep_flags =
      Agree(world, (prep.ok() ? 0.0 : 1.0) + (exists ? 2.0 : 0.0));
  if (prep_flags >= 2.0) return true;  // this step is already committed
  if (prep_flags > 0.0) {
    return prep.ok() ? absl::InternalError(
                           "checkpoint: rank 0 failed to "
                           "prepare the folder")
                     : prep;
  }
  return false;
}

absl::Status WriteShard(const SaveFolders& f, int rank,
                        const std::vector<ShardRun>& runs,
                        const SaveOptions& options) {
  const ConfinedFs& cfs = options.fs;
  const std::string file = absl::StrFormat("shard-%05d.bin", rank);
  ChunkedWriter w;
  if (auto s = w.Open(cfs, Join(f.tmp, file), kField); !s.ok()) return s;
  json entries = json::array();
  int64_t total = 0;
  for (const ShardRun& r : runs) total += r.box.numel();
  int64_t done = 0;
  bool paused = false;
  for (const ShardRun& r : runs) {
    const int64_t count = r.box.numel();
    entries.push_back(
        {{"tensor", r.name}, {"box", BoxToJson(r.box)}, {"offset", w.total()}});
    if (auto s = w.Write(reinterpret_cast<const char*>(r.data),
                         count * static_cast<int64_t>(sizeof(float)));
        !s.ok()) {
      return s;
    }
    done += count;
    if (!paused && options.pause_mid_write_s.has_value() && 2 * done >= total) {
      paused = true;
      std::this_thread::sleep_for(
          std::chrono::duration<double>(*options.pause_mid_write_s));
    }
  }
  if (auto s = w.Finish(); !s.ok()) return s;
  json chunks = json::array();
  for (uint64_t h : w.chunks()) chunks.push_back(Hex(h));
  const json index = {{"file", file},
                      {"bytes", w.total()},
                      {"chunk_bytes", kChunkBytes},
                      {"xxh64_chunks", chunks},
                      {"entries", entries}};
  return WriteSmallFile(
      cfs, Join(f.tmp, absl::StrFormat("shard-%05d.json", rank)), index.dump());
}

absl::Status CommitSave(const SaveFolders& f, const CheckpointMeta& meta,
                        const absl::Status& wrote, Communicator* world,
                        const SaveOptions& options) {
  const int rank = world != nullptr ? world->rank() : 0;
  const int size = world != nullptr ? world->size() : 1;
  if (Agree(world, wrote.ok() ? 0.0 : 1.0) > 0.0) {
    if (!wrote.ok()) return wrote;
    return absl::InternalError("checkpoint: another rank failed to write");
  }
  absl::Status committed = absl::OkStatus();
  if (rank == 0) {
    committed = [&]() -> absl::Status {
      auto manifest = MergeShardIndexes(f, meta, size, options.fs);
      if (!manifest.ok()) return manifest.status();
      if (auto s = WriteManifestAndRename(f, *manifest, options.fs); !s.ok()) {
        return s;
      }
      // Prune only once the new checkpoint is committed.
      return Prune(f.root, meta, options);
    }();
  }
  if (Agree(world, committed.ok() ? 0.0 : 1.0) > 0.0) {
    if (!committed.ok()) return committed;
    return absl::InternalError("checkpoint: rank 0 failed to commit");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SaveCheckpoint(const std::string& root,
                                           const CheckpointMeta& meta,
                                           const std::vector<ShardRun>& runs,
                                           Communicator* world,
                                           const SaveOptions& options) {
  const SaveFolders f = FoldersOf(root, meta.step);
  auto committed = PrepareSave(f, meta, world, options.fs);
  if (!committed.ok()) return committed.status();
  if (*committed) return f.final_dir;
  const absl::Status wrote =
      WriteShard(f, world != nullptr ? world->rank() : 0, runs, options);
  if (auto s = CommitSave(f, meta, wrote, world, options); !s.ok()) return s;
  return f.final_dir;
}

}  // namespace ptrain
