// What `ptworker prepare` writes and finds in --out; see prepare_output.h.
#include "worker/prepare_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/private_file.h"
#include "worker/engine/token_file.h"

namespace ptrain::prepare_internal {
namespace {

namespace stdfs = std::filesystem;

}  // namespace

// ---------------------------------------------------------------- files

namespace {

absl::Status WriteAll(int fd, const char* data, size_t n,
                      absl::string_view path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Errno("write", path);
    data += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status SyncDir(int dirfd, absl::string_view path) {
  if (::fsync(dirfd) != 0) return Errno("sync", path);
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------- names

std::string ShardName(const std::string& name, bool val, int64_t index) {
  return absl::StrFormat("%s_%s_%06d.bin", name, val ? "val" : "train", index);
}

namespace {

// NAME_val_NNNNNN.bin or NAME_train_NNNNNN.bin (6 digits or more).
bool IsShardName(std::string_view entry, const std::string& name) {
  if (entry.substr(0, name.size() + 1) != name + "_") return false;
  entry.remove_prefix(name.size() + 1);
  if (entry.rfind("val_", 0) == 0) {
    entry.remove_prefix(4);
  } else if (entry.rfind("train_", 0) == 0) {
    entry.remove_prefix(6);
  } else {
    return false;
  }
  if (entry.size() < 6 + 4 || entry.substr(entry.size() - 4) != ".bin") {
    return false;
  }
  entry.remove_suffix(4);
  return std::all_of(entry.begin(), entry.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

bool IsOurTemporary(std::string_view entry, const std::string& name) {
  for (const std::string& file :
       {name + "_tokenizer.bin", name + "_spm.model", name + "_prepare.json"}) {
    if (IsReplaceTemporary(entry, file)) return true;
  }
  return entry.ends_with(".tmp") &&
         IsShardName(entry.substr(0, entry.size() - 4), name);
}

// ---------------------------------------------------------------- manifest

std::string Hex64(uint64_t v) { return absl::StrFormat("%016x", v); }

json Settings(const PrepareFlags& f, const TokenizerChoice& c,
              const std::string& model_sha256,
              const std::vector<InputFile>& inputs) {
  json tok;
  tok["name"] = f.tokenizer;
  switch (c.kind) {
    case TokenizerKind::kGpt2:
      tok["kind"] = "gpt2";
      break;
    case TokenizerKind::kSpm:
      tok["kind"] = "spm";
      tok["model"] = stdfs::absolute(c.model).lexically_normal().string();
      tok["model_sha256"] = model_sha256;
      break;
    case TokenizerKind::kSpmTrain:
      tok["kind"] = "spm-train";
      tok["spm_vocab"] = c.vocab;
      tok["spm_type"] = c.type;
      break;
  }
  json in = json::array();
  for (const InputFile& i : inputs) {
    in.push_back(
        {{"path", i.absolute}, {"size", i.size}, {"mtime_ns", i.mtime_ns}});
  }
  return {{"tokenizer", tok},
          {"inputs", in},
          {"val_fraction", f.val_fraction},
          {"shard_tokens", f.shard_tokens},
          {"chunk_bytes", f.chunk_bytes}};
}

namespace {

std::string TokenizerText(const json& tok) {
  const std::string kind = tok.value("kind", "");
  if (kind == "spm") {
    return absl::StrCat("spm:", tok.value("model", ""), " (SHA-256 ",
                        tok.value("model_sha256", "").substr(0, 12), "…)");
  }
  if (kind == "spm-train") {
    return absl::StrCat("spm-train:", tok.value("spm_vocab", 0), " --spm-type ",
                        tok.value("spm_type", ""));
  }
  return kind;
}

}  // namespace

std::string Differences(const json& was, const json& now) {
  std::vector<std::string> d;
  const json& tw = was.at("tokenizer");
  const json& tn = now.at("tokenizer");
  const bool same_tok =
      tw.value("kind", "") == tn.value("kind", "") &&
      tw.value("model_sha256", "") == tn.value("model_sha256", "") &&
      tw.value("spm_vocab", 0) == tn.value("spm_vocab", 0) &&
      tw.value("spm_type", "") == tn.value("spm_type", "");
  if (!same_tok) {
    d.push_back(absl::StrCat("it holds shards of tokenizer ", TokenizerText(tw),
                             ", not ", TokenizerText(tn)));
  }
  for (const auto& [key, flag] :
       {std::pair<const char*, const char*>{"val_fraction", "--val-fraction"},
        {"shard_tokens", "--shard-tokens"},
        {"chunk_bytes", "the chunk size"}}) {
    const json w = was.value(key, json());
    if (w != now.at(key)) {
      d.push_back(
          absl::StrCat(flag, " was ", w.dump(), ", now ", now.at(key).dump()));
    }
  }
  const json& iw = was.at("inputs");
  const json& in = now.at("inputs");
  if (iw.size() != in.size()) {
    d.push_back(absl::StrCat("it was made from ", iw.size(),
                             " input files, --input names ", in.size(),
                             " now"));
  } else {
    for (size_t i = 0; i < iw.size(); ++i) {
      const std::string path = in[i].value("path", "");
      if (iw[i].value("path", "") != path) {
        d.push_back(absl::StrCat("input file ", i + 1, " was ",
                                 iw[i].value("path", ""), ", now ", path));
        break;
      }
      if (iw[i] != in[i]) {
        d.push_back(absl::StrCat("input ", path,
                                 " changed since (size or modification "
                                 "time)"));
        break;
      }
    }
  }
  return absl::StrJoin(d, "; ");
}

// ---------------------------------------------------------------- shards

ShardFile::~ShardFile() {
  const bool named = linked_ || (!unnamed_ && fd_ >= 0);
  if (fd_ >= 0) ::close(fd_);
  if (named && !committed_) ::unlinkat(dirfd_, tmp_.c_str(), 0);
}

absl::Status ShardFile::Open() {
  fd_ = unnamed_ ? ::openat(dirfd_, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0644)
                 : ::openat(dirfd_, tmp_.c_str(),
                            O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return Errno("create", Path() + ".tmp");
  buf_.assign(kTokenFileHeaderBytes, '\0');  // the header, counted at the end
  return absl::OkStatus();
}

absl::Status ShardFile::Append(const uint16_t* t, size_t n) {
  buf_.append(reinterpret_cast<const char*>(t), n * sizeof(uint16_t));
  tokens_ += static_cast<int64_t>(n);
  if (buf_.size() >= kWriteBuffer) return Flush();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ShardFile::Commit() {
  if (absl::Status s = Flush(); !s.ok()) return s;
  int32_t header[3] = {kTokenFileMagic, kTokenFileVersion,
                       static_cast<int32_t>(tokens_)};
  if (::pwrite(fd_, header, sizeof(header), 0) !=
      static_cast<ssize_t>(sizeof(header))) {
    return Errno("write", Path());
  }
  if (::fsync(fd_) != 0) return Errno("sync", Path());
  auto digest = Digest();
  if (!digest.ok()) return digest.status();
  if (unnamed_) {
    const std::string proc = absl::StrCat("/proc/self/fd/", fd_);
    if (::linkat(AT_FDCWD, proc.c_str(), dirfd_, tmp_.c_str(),
                 AT_SYMLINK_FOLLOW) != 0) {
      return Errno("link", Path() + ".tmp");
    }
    linked_ = true;
  }
  if (::renameat(dirfd_, tmp_.c_str(), dirfd_, name_.c_str()) != 0) {
    return Errno("rename to", Path());
  }
  committed_ = true;
  if (absl::Status s = SyncDir(dirfd_, dir_); !s.ok()) return s;
  return *digest;
}

absl::Status ShardFile::Flush() {
  absl::Status s = WriteAll(fd_, buf_.data(), buf_.size(), Path());
  // Write-back starts now, not at the fsync of a whole shard (hundreds of
  // MB), while the encoders would wait.
  if (s.ok()) {
    ::sync_file_range(fd_, written_, static_cast<off_t>(buf_.size()),
                      SYNC_FILE_RANGE_WRITE);
  }
  written_ += static_cast<int64_t>(buf_.size());
  buf_.clear();
  return s;
}

absl::StatusOr<uint64_t> ShardFile::Digest() {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::string block(kWriteBuffer, '\0');
  const int64_t size = kTokenFileHeaderBytes + 2 * tokens_;
  absl::Status s;
  for (int64_t at = 0; at < size && s.ok();) {
    const int64_t want = std::min<int64_t>(kWriteBuffer, size - at);
    auto n = ReadAt(fd_, block.data(), want, at, Path());
    if (!n.ok() || *n != want) {
      s = n.ok() ? absl::DataLossError(
                       absl::StrCat(Path(), ": shorter than written"))
                 : n.status();
      break;
    }
    XXH64_update(state, block.data(), static_cast<size_t>(want));
    at += want;
  }
  const uint64_t d = XXH64_digest(state);
  XXH64_freeState(state);
  if (!s.ok()) return s;
  return d;
}

bool UnnamedFilesWork(int dirfd, const std::string& probe) {
  const int fd = ::openat(dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const std::string proc = absl::StrCat("/proc/self/fd/", fd);
  const bool ok = ::linkat(AT_FDCWD, proc.c_str(), dirfd, probe.c_str(),
                           AT_SYMLINK_FOLLOW) == 0;
  ::close(fd);
  if (ok) ::unlinkat(dirfd, probe.c_str(), 0);
  return ok;
}

// ---------------------------------------------------------------- output

absl::StatusOr<OutDir> CheckOut(const std::string& flag, const ConfinedFs& fs) {
  OutDir o;
  o.path = flag;
  while (o.path.size() > 1 && o.path.back() == '/') o.path.pop_back();
  if (o.path.empty()) return Bad("--out: give a folder");
  o.name = stdfs::absolute(o.path).lexically_normal().filename().string();
  if (o.name.empty()) {
    o.name = stdfs::absolute(o.path)
                 .lexically_normal()
                 .parent_path()
                 .filename()
                 .string();
  }
  if (o.name.empty() || o.name == "." || o.name == "..") {
    return Bad("--out ", flag,
               ": its last part names the shards; give a folder by name");
  }
  if (absl::Status s = fs.Check(o.path, "--out"); !s.ok()) return s;
  struct stat st {};
  if (::stat(o.path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return Bad("--out ", flag, ": not a folder");
    o.exists = true;
    return o;
  }
  if (errno != ENOENT) return Errno("look at --out", flag);
  const stdfs::path up = stdfs::path(o.path).parent_path();
  const std::string parent = up.empty() ? std::string(".") : up.string();
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Bad("--out ", flag, ": its parent folder ", parent,
               " does not exist (prepare creates the folder, not its "
               "parents)");
  }
  return o;
}

std::string StillYours(const OutDir& o) {
  return absl::StrCat("; remove the folder (rm -r ", o.path,
                      ") or choose another --out");
}

absl::StatusOr<json> ReadManifest(const OutDir& o, const ConfinedFs& fs) {
  const std::string file = o.name + "_prepare.json";
  if (!o.exists) return json();
  auto entries = fs.List(o.path, "--out");
  if (!entries.ok()) return entries.status();
  bool has_manifest = false;
  std::vector<std::string> shards;
  for (const auto& e : *entries) {
    if (e.name == file) has_manifest = true;
    if (IsShardName(e.name, o.name)) shards.push_back(e.name);
  }
  if (!has_manifest) {
    if (!shards.empty()) {
      std::sort(shards.begin(), shards.end());
      return Bad("--out ", o.path, ": holds shards (", shards.front(),
                 shards.size() > 1 ? ", …" : "", ") but no ", file,
                 ": they are not a preparation this command can continue",
                 StillYours(o));
    }
    return json();
  }
  auto text = fs.ReadFile(o.path + "/" + file, "--out", 256 << 20);
  if (!text.ok()) return text.status();
  const json m = json::parse(*text, nullptr, false);
  const auto is = [&m](const char* key, json::value_t type) {
    return m.contains(key) && m.at(key).type() == type;
  };
  bool shaped = m.is_object() && m.value("format", "") == kFormat &&
                is("settings", json::value_t::object) &&
                is("shards", json::value_t::array) &&
                is("next", json::value_t::object);
  if (shaped) {
    const json& s = m.at("settings");
    shaped = s.contains("tokenizer") && s.at("tokenizer").is_object() &&
             s.contains("inputs") && s.at("inputs").is_array();
    for (const json& e : m.at("shards")) shaped = shaped && e.is_object();
    if (shaped) {
      for (const json& e : s.at("inputs")) shaped = shaped && e.is_object();
    }
  }
  if (!shaped) {
    return Bad("--out ", o.path, ": ", file,
               " is not a manifest of this version of ptworker prepare",
               StillYours(o));
  }
  return m;
}

absl::Status CheckShards(const OutDir& o, const json& m) {
  for (const json& s : m["shards"]) {
    const std::string file = s.value("file", "");
    const int64_t tokens = s.value("tokens", int64_t{-1});
    struct stat st {};
    const std::string path = o.path + "/" + file;
    if (!IsShardName(file, o.name) || tokens < 0 ||
        ::stat(path.c_str(), &st) != 0 ||
        st.st_size != kTokenFileHeaderBytes + 2 * tokens) {
      return absl::DataLossError(
          absl::StrCat("--out ", o.path, ": shard ", file,
                       " that the manifest lists is missing or not of its size",
                       StillYours(o)));
    }
  }
  return absl::OkStatus();
}

int CountShards(const json& m, bool val) {
  int n = 0;
  for (const json& s : m["shards"]) n += (s.value("split", "") == "val") == val;
  return n;
}

}  // namespace ptrain::prepare_internal
