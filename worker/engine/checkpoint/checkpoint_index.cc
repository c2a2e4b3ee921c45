// The index in a checkpoint's manifest (CheckpointReader::Load's steps on
// "files" and "tensors", checkpoint.h): the shard files with their sizes and
// chunk hashes, each tensor's shape and the boxes that tile it, each file
// exactly the runs it holds; then the files opened and their sizes checked.
// Not the run's own record (checkpoint_manifest.cc) nor the reads
// (checkpoint.cc).
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_internal.h"
#include "worker/engine/checkpoint/checkpoint_json.h"

namespace ptrain {

using json = nlohmann::json;
using manifest_json::Hex64;
using manifest_json::Int;
using manifest_json::IntValue;
using manifest_json::Member;
using manifest_json::ObjectAt;
using manifest_json::String;

namespace {

// What a reader accepts of the index (docs/checkpoints.md). Far above any
// real checkpoint, far below where int64 arithmetic on them could overflow.
constexpr int64_t kMinChunkBytes = 4 << 10;
constexpr int64_t kMaxChunkBytes = 16 << 20;
constexpr int64_t kMaxFileBytes = int64_t{1} << 50;
constexpr int64_t kMaxDim = int64_t{1} << 32;  // one dimension of a shape
constexpr int64_t kMaxElements = int64_t{1} << 48;
constexpr size_t kMaxShapeRank = 8;
// Boxes of one tensor: a shard per rank, a few per ZeRO stretch.
constexpr size_t kMaxShardsPerTensor = 1 << 14;
constexpr size_t kMaxNameLength = 256;

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

}  // namespace

absl::Status CheckpointReader::LoadFiles(const json& m) {
  // Files: one per rank, shard-00000.bin .. shard-<world-1>.bin, each with
  // its size and one well-formed hash per chunk.
  auto files = ObjectAt(m, "", "files");
  if (!files.ok()) return Damaged(files.status());
  if (static_cast<int64_t>((*files)->size()) != meta_.world) {
    return Damaged(absl::StrCat("files lists ", (*files)->size(),
                                " shard files for layout.world=", meta_.world));
  }
  std::set<int64_t> ranks;
  for (const auto& [name, f] : (*files)->items()) {
    const int64_t r = ShardNumber(name);
    if (r < 0 || r >= meta_.world || !ranks.insert(r).second) {
      return Damaged(absl::StrCat("files has ", Quote(name),
                                  ", not shard-RRRRR.bin of a rank below ",
                                  meta_.world));
    }
    auto info = LoadFileInfo(f, absl::StrCat("files.", name));
    if (!info.ok()) return info.status();
    files_[name] = std::move(*info);
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointReader::FileInfo> CheckpointReader::LoadFileInfo(
    const json& f, const std::string& where) const {
  absl::Status s = absl::OkStatus();
  auto check = [&](absl::Status next) {
    if (s.ok()) s = std::move(next);
  };
  FileInfo info;
  check(Int(f, where, "bytes", 0, kMaxFileBytes, &info.bytes));
  check(Int(f, where, "chunk_bytes", kMinChunkBytes, kMaxChunkBytes,
            &info.chunk_bytes));
  if (!s.ok()) return Damaged(s);
  auto hashes = Member(f, where, "xxh64_chunks");
  if (!hashes.ok()) return Damaged(hashes.status());
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
  return info;
}

absl::Status CheckpointReader::LoadTensors(const json& m) {
  // Tensors: shapes in range; each tensor's shards tile [0, numel) with
  // no gap and no overlap, each inside its file.
  auto tensors = ObjectAt(m, "", "tensors");
  if (!tensors.ok()) return Damaged(tensors.status());
  for (const auto& [name, t] : (*tensors)->items()) {
    if (auto s = LoadTensor(name, t); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::LoadTensor(const std::string& name,
                                          const json& t) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return Damaged(absl::StrCat("tensor name ", Quote(name),
                                " is empty or longer than ", kMaxNameLength));
  }
  const std::string where = absl::StrCat("tensors.", name);
  std::string dtype;
  if (auto st = String(t, where, "dtype", 16, &dtype); !st.ok()) {
    return Damaged(st);
  }
  if (dtype != "float32") {
    return Damaged(absl::StrCat(where, ".dtype=", Quote(dtype),
                                " (only float32 is written)"));
  }
  auto dims = LoadShape(t, where);
  if (!dims.ok()) return dims.status();
  auto shards = Member(t, where, "shards");
  if (!shards.ok()) return Damaged(shards.status());
  if (!(*shards)->is_array()) {
    return Damaged(where + ".shards is not a list");
  }
  std::vector<Entry> list;
  for (size_t i = 0; i < (*shards)->size(); ++i) {
    auto entry = LoadShard((**shards)[i],
                           absl::StrCat(where, ".shards[", i, "]"), *dims);
    if (!entry.ok()) return entry.status();
    list.push_back(std::move(*entry));
  }
  if (list.size() > kMaxShardsPerTensor) {
    return Damaged(
        absl::StrCat(where, " has more than ", kMaxShardsPerTensor, " shards"));
  }
  std::vector<Box> boxes;
  for (const Entry& e : list) boxes.push_back(e.box);
  if (const std::string why = CheckTiling(*dims, boxes); !why.empty()) {
    return Damaged(absl::StrCat(where, ".shards must tile ", ShapeString(*dims),
                                " exactly: ", why));
  }
  shapes_[name] = std::move(*dims);
  entries_[name] = std::move(list);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> CheckpointReader::LoadShape(
    const json& t, const std::string& where) const {
  auto shape = Member(t, where, "shape");
  if (!shape.ok()) return Damaged(shape.status());
  if (!(*shape)->is_array() || (*shape)->empty() ||
      (*shape)->size() > kMaxShapeRank) {
    return Damaged(absl::StrCat(where, ".shape must be a list of 1 to ",
                                kMaxShapeRank, " dimensions"));
  }
  std::vector<int64_t> dims;
  int64_t numel = 1;
  for (size_t i = 0; i < (*shape)->size(); ++i) {
    int64_t d = 0;
    if (auto st = IntValue((**shape)[i], absl::StrCat(where, ".shape[", i, "]"),
                           1, kMaxDim, &d);
        !st.ok()) {
      return Damaged(st);
    }
    if (__builtin_mul_overflow(numel, d, &numel) || numel > kMaxElements) {
      return Damaged(absl::StrCat(where, ".shape has more than ", kMaxElements,
                                  " elements"));
    }
    dims.push_back(d);
  }
  return dims;
}

absl::StatusOr<CheckpointReader::Entry> CheckpointReader::LoadShard(
    const json& e, const std::string& at,
    const std::vector<int64_t>& dims) const {
  absl::Status s = absl::OkStatus();
  auto check = [&](absl::Status next) {
    if (s.ok()) s = std::move(next);
  };
  Entry entry;
  check(String(e, at, "file", kMaxNameLength, &entry.file));
  if (!s.ok()) return Damaged(s);
  auto f = files_.find(entry.file);
  if (f == files_.end()) {
    return Damaged(
        absl::StrCat(at, ".file=", Quote(entry.file), " is not in files"));
  }
  const int64_t file_bytes = f->second.bytes;
  check(Int(e, at, "offset", 0, file_bytes, &entry.offset));
  if (!s.ok()) return Damaged(s);
  auto box = Member(e, at, "box");
  if (!box.ok()) return Damaged(box.status());
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
    if (!s.ok()) return Damaged(s);
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
                                ") are not whole floats inside ", entry.file,
                                " (", file_bytes, " bytes)"));
  }
  return entry;
}

absl::Status CheckpointReader::CheckFilesTiled() const {
  // Each shard file is exactly the runs it holds, back to back: no byte
  // claimed twice (which offsets pointing into another tensor would do).
  struct Span {
    int64_t begin, end;
    std::string tensor;
  };
  // In the order the tensors were loaded (by name), each tensor's shards in
  // the manifest's order.
  std::map<std::string, std::vector<Span>> file_spans;
  for (const auto& [name, list] : entries_) {
    for (const Entry& e : list) {
      file_spans[e.file].push_back(
          {e.offset,
           e.offset + e.box.numel() * static_cast<int64_t>(sizeof(float)),
           name});
    }
  }
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
  return absl::OkStatus();
}

absl::Status CheckpointReader::OpenShardFiles() {
  // Each must be there, a regular file of its size.
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
}  // namespace ptrain
