// What `ptworker prepare` writes and finds in --out; see prepare_output.h.
#include "worker/prepare_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/private_file.h"
#include "worker/engine/data/token_file.h"
#include "worker/prepare_decode.h"

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
    case TokenizerKind::kHf:
      tok["kind"] = "hf";
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
  json settings = {{"tokenizer", tok},
                   {"inputs", in},
                   {"val_fraction", f.val_fraction},
                   {"shard_tokens", f.shard_tokens},
                   {"chunk_bytes", f.chunk_bytes}};
  // What changes the text of JSON lines, where there are some.
  if (std::any_of(inputs.begin(), inputs.end(), [](const InputFile& i) {
        return KindOf(i.path).json_lines;
      })) {
    settings["field"] = f.field;
    settings["skip_bad_lines"] = f.skip_bad_lines;
  }
  return settings;
}

namespace {

std::string TokenizerText(const json& tok) {
  const std::string kind = tok.value("kind", "");
  if (kind == "spm") {
    return absl::StrCat("spm:", tok.value("model", ""), " (SHA-256 ",
                        tok.value("model_sha256", "").substr(0, 12), "…)");
  }
  if (kind == "hf") {
    return absl::StrCat("hf:", tok.value("model", ""), " (SHA-256 ",
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
        {"chunk_bytes", "the chunk size"},
        {"field", "--field"},
        {"skip_bad_lines", "--skip-bad-lines"}}) {
    const json w = was.value(key, json());
    const json n = now.value(key, json());
    if (w != n) {
      d.push_back(absl::StrCat(flag, " was ", w.dump(), ", now ", n.dump()));
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

absl::Status ShardFile::Append(const uint32_t* t, size_t n) {
  if (version_ == kTokenFileVersion32) {
    buf_.append(reinterpret_cast<const char*>(t), n * sizeof(uint32_t));
  } else {
    for (size_t i = 0; i < n; ++i) {
      const auto id = static_cast<uint16_t>(t[i]);
      buf_.append(reinterpret_cast<const char*>(&id), sizeof(id));
    }
  }
  tokens_ += static_cast<int64_t>(n);
  if (buf_.size() >= kWriteBuffer) return Flush();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ShardFile::Commit() {
  if (absl::Status s = Flush(); !s.ok()) return s;
  int32_t header[3] = {kTokenFileMagic, version_,
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
  const int64_t size =
      kTokenFileHeaderBytes + TokenFileTokenBytes(version_) * tokens_;
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

namespace {

// What looking up --out (or its parent) failing with `err` means.
absl::Status OutLookupError(int err, const std::string& flag,
                            const std::string& path) {
  const std::string at =
      path == flag ? absl::StrCat("--out ", flag)
                   : absl::StrCat("--out ", flag, ": its parent ", path);
  switch (err) {
    case ENAMETOOLONG:
      return Bad(at, ": a part of the path is longer than ", NAME_MAX,
                 " bytes, or the whole longer than ", PATH_MAX - 1);
    case ENOTDIR:
      return Bad(at, ": a part of the path is a file, not a folder");
    case ELOOP:
      return Bad(at, ": its symbolic links loop");
    case EACCES:
      return absl::PermissionDeniedError(
          absl::StrCat(at, ": permission denied to look it up"));
    default:
      errno = err;
      return Errno("look at --out", flag);
  }
}

}  // namespace

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
  if (o.name.size() > kMaxOutName) {
    return Bad("--out ", flag, ": its last part is ", o.name.size(),
               " bytes; it prefixes the names of the files written in it "
               "(NAME_tokenizer.bin.PID.tmp, …), which hold at most ",
               NAME_MAX, " bytes: give a name of at most ", kMaxOutName,
               " bytes");
  }
  if (o.path.size() + 1 + o.name.size() + (NAME_MAX - kMaxOutName) >=
      PATH_MAX) {
    return Bad("--out: the path is ", o.path.size(),
               " bytes; with the names of the files in it, it must stay under ",
               PATH_MAX, " bytes (PATH_MAX)");
  }
  if (absl::Status s = fs.Check(o.path, "--out"); !s.ok()) return s;
  struct stat st {};
  if (::stat(o.path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return Bad("--out ", flag, ": not a folder");
    if (::access(o.path.c_str(), W_OK | X_OK) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("--out ", flag, ": this user may not write there (",
                       std::strerror(errno), ")"));
    }
    o.exists = true;
    return o;
  }
  if (errno != ENOENT) return OutLookupError(errno, flag, flag);
  if (::lstat(o.path.c_str(), &st) == 0) {
    // A symbolic link whose target is missing: mkdir would not follow it.
    std::error_code ec;
    const stdfs::path target = stdfs::read_symlink(o.path, ec);
    return Bad("--out ", flag, ": a symbolic link to ",
               ec ? std::string("a path") : target.string(),
               ", which does not exist; prepare creates a folder, not a "
               "link's target: give the folder itself");
  }
  const stdfs::path up = stdfs::path(o.path).parent_path();
  const std::string parent = up.empty() ? std::string(".") : up.string();
  const bool parent_there = ::stat(parent.c_str(), &st) == 0;
  if (!parent_there && errno != ENOENT) {
    return OutLookupError(errno, flag, parent);
  }
  if (!parent_there || !S_ISDIR(st.st_mode)) {
    return Bad("--out ", flag, ": its parent folder ", parent,
               " does not exist (prepare creates the folder, not its "
               "parents)");
  }
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("--out ", flag, ": this user may not create it in ",
                     parent, " (", std::strerror(errno), ")"));
  }
  return o;
}

std::string StillYours(const OutDir& o) {
  return absl::StrCat("; remove the folder (rm -r ", o.path,
                      ") or choose another --out");
}

namespace {

// The first way a parsed manifest breaks the shape this version writes,
// as "FIELD must be RULE"; "" when none.
class ManifestShape {
 public:
  std::string Check(const json& m) {
    if (!m.is_object()) return "the file must hold a JSON object";
    const json* format = Get(m, "", "format");
    if (format != nullptr && *format != kFormat) {
      Fail("format", absl::StrCat("\"", kFormat,
                                  "\" (this version's; the folder was made "
                                  "by another version of ptworker prepare)"));
    }
    if (const json* st = Object(m, "", "settings")) {
      const json* tok = Object(*st, "settings.", "tokenizer");
      std::string kind;
      if (tok != nullptr) {
        String(*tok, "settings.tokenizer.", "name");
        kind = OneOf(*tok, "settings.tokenizer.", "kind",
                     {"gpt2", "spm", "spm-train", "hf"});
        if (kind == "spm" || kind == "hf") {
          String(*tok, "settings.tokenizer.", "model");
          String(*tok, "settings.tokenizer.", "model_sha256");
        } else if (kind == "spm-train") {
          Int(*tok, "settings.tokenizer.", "spm_vocab", 1);
          String(*tok, "settings.tokenizer.", "spm_type");
          String(m, "", "spm_model");
          String(m, "", "spm_model_sha256");
        }
      }
      if (const json* in = Array(*st, "settings.", "inputs")) {
        for (size_t i = 0; i < in->size(); ++i) {
          const std::string at = absl::StrCat("settings.inputs[", i, "].");
          if (!IsObject((*in)[i], absl::StrCat("settings.inputs[", i, "]"))) {
            continue;
          }
          String((*in)[i], at, "path");
          Int((*in)[i], at, "size", 0);
          Int((*in)[i], at, "mtime_ns", INT64_MIN);
        }
      }
      if (const json* v = Get(*st, "settings.", "val_fraction");
          v != nullptr && !v->is_number()) {
        Fail("settings.val_fraction", "a number");
      }
      Int(*st, "settings.", "shard_tokens", 1);
      Int(*st, "settings.", "chunk_bytes", 1);
    }
    for (const char* key : {"input_bytes", "chunks", "val_chunks",
                            "val_input_bytes", "end_of_text", "tokens"}) {
      Int(m, "", key, 0);
    }
    Int(m, "", "vocab_size", 1);
    if (const json* c = Get(m, "", "complete");
        c != nullptr && !c->is_boolean()) {
      Fail("complete", "true or false");
    }
    if (const json* shards = Array(m, "", "shards")) {
      for (size_t i = 0; i < shards->size(); ++i) {
        const std::string at = absl::StrCat("shards[", i, "]");
        const json& e = (*shards)[i];
        if (!IsObject(e, at)) continue;
        String(e, at + ".", "file");
        OneOf(e, at + ".", "split", {"val", "train"});
        Int(e, at + ".", "tokens", 1);
        String(e, at + ".", "xxh64");
        Position(e, at + ".", "end");
      }
    }
    Position(m, "", "next");
    return error_;
  }

 private:
  void Fail(const std::string& field, const std::string& rule) {
    if (error_.empty()) error_ = absl::StrCat(field, " must be ", rule);
  }
  const json* Get(const json& parent, const std::string& at, const char* key) {
    if (!parent.contains(key)) {
      Fail(at + key, "there");
      return nullptr;
    }
    return &parent.at(key);
  }
  bool IsObject(const json& j, const std::string& at) {
    if (!j.is_object()) Fail(at, "an object");
    return j.is_object();
  }
  const json* Object(const json& parent, const std::string& at,
                     const char* key) {
    const json* j = Get(parent, at, key);
    return j != nullptr && IsObject(*j, at + key) ? j : nullptr;
  }
  const json* Array(const json& parent, const std::string& at,
                    const char* key) {
    const json* j = Get(parent, at, key);
    if (j == nullptr) return nullptr;
    if (!j->is_array()) Fail(at + key, "an array");
    return j->is_array() ? j : nullptr;
  }
  void String(const json& parent, const std::string& at, const char* key) {
    const json* j = Get(parent, at, key);
    if (j != nullptr && !j->is_string()) Fail(at + key, "a string");
  }
  std::string OneOf(const json& parent, const std::string& at, const char* key,
                    std::initializer_list<const char*> values) {
    const json* j = Get(parent, at, key);
    if (j == nullptr) return "";
    for (const char* v : values) {
      if (*j == v) return v;
    }
    std::string list;
    for (const char* v : values) {
      absl::StrAppend(&list, list.empty() ? "" : ", ", "\"", v, "\"");
    }
    Fail(at + key, "one of " + list);
    return "";
  }
  void Int(const json& parent, const std::string& at, const char* key,
           int64_t min) {
    const json* j = Get(parent, at, key);
    if (j == nullptr) return;
    const bool fits =
        j->is_number_integer() &&
        (!j->is_number_unsigned() || j->get<uint64_t>() <= INT64_MAX) &&
        j->get<int64_t>() >= min;
    if (!fits) {
      Fail(at + key, min == INT64_MIN ? std::string("an integer")
                                      : absl::StrCat("an integer >= ", min));
    }
  }
  // {"chunk": C, "token": T}: where the token stream stands.
  void Position(const json& parent, const std::string& at, const char* key) {
    if (const json* p = Object(parent, at, key)) {
      Int(*p, at + key + ".", "chunk", 0);
      Int(*p, at + key + ".", "token", 0);
    }
  }

  std::string error_;
};

// Where the token stream stands: token `token` of chunk `chunk`.
struct StreamAt {
  int64_t chunk = 0, token = 0;
  StreamAt() = default;
  StreamAt(int64_t c, int64_t t) : chunk(c), token(t) {}
  explicit StreamAt(const json& p)
      : chunk(p.at("chunk").get<int64_t>()),
        token(p.at("token").get<int64_t>()) {}
  bool operator==(const StreamAt& o) const {
    return chunk == o.chunk && token == o.token;
  }
  bool operator<(const StreamAt& o) const {
    return chunk < o.chunk || (chunk == o.chunk && token < o.token);
  }
  std::string Text() const {
    return absl::StrCat("chunk ", chunk, ", token ", token);
  }
};

}  // namespace

absl::StatusOr<json> ReadManifest(const OutDir& o, const ConfinedFs& fs) {
  const std::string file = o.name + "_prepare.json";
  if (!o.exists) return json();
  auto entries = fs.List(o.path, "--out");
  if (!entries.ok()) return entries.status();
  bool has_manifest = false;
  std::vector<std::string> shards;
  for (const auto& e : *entries) {
    if (e.name == file && e.is_dir) {
      return Bad("--out ", o.path, ": ", file, " is a folder, not a manifest",
                 StillYours(o));
    }
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
  if (m.is_discarded()) {
    return Bad("--out ", o.path, ": ", file, " is not JSON", StillYours(o));
  }
  const std::string error = ManifestShape().Check(m);
  if (!error.empty()) {
    return Bad("--out ", o.path, ": ", file,
               " is not a manifest of this version of ptworker prepare: ",
               error, StillYours(o));
  }
  return m;
}

absl::Status CheckShards(const OutDir& o, const json& m, const ConfinedFs& fs) {
  const std::string file = o.name + "_prepare.json";
  const auto bad = [&](auto&&... why) {
    return Bad("--out ", o.path, ": ", file, " ", why..., StillYours(o));
  };
  const int64_t shard_tokens = m["settings"]["shard_tokens"].get<int64_t>();
  const int64_t chunks = m["chunks"].get<int64_t>();
  const int64_t token_bytes =
      TokenFileTokenBytes(TokenFileVersionFor(m["vocab_size"].get<int64_t>()));
  std::set<std::string> listed;
  int64_t tokens = 0;
  int counts[2] = {0, 0};  // train, val
  StreamAt end;
  const json& shards = m["shards"];
  for (size_t i = 0; i < shards.size(); ++i) {
    const json& s = shards[i];
    const std::string name = s["file"].get<std::string>();
    const bool val = s["split"] == "val";
    const int64_t n = s["tokens"].get<int64_t>();
    const std::string want = ShardName(o.name, val, counts[val]);
    if (name != want || (val && counts[0] > 0)) {
      return bad("lists ", name, " as shard ", i + 1, " (shards[", i,
                 "]); shards go val then train, numbered from 0: it must be ",
                 want);
    }
    if (n > shard_tokens) {
      return bad("says ", name, " holds ", n, " tokens, more than ",
                 "--shard-tokens ", shard_tokens);
    }
    const StreamAt e(s["end"]);
    if (e < end || e.chunk > chunks) {
      return bad("says ", name, " ends at ", e.Text(),
                 ", which is not after the shard before it (", end.Text(),
                 ") within the ", chunks, " chunks");
    }
    end = e;
    ++counts[val];
    tokens += n;
    listed.insert(name);
    struct stat st {};
    const std::string path = o.path + "/" + name;
    if (::stat(path.c_str(), &st) != 0 ||
        st.st_size != kTokenFileHeaderBytes + token_bytes * n) {
      return absl::DataLossError(
          absl::StrCat("--out ", o.path, ": shard ", name,
                       " that the manifest lists is missing or not of its size",
                       StillYours(o)));
    }
  }
  if (m["tokens"].get<int64_t>() != tokens) {
    return bad("counts ", m["tokens"].get<int64_t>(),
               " tokens (tokens), its shards hold ", tokens);
  }
  const StreamAt next(m["next"]);
  if (!(next == end)) {
    return bad(
        "goes on at ", next.Text(), " (next), but ",
        shards.empty()
            ? std::string("it lists no shard: a preparation starts at chunk "
                          "0, token 0")
            : absl::StrCat("its last shard ",
                           shards.back()["file"].get<std::string>(),
                           " ends at ", end.Text()));
  }
  if (m["complete"].get<bool>() && !(next == StreamAt(chunks, 0))) {
    return bad("is complete, but its shards end at ", next.Text(), " of ",
               chunks, " chunks");
  }
  if (m["val_chunks"].get<int64_t>() > chunks) {
    return bad("has ", m["val_chunks"].get<int64_t>(),
               " validation chunks (val_chunks) of ", chunks);
  }
  // A shard the manifest does not list would be written over or, worse,
  // trained on twice.
  auto entries = fs.List(o.path, "--out");
  if (!entries.ok()) return entries.status();
  std::vector<std::string> extra;
  for (const auto& e : *entries) {
    if (IsShardName(e.name, o.name) && listed.count(e.name) == 0) {
      extra.push_back(e.name);
    }
  }
  if (!extra.empty()) {
    std::sort(extra.begin(), extra.end());
    return bad("does not list ", extra.front(),
               extra.size() > 1
                   ? absl::StrCat(" and ", extra.size() - 1, " more shards")
                   : std::string(),
               " that the folder holds");
  }
  return absl::OkStatus();
}

int CountShards(const json& m, bool val) {
  int n = 0;
  for (const json& s : m["shards"]) n += (s.value("split", "") == "val") == val;
  return n;
}

}  // namespace ptrain::prepare_internal
