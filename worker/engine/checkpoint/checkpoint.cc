// What the checkpoint's units share (checkpoint_internal.h), the names of
// tensors and folders, whose a checkpoint is, and CheckpointReader's reads:
// chunk by chunk, each verified against its hash. Not the manifest's
// validation (checkpoint_manifest.cc) nor the writing (checkpoint_writer.cc,
// checkpoint_async.cc).
#include "worker/engine/checkpoint/checkpoint.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/checkpoint_internal.h"
#include "worker/engine/checkpoint/checkpoint_json.h"

namespace ptrain {

namespace fs = std::filesystem;
using json = nlohmann::json;
using manifest_json::ParseJson;

std::string Errno(const std::string& what, const std::string& path) {
  return absl::StrCat(what, " '", path, "': ", std::strerror(errno));
}

bool PreadAll(int fd, char* out, int64_t bytes, int64_t at) {
  int64_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::pread(fd, out + got, bytes - got, at + got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += n;
  }
  return true;
}

std::string Hex(uint64_t h) { return absl::StrFormat("%016x", h); }

std::string Join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

std::string Quote(absl::string_view s) {
  std::string out(s.substr(0, 64));
  for (char& c : out) {
    if (!absl::ascii_isprint(static_cast<unsigned char>(c))) c = '?';
  }
  return absl::StrCat("'", out, s.size() > 64 ? "...'" : "'");
}

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

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

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

std::string CheckpointFolder(const std::string& root, int64_t step) {
  return Join(root, StepName(step));
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
  if (!PreadAll(info.fd->get(), buf.data(), n, c * cb)) {
    return absl::DataLossError(Errno("short read from", path));
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

}  // namespace ptrain
