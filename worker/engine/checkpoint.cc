#include "worker/engine/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace ptrain {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Checksum granularity: a reader verifies whole chunks, so this bounds how
// much it reads beyond the slices it needs.
constexpr int64_t kChunkBytes = 64 << 10;
constexpr char kFormat[] = "ptrain-checkpoint-1";

std::string Errno(const std::string& what, const std::string& path) {
  return absl::StrCat(what, " '", path, "': ", std::strerror(errno));
}

std::string Hex(uint64_t h) { return absl::StrFormat("%016x", h); }

absl::Status FsyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return absl::InternalError(Errno("cannot open", path));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError(Errno("cannot fsync", path));
  return absl::OkStatus();
}

// Writes a file through a buffer, hashing each kChunkBytes chunk.
class ChunkedWriter {
 public:
  ~ChunkedWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (state_ != nullptr) XXH64_freeState(state_);
  }
  absl::Status Open(const std::string& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) return absl::InternalError(Errno("cannot create", path));
    state_ = XXH64_createState();
    XXH64_reset(state_, 0);
    buffer_.reserve(kBuffer);
    return absl::OkStatus();
  }
  absl::Status Write(const char* data, int64_t bytes) {
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
  // Flushes, fsyncs and closes.
  absl::Status Finish() {
    if (in_chunk_ > 0) CloseChunk();
    if (auto s = Flush(); !s.ok()) return s;
    if (::fsync(fd_) != 0)
      return absl::InternalError(Errno("cannot fsync", path_));
    if (::close(fd_) != 0) {
      fd_ = -1;
      return absl::InternalError(Errno("cannot close", path_));
    }
    fd_ = -1;
    return absl::OkStatus();
  }
  int64_t total() const { return total_; }
  const std::vector<uint64_t>& chunks() const { return chunks_; }

 private:
  static constexpr int64_t kBuffer = 8 << 20;
  void CloseChunk() {
    chunks_.push_back(XXH64_digest(state_));
    XXH64_reset(state_, 0);
    in_chunk_ = 0;
  }
  absl::Status Flush() {
    const char* p = buffer_.data();
    size_t left = buffer_.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
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

  std::string path_;
  int fd_ = -1;
  XXH64_state_t* state_ = nullptr;
  std::vector<char> buffer_;
  std::vector<uint64_t> chunks_;
  int64_t in_chunk_ = 0, total_ = 0;
};

absl::Status WriteSmallFile(const std::string& path, const std::string& text) {
  ChunkedWriter w;
  if (auto s = w.Open(path); !s.ok()) return s;
  if (auto s = w.Write(text.data(), static_cast<int64_t>(text.size()));
      !s.ok()) {
    return s;
  }
  return w.Finish();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(Errno("cannot read", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Sum of x over the world (x itself without one): how ranks agree.
double Agree(Communicator* world, double x) {
  if (world != nullptr && world->size() > 1) world->AllReduce(&x, 1);
  return x;
}

json MetaToJson(const CheckpointMeta& m) {
  return {{"step", m.step},
          {"tokens_seen", m.tokens_seen},
          {"optimizer_step", m.optimizer_step},
          {"sampler", {{"seed", m.seed}, {"next_step", m.step}}},
          {"rng", {{"kind", "philox4x32-10"}, {"seed", m.seed}}},
          {"model",
           {{"n_layer", m.model.n_layer},
            {"n_head", m.model.n_head},
            {"n_embd", m.model.n_embd},
            {"block_size", m.model.block_size},
            {"vocab_size", m.model.vocab_size}}},
          {"vocab", m.vocab},
          {"spec", m.spec_yaml},
          {"layout",
           {{"dp", m.dp},
            {"tp", m.tp},
            {"pp", m.pp},
            {"zero", m.zero},
            {"world", m.world}}}};
}

CheckpointMeta MetaFromJson(const json& j) {
  CheckpointMeta m;
  m.step = j.at("step");
  m.tokens_seen = j.at("tokens_seen");
  m.optimizer_step = j.at("optimizer_step");
  m.seed = j.at("sampler").at("seed");
  const json& md = j.at("model");
  m.model = GptConfig{md.at("n_layer"), md.at("n_head"), md.at("n_embd"),
                      md.at("block_size"), md.at("vocab_size")};
  m.vocab = j.at("vocab");
  m.spec_yaml = j.at("spec");
  const json& l = j.at("layout");
  m.dp = l.at("dp");
  m.tp = l.at("tp");
  m.pp = l.at("pp");
  m.zero = l.at("zero");
  m.world = l.at("world");
  return m;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

std::string ExpAvgName(const std::string& name) {
  return "optimizer.exp_avg." + name;
}
std::string ExpAvgSqName(const std::string& name) {
  return "optimizer.exp_avg_sq." + name;
}

absl::StatusOr<std::string> SaveCheckpoint(const std::string& root,
                                           const CheckpointMeta& meta,
                                           const std::vector<ParamInfo>& layout,
                                           const std::vector<ShardRun>& runs,
                                           Communicator* world,
                                           const SaveOptions& options) {
  const int rank = world != nullptr ? world->rank() : 0;
  const int size = world != nullptr ? world->size() : 1;
  const std::string final_dir =
      (fs::path(root) / absl::StrFormat("step-%08d", meta.step)).string();
  const std::string tmp = final_dir + ".tmp";

  // Rank 0 prepares a clean step-N.tmp/ (a crashed save may have left one).
  absl::Status prep = absl::OkStatus();
  bool exists = false;
  if (rank == 0) {
    std::error_code ec;
    exists = fs::exists(fs::path(final_dir) / "manifest.json", ec);
    if (!exists) {
      fs::remove_all(tmp, ec);
      fs::create_directories(tmp, ec);
      if (ec) {
        prep = absl::InternalError(
            absl::StrCat("cannot create '", tmp, "': ", ec.message()));
      }
    }
  }
  const double prep_flags =
      Agree(world, (prep.ok() ? 0.0 : 1.0) + (exists ? 2.0 : 0.0));
  if (prep_flags >= 2.0) return final_dir;  // this step is already committed
  if (prep_flags > 0.0) {
    return prep.ok() ? absl::InternalError(
                           "checkpoint: rank 0 failed to "
                           "prepare the folder")
                     : prep;
  }

  // Every rank writes its shard, then a small index of what it wrote.
  const std::string file = absl::StrFormat("shard-%05d.bin", rank);
  absl::Status wrote = [&]() -> absl::Status {
    ChunkedWriter w;
    if (auto s = w.Open((fs::path(tmp) / file).string()); !s.ok()) return s;
    json entries = json::array();
    int64_t total = 0;
    for (const ShardRun& r : runs) total += r.count;
    int64_t done = 0;
    bool paused = false;
    for (const ShardRun& r : runs) {
      entries.push_back({{"tensor", r.name},
                         {"start", r.start},
                         {"count", r.count},
                         {"offset", w.total()}});
      if (auto s = w.Write(reinterpret_cast<const char*>(r.data),
                           r.count * static_cast<int64_t>(sizeof(float)));
          !s.ok()) {
        return s;
      }
      done += r.count;
      if (!paused && options.pause_mid_write_s > 0 && 2 * done >= total) {
        paused = true;
        std::this_thread::sleep_for(
            std::chrono::duration<double>(options.pause_mid_write_s));
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
        (fs::path(tmp) / absl::StrFormat("shard-%05d.json", rank)).string(),
        index.dump());
  }();
  if (Agree(world, wrote.ok() ? 0.0 : 1.0) > 0.0) {
    if (!wrote.ok()) return wrote;
    return absl::InternalError("checkpoint: another rank failed to write");
  }

  // Rank 0 merges the indexes into the manifest and commits by rename.
  absl::Status committed = absl::OkStatus();
  if (rank == 0) {
    committed = [&]() -> absl::Status {
      json manifest = MetaToJson(meta);
      manifest["format"] = kFormat;
      json tensors = json::object(), files = json::object();
      for (const ParamInfo& p : layout) {
        for (const std::string& n :
             {p.name, ExpAvgName(p.name), ExpAvgSqName(p.name)}) {
          tensors[n] = {{"shape", p.shape},
                        {"dtype", "float32"},
                        {"shards", json::array()}};
        }
      }
      for (int r = 0; r < size; ++r) {
        const std::string side =
            (fs::path(tmp) / absl::StrFormat("shard-%05d.json", r)).string();
        auto text = ReadSmallFile(side);
        if (!text.ok()) return text.status();
        const json index = json::parse(*text);
        files[index.at("file").get<std::string>()] = {
            {"bytes", index.at("bytes")},
            {"chunk_bytes", index.at("chunk_bytes")},
            {"xxh64_chunks", index.at("xxh64_chunks")}};
        for (const json& e : index.at("entries")) {
          const std::string t = e.at("tensor");
          if (!tensors.contains(t)) {
            return absl::InternalError("checkpoint: unknown tensor " + t);
          }
          tensors[t]["shards"].push_back({{"file", index.at("file")},
                                          {"offset", e.at("offset")},
                                          {"start", e.at("start")},
                                          {"count", e.at("count")}});
        }
        fs::remove(side);
      }
      manifest["tensors"] = tensors;
      manifest["files"] = files;
      if (auto s = WriteSmallFile((fs::path(tmp) / "manifest.json").string(),
                                  manifest.dump(1));
          !s.ok()) {
        return s;
      }
      if (auto s = FsyncPath(tmp); !s.ok()) return s;
      if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
        return absl::InternalError(Errno("cannot rename", tmp));
      }
      if (auto s = FsyncPath(root); !s.ok()) return s;
      // Prune only once the new checkpoint is committed.
      if (options.keep_last > 0) {
        const auto all = ListCheckpoints(root);
        for (size_t i = options.keep_last; i < all.size(); ++i) {
          std::error_code ec;
          fs::remove_all(all[i], ec);
        }
      }
      return absl::OkStatus();
    }();
  }
  if (Agree(world, committed.ok() ? 0.0 : 1.0) > 0.0) {
    if (!committed.ok()) return committed;
    return absl::InternalError("checkpoint: rank 0 failed to commit");
  }
  return final_dir;
}

std::vector<std::string> ListCheckpoints(const std::string& root) {
  static const std::regex kName("step-[0-9]{8}");
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, kName)) {
      out.push_back(entry.path().string());
    }
  }
  // Fixed-width step numbers sort as text.
  std::sort(out.rbegin(), out.rend());
  return out;
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& dir) {
  const std::string path = (fs::path(dir) / "manifest.json").string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", dir, "' is not a committed checkpoint (no manifest.json)"));
  }
  auto text = ReadSmallFile(path);
  if (!text.ok()) return text.status();
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->dir_ = dir;
  try {
    const json m = json::parse(*text);
    if (m.at("format") != kFormat) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", dir, "': unknown checkpoint format ", m.at("format").dump()));
    }
    r->meta_ = MetaFromJson(m);
    for (const auto& [name, t] : m.at("tensors").items()) {
      r->shapes_[name] = t.at("shape").get<std::vector<int64_t>>();
      auto& list = r->entries_[name];
      for (const json& s : t.at("shards")) {
        list.push_back(
            Entry{s.at("file"), s.at("offset"), s.at("start"), s.at("count")});
      }
    }
    for (const auto& [name, f] : m.at("files").items()) {
      FileInfo info;
      info.bytes = f.at("bytes");
      info.chunk_bytes = f.at("chunk_bytes");
      for (const json& h : f.at("xxh64_chunks")) {
        info.chunks.push_back(std::stoull(h.get<std::string>(), nullptr, 16));
      }
      r->files_[name] = std::move(info);
    }
  } catch (const json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' is damaged: ", e.what()));
  }
  return r;
}

absl::Status CheckpointReader::CheckCompatible(
    const std::vector<ParamInfo>& layout) const {
  for (const ParamInfo& p : layout) {
    for (const std::string& n :
         {p.name, ExpAvgName(p.name), ExpAvgSqName(p.name)}) {
      auto it = shapes_.find(n);
      if (it == shapes_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint '", dir_,
                         "' does not fit the model: it has no tensor ", n));
      }
      if (it->second != p.shape) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint '", dir_, "' does not fit the model: tensor ", n,
            " has shape ", ShapeString(it->second), " in the checkpoint but ",
            ShapeString(p.shape), " in the model"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadFileRange(const std::string& file,
                                             int64_t offset, int64_t bytes,
                                             char* dst) {
  auto it = files_.find(file);
  if (it == files_.end()) {
    return absl::DataLossError(
        absl::StrCat("'", dir_, "': manifest lists no file ", file));
  }
  const FileInfo& info = it->second;
  const std::string path = (fs::path(dir_) / file).string();
  std::error_code ec;
  const auto on_disk = fs::file_size(path, ec);
  if (ec || static_cast<int64_t>(on_disk) != info.bytes) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' is ", ec ? 0 : on_disk,
                     " bytes, the manifest says ", info.bytes));
  }
  // Whole chunks, each checked against its hash once and kept for the
  // neighbouring slices that share it.
  const int64_t cb = info.chunk_bytes;
  const int64_t c0 = offset / cb, c1 = (offset + bytes - 1) / cb;
  for (int64_t c = c0; c <= c1; ++c) {
    auto chunk = Chunk(file, path, info, c);
    if (!chunk.ok()) return chunk.status();
    const int64_t lo = std::max(offset, c * cb);
    const int64_t hi = std::min(offset + bytes, (c + 1) * cb);
    std::memcpy(dst + (lo - offset), (*chunk)->data() + (lo - c * cb), hi - lo);
  }
  return absl::OkStatus();
}

absl::StatusOr<const std::vector<char>*> CheckpointReader::Chunk(
    const std::string& file, const std::string& path, const FileInfo& info,
    int64_t c) {
  const auto key = std::make_pair(file, c);
  if (auto it = cache_.find(key); it != cache_.end()) return &it->second;
  const int64_t cb = info.chunk_bytes;
  const int64_t n = std::min(cb, info.bytes - c * cb);
  std::vector<char> buf(n);
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return absl::DataLossError(Errno("cannot open", path));
  int64_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, buf.data() + got, n - got, c * cb + got);
    if (r <= 0) {
      ::close(fd);
      return absl::DataLossError(Errno("short read from", path));
    }
    got += r;
  }
  ::close(fd);
  bytes_read_ += n;
  if (c >= static_cast<int64_t>(info.chunks.size()) ||
      XXH64(buf.data(), static_cast<size_t>(n), 0) != info.chunks[c]) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' is corrupt: checksum mismatch in bytes [",
                     c * cb, ", ", c * cb + n, ")"));
  }
  if (cache_.size() >= kCachedChunks) cache_.erase(cache_.begin());
  return &cache_.emplace(key, std::move(buf)).first->second;
}

absl::Status CheckpointReader::Read(const std::string& name, int64_t start,
                                    int64_t count, float* dst) {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", dir_, "' has no tensor ", name));
  }
  int64_t covered = 0;
  for (const Entry& e : it->second) {
    const int64_t lo = std::max(start, e.start);
    const int64_t hi = std::min(start + count, e.start + e.count);
    if (lo >= hi) continue;
    const int64_t offset =
        e.offset + (lo - e.start) * static_cast<int64_t>(sizeof(float));
    if (auto s = ReadFileRange(e.file, offset, (hi - lo) * sizeof(float),
                               reinterpret_cast<char*>(dst + (lo - start)));
        !s.ok()) {
      return s;
    }
    covered += hi - lo;
  }
  if (covered != count) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint '", dir_, "': tensor ", name, " elements [", start, ", ",
        start + count, ") are not all in its shards"));
  }
  return absl::OkStatus();
}

// --- llm.c --------------------------------------------------------------

namespace {

constexpr int32_t kLlmcMagic = 20240326;
constexpr int32_t kLlmcVersion = 3;  // fp32, padded vocabulary

// llm.c's order: wte, wpe, then each block tensor kind across all layers,
// then ln_f.
const char* const kBlockKinds[] = {
    "ln_1.weight",      "ln_1.bias",          "attn.c_attn.weight",
    "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight",      "ln_2.bias",          "mlp.c_fc.weight",
    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

int64_t PaddedVocab(int64_t V) { return (V + 127) / 128 * 128; }

// Tensors in llm.c order with their element counts as stored (wte padded).
std::vector<std::pair<std::string, int64_t>> LlmcOrder(const GptConfig& c,
                                                       int64_t maxT) {
  const int64_t C = c.n_embd;
  const std::map<std::string, int64_t> per_layer = {
      {"ln_1.weight", C},
      {"ln_1.bias", C},
      {"attn.c_attn.weight", 3 * C * C},
      {"attn.c_attn.bias", 3 * C},
      {"attn.c_proj.weight", C * C},
      {"attn.c_proj.bias", C},
      {"ln_2.weight", C},
      {"ln_2.bias", C},
      {"mlp.c_fc.weight", 4 * C * C},
      {"mlp.c_fc.bias", 4 * C},
      {"mlp.c_proj.weight", 4 * C * C},
      {"mlp.c_proj.bias", C}};
  std::vector<std::pair<std::string, int64_t>> out;
  out.emplace_back("wte", PaddedVocab(c.vocab_size) * C);
  out.emplace_back("wpe", maxT * C);
  for (const char* kind : kBlockKinds) {
    for (int l = 0; l < c.n_layer; ++l) {
      out.emplace_back(absl::StrCat("h.", l, ".", kind), per_layer.at(kind));
    }
  }
  out.emplace_back("ln_f.weight", C);
  out.emplace_back("ln_f.bias", C);
  return out;
}

}  // namespace

absl::Status ExportLlmc(TensorSource& source, const GptConfig& config,
                        const std::string& path) {
  const int64_t C = config.n_embd, V = config.vocab_size;
  int32_t header[256] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = config.block_size;
  header[3] = config.vocab_size;
  header[4] = config.n_layer;
  header[5] = config.n_head;
  header[6] = config.n_embd;
  header[7] = static_cast<int32_t>(PaddedVocab(V));
  // Written beside the target and renamed: never a half-written file.
  const std::string tmp = path + ".tmp";
  ChunkedWriter w;
  if (auto s = w.Open(tmp); !s.ok()) return s;
  if (auto s = w.Write(reinterpret_cast<const char*>(header), sizeof(header));
      !s.ok()) {
    return s;
  }
  for (const auto& [name, stored] : LlmcOrder(config, config.block_size)) {
    const int64_t real = name == "wte" ? V * C : stored;
    std::vector<float> buf(stored, 0.0f);  // wte rows past V stay zero
    if (auto s = source.Read(name, 0, real, buf.data()); !s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
    if (auto s = w.Write(reinterpret_cast<const char*>(buf.data()),
                         stored * static_cast<int64_t>(sizeof(float)));
        !s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
  }
  if (auto s = w.Finish(); !s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(Errno("cannot rename", tmp));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LlmcSource>> LlmcSource::Open(
    const std::string& path, const GptConfig& config) {
  const std::string field = "model.init_from";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(field, ": cannot read llm.c checkpoint '", path, "'"));
  }
  int32_t h[256];
  if (!in.read(reinterpret_cast<char*>(h), sizeof(h))) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is shorter than the llm.c header"));
  }
  if (h[0] != kLlmcMagic || h[1] != kLlmcVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", path, "' has magic ", h[0], " version ", h[1],
        " (expected ", kLlmcMagic, " version ", kLlmcVersion, ", fp32)"));
  }
  const int maxT = h[2], V = h[3], L = h[4], NH = h[5], C = h[6], Vp = h[7];
  auto mismatch = [&](const char* what, int64_t file, int64_t model) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' has ", what, "=", file,
                     " but the model has ", model));
  };
  if (L != config.n_layer) return mismatch("n_layer", L, config.n_layer);
  if (NH != config.n_head) return mismatch("n_head", NH, config.n_head);
  if (C != config.n_embd) return mismatch("n_embd", C, config.n_embd);
  if (V != config.vocab_size)
    return mismatch("vocab_size", V, config.vocab_size);
  if (maxT < config.block_size) {
    return mismatch("max sequence length", maxT, config.block_size);
  }
  if (Vp != PaddedVocab(V)) return mismatch("padded vocab", Vp, PaddedVocab(V));
  std::unique_ptr<LlmcSource> src(new LlmcSource());
  src->path_ = path;
  int64_t offset = sizeof(h);
  for (const auto& [name, stored] : LlmcOrder(config, maxT)) {
    src->offsets_[name] = offset;
    src->numel_[name] = stored;
    offset += stored * static_cast<int64_t>(sizeof(float));
  }
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || static_cast<int64_t>(size) != offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is ", ec ? 0 : size,
                     " bytes; its header implies ", offset));
  }
  return src;
}

absl::Status LlmcSource::Read(const std::string& name, int64_t start,
                              int64_t count, float* dst) {
  auto it = offsets_.find(name);
  if (it == offsets_.end() || start + count > numel_.at(name)) {
    return absl::NotFoundError(absl::StrCat("llm.c checkpoint '", path_,
                                            "' has no ", name, "[", start, ", ",
                                            start + count, ")"));
  }
  std::ifstream in(path_, std::ios::binary);
  in.seekg(it->second + start * static_cast<int64_t>(sizeof(float)));
  if (!in.read(reinterpret_cast<char*>(dst), count * sizeof(float))) {
    return absl::DataLossError(absl::StrCat("short read from '", path_, "'"));
  }
  return absl::OkStatus();
}

}  // namespace ptrain
