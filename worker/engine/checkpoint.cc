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
#include <ctime>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/checkpoint_commit.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "worker/engine/data.h"

namespace ptrain {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Checksum granularity: a reader verifies whole chunks, so this bounds how
// much it reads beyond the slices it needs.
constexpr int64_t kChunkBytes = 64 << 10;
// The format written: 4 records the char tokenizer's vocabulary as the
// UTF-8 of its code points. 3, read too, recorded one byte per character
// (docs/checkpoints.md has the history).
constexpr char kFormat[] = "ptrain-checkpoint-4";
constexpr char kByteVocabFormat[] = "ptrain-checkpoint-3";
constexpr const char* kManifest = kManifestFile;
constexpr const char* kDigestFile = kManifestDigestFile;
constexpr char kField[] = "checkpoint.dir";

// What a reader accepts (docs/checkpoints.md). Far above any real model,
// far below where int64 arithmetic on them could overflow.
constexpr int64_t kMinChunkBytes = 4 << 10;
constexpr int64_t kMaxChunkBytes = 16 << 20;
constexpr int64_t kMaxSideIndexBytes = 256 << 20;
constexpr int64_t kMaxStep = int64_t{1} << 48;
constexpr int64_t kMaxTokens = int64_t{1} << 62;
constexpr int64_t kMaxModelDim = 1 << 24;  // n_head, n_embd, block_size, V
constexpr int64_t kMaxLayers = 1 << 16;
constexpr int64_t kMaxDegree = 1 << 16;  // dp, tp, pp
constexpr int64_t kMaxWorld = 1 << 20;
constexpr int64_t kMaxFileBytes = int64_t{1} << 50;
constexpr int64_t kMaxDim = int64_t{1} << 32;  // one dimension of a shape
constexpr int64_t kMaxElements = int64_t{1} << 48;
constexpr size_t kMaxShapeRank = 8;
// Boxes of one tensor: a shard per rank, a few per ZeRO stretch.
constexpr size_t kMaxShardsPerTensor = 1 << 14;
constexpr size_t kMaxNameLength = 256;
constexpr size_t kMaxUidLength = 128;
constexpr int64_t kMaxSpecBytes = 1 << 20;
// A character is at most four bytes of UTF-8.
constexpr int64_t kMaxVocabBytes = int64_t{4} * CharTokenizer::kMaxSize;
constexpr int kMaxJsonDepth = 16;

std::string Errno(const std::string& what, const std::string& path) {
  return absl::StrCat(what, " '", path, "': ", std::strerror(errno));
}

std::string Hex(uint64_t h) { return absl::StrFormat("%016x", h); }

std::string Join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// A name from a manifest, shortened for an error message.
std::string Quote(absl::string_view s) {
  std::string out(s.substr(0, 64));
  for (char& c : out) {
    if (!absl::ascii_isprint(static_cast<unsigned char>(c))) c = '?';
  }
  return absl::StrCat("'", out, s.size() > 64 ? "...'" : "'");
}

// Deepest nesting of [ and { outside strings: refused before parsing, so
// that no recursion anywhere sees an absurd depth.
int JsonDepth(const std::string& text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

// Parses a manifest-like JSON text without exceptions; nullopt if it is not
// JSON or nests too deeply.
std::optional<json> ParseJson(const std::string& text) {
  if (JsonDepth(text) > kMaxJsonDepth) return std::nullopt;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// --- typed access to manifest fields: never throws, names the field -----

std::string Path(absl::string_view where, absl::string_view key) {
  return where.empty() ? std::string(key) : absl::StrCat(where, ".", key);
}

absl::Status Bad(const std::string& msg) {
  return absl::InvalidArgumentError(msg);
}

absl::StatusOr<const json*> Member(const json& obj, absl::string_view where,
                                   absl::string_view key) {
  if (!obj.is_object()) {
    return Bad(absl::StrCat(where.empty() ? "the manifest" : where,
                            " is not an object"));
  }
  auto it = obj.find(key);
  if (it == obj.end()) return Bad(Path(where, key) + " is missing");
  return &*it;
}

absl::StatusOr<const json*> ObjectAt(const json& obj, absl::string_view where,
                                     absl::string_view key) {
  auto v = Member(obj, where, key);
  if (!v.ok()) return v.status();
  if (!(*v)->is_object()) {
    return Bad(absl::StrCat(Path(where, key), " is ", (*v)->type_name(),
                            ", not an object"));
  }
  return v;
}

// An integer in [lo, hi]: a JSON integer (not 5.0, not 1e30, not "5").
absl::Status IntValue(const json& v, const std::string& path, int64_t lo,
                      int64_t hi, int64_t* out) {
  if (v.is_number_float()) {
    return Bad(absl::StrCat(path, "=", v.get<double>(), " is not an integer"));
  }
  if (!v.is_number_integer()) {
    return Bad(absl::StrCat(path, " is ", v.type_name(), ", not an integer"));
  }
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) {
      return Bad(
          absl::StrCat(path, "=", u, " is outside [", lo, ", ", hi, "]"));
    }
    *out = static_cast<int64_t>(u);
  } else {
    *out = v.get<int64_t>();
  }
  if (*out < lo || *out > hi) {
    return Bad(
        absl::StrCat(path, "=", *out, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status Int(const json& obj, absl::string_view where,
                 absl::string_view key, int64_t lo, int64_t hi, int64_t* out) {
  auto v = Member(obj, where, key);
  if (!v.ok()) return v.status();
  return IntValue(**v, Path(where, key), lo, hi, out);
}

absl::Status Int32(const json& obj, absl::string_view where,
                   absl::string_view key, int64_t lo, int64_t hi, int* out) {
  int64_t v = 0;
  if (auto s = Int(obj, where, key, lo, hi, &v); !s.ok()) return s;
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status Uint64(const json& obj, absl::string_view where,
                    absl::string_view key, uint64_t* out) {
  auto v = Member(obj, where, key);
  if (!v.ok()) return v.status();
  const std::string path = Path(where, key);
  if (!(*v)->is_number_integer() ||
      (!(*v)->is_number_unsigned() && (*v)->get<int64_t>() < 0)) {
    return Bad(path + " is not an integer between 0 and 2^64-1");
  }
  *out = (*v)->get<uint64_t>();
  return absl::OkStatus();
}

absl::Status String(const json& obj, absl::string_view where,
                    absl::string_view key, size_t max_len, std::string* out) {
  auto v = Member(obj, where, key);
  if (!v.ok()) return v.status();
  const std::string path = Path(where, key);
  if (!(*v)->is_string()) {
    return Bad(absl::StrCat(path, " is ", (*v)->type_name(), ", not a string"));
  }
  const auto& s = (*v)->get_ref<const std::string&>();
  if (s.size() > max_len) {
    return Bad(
        absl::StrCat(path, " is ", s.size(), " bytes long; at most ", max_len));
  }
  *out = s;
  return absl::OkStatus();
}

// A 64-bit hash written by Hex: exactly 16 lowercase hex digits.
bool Hex64(const json& h, uint64_t* out) {
  if (!h.is_string()) return false;
  const std::string& s = h.get_ref<const std::string&>();
  return s.size() == 16 &&
         std::all_of(s.begin(), s.end(),
                     [](char ch) {
                       return (ch >= '0' && ch <= '9') ||
                              (ch >= 'a' && ch <= 'f');
                     }) &&
         absl::SimpleHexAtoi(s, out);
}

// "shard-RRRRR.bin" (5 or more digits) -> R, or -1.
int64_t ShardNumber(absl::string_view name) {
  constexpr absl::string_view kPrefix = "shard-", kSuffix = ".bin";
  if (name.size() < kPrefix.size() + 5 + kSuffix.size() ||
      name.substr(0, kPrefix.size()) != kPrefix ||
      name.substr(name.size() - kSuffix.size()) != kSuffix) {
    return -1;
  }
  const absl::string_view digits = name.substr(
      kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  int64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9' || n > kMaxWorld) return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}

// "step-NNNNNNNN" (8 or more digits) -> N, or -1.
int64_t StepNumber(absl::string_view name) {
  constexpr absl::string_view kPrefix = "step-";
  if (name.size() < kPrefix.size() + 8 ||
      name.substr(0, kPrefix.size()) != kPrefix) {
    return -1;
  }
  int64_t n = 0;
  for (char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9' || n > kMaxStep) return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}

std::string StepName(int64_t step) {
  return absl::StrFormat("step-%08d", step);
}

// Writes a file through a buffer, hashing each kChunkBytes chunk.
class ChunkedWriter {
 public:
  ~ChunkedWriter() {
    if (state_ != nullptr) XXH64_freeState(state_);
  }
  absl::Status Open(const ConfinedFs& fs, const std::string& path,
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
    if (::fsync(fd_.get()) != 0) {
      return absl::InternalError(Errno("cannot fsync", path_));
    }
    if (::close(fd_.Release()) != 0) {
      return absl::InternalError(Errno("cannot close", path_));
    }
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

  std::string path_;
  UniqueFd fd_;
  XXH64_state_t* state_ = nullptr;
  std::vector<char> buffer_;
  std::vector<uint64_t> chunks_;
  int64_t in_chunk_ = 0, total_ = 0;
};

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

// Sum of x over the world (x itself without one): how ranks agree.
double Agree(Communicator* world, double x) {
  if (world != nullptr && world->size() > 1) world->AllReduce(&x, 1);
  return x;
}

json MetaToJson(const CheckpointMeta& m) {
  json j = {{"step", m.step},
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
            {"job_uid", m.job_uid},
            {"layout",
             {{"dp", m.dp},
              {"tp", m.tp},
              {"pp", m.pp},
              {"zero", m.zero},
              {"world", m.world}}}};
  if (m.data_digest.has_value()) j["data_digest"] = Hex(*m.data_digest);
  return j;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

json BoxToJson(const Box& b) {
  json out = json::array();
  for (size_t d = 0; d < b.lo.size(); ++d) out.push_back({b.lo[d], b.hi[d]});
  return out;
}

}  // namespace

std::string ExpAvgName(const std::string& name) {
  return "optimizer.exp_avg." + name;
}
std::string ExpAvgSqName(const std::string& name) {
  return "optimizer.exp_avg_sq." + name;
}

absl::StatusOr<std::vector<std::string>> ListCheckpoints(
    const std::string& root, const ConfinedFs& fs) {
  std::vector<std::string> out;
  auto entries = fs.List(root, kField);
  if (!entries.ok()) {
    if (entries.status().code() == absl::StatusCode::kNotFound) return out;
    return entries.status();
  }
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const ConfinedFs::Entry& e : *entries) {
    const int64_t n = StepNumber(e.name);
    if (e.is_dir && n >= 0) steps.emplace_back(n, Join(root, e.name));
  }
  std::sort(steps.rbegin(), steps.rend());
  for (auto& [n, dir] : steps) out.push_back(std::move(dir));
  return out;
}

absl::StatusOr<std::string> CheckpointJobUid(const std::string& dir,
                                             const ConfinedFs& fs) {
  auto text = fs.ReadFile(Join(dir, kManifest), kField, kMaxManifestBytes);
  if (!text.ok()) return text.status();
  const std::optional<json> m = ParseJson(*text);
  if (!m.has_value() || !m->is_object()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", dir, " is damaged: manifest.json is not valid JSON"));
  }
  auto it = m->find("job_uid");
  if (it == m->end()) return std::string();
  if (!it->is_string() ||
      it->get_ref<const std::string&>().size() > kMaxUidLength) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", dir, " is damaged: job_uid is not a short string"));
  }
  return it->get<std::string>();
}

std::string NewRunUid(Communicator* world) {
  // Drawn on rank 0, summed over the world (the others add zeros): every
  // rank records the same id. Both numbers are exact in a double.
  double drawn[2] = {0, 0};
  if (world == nullptr || world->rank() == 0) {
    std::random_device random;
    drawn[0] = static_cast<double>(std::time(nullptr));
    drawn[1] = static_cast<double>(random());
  }
  if (world != nullptr && world->size() > 1) world->AllReduce(drawn, 2);
  const auto when = static_cast<std::time_t>(drawn[0]);
  std::tm utc{};
  gmtime_r(&when, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &utc);
  return absl::StrFormat("run-%s-%08x", stamp, static_cast<uint32_t>(drawn[1]));
}

absl::StatusOr<std::vector<std::string>> OtherRunsCheckpointsAt(
    const std::string& root, const std::string& run_uid,
    const std::function<bool(int64_t)>& will_save, const ConfinedFs& fs) {
  auto all = ListCheckpoints(root, fs);
  if (!all.ok()) return all.status();
  std::vector<std::string> others;
  for (auto it = all->rbegin(); it != all->rend(); ++it) {
    const std::string name = fs::path(*it).filename().string();
    if (!will_save(StepNumber(name))) continue;
    // One whose owner cannot be read is left alone when its step comes
    // (PrepareSave), so it is no obstacle.
    auto owner = CheckpointJobUid(*it, fs);
    if (owner.ok() && *owner != run_uid) {
      others.push_back(absl::StrCat(
          name, " (",
          owner->empty() ? "a run without an id" : "'" + *owner + "'", ")"));
    }
  }
  return others;
}

namespace {

// A save's folders: root/step-N, written as root/step-N.tmp.
struct SaveFolders {
  std::string root, final_dir, tmp;
};

// Collective. Rank 0 prepares a clean step-N.tmp/ (a crashed save may have
// left one). True when this job committed the step already (nothing to
// write); FailedPrecondition when another job did.
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

// Not collective: rank `rank` writes its runs to step-N.tmp/shard-R.bin,
// then a small index of what it wrote (shard-R.json).
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

// Collective, once every rank's WriteShard has returned (`wrote`, this
// rank's): rank 0 merges the indexes into the manifest, writes its digest
// last, commits by rename and prunes.
absl::Status CommitSave(const SaveFolders& f, const CheckpointMeta& meta,
                        const absl::Status& wrote, Communicator* world,
                        const SaveOptions& options) {
  const ConfinedFs& cfs = options.fs;
  const int rank = world != nullptr ? world->rank() : 0;
  const int size = world != nullptr ? world->size() : 1;
  if (Agree(world, wrote.ok() ? 0.0 : 1.0) > 0.0) {
    if (!wrote.ok()) return wrote;
    return absl::InternalError("checkpoint: another rank failed to write");
  }
  absl::Status committed = absl::OkStatus();
  if (rank == 0) {
    committed = [&]() -> absl::Status {
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
        const std::string side =
            Join(f.tmp, absl::StrFormat("shard-%05d.json", r));
        auto text = cfs.ReadFile(side, kField, kMaxSideIndexBytes);
        if (!text.ok()) return text.status();
        // Written by this job's ranks a moment ago; still, a bad one is an
        // error, not an exception.
        const std::optional<json> index = ParseJson(*text);
        if (!index.has_value() || !index->is_object() ||
            !index->contains("file") || !index->contains("entries")) {
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
      const std::string text = manifest.dump(1);
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
      if (auto s = cfs.SyncDir(f.root, kField); !s.ok()) return s;
      // Prune only once the new checkpoint is committed, and only this
      // job's: a checkpoint whose owner cannot be read is left alone.
      if (options.keep_last > 0) {
        auto all = ListCheckpoints(f.root, cfs);
        if (!all.ok()) return all.status();
        int kept = 0;
        for (const std::string& dir : *all) {
          auto owner = CheckpointJobUid(dir, cfs);
          if (!owner.ok() || *owner != meta.job_uid) continue;
          if (++kept <= options.keep_last) continue;
          if (auto s = cfs.RemoveAll(dir, kField); !s.ok()) return s;
        }
      }
      return absl::OkStatus();
    }();
  }
  if (Agree(world, committed.ok() ? 0.0 : 1.0) > 0.0) {
    if (!committed.ok()) return committed;
    return absl::InternalError("checkpoint: rank 0 failed to commit");
  }
  return absl::OkStatus();
}

SaveFolders FoldersOf(const std::string& root, int64_t step) {
  SaveFolders f;
  f.root = root;
  f.final_dir = CheckpointFolder(root, step);
  f.tmp = f.final_dir + ".tmp";
  return f;
}

}  // namespace

std::string CheckpointFolder(const std::string& root, int64_t step) {
  return Join(root, StepName(step));
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

BackgroundSave::~BackgroundSave() {
  if (writer_.joinable()) writer_.join();
}

absl::StatusOr<bool> BackgroundSave::Start(const std::string& root,
                                           const CheckpointMeta& meta,
                                           std::vector<ShardRun> runs,
                                           Communicator* world,
                                           const SaveOptions& options) {
  PT_CHECK(!pending(), "a background checkpoint is already pending");
  const SaveFolders f = FoldersOf(root, meta.step);
  auto committed = PrepareSave(f, meta, world, options.fs);
  if (!committed.ok()) return committed.status();
  if (*committed) return true;
  meta_ = meta;
  options_ = options;
  // The copy the thread writes from: the caller's state changes with the
  // next step.
  int64_t total = 0;
  for (const ShardRun& r : runs) total += r.box.numel();
  snapshot_.resize(total);
  float* at = snapshot_.data();
  for (ShardRun& r : runs) {
    const int64_t n = r.box.numel();
    std::memcpy(at, r.data, n * sizeof(float));
    r.data = at;
    at += n;
  }
  runs_ = std::move(runs);
  root_ = root;
  wrote_ = absl::OkStatus();
  written_.store(false);
  const int rank = world != nullptr ? world->rank() : 0;
  writer_ = std::thread([this, f, rank] {
    const auto t0 = std::chrono::steady_clock::now();
    wrote_ = WriteShard(f, rank, runs_, options_);
    write_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    written_.store(true, std::memory_order_release);
  });
  return false;
}

bool BackgroundSave::AllWritten(Communicator* world) {
  PT_CHECK(pending(), "no background checkpoint is pending");
  const bool mine = written_.load(std::memory_order_acquire);
  return Agree(world, mine ? 0.0 : 1.0) == 0.0;
}

absl::StatusOr<std::string> BackgroundSave::Finish(Communicator* world) {
  PT_CHECK(pending(), "no background checkpoint is pending");
  writer_.join();
  const SaveFolders f = FoldersOf(root_, meta_.step);
  const absl::Status s = CommitSave(f, meta_, wrote_, world, options_);
  runs_.clear();
  if (!s.ok()) return s;
  return f.final_dir;
}

absl::Status CheckpointReader::Damaged(const std::string& what) const {
  return absl::DataLossError(
      absl::StrCat("checkpoint ", dir_, " is damaged: ", what));
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& dir, const ConfinedFs& fs, const std::string& field) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->dir_ = dir;
  r->fs_ = fs;
  r->field_ = field;
  auto has_manifest = fs.Exists(Join(dir, kManifest), field);
  if (!has_manifest.ok()) return has_manifest.status();
  if (!*has_manifest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", dir, "' is not a committed checkpoint (no manifest.json)"));
  }
  // The digest first: it says whether the manifest is the one written.
  auto digest = fs.ReadFile(Join(dir, kDigestFile), field, 4096);
  if (!digest.ok()) {
    switch (digest.status().code()) {
      case absl::StatusCode::kNotFound:
        return r->Damaged(
            "it has no manifest.sha256 (the digest of manifest.json)");
      case absl::StatusCode::kResourceExhausted:
      case absl::StatusCode::kInvalidArgument:
        return r->Damaged("manifest.sha256 is not a SHA-256 line");
      default:
        return digest.status();
    }
  }
  auto text = fs.ReadFile(Join(dir, kManifest), field, kMaxManifestBytes);
  if (!text.ok()) {
    if (text.status().code() == absl::StatusCode::kResourceExhausted ||
        text.status().code() == absl::StatusCode::kInvalidArgument) {
      return r->Damaged(std::string(text.status().message()));
    }
    return text.status();
  }
  if (const std::string bad = CheckManifestDigest(*digest, *text);
      !bad.empty()) {
    return r->Damaged(bad);
  }
  const std::optional<json> m = ParseJson(*text);
  if (!m.has_value()) {
    return r->Damaged(
        absl::StrCat("manifest.json is not JSON (or nests more than ",
                     kMaxJsonDepth, " levels)"));
  }
  if (auto s = r->Load(*m); !s.ok()) return s;
  return r;
}

absl::Status CheckpointReader::Load(const json& m) {
  // Every number is checked here, before anything is read from a shard
  // (docs/checkpoints.md has the rules).
  auto fail = [&](const absl::Status& s) {
    return Damaged(std::string(s.message()));
  };
  std::string format;
  if (auto s = String(m, "", "format", 64, &format); !s.ok()) return fail(s);
  const bool byte_vocab = format == kByteVocabFormat;
  if (format != kFormat && !byte_vocab) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", dir_, " has format ", Quote(format),
        "; this ptworker reads ", kFormat, " and ", kByteVocabFormat));
  }
  CheckpointMeta& meta = meta_;
  absl::Status s = absl::OkStatus();
  auto check = [&](absl::Status next) {
    if (s.ok()) s = std::move(next);
  };
  check(Int(m, "", "step", 0, kMaxStep, &meta.step));
  check(Int(m, "", "tokens_seen", 0, kMaxTokens, &meta.tokens_seen));
  if (s.ok()) {
    check(Int(m, "", "optimizer_step", 0, meta.step, &meta.optimizer_step));
  }
  if (!s.ok()) return fail(s);

  auto sampler = ObjectAt(m, "", "sampler");
  if (!sampler.ok()) return fail(sampler.status());
  check(Uint64(**sampler, "sampler", "seed", &meta.seed));
  auto model = ObjectAt(m, "", "model");
  if (!model.ok()) return fail(model.status());
  GptConfig& c = meta.model;
  check(Int32(**model, "model", "n_layer", 1, kMaxLayers, &c.n_layer));
  check(Int32(**model, "model", "n_head", 1, kMaxModelDim, &c.n_head));
  check(Int32(**model, "model", "n_embd", 1, kMaxModelDim, &c.n_embd));
  check(Int32(**model, "model", "block_size", 1, kMaxModelDim, &c.block_size));
  check(Int32(**model, "model", "vocab_size", 1, kMaxModelDim, &c.vocab_size));
  if (!s.ok()) return fail(s);
  if (c.n_embd % c.n_head != 0) {
    return Damaged(absl::StrCat("model.n_head=", c.n_head,
                                " does not divide model.n_embd=", c.n_embd));
  }
  check(String(m, "", "vocab", byte_vocab ? 256 : kMaxVocabBytes, &meta.vocab));
  check(String(m, "", "spec", kMaxSpecBytes, &meta.spec_yaml));
  if (!s.ok()) return fail(s);
  if (!meta.vocab.empty()) {
    if (byte_vocab) {
      // One byte a character, in byte order: as code points U+0000..U+00FF
      // (the same text for the ASCII vocabularies such checkpoints hold).
      std::string utf8;
      for (unsigned char b : meta.vocab) AppendChar(b, &utf8);
      meta.vocab = std::move(utf8);
    }
    auto vocab = CharTokenizer::FromVocab(meta.vocab);
    if (!vocab.ok()) {
      return Damaged("vocab: " + std::string(vocab.status().message()));
    }
    if (vocab->size() != c.vocab_size) {
      return Damaged(
          absl::StrCat("vocab has ", vocab->size(),
                       " characters but model.vocab_size=", c.vocab_size));
    }
  }
  if (m.contains("job_uid")) {
    if (auto st = String(m, "", "job_uid", kMaxUidLength, &meta.job_uid);
        !st.ok()) {
      return fail(st);
    }
  }
  // Absent (format 3, or a writer that did not know the data): unknown.
  if (auto it = m.find("data_digest"); it != m.end()) {
    uint64_t d = 0;
    if (!Hex64(*it, &d)) {
      return Damaged("data_digest is not 16 lowercase hex digits");
    }
    meta.data_digest = d;
  }
  auto layout = ObjectAt(m, "", "layout");
  if (!layout.ok()) return fail(layout.status());
  check(Int32(**layout, "layout", "dp", 1, kMaxDegree, &meta.dp));
  check(Int32(**layout, "layout", "tp", 1, kMaxDegree, &meta.tp));
  check(Int32(**layout, "layout", "pp", 1, kMaxDegree, &meta.pp));
  check(Int32(**layout, "layout", "zero", 0, 3, &meta.zero));
  check(Int32(**layout, "layout", "world", 1, kMaxWorld, &meta.world));
  if (!s.ok()) return fail(s);
  if (int64_t{meta.dp} * meta.tp * meta.pp != meta.world) {
    return Damaged(absl::StrCat("layout.world=", meta.world,
                                " is not layout.dp × tp × pp = ", meta.dp,
                                " × ", meta.tp, " × ", meta.pp));
  }
  // The folder's name, when it is a step folder, is the manifest's step.
  std::string base = dir_;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const int64_t named = StepNumber(fs::path(base).filename().string());
  if (named >= 0 && named != meta.step) {
    return Damaged(absl::StrCat("it is folder ", StepName(named),
                                " but its manifest has step=", meta.step));
  }

  // Files: one per rank, shard-00000.bin .. shard-<world-1>.bin, each with
  // its size and one well-formed hash per chunk.
  auto files = ObjectAt(m, "", "files");
  if (!files.ok()) return fail(files.status());
  if (static_cast<int64_t>((*files)->size()) != meta.world) {
    return Damaged(absl::StrCat("files lists ", (*files)->size(),
                                " shard files for layout.world=", meta.world));
  }
  std::set<int64_t> ranks;
  for (const auto& [name, f] : (*files)->items()) {
    const int64_t r = ShardNumber(name);
    if (r < 0 || r >= meta.world || !ranks.insert(r).second) {
      return Damaged(absl::StrCat("files has ", Quote(name),
                                  ", not shard-RRRRR.bin of a rank below ",
                                  meta.world));
    }
    const std::string where = absl::StrCat("files.", name);
    FileInfo info;
    check(Int(f, where, "bytes", 0, kMaxFileBytes, &info.bytes));
    check(Int(f, where, "chunk_bytes", kMinChunkBytes, kMaxChunkBytes,
              &info.chunk_bytes));
    if (!s.ok()) return fail(s);
    auto hashes = Member(f, where, "xxh64_chunks");
    if (!hashes.ok()) return fail(hashes.status());
    const int64_t n_chunks =
        (info.bytes + info.chunk_bytes - 1) / info.chunk_bytes;
    if (!(*hashes)->is_array() ||
        static_cast<int64_t>((*hashes)->size()) != n_chunks) {
      return Damaged(absl::StrCat(where, ".xxh64_chunks must be a list of ",
                                  n_chunks, " hashes (bytes=", info.bytes,
                                  " / chunk_bytes=", info.chunk_bytes, ")"));
    }
    info.chunks.reserve(n_chunks);
    for (const json& h : **hashes) {
      uint64_t v = 0;
      if (!Hex64(h, &v)) {
        return Damaged(absl::StrCat(where, ".xxh64_chunks[", info.chunks.size(),
                                    "] is not 16 lowercase hex digits"));
      }
      info.chunks.push_back(v);
    }
    files_[name] = std::move(info);
  }

  // Tensors: shapes in range; each tensor's shards tile [0, numel) with
  // no gap and no overlap, each inside its file.
  auto tensors = ObjectAt(m, "", "tensors");
  if (!tensors.ok()) return fail(tensors.status());
  struct Span {
    int64_t begin, end;
    std::string tensor;
  };
  std::map<std::string, std::vector<Span>> file_spans;
  for (const auto& [name, t] : (*tensors)->items()) {
    if (name.empty() || name.size() > kMaxNameLength) {
      return Damaged(absl::StrCat("tensor name ", Quote(name),
                                  " is empty or longer than ", kMaxNameLength));
    }
    const std::string where = absl::StrCat("tensors.", name);
    std::string dtype;
    if (auto st = String(t, where, "dtype", 16, &dtype); !st.ok()) {
      return fail(st);
    }
    if (dtype != "float32") {
      return Damaged(absl::StrCat(where, ".dtype=", Quote(dtype),
                                  " (only float32 is written)"));
    }
    auto shape = Member(t, where, "shape");
    if (!shape.ok()) return fail(shape.status());
    if (!(*shape)->is_array() || (*shape)->empty() ||
        (*shape)->size() > kMaxShapeRank) {
      return Damaged(absl::StrCat(where, ".shape must be a list of 1 to ",
                                  kMaxShapeRank, " dimensions"));
    }
    std::vector<int64_t> dims;
    int64_t numel = 1;
    for (size_t i = 0; i < (*shape)->size(); ++i) {
      int64_t d = 0;
      if (auto st =
              IntValue((**shape)[i], absl::StrCat(where, ".shape[", i, "]"), 1,
                       kMaxDim, &d);
          !st.ok()) {
        return fail(st);
      }
      if (__builtin_mul_overflow(numel, d, &numel) || numel > kMaxElements) {
        return Damaged(absl::StrCat(where, ".shape has more than ",
                                    kMaxElements, " elements"));
      }
      dims.push_back(d);
    }
    auto shards = Member(t, where, "shards");
    if (!shards.ok()) return fail(shards.status());
    if (!(*shards)->is_array()) {
      return Damaged(where + ".shards is not a list");
    }
    std::vector<Entry> list;
    for (size_t i = 0; i < (*shards)->size(); ++i) {
      const json& e = (**shards)[i];
      const std::string at = absl::StrCat(where, ".shards[", i, "]");
      Entry entry;
      check(String(e, at, "file", kMaxNameLength, &entry.file));
      if (!s.ok()) return fail(s);
      auto f = files_.find(entry.file);
      if (f == files_.end()) {
        return Damaged(
            absl::StrCat(at, ".file=", Quote(entry.file), " is not in files"));
      }
      const int64_t file_bytes = f->second.bytes;
      check(Int(e, at, "offset", 0, file_bytes, &entry.offset));
      if (!s.ok()) return fail(s);
      auto box = Member(e, at, "box");
      if (!box.ok()) return fail(box.status());
      if (!(*box)->is_array() || (*box)->size() != dims.size()) {
        return Damaged(absl::StrCat(at, ".box must be a list of ", dims.size(),
                                    " [lo, hi] pairs"));
      }
      for (size_t d = 0; d < dims.size(); ++d) {
        const json& range = (**box)[d];
        const std::string rd = absl::StrCat(at, ".box[", d, "]");
        int64_t lo = 0, hi = 0;
        if (!range.is_array() || range.size() != 2) {
          return Damaged(rd + " must be a [lo, hi] pair");
        }
        check(IntValue(range[0], rd + "[0]", 0, dims[d] - 1, &lo));
        check(IntValue(range[1], rd + "[1]", lo + 1, dims[d], &hi));
        if (!s.ok()) return fail(s);
        entry.box.lo.push_back(lo);
        entry.box.hi.push_back(hi);
      }
      // Inside a tensor of at most kMaxElements: no overflow.
      const int64_t count = entry.box.numel();
      const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
      if (entry.offset % static_cast<int64_t>(sizeof(float)) != 0 ||
          bytes > file_bytes - entry.offset) {
        return Damaged(absl::StrCat(at, ": bytes [", entry.offset, ", ",
                                    entry.offset, " + 4·", count,
                                    ") are not whole floats inside ",
                                    entry.file, " (", file_bytes, " bytes)"));
      }
      file_spans[entry.file].push_back(
          {entry.offset, entry.offset + bytes, name});
      list.push_back(std::move(entry));
    }
    if (list.size() > kMaxShardsPerTensor) {
      return Damaged(absl::StrCat(where, " has more than ", kMaxShardsPerTensor,
                                  " shards"));
    }
    std::vector<Box> boxes;
    for (const Entry& e : list) boxes.push_back(e.box);
    if (const std::string why = CheckTiling(dims, boxes); !why.empty()) {
      return Damaged(absl::StrCat(where, ".shards must tile ",
                                  ShapeString(dims), " exactly: ", why));
    }
    shapes_[name] = std::move(dims);
    entries_[name] = std::move(list);
  }
  // Each shard file is exactly the runs it holds, back to back: no byte
  // claimed twice (which offsets pointing into another tensor would do).
  for (const auto& [name, info] : files_) {
    auto& spans = file_spans[name];
    std::sort(spans.begin(), spans.end(),
              [](const Span& a, const Span& b) { return a.begin < b.begin; });
    int64_t next = 0;
    for (const Span& sp : spans) {
      if (sp.begin != next) {
        return Damaged(absl::StrCat(
            name, ": ", sp.begin < next ? "tensors overlap" : "a gap",
            " at byte ", std::min(sp.begin, next), " (tensor ",
            Quote(sp.tensor), ")"));
      }
      next = sp.end;
    }
    if (next != info.bytes) {
      return Damaged(absl::StrCat(name, ": its tensors end at byte ", next,
                                  " of its ", info.bytes));
    }
  }
  // The tensors are the model's: weights and both moments of every tensor
  // GptTensors(model) has, with its shapes. (Counted first, so that the
  // table built for the comparison is no larger than the manifest.)
  const int64_t needed = 3 * (12 * int64_t{c.n_layer} + 4);
  if (static_cast<int64_t>(shapes_.size()) < needed) {
    return Damaged(absl::StrCat("model.n_layer=", c.n_layer, " needs ", needed,
                                " tensors but the manifest has ",
                                shapes_.size()));
  }
  if (auto own = CheckCompatible(c, GptTensors(c)); !own.ok()) {
    return Damaged(absl::StrCat("its tensors do not match its own model: ",
                                own.message()));
  }
  // Only now the files: each must be there, a regular file of its size.
  for (auto& [name, info] : files_) {
    const std::string path = Join(dir_, name);
    auto fd = fs_.Open(path, O_RDONLY | O_NONBLOCK, field_);
    if (!fd.ok()) {
      if (fd.status().code() == absl::StatusCode::kNotFound) {
        return Damaged(name + " is missing");
      }
      return fd.status();
    }
    struct stat st;
    if (::fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return Damaged(name + " is not a regular file");
    }
    if (st.st_size != info.bytes) {
      return Damaged(absl::StrCat(name, " is ", st.st_size,
                                  " bytes, the manifest says ", info.bytes));
    }
    info.fd = std::make_shared<UniqueFd>(std::move(*fd));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::CheckCompatible(
    const GptConfig& model, const std::vector<ParamInfo>& layout) const {
  for (const ParamInfo& p : layout) {
    for (const std::string& n :
         {p.name, ExpAvgName(p.name), ExpAvgSqName(p.name)}) {
      auto it = shapes_.find(n);
      if (it == shapes_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint '", dir_,
                         "' does not fit the model: it has no tensor ", n));
      }
      if (it->second != p.global_shape) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint '", dir_, "' does not fit the model: tensor ", n,
            " has shape ", ShapeString(it->second), " in the checkpoint but ",
            ShapeString(p.global_shape), " in the model"));
      }
    }
  }
  const GptConfig& c = meta_.model;
  for (auto [field, theirs, ours] :
       {std::tuple<const char*, int, int>{"n_layer", c.n_layer, model.n_layer},
        {"n_head", c.n_head, model.n_head},
        {"n_embd", c.n_embd, model.n_embd},
        {"block_size", c.block_size, model.block_size},
        {"vocab_size", c.vocab_size, model.vocab_size}}) {
    if (theirs != ours) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint '", dir_, "' does not fit the model: model.", field, "=",
          theirs, " in the checkpoint but ", ours, " in the model"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadFileRange(const std::string& file,
                                             int64_t offset, int64_t bytes,
                                             char* dst) {
  auto it = files_.find(file);
  if (it == files_.end()) return Damaged("manifest lists no file " + file);
  const FileInfo& info = it->second;
  if (bytes <= 0) return absl::OkStatus();
  // Whole chunks, each checked against its hash once and kept for the
  // neighbouring slices that share it.
  const int64_t cb = info.chunk_bytes;
  const int64_t c0 = offset / cb, c1 = (offset + bytes - 1) / cb;
  for (int64_t c = c0; c <= c1; ++c) {
    auto chunk = Chunk(file, info, c);
    if (!chunk.ok()) return chunk.status();
    const int64_t lo = std::max(offset, c * cb);
    const int64_t hi = std::min(offset + bytes, (c + 1) * cb);
    std::memcpy(dst + (lo - offset), (*chunk)->data() + (lo - c * cb), hi - lo);
  }
  return absl::OkStatus();
}

absl::StatusOr<const std::vector<char>*> CheckpointReader::Chunk(
    const std::string& file, const FileInfo& info, int64_t c) {
  const auto key = std::make_pair(file, c);
  if (auto it = cache_.find(key); it != cache_.end()) return &it->second;
  const int64_t cb = info.chunk_bytes;
  const std::string path = Join(dir_, file);
  if (c < 0 || c >= static_cast<int64_t>(info.chunks.size())) {
    return Damaged(absl::StrCat(file, " has no chunk ", c));
  }
  const int64_t n = std::min(cb, info.bytes - c * cb);
  std::vector<char> buf(n);
  int64_t got = 0;
  while (got < n) {
    const ssize_t r =
        ::pread(info.fd->get(), buf.data() + got, n - got, c * cb + got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::DataLossError(Errno("short read from", path));
    got += r;
  }
  bytes_read_ += n;
  if (XXH64(buf.data(), static_cast<size_t>(n), 0) != info.chunks[c]) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' is corrupt: checksum mismatch in bytes [",
                     c * cb, ", ", c * cb + n, ")"));
  }
  if (cache_.size() >= kCachedChunks) cache_.erase(cache_.begin());
  return &cache_.emplace(key, std::move(buf)).first->second;
}

absl::Status CheckpointReader::Read(const std::string& name, const Box& box,
                                    float* dst) {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", dir_, "' has no tensor ", name));
  }
  const std::vector<int64_t>& shape = shapes_.at(name);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.lo.size() != shape.size() || box.hi.size() != shape.size() ||
        box.lo[d] < 0 || box.lo[d] > box.hi[d] || box.hi[d] > shape[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint '", dir_, "': a box outside tensor ", name,
                       " of shape ", ShapeString(shape)));
    }
  }
  int64_t covered = 0;
  for (const Entry& e : it->second) {
    const Box part = Intersect(box, e.box);
    if (part.empty()) continue;
    // Row by row: a row of the intersection is contiguous in the entry's
    // data and in dst alike.
    const int64_t row = part.hi.back() - part.lo.back();
    absl::Status status = absl::OkStatus();
    ForEachBoxRow(part, [&](const std::vector<int64_t>& coord) {
      if (!status.ok()) return;
      const int64_t offset = e.offset + BoxIndex(e.box, coord) *
                                            static_cast<int64_t>(sizeof(float));
      status = ReadFileRange(
          e.file, offset, row * static_cast<int64_t>(sizeof(float)),
          reinterpret_cast<char*>(dst + BoxIndex(box, coord)));
    });
    if (!status.ok()) return status;
    covered += part.numel();
  }
  if (covered != box.numel()) {
    return absl::DataLossError(absl::StrCat("checkpoint '", dir_, "': tensor ",
                                            name, " is not all in its shards"));
  }
  return absl::OkStatus();
}

// --- llm.c --------------------------------------------------------------

namespace {

constexpr int32_t kLlmcMagic = 20240326;
constexpr int32_t kLlmcVersion = 3;  // fp32, padded vocabulary

// llm.c's order: wte, wpe, then each block tensor kind across all layers,
// then ln_f; each tensor with its global shape as stored (wte padded to
// the multiple of 128 llm.c pads to, wpe with maxT rows).
std::vector<std::pair<std::string, std::vector<int64_t>>> LlmcOrder(
    const GptConfig& c, int64_t maxT) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ParamInfo& p : GptTensors(c)) shapes[p.name] = p.global_shape;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.emplace_back(
      "wte", std::vector<int64_t>{PaddedVocab(c.vocab_size, 1), c.n_embd});
  out.emplace_back("wpe", std::vector<int64_t>{maxT, c.n_embd});
  for (const std::string& kind : GptBlockTensorNames()) {
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string name = absl::StrCat("h.", l, ".", kind);
      out.emplace_back(name, shapes.at(name));
    }
  }
  out.emplace_back("ln_f.weight", shapes.at("ln_f.weight"));
  out.emplace_back("ln_f.bias", shapes.at("ln_f.bias"));
  return out;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A model config whose llm.c tensors can be counted in int64 without
// overflow (the header stores int32 dimensions; C·C must stay far inside).
bool LlmcSizable(const GptConfig& c) {
  return c.n_layer >= 1 && c.n_layer <= (1 << 20) && c.n_embd >= 1 &&
         c.n_embd <= (1 << 24) && c.vocab_size >= 1 && c.block_size >= 1;
}

}  // namespace

absl::Status ExportLlmc(TensorSource& source, const GptConfig& config,
                        const std::string& path, const ConfinedFs& fs,
                        const std::string& field) {
  if (!LlmcSizable(config)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the model is too large for llm.c's format"));
  }
  const int64_t V = config.vocab_size;
  int32_t header[256] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = config.block_size;
  header[3] = config.vocab_size;
  header[4] = config.n_layer;
  header[5] = config.n_head;
  header[6] = config.n_embd;
  header[7] = PaddedVocab(config.vocab_size, 1);
  // Written beside the target and renamed: never a half-written file.
  const std::string tmp = path + ".tmp";
  auto fail = [&](absl::Status s) {
    (void)fs.Remove(tmp, field);
    return s;
  };
  ChunkedWriter w;
  if (auto s = w.Open(fs, tmp, field); !s.ok()) return s;
  if (auto s = w.Write(reinterpret_cast<const char*>(header), sizeof(header));
      !s.ok()) {
    return fail(s);
  }
  for (const auto& [name, shape] : LlmcOrder(config, config.block_size)) {
    const int64_t stored = Numel(shape);
    Box real = WholeBox(shape);
    if (name == "wte") real.hi[0] = V;  // rows past V stay zero
    std::vector<float> buf(stored, 0.0f);
    if (auto s = source.Read(name, real, buf.data()); !s.ok()) {
      return fail(s);
    }
    if (auto s = w.Write(reinterpret_cast<const char*>(buf.data()),
                         stored * static_cast<int64_t>(sizeof(float)));
        !s.ok()) {
      return fail(s);
    }
  }
  if (auto s = w.Finish(); !s.ok()) return fail(s);
  if (auto s = fs.Rename(tmp, path, field); !s.ok()) return fail(s);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LlmcSource>> LlmcSource::Open(
    const std::string& path, const GptConfig& config, const ConfinedFs& fs,
    const std::string& field) {
  auto fd =
      fs.Open(path, O_RDONLY | O_NONBLOCK, field);  // never wait on a FIFO
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is not a regular file"));
  }
  int32_t h[256];
  if (::pread(fd->get(), h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h))) {
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
  if (Vp != PaddedVocab(V, 1)) {
    return mismatch("padded vocab", Vp, PaddedVocab(V, 1));
  }
  if (!LlmcSizable(config)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the model is too large for llm.c's format"));
  }
  std::unique_ptr<LlmcSource> src(new LlmcSource());
  src->path_ = path;
  // Every count fits int64 (LlmcSizable, maxT < 2^31); their byte sum is
  // checked as it grows.
  int64_t offset = sizeof(h);
  for (const auto& [name, shape] : LlmcOrder(config, maxT)) {
    src->offsets_[name] = offset;
    src->shapes_[name] = shape;
    if (__builtin_add_overflow(offset, Numel(shape) * 4, &offset) ||
        offset > st.st_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", path, "' is ", st.st_size,
                       " bytes; its header implies more (at least ",
                       std::min<int64_t>(offset, INT64_MAX), ")"));
    }
  }
  if (st.st_size != offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is ", st.st_size,
                     " bytes; its header implies ", offset));
  }
  for (const ParamInfo& p : GptTensors(config)) {
    src->bounds_[p.name] = p.global_shape;
  }
  src->fd_ = std::move(*fd);
  return src;
}

absl::Status LlmcSource::Read(const std::string& name, const Box& box,
                              float* dst) {
  auto it = offsets_.find(name);
  auto bound = bounds_.find(name);
  bool inside = it != offsets_.end() && bound != bounds_.end();
  const std::vector<int64_t>* shape = inside ? &shapes_.at(name) : nullptr;
  const std::vector<int64_t>* limit = inside ? &bound->second : nullptr;
  for (size_t d = 0; inside && d < limit->size(); ++d) {
    inside = box.lo.size() == limit->size() && box.hi.size() == limit->size() &&
             limit->size() == shape->size() && box.lo[d] >= 0 &&
             box.lo[d] <= box.hi[d] && box.hi[d] <= (*limit)[d] &&
             (*limit)[d] <= (*shape)[d];
  }
  if (!inside) {
    return absl::NotFoundError(absl::StrCat("llm.c checkpoint '", path_,
                                            "' has no such part of ", name));
  }
  const Box whole = WholeBox(*shape);
  const int64_t row = box.hi.back() - box.lo.back();
  absl::Status status = absl::OkStatus();
  ForEachBoxRow(box, [&](const std::vector<int64_t>& coord) {
    if (!status.ok()) return;
    char* out = reinterpret_cast<char*>(dst + BoxIndex(box, coord));
    const int64_t bytes = row * static_cast<int64_t>(sizeof(float));
    const int64_t at = it->second + BoxIndex(whole, coord) *
                                        static_cast<int64_t>(sizeof(float));
    int64_t got = 0;
    while (got < bytes) {
      const ssize_t n = ::pread(fd_.get(), out + got, bytes - got, at + got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status =
            absl::DataLossError(absl::StrCat("short read from '", path_, "'"));
        return;
      }
      got += n;
    }
  });
  return status;
}

}  // namespace ptrain
