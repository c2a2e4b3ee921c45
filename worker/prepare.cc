// `ptworker prepare`; see prepare.h.
#include "worker/prepare.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/confined_fs.h"
#include "common/digest.h"
#include "common/exit_codes.h"
#include "common/spec.h"
#include "common/tokenizer.h"
#include "nlohmann/json.hpp"
#include "worker/exit_status.h"

namespace ptrain {
namespace {

namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr char kFormat[] = "ptrain-prepare-1";
// llm.c's token file: 256 int32 (magic, version, token count), then uint16
// tokens (worker/engine/data.h reads it).
constexpr int32_t kTokenMagic = 20240520;
constexpr int32_t kTokenVersion = 1;
constexpr int64_t kHeaderBytes = 256 * sizeof(int32_t);
// Writes of a shard go by this.
constexpr size_t kWriteBuffer = size_t{1} << 20;
// SentencePiece's model files are a few MB.
constexpr int64_t kMaxModelBytes = int64_t{1} << 30;

absl::Status Bad(auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

absl::Status Errno(absl::string_view what, absl::string_view path) {
  return absl::UnavailableError(
      absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

// ---------------------------------------------------------------- flags

enum class TokenizerKind { kGpt2, kSpm, kSpmTrain };

struct TokenizerChoice {
  TokenizerKind kind = TokenizerKind::kGpt2;
  std::string model;  // spm: the model's path
  int vocab = 0;      // spm-train
  std::string type;   // spm-train: bpe | unigram
};

absl::StatusOr<TokenizerChoice> ParseTokenizer(const PrepareFlags& f) {
  TokenizerChoice c;
  const std::string& t = f.tokenizer;
  if (t == "gpt2") {
    c.kind = TokenizerKind::kGpt2;
  } else if (t.rfind("spm:", 0) == 0 && t.size() > 4) {
    c.kind = TokenizerKind::kSpm;
    c.model = t.substr(4);
  } else if (t.rfind("spm-train:", 0) == 0) {
    c.kind = TokenizerKind::kSpmTrain;
    const std::string v = t.substr(10);
    if (!absl::SimpleAtoi(v, &c.vocab) || c.vocab < kPrepareMinSpmVocab ||
        c.vocab > 65536) {
      return Bad("--tokenizer '", t, "': VOCAB must be an integer in [",
                 kPrepareMinSpmVocab, ", 65536] (token files store ids as ",
                 "uint16)");
    }
  } else {
    return Bad("--tokenizer '", t,
               "': not one of gpt2, spm:MODEL, spm-train:VOCAB");
  }
  if (c.kind == TokenizerKind::kSpmTrain) {
    c.type = f.spm_type.empty() ? "bpe" : f.spm_type;
    if (c.type != "bpe" && c.type != "unigram") {
      return Bad("--spm-type '", f.spm_type, "': not one of bpe, unigram");
    }
  } else if (!f.spm_type.empty()) {
    return Bad("--spm-type is for --tokenizer spm-train:VOCAB only, not '", t,
               "'");
  }
  return c;
}

absl::Status CheckNumbers(const PrepareFlags& f) {
  if (!(f.val_fraction >= 0 && f.val_fraction <= 0.5)) {
    return Bad("--val-fraction ", f.val_fraction, ": must be in [0, 0.5]");
  }
  if (f.shard_tokens < kPrepareMinShardTokens ||
      f.shard_tokens > kPrepareMaxShardTokens) {
    return Bad("--shard-tokens ", f.shard_tokens, ": must be in [",
               kPrepareMinShardTokens, ", ", kPrepareMaxShardTokens,
               "] (llm.c's header counts tokens in an int32)");
  }
  if (f.threads < 0 || f.threads > 4096) {
    return Bad("--threads ", f.threads, ": must be in [1, 4096]");
  }
  if (f.chunk_bytes < 0) return Bad("chunk size ", f.chunk_bytes, " < 0");
  return absl::OkStatus();
}

// ---------------------------------------------------------------- inputs

struct InputFile {
  std::string path;      // as matched
  std::string absolute;  // what the manifest records
  int64_t size = 0;
  int64_t mtime_ns = 0;
};

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 +
         st.st_mtim.tv_nsec;
}

// Every --input's files in order: a pattern's matches sorted (glob(3)),
// each file once (the first time it is named).
absl::StatusOr<std::vector<InputFile>> ResolveInputs(
    const std::vector<std::string>& patterns, const ConfinedFs& fs) {
  if (patterns.empty()) return Bad("--input: give at least one file");
  std::vector<InputFile> files;
  std::set<std::pair<dev_t, ino_t>> seen;
  for (const std::string& pattern : patterns) {
    const std::string field = absl::StrCat("--input '", pattern, "'");
    std::vector<std::string> paths;
    const bool wild = pattern.find_first_of("*?[") != std::string::npos;
    if (!wild) {
      paths.push_back(pattern);
    } else {
      glob_t g{};
      const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
      if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
      ::globfree(&g);
      if (rc != 0 && rc != GLOB_NOMATCH) {
        return absl::UnavailableError(
            absl::StrCat(field, ": cannot list the files it matches"));
      }
    }
    int matched = 0;
    for (const std::string& path : paths) {
      if (absl::Status s = fs.Check(path, field); !s.ok()) return s;
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) {
        if (!wild && errno == ENOENT) return Bad(field, ": no such file");
        if (!wild) return Errno("read", field);
        continue;  // vanished since glob listed it
      }
      if (!S_ISREG(st.st_mode)) {
        if (!wild) {
          return Bad(field, ": not a file",
                     S_ISDIR(st.st_mode) ? " (a folder: give a pattern such "
                                           "as 'folder/*.txt')"
                                         : "");
        }
        continue;  // a pattern's folders are not documents
      }
      ++matched;
      if (!seen.insert({st.st_dev, st.st_ino}).second) continue;
      InputFile in;
      in.path = path;
      in.absolute = stdfs::absolute(path).lexically_normal().string();
      in.size = st.st_size;
      in.mtime_ns = MtimeNs(st);
      files.push_back(std::move(in));
    }
    if (matched == 0) return Bad(field, ": matches no file");
  }
  int64_t total = 0;
  for (const InputFile& in : files) total += in.size;
  if (total == 0) {
    return Bad("--input: every file the inputs name is empty (", files.size(),
               " file", files.size() == 1 ? "" : "s", ")");
  }
  return files;
}

// ---------------------------------------------------------------- files

// pread until `n` bytes or the end of the file; the count read.
absl::StatusOr<int64_t> ReadAt(int fd, char* buf, int64_t n, int64_t at,
                               absl::string_view path) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, buf + done, n - done, at + done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("read", path);
    if (r == 0) break;
    done += r;
  }
  return done;
}

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

// `bytes` into dir/name through a temporary and rename(2), fsynced.
absl::Status WriteFileAtomic(int dirfd, const std::string& dir,
                             const std::string& name, std::string_view bytes) {
  const std::string tmp = name + ".tmp";
  const std::string path = dir + "/" + name;
  const int fd = ::openat(dirfd, tmp.c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", path + ".tmp");
  absl::Status s = WriteAll(fd, bytes.data(), bytes.size(), path);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("sync", path);
  ::close(fd);
  if (s.ok() && ::renameat(dirfd, tmp.c_str(), dirfd, name.c_str()) != 0) {
    s = Errno("rename to", path);
  }
  if (!s.ok()) {
    ::unlinkat(dirfd, tmp.c_str(), 0);
    return s;
  }
  return SyncDir(dirfd, dir);
}

// ---------------------------------------------------------------- plan

struct Chunk {
  int file = 0;  // index into the inputs
  int64_t begin = 0, end = 0;
  bool first = false;  // the document's start: end of text goes before it
};

struct Plan {
  std::vector<Chunk> chunks;
  int64_t val_chunks = 0;  // the first ones
  int64_t val_bytes = 0;
  int64_t total_bytes = 0;
};

absl::StatusOr<Plan> MakePlan(const std::vector<InputFile>& inputs,
                              const PrepareFlags& f, const ConfinedFs& fs) {
  Plan plan;
  for (const InputFile& in : inputs) plan.total_bytes += in.size;
  int64_t val_target = 0;
  if (f.val_fraction > 0) {
    val_target = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(
               f.val_fraction * static_cast<double>(plan.total_bytes))));
  }
  int64_t at = 0;  // the stream offset of the file's first byte
  for (int i = 0; i < static_cast<int>(inputs.size()); ++i) {
    const InputFile& in = inputs[i];
    const int64_t n = in.size;
    if (n == 0) continue;
    const std::string field = absl::StrCat("--input ", in.path);
    auto fd = fs.Open(in.path, O_RDONLY, field);
    if (!fd.ok()) return fd.status();
    struct stat st {};
    if (::fstat(fd->get(), &st) != 0) return Errno("stat", in.path);
    if (st.st_size != n || MtimeNs(st) != in.mtime_ns) {
      return absl::UnavailableError(
          absl::StrCat(in.path, ": changed while being read; run again"));
    }
    int64_t val_cut = -1;
    if (val_target > at && val_target <= at + n) {
      auto cut = NextCutPointInFile(fd->get(), n, val_target - at, in.path);
      if (!cut.ok()) return cut.status();
      val_cut = *cut;
    }
    for (int64_t s = 0; s < n;) {
      int64_t e = n;
      if (s + f.chunk_bytes < n) {
        auto cut = NextCutPointInFile(fd->get(), n, s + f.chunk_bytes, in.path);
        if (!cut.ok()) return cut.status();
        e = *cut;
      }
      if (val_cut > s && val_cut < e) e = val_cut;
      plan.chunks.push_back({i, s, e, s == 0});
      if (e == val_cut) {
        plan.val_chunks = static_cast<int64_t>(plan.chunks.size());
        plan.val_bytes = at + e;
      }
      s = e;
    }
    at += n;
  }
  if (f.val_fraction > 0 &&
      plan.val_chunks == static_cast<int64_t>(plan.chunks.size())) {
    return Bad("--val-fraction ", f.val_fraction,
               ": the validation split would take all ", plan.total_bytes,
               " bytes of input (the first cut point past ", val_target,
               " bytes is the end: lines that start and end in a printable "
               "character are where text is cut); give more input or "
               "--val-fraction 0");
  }
  return plan;
}

// ---------------------------------------------------------------- names

std::string ShardName(const std::string& name, bool val, int64_t index) {
  return absl::StrFormat("%s_%s_%06d.bin", name, val ? "val" : "train", index);
}

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

// What this command leaves when it is stopped mid-write: one of its own
// files' names + ".tmp" (shards, the manifest), or + ".tmp.PID" (the
// tokenizer file and the SentencePiece model, written by common/).
bool IsOurTemporary(std::string_view entry, const std::string& name) {
  size_t at = entry.rfind(".tmp");
  if (at == std::string_view::npos) return false;
  const std::string_view tail = entry.substr(at + 4);
  if (!tail.empty() && (tail[0] != '.' || tail.size() < 2 ||
                        !std::all_of(tail.begin() + 1, tail.end(), [](char c) {
                          return c >= '0' && c <= '9';
                        }))) {
    return false;
  }
  const std::string_view base = entry.substr(0, at);
  return IsShardName(base, name) || base == name + "_tokenizer.bin" ||
         base == name + "_spm.model" || base == name + "_prepare.json";
}

// ---------------------------------------------------------------- manifest

std::string Hex64(uint64_t v) { return absl::StrFormat("%016x", v); }

// The settings a preparation is made with: a rerun must have the same.
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

// How the settings `was` (a manifest's, its shape checked) differ from
// `now`, "" if not.
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

// ---------------------------------------------------------------- progress

// One line on stderr: rewritten in place on a terminal, else every 5 s.
class Progress {
 public:
  Progress(bool quiet, int64_t total_bytes, int64_t done_at_start)
      : quiet_(quiet),
        tty_(::isatty(STDERR_FILENO) == 1),
        total_(total_bytes),
        start_done_(done_at_start),
        start_(Clock::now()),
        last_(start_) {}

  void Update(int64_t done, int64_t tokens, int64_t shards) {
    if (quiet_) return;
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (since < (tty_ ? 0.2 : 5.0)) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double rate = s > 0 ? (done - start_done_) / s : 0;
    std::string eta = "?";
    if (rate > 0) {
      eta = absl::StrFormat("%.0f s", (total_ - done) / rate);
    }
    const std::string line = absl::StrFormat(
        "prepare: %.1f/%.1f MB (%.0f%%), %.2f MB/s, ETA %s, %d tokens, %d "
        "shards",
        done / 1e6, total_ / 1e6, 100.0 * done / total_, rate / 1e6, eta,
        tokens, shards);
    if (tty_) {
      std::fprintf(stderr, "\r%s\033[K", line.c_str());
      shown_ = true;
    } else {
      std::fprintf(stderr, "ptworker: %s\n", line.c_str());
    }
    std::fflush(stderr);
  }

  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() { End(); }

  // A warning on a line of its own.
  void Warn(const std::string& text) {
    End();
    std::fprintf(stderr, "ptworker: warning: %s\n", text.c_str());
  }

  // Ends the rewritten line.
  void End() {
    if (shown_) std::fputc('\n', stderr);
    shown_ = false;
  }

  double Seconds() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }

 private:
  const bool quiet_, tty_;
  const int64_t total_, start_done_;
  const Clock::time_point start_;
  Clock::time_point last_;
  bool shown_ = false;
};

// ---------------------------------------------------------------- shards

// A shard being written: an unnamed file (O_TMPFILE) linked in once it is
// whole, or NAME.tmp renamed; either way its name shows it whole or not
// at all. A shard that is not committed leaves nothing (a named
// temporary is removed; one left by a kill is removed by the next run).
class ShardFile {
 public:
  ShardFile(int dirfd, std::string dir, std::string name, bool unnamed)
      : dirfd_(dirfd),
        dir_(std::move(dir)),
        name_(std::move(name)),
        tmp_(name_ + ".tmp"),
        unnamed_(unnamed) {}
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;
  ~ShardFile() {
    const bool named = linked_ || (!unnamed_ && fd_ >= 0);
    if (fd_ >= 0) ::close(fd_);
    if (named && !committed_) ::unlinkat(dirfd_, tmp_.c_str(), 0);
  }

  absl::Status Open() {
    fd_ = unnamed_ ? ::openat(dirfd_, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0644)
                   : ::openat(dirfd_, tmp_.c_str(),
                              O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return Errno("create", Path() + ".tmp");
    buf_.assign(kHeaderBytes, '\0');  // the header, counted at the end
    return absl::OkStatus();
  }

  int64_t tokens() const { return tokens_; }
  const std::string& name() const { return name_; }

  absl::Status Append(const uint16_t* t, size_t n) {
    buf_.append(reinterpret_cast<const char*>(t), n * sizeof(uint16_t));
    tokens_ += static_cast<int64_t>(n);
    if (buf_.size() >= kWriteBuffer) return Flush();
    return absl::OkStatus();
  }

  // Header, fsync, the file's XXH64 (read back), then its name.
  absl::StatusOr<uint64_t> Commit() {
    if (absl::Status s = Flush(); !s.ok()) return s;
    int32_t header[3] = {kTokenMagic, kTokenVersion,
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

 private:
  std::string Path() const { return dir_ + "/" + name_; }

  absl::Status Flush() {
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

  absl::StatusOr<uint64_t> Digest() {
    XXH64_state_t* state = XXH64_createState();
    XXH64_reset(state, 0);
    std::string block(kWriteBuffer, '\0');
    const int64_t size = kHeaderBytes + 2 * tokens_;
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

  const int dirfd_;
  const std::string dir_, name_, tmp_;
  const bool unnamed_;
  int fd_ = -1;
  std::string buf_;
  int64_t written_ = 0;  // bytes in the file
  int64_t tokens_ = 0;
  bool linked_ = false, committed_ = false;
};

// Whether the output folder takes O_TMPFILE files that can be linked in
// (not every filesystem does; then shards are written as NAME.tmp).
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

// ---------------------------------------------------------------- encoding

struct ChunkOut {
  absl::Status status;
  std::vector<uint16_t> tokens;
  int64_t bad_utf8 = -1;  // the chunk's first byte that is not UTF-8
};

// The offset of `text`'s first byte that is not UTF-8, -1 if none: ASCII
// eight bytes at a time, each run of other bytes by FirstInvalidUtf8 (a
// character's bytes are all >= 0x80, so no run cuts one).
int64_t FirstNonUtf8(std::string_view text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    for (uint64_t w; i + 8 <= n; i += 8) {
      std::memcpy(&w, b + i, 8);
      if (w & 0x8080808080808080u) break;
    }
    while (i < n && b[i] < 0x80) ++i;
    size_t j = i;
    while (j < n && b[j] >= 0x80) ++j;
    if (j > i) {
      const int64_t bad = FirstInvalidUtf8(text.substr(i, j - i));
      if (bad >= 0) return static_cast<int64_t>(i) + bad;
    }
    i = j;
  }
  return -1;
}

ChunkOut EncodeChunk(const Chunk& c, const InputFile& in,
                     const Tokenizer& tokenizer, bool bytes_level,
                     const ConfinedFs& fs) {
  ChunkOut out;
  auto fd = fs.Open(in.path, O_RDONLY, absl::StrCat("--input ", in.path));
  if (!fd.ok()) {
    out.status = fd.status();
    return out;
  }
  std::string text(static_cast<size_t>(c.end - c.begin), '\0');
  auto n = ReadAt(fd->get(), text.data(), c.end - c.begin, c.begin, in.path);
  if (!n.ok() || *n != c.end - c.begin) {
    out.status = n.ok() ? absl::UnavailableError(absl::StrCat(
                              in.path, ": became shorter while being read"))
                        : n.status();
    return out;
  }
  out.bad_utf8 = FirstNonUtf8(text);
  // SentencePiece reads UTF-8: what is not becomes U+FFFD here, the same
  // way every time.
  if (out.bad_utf8 >= 0 && !bytes_level) text = ToValidUtf8(text);
  const std::vector<int32_t> ids = tokenizer.Encode(text);
  out.tokens.reserve(ids.size() + 1);
  if (c.first) {
    out.tokens.push_back(static_cast<uint16_t>(tokenizer.end_of_text()));
  }
  for (int32_t id : ids) out.tokens.push_back(static_cast<uint16_t>(id));
  return out;
}

// Encodes chunks [first, n) on `threads` threads, in order, as far ahead
// of the one the caller takes as `window` allows: Take(i) returns chunk
// i's result.
class EncodePool {
 public:
  // How far ahead: `chunks` chunks, or more while they hold at most
  // `bytes` bytes of text (many small files keep every thread busy without
  // waking the caller for each); `offsets` (n + 1) are the chunks' starts
  // in the stream, then its end.
  struct Window {
    int64_t chunks = 0;
    int64_t bytes = 0;
    const std::vector<int64_t>* offsets = nullptr;
  };

  EncodePool(std::function<ChunkOut(int64_t)> encode, int64_t first, int64_t n,
             int threads, Window window)
      : encode_(std::move(encode)),
        n_(n),
        window_(window),
        next_(first),
        taken_(first) {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { Work(); });
  }
  EncodePool(const EncodePool&) = delete;
  EncodePool& operator=(const EncodePool&) = delete;
  ~EncodePool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
    }
    room_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // Chunk i's result (i: the next one); `wait` runs about every second
  // while it is not ready.
  ChunkOut Take(int64_t i, const std::function<void()>& wait) {
    std::unique_lock<std::mutex> lock(mu_);
    while (done_.count(i) == 0) {
      ready_.wait_for(lock, std::chrono::seconds(1));
      if (done_.count(i) == 0) {
        lock.unlock();
        wait();
        lock.lock();
      }
    }
    ChunkOut out = std::move(done_[i]);
    done_.erase(i);
    taken_ = i + 1;
    lock.unlock();
    room_.notify_all();
    return out;
  }

 private:
  void Work() {
    for (;;) {
      const int64_t i = next_.fetch_add(1);
      if (i >= n_) return;
      {
        std::unique_lock<std::mutex> lock(mu_);
        room_.wait(lock, [&] { return cancelled_ || InWindow(i); });
        if (cancelled_) return;
      }
      ChunkOut out = encode_(i);
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_[i] = std::move(out);
      }
      ready_.notify_one();  // the caller is the only one waiting
    }
  }

  bool InWindow(int64_t i) const {
    const std::vector<int64_t>& at = *window_.offsets;
    return i < taken_ + window_.chunks ||
           at[i + 1] - at[taken_] <= window_.bytes;
  }

  const std::function<ChunkOut(int64_t)> encode_;
  const int64_t n_;
  const Window window_;
  std::atomic<int64_t> next_;
  std::mutex mu_;
  std::condition_variable ready_, room_;
  std::map<int64_t, ChunkOut> done_;  // guarded by mu_
  int64_t taken_;                     // guarded by mu_
  bool cancelled_ = false;            // guarded by mu_
  std::vector<std::thread> threads_;
};

// ---------------------------------------------------------------- output

// The output folder, checked before anything is written.
struct OutDir {
  std::string path;  // as given, without trailing slashes
  std::string name;  // its last part: the files' prefix
  bool exists = false;
};

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

// The manifest --out holds, null when none; errors when the folder is not
// one this command may continue (bad input).
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

// The shards a manifest lists are there, each of its size.
absl::Status CheckShards(const OutDir& o, const json& m) {
  for (const json& s : m["shards"]) {
    const std::string file = s.value("file", "");
    const int64_t tokens = s.value("tokens", int64_t{-1});
    struct stat st {};
    const std::string path = o.path + "/" + file;
    if (!IsShardName(file, o.name) || tokens < 0 ||
        ::stat(path.c_str(), &st) != 0 ||
        st.st_size != kHeaderBytes + 2 * tokens) {
      return absl::DataLossError(
          absl::StrCat("--out ", o.path, ": shard ", file,
                       " that the manifest lists is missing or not of its size",
                       StillYours(o)));
    }
  }
  return absl::OkStatus();
}

// Yields the lines of every input in order, as UTF-8, for SentencePiece.
class LineReader {
 public:
  LineReader(const std::vector<InputFile>& inputs, const ConfinedFs& fs)
      : inputs_(inputs), fs_(fs) {}
  absl::Status status() const { return status_; }

  bool Next(std::string* line) {
    for (;;) {
      const size_t nl = buf_.find('\n', pos_);
      if (nl != std::string::npos) {
        *line = ToValidUtf8(std::string_view(buf_).substr(pos_, nl - pos_));
        pos_ = nl + 1;
        if (line->empty() || skipping_) {
          skipping_ = false;
          continue;
        }
        return true;
      }
      // SentencePiece skips sentences this long; memory stays bounded.
      if (buf_.size() - pos_ > kMaxLine) {
        pos_ = buf_.size();
        skipping_ = true;
      }
      if (!Fill()) {
        if (pos_ < buf_.size() && !skipping_) {  // a last line, no '\n'
          *line = ToValidUtf8(std::string_view(buf_).substr(pos_));
          buf_.clear();
          pos_ = 0;
          return true;
        }
        skipping_ = false;
        if (!NextFile()) return false;
      }
    }
  }

 private:
  // More of the current file; false at its end.
  bool Fill() {
    if (!fd_.valid() || at_ >= inputs_[file_].size) return false;
    buf_.erase(0, pos_);
    pos_ = 0;
    const int64_t want =
        std::min<int64_t>(kWriteBuffer, inputs_[file_].size - at_);
    const size_t old = buf_.size();
    buf_.resize(old + static_cast<size_t>(want));
    auto n =
        ReadAt(fd_.get(), buf_.data() + old, want, at_, inputs_[file_].path);
    if (!n.ok() || *n != want) {
      status_ =
          n.ok()
              ? absl::UnavailableError(absl::StrCat(
                    inputs_[file_].path, ": became shorter while being read"))
              : n.status();
      buf_.resize(old);
      at_ = inputs_[file_].size;
      return false;
    }
    at_ += want;
    return true;
  }

  bool NextFile() {
    if (!status_.ok()) return false;
    fd_ = UniqueFd();
    buf_.clear();
    pos_ = 0;
    at_ = 0;
    if (started_) ++file_;
    started_ = true;
    if (file_ >= inputs_.size()) return false;
    auto fd = fs_.Open(inputs_[file_].path, O_RDONLY, "--input");
    if (!fd.ok()) {
      status_ = fd.status();
      return false;
    }
    fd_ = std::move(*fd);
    return true;
  }

  const std::vector<InputFile>& inputs_;
  const ConfinedFs& fs_;
  absl::Status status_;
  UniqueFd fd_;
  static constexpr size_t kMaxLine = size_t{1} << 20;

  size_t file_ = 0;
  bool started_ = false, skipping_ = false;
  std::string buf_;
  size_t pos_ = 0;
  int64_t at_ = 0;
};

// Counts of a manifest's shards by split.
int CountShards(const json& m, bool val) {
  int n = 0;
  for (const json& s : m["shards"]) n += (s.value("split", "") == "val") == val;
  return n;
}

// ---------------------------------------------------------------- prepare

class Preparation {
 public:
  Preparation(const PrepareFlags& f, ConfinedFs fs)
      : f_(f), fs_(std::move(fs)) {}

  absl::StatusOr<PrepareResult> Run() {
    if (absl::Status s = CheckNumbers(f_); !s.ok()) return s;
    auto choice = ParseTokenizer(f_);
    if (!choice.ok()) return choice.status();
    choice_ = *choice;
    if (f_.chunk_bytes == 0) {
      f_.chunk_bytes = choice_.kind == TokenizerKind::kGpt2
                           ? kPrepareChunkBytes
                           : kPrepareSpmChunkBytes;
    }
    auto out = CheckOut(f_.out, fs_);
    if (!out.ok()) return out.status();
    out_ = *out;
    auto inputs = ResolveInputs(f_.inputs, fs_);
    if (!inputs.ok()) return inputs.status();
    inputs_ = std::move(*inputs);
    if (absl::Status s = OpenGivenTokenizer(); !s.ok()) return s;
    auto manifest = ReadManifest(out_, fs_);
    if (!manifest.ok()) return manifest.status();
    manifest_ = std::move(*manifest);
    settings_ = Settings(f_, choice_, model_sha256_, inputs_);
    if (!manifest_.is_null()) {
      const std::string diff = Differences(manifest_["settings"], settings_);
      if (!diff.empty()) {
        return Bad("--out ", out_.path,
                   ": holds a preparation with other settings: ", diff,
                   StillYours(out_));
      }
      if (absl::Status s = CheckShards(out_, manifest_); !s.ok()) return s;
    }
    auto plan = MakePlan(inputs_, f_, fs_);
    if (!plan.ok()) return plan.status();
    plan_ = std::move(*plan);
    if (!manifest_.is_null()) {
      if (manifest_.value("chunks", int64_t{-1}) !=
              static_cast<int64_t>(plan_.chunks.size()) ||
          manifest_.value("val_chunks", int64_t{-1}) != plan_.val_chunks) {
        return Bad("--out ", out_.path,
                   ": the inputs' contents changed since the preparation "
                   "began (their chunks differ)",
                   StillYours(out_));
      }
      if (manifest_.value("complete", false)) return Complete();
    }
    // Bad input past this point leaves no new file (the folder itself
    // goes if this run made it).
    absl::Status s = Write();
    if (!s.ok() && IsInputError(s) && made_dir_) {
      ::rmdir(out_.path.c_str());
    }
    if (!s.ok()) return s;
    return result_;
  }

 private:
  // gpt2 and spm:MODEL; spm-train's model is opened once trained.
  absl::Status OpenGivenTokenizer() {
    if (choice_.kind == TokenizerKind::kSpmTrain) return absl::OkStatus();
    ReadFile read = nullptr;
    if (choice_.kind == TokenizerKind::kSpm) {
      auto bytes = fs_.ReadFile(choice_.model, "--tokenizer", kMaxModelBytes);
      if (!bytes.ok()) return bytes.status();
      model_sha256_ = Sha256Hex(*bytes);
      read = [bytes =
                  *bytes](const std::string&) -> absl::StatusOr<std::string> {
        return bytes;
      };
    }
    auto t = OpenTokenizer(f_.tokenizer, "--tokenizer", read);
    if (!t.ok()) return t.status();
    tokenizer_ = std::move(*t);
    return CheckVocabulary();
  }

  absl::Status CheckVocabulary() {
    if (tokenizer_->size() > 65536) {
      return Bad("--tokenizer ", f_.tokenizer, ": its vocabulary has ",
                 tokenizer_->size(),
                 " tokens; token files store ids as uint16 (at most 65536)");
    }
    if (tokenizer_->end_of_text() < 0) {
      return Bad("--tokenizer ", f_.tokenizer,
                 ": the model has no end-of-text piece (</s>) to put between "
                 "documents");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<PrepareResult> Complete() {
    result_.already_complete = true;
    result_.input_bytes = plan_.total_bytes;
    result_.tokens = manifest_.value("tokens", int64_t{0});
    result_.val_shards = CountShards(manifest_, true);
    result_.train_shards = CountShards(manifest_, false);
    return result_;
  }

  absl::Status Write() {
    if (!out_.exists) {
      if (::mkdir(out_.path.c_str(), 0755) != 0) {
        return Errno("create --out", out_.path);
      }
      made_dir_ = true;
    }
    auto dir = fs_.Open(out_.path, O_RDONLY | O_DIRECTORY, "--out");
    if (!dir.ok()) return dir.status();
    dir_ = std::move(*dir);
    if (::flock(dir_.get(), LOCK_EX | LOCK_NB) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--out ", out_.path,
          ": another ptworker prepare is writing there; wait for it"));
    }
    if (absl::Status s = RemoveTemporaries(); !s.ok()) return s;
    if (absl::Status s = SetUpTokenizer(); !s.ok()) return s;
    if (manifest_.is_null()) {
      manifest_ = {{"format", kFormat},
                   {"settings", settings_},
                   {"input_bytes", plan_.total_bytes},
                   {"chunks", static_cast<int64_t>(plan_.chunks.size())},
                   {"val_chunks", plan_.val_chunks},
                   {"val_input_bytes", plan_.val_bytes},
                   {"vocab_size", tokenizer_->size()},
                   {"end_of_text", tokenizer_->end_of_text()},
                   {"shards", json::array()},
                   {"next", {{"chunk", 0}, {"token", 0}}},
                   {"tokens", 0},
                   {"complete", false}};
      if (choice_.kind == TokenizerKind::kSpmTrain) {
        manifest_["spm_model"] = out_.name + "_spm.model";
        manifest_["spm_model_sha256"] = model_sha256_;
      }
      if (absl::Status s = SaveManifest(); !s.ok()) return s;
    }
    return WriteShards();
  }

  absl::Status RemoveTemporaries() {
    auto entries = fs_.List(out_.path, "--out");
    if (!entries.ok()) return entries.status();
    for (const auto& e : *entries) {
      if (!e.is_dir && IsOurTemporary(e.name, out_.name)) {
        ::unlinkat(dir_.get(), e.name.c_str(), 0);
      }
    }
    return absl::OkStatus();
  }

  // spm-train: trains (or, continuing, reopens) the model; every kind:
  // the llm.c tokenizer file.
  absl::Status SetUpTokenizer() {
    if (choice_.kind == TokenizerKind::kSpmTrain) {
      const std::string model = out_.path + "/" + out_.name + "_spm.model";
      const std::string field = absl::StrCat("--tokenizer ", f_.tokenizer);
      if (manifest_.is_null()) {
        LineReader lines(inputs_, fs_);
        absl::Status s = TrainSentencePiece(
            [&lines](std::string* line) { return lines.Next(line); },
            choice_.vocab, choice_.type, model);
        if (!lines.status().ok()) return lines.status();
        if (!s.ok()) {
          return absl::Status(s.code(), absl::StrCat(field, ": ", s.message()));
        }
      }
      auto bytes = fs_.ReadFile(model, "--out", kMaxModelBytes);
      if (!bytes.ok()) return bytes.status();
      model_sha256_ = Sha256Hex(*bytes);
      if (!manifest_.is_null() &&
          manifest_.value("spm_model_sha256", "") != model_sha256_) {
        return Bad("--out ", out_.path, ": ", out_.name,
                   "_spm.model is not the model its shards were made with",
                   StillYours(out_));
      }
      auto t = OpenTokenizer(
          absl::StrCat("spm:", model), field,
          [b = *bytes](const std::string&) -> absl::StatusOr<std::string> {
            return b;
          });
      if (!t.ok()) return t.status();
      tokenizer_ = std::move(*t);
      if (absl::Status s = CheckVocabulary(); !s.ok()) return s;
    }
    return WriteLlmcTokenizer(*tokenizer_,
                              out_.path + "/" + out_.name + "_tokenizer.bin");
  }

  absl::Status SaveManifest() {
    return WriteFileAtomic(dir_.get(), out_.path, out_.name + "_prepare.json",
                           manifest_.dump(1) + "\n");
  }

  absl::Status WriteShards() {
    const int64_t n = static_cast<int64_t>(plan_.chunks.size());
    const int64_t first = manifest_["next"].value("chunk", int64_t{0});
    const int64_t skip = manifest_["next"].value("token", int64_t{0});
    if (first < 0 || first > n || skip < 0) {
      return Bad("--out ", out_.path, ": its manifest's next chunk ", first,
                 " is not one of its ", n, StillYours(out_));
    }
    int64_t done_bytes = 0;
    for (int64_t i = 0; i < first; ++i) {
      done_bytes += plan_.chunks[i].end - plan_.chunks[i].begin;
    }
    const int64_t done_at_start = done_bytes;
    tokens_ = manifest_.value("tokens", int64_t{0});
    val_shards_ = CountShards(manifest_, true);
    train_shards_ = CountShards(manifest_, false);
    unnamed_ = !f_.named_temporaries &&
               UnnamedFilesWork(dir_.get(), out_.name + "_prepare.json.tmp");
    Progress progress(f_.quiet, plan_.total_bytes, done_bytes);
    const bool bytes_level = choice_.kind == TokenizerKind::kGpt2;
    const Tokenizer& tokenizer = *tokenizer_;
    const int64_t want =
        f_.threads > 0 ? f_.threads
                       : std::max(1u, std::thread::hardware_concurrency());
    const int threads =
        static_cast<int>(std::max<int64_t>(1, std::min(want, n - first)));
    // In memory at most: 2·threads + 2 chunks, or 8 MiB of text a thread
    // (and its tokens) when that is more.
    std::vector<int64_t> offsets = {0};
    for (const Chunk& c : plan_.chunks) {
      offsets.push_back(offsets.back() + c.end - c.begin);
    }
    EncodePool pool(
        [&](int64_t i) {
          const Chunk& c = plan_.chunks[i];
          return EncodeChunk(c, inputs_[c.file], tokenizer, bytes_level, fs_);
        },
        first, n, threads,
        {2 * threads + 2, (int64_t{8} << 20) * threads, &offsets});
    std::unique_ptr<ShardFile> shard;
    bool shard_val = false;
    int64_t warned_file = -1;
    for (int64_t i = first; i < n; ++i) {
      const Chunk& c = plan_.chunks[i];
      ChunkOut out = pool.Take(i, [&] {
        progress.Update(done_bytes, tokens_, val_shards_ + train_shards_);
      });
      if (!out.status.ok()) return out.status;
      if (out.bad_utf8 >= 0 && warned_file != c.file) {
        warned_file = c.file;
        progress.Warn(absl::StrCat(
            inputs_[c.file].path, ": not UTF-8 at byte ",
            c.begin + out.bad_utf8,
            bytes_level ? "; encoded as bytes"
                        : "; each byte that is not UTF-8 encoded as U+FFFD"));
      }
      const bool val = i < plan_.val_chunks;
      if (shard != nullptr && shard_val != val) {
        if (absl::Status s = Commit(std::move(shard), shard_val, i, 0);
            !s.ok()) {
          return s;
        }
      }
      size_t pos = i == first ? static_cast<size_t>(skip) : 0;
      while (pos < out.tokens.size()) {
        if (shard == nullptr) {
          shard = std::make_unique<ShardFile>(
              dir_.get(), out_.path,
              ShardName(out_.name, val, val ? val_shards_ : train_shards_),
              unnamed_);
          shard_val = val;
          if (absl::Status s = shard->Open(); !s.ok()) return s;
        }
        const size_t take = static_cast<size_t>(
            std::min<int64_t>(f_.shard_tokens - shard->tokens(),
                              static_cast<int64_t>(out.tokens.size() - pos)));
        if (absl::Status s = shard->Append(out.tokens.data() + pos, take);
            !s.ok()) {
          return s;
        }
        pos += take;
        tokens_ += static_cast<int64_t>(take);
        if (shard->tokens() == f_.shard_tokens) {
          const bool whole = pos == out.tokens.size();
          if (absl::Status s = Commit(std::move(shard), val, whole ? i + 1 : i,
                                      whole ? 0 : static_cast<int64_t>(pos));
              !s.ok()) {
            return s;
          }
        }
      }
      done_bytes += c.end - c.begin;
      progress.Update(done_bytes, tokens_, val_shards_ + train_shards_);
    }
    if (shard != nullptr) {
      if (absl::Status s = Commit(std::move(shard), shard_val, n, 0); !s.ok()) {
        return s;
      }
    }
    manifest_["complete"] = true;
    if (absl::Status s = SaveManifest(); !s.ok()) return s;
    progress.End();
    result_.input_bytes = plan_.total_bytes;
    result_.tokens = tokens_;
    result_.val_shards = val_shards_;
    result_.train_shards = train_shards_;
    result_.bytes_this_run = done_bytes - done_at_start;
    result_.seconds = progress.Seconds();
    return absl::OkStatus();
  }

  // Names the shard and records it; the stream continues at token `token`
  // of chunk `chunk`.
  absl::Status Commit(std::unique_ptr<ShardFile> shard, bool val, int64_t chunk,
                      int64_t token) {
    auto digest = shard->Commit();
    if (!digest.ok()) return digest.status();
    (val ? val_shards_ : train_shards_) += 1;
    manifest_["shards"].push_back({{"file", shard->name()},
                                   {"split", val ? "val" : "train"},
                                   {"tokens", shard->tokens()},
                                   {"xxh64", Hex64(*digest)}});
    manifest_["next"] = {{"chunk", chunk}, {"token", token}};
    manifest_["tokens"] = tokens_;
    if (absl::Status s = SaveManifest(); !s.ok()) return s;
    if (f_.stop_after_shards > 0 && ++committed_ == f_.stop_after_shards) {
      if (f_.stop_exits) std::_Exit(1);
      return absl::AbortedError(
          absl::StrCat("stopped after ", committed_, " shards (test hook)"));
    }
    return absl::OkStatus();
  }

  PrepareFlags f_;
  const ConfinedFs fs_;
  TokenizerChoice choice_;
  OutDir out_;
  std::vector<InputFile> inputs_;
  std::string model_sha256_;
  std::unique_ptr<Tokenizer> tokenizer_;
  json manifest_, settings_;
  Plan plan_;
  bool made_dir_ = false, unnamed_ = false;
  UniqueFd dir_;
  int64_t tokens_ = 0, committed_ = 0;
  int val_shards_ = 0, train_shards_ = 0;
  PrepareResult result_;
};

}  // namespace

size_t NextCutPoint(std::string_view text, size_t from) {
  const auto word = [&](size_t i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    return c > 0x20 && c < 0x7F;
  };
  const size_t n = text.size();
  for (size_t p = std::max<size_t>(from, 2); p < n; ++p) {
    const char before = text[p - 1];
    if (before == '\n' && word(p - 2) && word(p)) return p;
    if (before == '\r' && text[p] == '\n' && word(p - 2) && p + 1 < n &&
        word(p + 1)) {
      return p;
    }
  }
  return n;
}

std::vector<size_t> ChunkEnds(std::string_view text, size_t chunk_bytes) {
  std::vector<size_t> ends;
  for (size_t s = 0; s < text.size();) {
    const size_t e = s + chunk_bytes < text.size()
                         ? NextCutPoint(text, s + chunk_bytes)
                         : text.size();
    ends.push_back(e);
    s = e;
  }
  return ends;
}

absl::StatusOr<int64_t> NextCutPointInFile(int fd, int64_t size, int64_t from,
                                           std::string_view path,
                                           int64_t block) {
  const absl::string_view name(path.data(), path.size());
  std::string buf;
  int64_t pos = std::max<int64_t>(from, 2);
  while (pos < size) {
    // Two bytes of context before, one after (the "\r\n" rule).
    const int64_t lo = pos - 2;
    const int64_t hi = std::min(size, pos + std::max<int64_t>(block, 1) + 1);
    buf.resize(static_cast<size_t>(hi - lo));
    auto n = ReadAt(fd, buf.data(), hi - lo, lo, name);
    if (!n.ok()) return n.status();
    if (*n != hi - lo) {
      return absl::UnavailableError(
          absl::StrCat(name, ": became shorter while being read"));
    }
    // Every position but the window's last is judged as in the whole
    // text; a "\r\n" cut there needs the byte after it: the next window
    // looks at it again.
    const size_t q = NextCutPoint(buf, 2);
    if (q < buf.size()) return lo + static_cast<int64_t>(q);
    if (hi == size) break;
    pos = hi - 1;
  }
  return size;
}

absl::StatusOr<PrepareResult> Prepare(const PrepareFlags& flags) {
  auto fs = ConfinedFs::FromEnvironment();
  if (!fs.ok()) return fs.status();
  return Preparation(flags, std::move(*fs)).Run();
}

int RunPrepare(PrepareFlags flags, const NodeShare& node) {
  if (flags.threads == 0) flags.threads = std::max(1, node.rank_cores);
  if (const char* v = std::getenv("PTRAIN_TEST_PREPARE_STOP_AFTER_SHARDS")) {
    if (!absl::SimpleAtoi(v, &flags.stop_after_shards)) {
      std::fprintf(
          stderr,
          "ptworker: error: PTRAIN_TEST_PREPARE_STOP_AFTER_SHARDS='%s' "
          "is not an integer\n",
          v);
      return kExitBadInput;
    }
    flags.stop_exits = true;
  }
  absl::StatusOr<PrepareResult> r;
  try {
    r = Prepare(flags);
  } catch (const std::exception& e) {
    r = absl::InternalError(absl::StrCat("prepare: ", e.what()));
  }
  if (!r.ok()) {
    std::fprintf(stderr, "ptworker: error: %s\n",
                 std::string(r.status().message()).c_str());
    return IsInputError(r.status()) ? kExitBadInput : 1;
  }
  const int shards = r->val_shards + r->train_shards;
  if (r->already_complete) {
    std::printf(
        "%s is complete: %lld tokens in %d val + %d train shards; nothing "
        "to do\n",
        flags.out.c_str(), static_cast<long long>(r->tokens), r->val_shards,
        r->train_shards);
  } else {
    std::printf(
        "prepared %s: %.1f MB of input, %lld tokens, %d shard%s (%d val, "
        "%d train), %.2f s, %.2f MB/s\n",
        flags.out.c_str(), r->input_bytes / 1e6,
        static_cast<long long>(r->tokens), shards, shards == 1 ? "" : "s",
        r->val_shards, r->train_shards, r->seconds,
        r->seconds > 0 ? r->bytes_this_run / 1e6 / r->seconds : 0.0);
  }
  return 0;
}

}  // namespace ptrain
