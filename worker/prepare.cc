// `ptworker prepare`; see prepare.h. This unit runs a preparation: the
// progress line, the threads that encode chunks, SentencePiece's training
// lines, the Preparation that writes a plan (prepare_plan.h) into --out
// (prepare_output.h), Prepare and RunPrepare.
#include "worker/prepare.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/confined_fs.h"
#include "common/digest.h"
#include "common/exit_codes.h"
#include "common/private_file.h"
#include "common/spec.h"
#include "common/thread_entry.h"
#include "common/tokenizer.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "worker/engine/data/token_file.h"
#include "worker/exit_status.h"
#include "worker/prepare_decode.h"
#include "worker/prepare_output.h"
#include "worker/prepare_plan.h"

namespace ptrain {
namespace prepare_internal {
namespace {

using Clock = std::chrono::steady_clock;

// SentencePiece's model files are a few MB.
constexpr int64_t kMaxModelBytes = int64_t{1} << 30;

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

// ---------------------------------------------------------------- encoding

struct ChunkOut {
  absl::Status status;
  std::vector<uint32_t> tokens;
  int64_t bad_utf8 = -1;  // the chunk's first byte that is not UTF-8
};

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
  out.bad_utf8 = FirstInvalidUtf8(text);
  // SentencePiece reads UTF-8: what is not becomes U+FFFD here, the same
  // way every time.
  if (out.bad_utf8 >= 0 && !bytes_level) text = ToValidUtf8(text);
  const uint32_t eot = static_cast<uint32_t>(tokenizer.end_of_text());
  if (!in.documents) {
    const std::vector<int32_t> ids = tokenizer.Encode(text);
    out.tokens.reserve(ids.size() + 1);
    if (c.first) out.tokens.push_back(eot);
    out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
    return out;
  }
  // Documents separated by NUL: each encoded alone, end of text before
  // each one that starts here (a NUL before it, or the chunk's `first`).
  bool starts = c.first;
  for (size_t at = 0;;) {
    const size_t nul = text.find('\0', at);
    const std::string_view doc = std::string_view(text).substr(
        at, nul == std::string::npos ? std::string::npos : nul - at);
    if (!doc.empty()) {
      if (starts) out.tokens.push_back(eot);
      const std::vector<int32_t> ids = tokenizer.Encode(doc);
      out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
    }
    if (nul == std::string::npos) break;
    starts = true;
    at = nul + 1;
  }
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
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back(ThreadEntry("prepare-encode", [this] { Work(); }));
    }
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

// Yields the lines of every input in order, as UTF-8, for SentencePiece's
// training: empty lines left out, a line longer than SentencePiece takes
// (kMaxSentence bytes) in pieces of at most kPiece·2 bytes (CutPoint: at a
// space, else between characters), until kMaxBytes were given. Memory
// stays bounded whatever the lines' length.
class LineReader {
 public:
  // SentencePiece's max_sentence_length (tokenizer.cc): it skips longer
  // sentences.
  static constexpr size_t kMaxSentence = size_t{1} << 16;
  // A piece is at most twice this: even when each byte becomes U+FFFD's
  // three, it fits kMaxSentence.
  static constexpr size_t kPiece = size_t{10} << 10;
  // SentencePiece holds every sentence it is given (at most 2,000,000 of
  // them, input_sentence_size) in memory; a sample is enough.
  static constexpr int64_t kMaxBytes = int64_t{256} << 20;

  LineReader(const std::vector<InputFile>& inputs, const ConfinedFs& fs)
      : inputs_(inputs), fs_(fs) {}
  absl::Status status() const { return status_; }

  bool Next(std::string* line) {
    while (given_ < kMaxBytes) {
      const size_t avail = buf_.size() - pos_;
      const size_t look = std::min(avail, kMaxSentence + 1);
      const char* nl =
          static_cast<const char*>(std::memchr(buf_.data() + pos_, '\n', look));
      if (nl == nullptr && avail <= kMaxSentence && !Eof()) {
        if (!Fill()) return false;
        continue;
      }
      if (nl == nullptr && avail == 0) {  // this file's end
        if (!NextFile()) return false;
        continue;
      }
      // The rest of the line (whole: up to its '\n' or the file's end),
      // or the first kMaxSentence + 1 bytes of a line longer than that.
      const bool whole = nl != nullptr || avail <= kMaxSentence;
      const size_t end =
          nl != nullptr ? static_cast<size_t>(nl - buf_.data()) : pos_ + look;
      const std::string_view rest(buf_.data() + pos_, end - pos_);
      if (whole && rest.size() <= kMaxSentence) {
        std::string text = ToValidUtf8(rest);
        if (text.size() <= kMaxSentence) {
          pos_ = end + (nl != nullptr ? 1 : 0);
          if (text.empty()) continue;
          return Give(std::move(text), line);
        }
      }
      const size_t cut = CutPoint(rest, kPiece, kPiece);
      std::string piece = ToValidUtf8(rest.substr(0, cut));
      pos_ += cut;
      if (nl != nullptr && pos_ == end) ++pos_;
      return Give(std::move(piece), line);
    }
    return false;
  }

 private:
  bool Give(std::string text, std::string* line) {
    given_ += static_cast<int64_t>(text.size());
    *line = std::move(text);
    return true;
  }

  // Whether every byte of the current file was read (or there is none).
  bool Eof() const { return !fd_.valid() || at_ >= inputs_[file_].size; }

  // More of the current file; false (status_ set) when it fails.
  bool Fill() {
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
      return false;
    }
    // A decoded file's documents are lines of their own.
    if (inputs_[file_].documents) {
      std::replace(buf_.begin() + static_cast<std::ptrdiff_t>(old), buf_.end(),
                   '\0', '\n');
    }
    at_ += want;
    return true;
  }

  // Opens the next file; false when there is none (or status_ is set).
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
  size_t file_ = 0;
  bool started_ = false;
  std::string buf_;
  size_t pos_ = 0;
  int64_t at_ = 0;
  int64_t given_ = 0;
};

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
    // The folder is this run's from before its manifest is read until the
    // end: another run cannot change what it was read as.
    if (out_.exists) {
      if (absl::Status s = Lock(); !s.ok()) return s;
    }
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
      if (absl::Status s = CheckShards(out_, manifest_, fs_); !s.ok()) {
        return s;
      }
    }
    // JSON lines and compressed inputs are decoded into --out first (a
    // complete preparation needs them no more).
    decoding_ = std::any_of(
        inputs_.begin(), inputs_.end(),
        [](const InputFile& in) { return KindOf(in.path).decoded(); });
    if (decoding_) {
      if (!manifest_.is_null() && manifest_["complete"].get<bool>()) {
        plan_.total_bytes = manifest_["input_bytes"].get<int64_t>();
        return Complete();
      }
      if (f_.before_create && !out_.exists) f_.before_create();
      if (absl::Status s = MakeOut(); !s.ok()) return s;
      if (absl::Status s = Decode(); !s.ok()) return Abandon(s);
    }
    auto plan = MakePlan(inputs_, f_, fs_);
    if (!plan.ok()) return Abandon(plan.status());
    plan_ = std::move(*plan);
    if (!manifest_.is_null()) {
      if (manifest_["chunks"].get<int64_t>() !=
              static_cast<int64_t>(plan_.chunks.size()) ||
          manifest_["val_chunks"].get<int64_t>() != plan_.val_chunks) {
        return Bad("--out ", out_.path,
                   ": the inputs' contents changed since the preparation "
                   "began (their chunks differ)",
                   StillYours(out_));
      }
      if (manifest_["complete"].get<bool>()) return Complete();
    }
    if (f_.before_create && !out_.exists && !made_dir_) f_.before_create();
    // Bad input past this point leaves no new file (the folder itself
    // goes if this run made it).
    absl::Status s = Write();
    if (!s.ok()) return Abandon(s);
    if (decoding_) {
      // The shards are whole: the decoded text is needed no more.
      if (absl::Status r = fs_.RemoveAll(DecodedDir(), "--out");
          !r.ok() && !f_.quiet) {
        std::fprintf(stderr, "ptworker: warning: %s\n",
                     std::string(r.message()).c_str());
      }
    }
    return result_;
  }

 private:
  // gpt2, spm:MODEL and hf:TOKENIZER_JSON; spm-train's model is opened
  // once trained.
  absl::Status OpenGivenTokenizer() {
    if (choice_.kind == TokenizerKind::kSpmTrain) return absl::OkStatus();
    ReadFile read = nullptr;
    if (choice_.kind == TokenizerKind::kSpm ||
        choice_.kind == TokenizerKind::kHf) {
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
    if (tokenizer_->end_of_text() < 0) {
      return Bad("--tokenizer ", f_.tokenizer,
                 ": the model has no end-of-text token (</s>, <|endoftext|>, "
                 "...) to put between documents");
    }
    return absl::OkStatus();
  }

  // Opens --out and takes its lock; a folder another run holds is refused.
  absl::Status Lock() {
    auto dir = fs_.Open(out_.path, O_RDONLY | O_DIRECTORY, "--out");
    if (!dir.ok()) return dir.status();
    dir_ = std::move(*dir);
    if (::flock(dir_.get(), LOCK_EX | LOCK_NB) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--out ", out_.path,
          ": another ptworker prepare is writing there; wait for it"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<PrepareResult> Complete() {
    result_.already_complete = true;
    result_.input_bytes = plan_.total_bytes;
    result_.tokens = manifest_["tokens"].get<int64_t>();
    result_.val_shards = CountShards(manifest_, true);
    result_.train_shards = CountShards(manifest_, false);
    return result_;
  }

  // --threads, or the machine's cores.
  int64_t ThreadsWanted() const {
    return f_.threads > 0 ? f_.threads
                          : std::max(1u, std::thread::hardware_concurrency());
  }

  std::string DecodedDir() const {
    return out_.path + "/" + out_.name + "_decoded";
  }

  // The inputs as the plan reads them: JSON lines and compressed files
  // decoded into DecodedDir (prepare_decode.h).
  absl::Status Decode() {
    auto there = fs_.Exists(DecodedDir(), "--out");
    if (!there.ok()) return there.status();
    made_decoded_ = !*there;
    const int threads = static_cast<int>(ThreadsWanted());
    const auto start = std::chrono::steady_clock::now();
    auto decoded = DecodeInputs(
        inputs_, f_, DecodedDir(), threads, fs_, [](const std::string& w) {
          std::fprintf(stderr, "ptworker: warning: %s\n", w.c_str());
        });
    if (!decoded.ok()) return decoded.status();
    inputs_ = std::move(*decoded);
    int64_t total = 0;
    for (const InputFile& in : inputs_) total += in.size;
    if (total == 0) {
      return Bad("--input: the inputs hold no text (", inputs_.size(), " file",
                 inputs_.size() == 1 ? "" : "s", ", each empty once decoded)");
    }
    if (!f_.quiet) {
      std::fprintf(
          stderr,
          "ptworker: JSON lines and compressed inputs decoded into %s in "
          "%.1f s; %.1f MB of text in all\n",
          DecodedDir().c_str(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                        start)
              .count(),
          static_cast<double>(total) / 1e6);
    }
    return absl::OkStatus();
  }

  // `s`, bad input leaving nothing this run made: the decoded folder, if
  // it made it, and --out, if it made that.
  absl::Status Abandon(absl::Status s) {
    if (s.ok() || !IsInputError(s)) return s;
    if (made_decoded_) (void)fs_.RemoveAll(DecodedDir(), "--out");
    if (made_dir_) {
      dir_ = UniqueFd();
      ::rmdir(out_.path.c_str());
    }
    return s;
  }

  // --out, made and locked if it was not there.
  absl::Status MakeOut() {
    if (!out_.exists && !made_dir_) {
      if (::mkdir(out_.path.c_str(), 0755) != 0) {
        if (errno == EEXIST) {
          // Another run made it since this one looked: it is that run's.
          return absl::FailedPreconditionError(absl::StrCat(
              "--out ", out_.path,
              ": another ptworker prepare created it meanwhile and is "
              "writing there; wait for it"));
        }
        return Errno("create --out", out_.path);
      }
      made_dir_ = true;
      if (absl::Status s = Lock(); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Write() {
    if (absl::Status s = MakeOut(); !s.ok()) return s;
    if (absl::Status s = MakeTokenizerFiles(); !s.ok()) return s;
    // Checked: from here on, files are written.
    if (absl::Status s = RemoveTemporaries(); !s.ok()) return s;
    for (const auto& [file, bytes] : tokenizer_files_) {
      if (absl::Status s =
              ReplaceFileAt(dir_.get(), out_.path, file, bytes, 0644);
          !s.ok()) {
        return s;
      }
    }
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

  // What --out holds as `file` (NAME_…), nullopt when nothing.
  absl::StatusOr<std::optional<std::string>> Existing(const std::string& file) {
    const std::string path = out_.path + "/" + file;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return std::nullopt;
      return Errno("look at", path);
    }
    if (!S_ISREG(st.st_mode)) {
      return Bad("--out ", out_.path, ": holds ", file,
                 ", which is not a plain file: prepare writes over no file "
                 "it did not make",
                 StillYours(out_));
    }
    auto bytes = fs_.ReadFile(path, "--out", kMaxModelBytes);
    if (absl::IsNotFound(bytes.status())) return std::nullopt;
    if (!bytes.ok()) return bytes.status();
    return std::optional<std::string>(std::move(*bytes));
  }

  // Queues `bytes` to be written as `file` (tokenizer_files_) unless --out
  // holds them already; a file of other bytes there is not this
  // preparation's and is refused. `what` says what it must be.
  absl::Status OursOrNew(const std::string& file, std::string bytes,
                         const std::string& what) {
    auto existing = Existing(file);
    if (!existing.ok()) return existing.status();
    if (!existing->has_value()) {
      tokenizer_files_.emplace_back(file, std::move(bytes));
    } else if (**existing != bytes) {
      return Bad("--out ", out_.path, ": holds ", file, ", which is not ", what,
                 " (its bytes differ): prepare writes over no file it "
                 "did not make",
                 StillYours(out_));
    }
    return absl::OkStatus();
  }

  // spm-train: trains (or, continuing, reopens) the model; every kind:
  // the llm.c tokenizer file. Checks what --out holds under their names
  // and writes nothing (Write does).
  absl::Status MakeTokenizerFiles() {
    if (choice_.kind == TokenizerKind::kSpmTrain) {
      const std::string model = out_.name + "_spm.model";
      const std::string field = absl::StrCat("--tokenizer ", f_.tokenizer);
      std::string bytes;
      if (manifest_.is_null()) {
        LineReader lines(inputs_, fs_);
        int64_t given = 0;
        auto trained = TrainSentencePiece(
            [&](std::string* line) {
              const bool more = lines.Next(line);
              given += more;
              return more;
            },
            choice_.vocab, choice_.type);
        if (!lines.status().ok()) return lines.status();
        if (given == 0) {
          return Bad(field,
                     ": every line of the input is empty: there is no text "
                     "to train a SentencePiece model on");
        }
        if (!trained.ok()) {
          return absl::Status(
              trained.status().code(),
              absl::StrCat(field, ": ", trained.status().message()));
        }
        bytes = std::move(*trained);
        model_sha256_ = Sha256Hex(bytes);
        if (absl::Status s = OursOrNew(
                model, bytes,
                absl::StrCat("the model ", f_.tokenizer, " trains on --input"));
            !s.ok()) {
          return s;
        }
      } else {
        auto existing =
            fs_.ReadFile(out_.path + "/" + model, "--out", kMaxModelBytes);
        if (!existing.ok()) return existing.status();
        bytes = std::move(*existing);
        model_sha256_ = Sha256Hex(bytes);
        if (manifest_["spm_model_sha256"] != model_sha256_) {
          return Bad("--out ", out_.path, ": ", model,
                     " is not the model its shards were made with",
                     StillYours(out_));
        }
      }
      auto t = OpenTokenizer(
          absl::StrCat("spm:", out_.path, "/", model), field,
          [&bytes](const std::string&) -> absl::StatusOr<std::string> {
            return bytes;
          });
      if (!t.ok()) return t.status();
      tokenizer_ = std::move(*t);
      if (absl::Status s = CheckVocabulary(); !s.ok()) return s;
    }
    const std::string file = out_.name + "_tokenizer.bin";
    auto bytes = LlmcTokenizerBytes(*tokenizer_, out_.path + "/" + file);
    if (!bytes.ok()) return bytes.status();
    return OursOrNew(
        file, std::move(*bytes),
        absl::StrCat("the llm.c tokenizer file of --tokenizer ", f_.tokenizer));
  }

  absl::Status SaveManifest() {
    return ReplaceFileAt(dir_.get(), out_.path, out_.name + "_prepare.json",
                         manifest_.dump(1) + "\n", 0644);
  }

  absl::Status WriteShards() {
    const int64_t n = static_cast<int64_t>(plan_.chunks.size());
    const int64_t first = manifest_["next"].value("chunk", int64_t{0});
    const int64_t skip = manifest_["next"].value("token", int64_t{0});
    if (first < 0 || first > n || skip < 0) {
      return Bad("--out ", out_.path, ": its manifest's next chunk ", first,
                 " is not one of its ", n, StillYours(out_));
    }
    // Each chunk's start in the stream, then its end.
    std::vector<int64_t> offsets = {0};
    for (const Chunk& c : plan_.chunks) {
      offsets.push_back(offsets.back() + c.end - c.begin);
    }
    int64_t done_bytes = offsets[first];
    const int64_t done_at_start = done_bytes;
    tokens_ = manifest_.value("tokens", int64_t{0});
    val_shards_ = CountShards(manifest_, true);
    train_shards_ = CountShards(manifest_, false);
    unnamed_ = !f_.named_temporaries &&
               UnnamedFilesWork(dir_.get(), out_.name + "_prepare.json.tmp");
    Progress progress(f_.quiet, plan_.total_bytes, done_bytes);
    // Byte-level BPE (GPT-2's, a tokenizer.json's) encodes any bytes.
    const bool bytes_level = choice_.kind == TokenizerKind::kGpt2 ||
                             choice_.kind == TokenizerKind::kHf;
    const Tokenizer& tokenizer = *tokenizer_;
    const int64_t want = ThreadsWanted();
    const int threads =
        static_cast<int>(std::max<int64_t>(1, std::min(want, n - first)));
    // In memory at most: 2·threads + 2 chunks, or 8 MiB of text a thread
    // (and its tokens) when that is more.
    EncodePool pool(
        [&](int64_t i) {
          const Chunk& c = plan_.chunks[i];
          return EncodeChunk(c, inputs_[c.file], tokenizer, bytes_level, fs_);
        },
        first, n, threads,
        {2 * threads + 2, (int64_t{8} << 20) * threads, &offsets});
    std::unique_ptr<ShardFile> shard;
    bool shard_val = false;
    // Once a file (its first such byte in the order chunks are written).
    std::set<int> warned;
    for (int64_t i = first; i < n; ++i) {
      const Chunk& c = plan_.chunks[i];
      ChunkOut out = pool.Take(i, [&] {
        progress.Update(done_bytes, tokens_, val_shards_ + train_shards_);
      });
      if (!out.status.ok()) return out.status;
      if (i == first && static_cast<size_t>(skip) > out.tokens.size()) {
        return Bad("--out ", out_.path, ": its manifest goes on at token ",
                   skip, " of chunk ", i, ", which has ", out.tokens.size(),
                   StillYours(out_));
      }
      if (out.bad_utf8 >= 0 && warned.insert(c.file).second) {
        progress.Warn(absl::StrCat(
            inputs_[c.file].name(), ": not UTF-8 at byte ",
            c.begin + out.bad_utf8,
            inputs_[c.file].shown.empty() ? "" : " of its text",
            bytes_level ? "; encoded as bytes"
                        : "; each byte that is not UTF-8 encoded as U+FFFD"));
      }
      const bool val = c.val;  // the first plan_.val_chunks
      if (shard != nullptr && shard_val != val) {
        if (absl::Status s = Commit(std::move(shard), shard_val, i, 0);
            !s.ok()) {
          return s;
        }
      }
      const size_t pos = i == first ? static_cast<size_t>(skip) : 0;
      if (absl::Status s =
              AppendTokens(i, val, out.tokens, pos, &shard, &shard_val);
          !s.ok()) {
        return s;
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

  // Appends chunk `i`'s `tokens` from `pos` on to the shards of its split
  // (`val`): opens `*shard` (and sets `*shard_val`) when there is none,
  // and commits it each time it holds --shard-tokens.
  absl::Status AppendTokens(int64_t i, bool val,
                            const std::vector<uint32_t>& tokens, size_t pos,
                            std::unique_ptr<ShardFile>* shard,
                            bool* shard_val) {
    while (pos < tokens.size()) {
      if (*shard == nullptr) {
        *shard = std::make_unique<ShardFile>(
            dir_.get(), out_.path,
            ShardName(out_.name, val, val ? val_shards_ : train_shards_),
            TokenFileVersionFor(tokenizer_->size()), unnamed_);
        *shard_val = val;
        if (absl::Status s = (*shard)->Open(); !s.ok()) return s;
      }
      const size_t take = static_cast<size_t>(
          std::min<int64_t>(f_.shard_tokens - (*shard)->tokens(),
                            static_cast<int64_t>(tokens.size() - pos)));
      if (absl::Status s = (*shard)->Append(tokens.data() + pos, take);
          !s.ok()) {
        return s;
      }
      pos += take;
      tokens_ += static_cast<int64_t>(take);
      if ((*shard)->tokens() == f_.shard_tokens) {
        const bool whole = pos == tokens.size();
        if (absl::Status s = Commit(std::move(*shard), val, whole ? i + 1 : i,
                                    whole ? 0 : static_cast<int64_t>(pos));
            !s.ok()) {
          return s;
        }
      }
    }
    return absl::OkStatus();
  }

  // Names the shard and records it; the stream continues at token `token`
  // of chunk `chunk`.
  absl::Status Commit(std::unique_ptr<ShardFile> shard, bool val, int64_t chunk,
                      int64_t token) {
    auto digest = shard->Commit();
    if (!digest.ok()) return digest.status();
    (val ? val_shards_ : train_shards_) += 1;
    manifest_["shards"].push_back(
        {{"file", shard->name()},
         {"split", val ? "val" : "train"},
         {"tokens", shard->tokens()},
         {"xxh64", Hex64(*digest)},
         {"end", {{"chunk", chunk}, {"token", token}}}});
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
  // The model and tokenizer file to write (name in --out, bytes).
  std::vector<std::pair<std::string, std::string>> tokenizer_files_;
  bool made_dir_ = false, unnamed_ = false;
  bool decoding_ = false, made_decoded_ = false;
  UniqueFd dir_;
  int64_t tokens_ = 0, committed_ = 0;
  int val_shards_ = 0, train_shards_ = 0;
  PrepareResult result_;
};

}  // namespace
}  // namespace prepare_internal

absl::StatusOr<PrepareResult> Prepare(const PrepareFlags& flags) {
  auto fs = ConfinedFs::FromEnvironment();
  if (!fs.ok()) return fs.status();
  return prepare_internal::Preparation(flags, std::move(*fs)).Run();
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
