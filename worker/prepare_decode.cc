// `ptworker prepare`'s decoding of JSON lines and compressed inputs; see
// prepare_decode.h.
#include "worker/prepare_decode.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "simdjson.h"
#include "worker/prepare_output.h"

namespace ptrain::prepare_internal {

namespace {

// The version of the decoded files' form: part of their names' digest.
constexpr char kDecodedForm[] = "ptrain-decoded-1";
constexpr size_t kBlock = size_t{1} << 20;

bool EndsWith(std::string_view s, std::string_view tail) {
  if (s.size() < tail.size()) return false;
  const std::string_view end = s.substr(s.size() - tail.size());
  return absl::AsciiStrToLower(absl::string_view(end.data(), end.size())) ==
         tail;
}

// ---------------------------------------------------------------- sources

// Reads of the file itself, block by block.
class FileSource {
 public:
  FileSource(UniqueFd fd, std::string name)
      : fd_(std::move(fd)), name_(std::move(name)) {}
  // Up to `cap` bytes; 0 at the end.
  absl::StatusOr<size_t> Read(char* dst, size_t cap) {
    for (;;) {
      const ssize_t r = ::read(fd_.get(), dst, cap);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Errno("read", name_);
      return static_cast<size_t>(r);
    }
  }
  // Its decompression failed (`codec`'s reason `why`) after `text`
  // bytes of output.
  absl::Status Corrupt(absl::string_view codec, absl::string_view why,
                       int64_t text) const {
    return absl::InvalidArgumentError(
        absl::StrCat("--input ", name_, ": not ", codec, ", or corrupt (", why,
                     ") after ", text, " bytes of text"));
  }
  // Its compressed `stream` ended before its end, after `text` bytes.
  absl::Status Truncated(absl::string_view stream, int64_t text) const {
    return absl::InvalidArgumentError(
        absl::StrCat("--input ", name_, ": truncated: the ", stream,
                     " ends early, after ", text, " bytes of text"));
  }

 private:
  UniqueFd fd_;
  std::string name_;
};

class PlainSource final : public ByteSource {
 public:
  explicit PlainSource(FileSource file) : file_(std::move(file)) {}
  absl::StatusOr<size_t> Read(char* dst, size_t cap) override {
    return file_.Read(dst, cap);
  }

 private:
  FileSource file_;
};

// gzip (RFC 1952) through zlib; members one after another are one stream,
// as gzip -d reads them.
class GzipSource final : public ByteSource {
 public:
  explicit GzipSource(FileSource file)
      : file_(std::move(file)), in_(kBlock, '\0') {
    ok_ = ::inflateInit2(&z_, 16 + MAX_WBITS) == Z_OK;
  }
  ~GzipSource() override {
    if (ok_) ::inflateEnd(&z_);
  }
  absl::StatusOr<size_t> Read(char* dst, size_t cap) override {
    if (!ok_) return absl::ResourceExhaustedError("zlib: cannot start");
    for (;;) {
      if (z_.avail_in == 0 && !eof_) {
        auto n = file_.Read(in_.data(), in_.size());
        if (!n.ok()) return n.status();
        eof_ = *n == 0;
        z_.next_in = reinterpret_cast<Bytef*>(in_.data());
        z_.avail_in = static_cast<uInt>(*n);
      }
      if (member_ended_) {
        if (z_.avail_in == 0 && eof_) return 0;
        if (z_.avail_in == 0) continue;
        ::inflateReset(&z_);  // the next member
        member_ended_ = false;
      }
      z_.next_out = reinterpret_cast<Bytef*>(dst);
      z_.avail_out = static_cast<uInt>(std::min<size_t>(cap, 1u << 30));
      const uInt before = z_.avail_out;
      const int rc = ::inflate(&z_, Z_NO_FLUSH);
      const size_t made = before - z_.avail_out;
      if (rc == Z_STREAM_END) {
        member_ended_ = true;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        return file_.Corrupt("gzip", z_.msg != nullptr ? z_.msg : "zlib error",
                             total_ + static_cast<int64_t>(made));
      }
      total_ += static_cast<int64_t>(made);
      if (made > 0) return made;
      if (eof_ && z_.avail_in == 0 && !member_ended_) {
        return file_.Truncated("gzip stream", total_);
      }
    }
  }

 private:
  FileSource file_;
  std::string in_;
  z_stream z_{};
  bool ok_ = false, eof_ = false, member_ended_ = false;
  int64_t total_ = 0;
};

// zstd frames one after another through libzstd's streaming decoder.
class ZstdSource final : public ByteSource {
 public:
  explicit ZstdSource(FileSource file)
      : file_(std::move(file)), d_(ZSTD_createDCtx()), in_(kBlock, '\0') {}
  ~ZstdSource() override { ZSTD_freeDCtx(d_); }
  absl::StatusOr<size_t> Read(char* dst, size_t cap) override {
    if (d_ == nullptr) return absl::ResourceExhaustedError("zstd: no context");
    for (;;) {
      if (buf_.pos == buf_.size && !eof_) {
        auto n = file_.Read(in_.data(), in_.size());
        if (!n.ok()) return n.status();
        eof_ = *n == 0;
        buf_ = {in_.data(), *n, 0};
      }
      // All read, the last frame ended and flushed.
      if (eof_ && buf_.pos == buf_.size && last_ == 0) return 0;
      ZSTD_outBuffer out{dst, cap, 0};
      const size_t rc = ZSTD_decompressStream(d_, &out, &buf_);
      if (ZSTD_isError(rc)) {
        return file_.Corrupt("zstd", ZSTD_getErrorName(rc),
                             total_ + static_cast<int64_t>(out.pos));
      }
      last_ = rc;
      total_ += static_cast<int64_t>(out.pos);
      if (out.pos > 0) return out.pos;
      if (eof_ && buf_.pos == buf_.size && last_ != 0) {
        return file_.Truncated("zstd frame", total_);
      }
    }
  }

 private:
  FileSource file_;
  ZSTD_DCtx* d_;
  std::string in_;
  ZSTD_inBuffer buf_{nullptr, 0, 0};
  bool eof_ = false;
  size_t last_ = 0;  // 0: the last frame ended
  int64_t total_ = 0;
};

// ---------------------------------------------------------------- output

// The decoded text, written through a buffer into `tmp`, synced and
// renamed to `name` by Finish; removed if not finished.
class DecodedFile {
 public:
  DecodedFile(const ConfinedFs& fs, std::string tmp, std::string name)
      : fs_(fs), tmp_(std::move(tmp)), name_(std::move(name)) {}
  ~DecodedFile() {
    if (fd_.valid() && !finished_) {
      fd_ = UniqueFd();
      (void)fs_.Remove(tmp_, "--out");
    }
  }
  absl::Status Open() {
    auto fd = fs_.Open(tmp_, O_WRONLY | O_CREAT | O_TRUNC, "--out", 0644);
    if (!fd.ok()) return fd.status();
    fd_ = std::move(*fd);
    buf_.reserve(kBlock);
    return absl::OkStatus();
  }
  absl::Status Append(std::string_view bytes) {
    size_ += static_cast<int64_t>(bytes.size());
    if (buf_.size() + bytes.size() > kBlock) {
      if (absl::Status s = Flush(); !s.ok()) return s;
    }
    if (bytes.size() >= kBlock) return WriteAll(bytes);
    buf_.append(bytes);
    return absl::OkStatus();
  }
  int64_t size() const { return size_; }
  absl::Status Finish() {
    if (absl::Status s = Flush(); !s.ok()) return s;
    if (::fsync(fd_.get()) != 0) return Errno("sync", tmp_);
    if (absl::Status s = fs_.Rename(tmp_, name_, "--out"); !s.ok()) return s;
    finished_ = true;
    return absl::OkStatus();
  }

 private:
  absl::Status Flush() {
    absl::Status s = WriteAll(buf_);
    buf_.clear();
    return s;
  }
  // Writes `bytes` and starts their writeback, so that Finish's sync has
  // little left to wait for.
  absl::Status WriteAll(std::string_view bytes) {
    const off_t from = written_;
    while (!bytes.empty()) {
      const ssize_t w = ::write(fd_.get(), bytes.data(), bytes.size());
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return Errno("write", tmp_);
      bytes.remove_prefix(static_cast<size_t>(w));
      written_ += w;
    }
    if (written_ > from) {
      (void)::sync_file_range(fd_.get(), from, written_ - from,
                              SYNC_FILE_RANGE_WRITE);
    }
    return absl::OkStatus();
  }

  const ConfinedFs& fs_;
  const std::string tmp_, name_;
  UniqueFd fd_;
  std::string buf_;
  int64_t size_ = 0;
  off_t written_ = 0;
  bool finished_ = false;
};

// ---------------------------------------------------------------- decoding

std::string DecodedName(const InputFile& in, const InputKind& kind,
                        const PrepareFlags& f) {
  const std::string key =
      absl::StrCat(kDecodedForm, "\n", in.absolute, "\n", in.size, "\n",
                   in.mtime_ns, "\n", kind.json_lines ? f.field : "", "\n",
                   kind.json_lines && f.skip_bad_lines ? "skip" : "");
  return Hex64(XXH64(key.data(), key.size(), 0)) + ".txt";
}

// "N MiB" or "N bytes".
std::string SizeText(int64_t bytes) {
  return bytes % (int64_t{1} << 20) == 0 ? absl::StrCat(bytes >> 20, " MiB")
                                         : absl::StrCat(bytes, " bytes");
}

std::string TooLong(int64_t max) {
  return absl::StrCat("a line longer than ", SizeText(max),
                      " (the most one line may hold)");
}

// A run of whole lines of one JSON-lines input (the last may lack its
// '\n' at the input's end), or one line too long to hold; decoded on any
// thread, then committed in input order.
struct Piece {
  std::string lines;
  bool too_long = false;  // stands for one line longer than the limit
  // What decoding found; line numbers count from the piece's first.
  std::string text;  // its documents, NUL between
  int64_t line_count = 0;
  int64_t documents = 0, empty = 0, nuls = 0, bad = 0;
  int64_t first_bad = 0;
  std::string first_why;
};

// Each line of `p` through `field`. Without --skip-bad-lines it stops at
// the first bad line: that one is refused.
void DecodePiece(Piece& p, JsonField& field, const DecodeLimits& limits,
                 bool skip_bad_lines) {
  if (p.too_long) {
    p.line_count = p.bad = p.first_bad = 1;
    p.first_why = TooLong(limits.max_line_bytes);
    return;
  }
  std::string_view rest = p.lines;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    ++p.line_count;
    if (absl::StripAsciiWhitespace(absl::string_view(line.data(), line.size()))
            .empty()) {
      continue;
    }
    std::string why;
    if (static_cast<int64_t>(line.size()) > limits.max_line_bytes) {
      why = TooLong(limits.max_line_bytes);
    } else {
      const size_t before = p.text.size();
      if (p.documents > 0) p.text.push_back('\0');
      const size_t start = p.text.size();
      if (absl::Status s = field.AppendText(line, &p.text, &p.nuls); !s.ok()) {
        p.text.resize(before);
        why = std::string(s.message());
      } else if (p.text.size() == start) {
        p.text.resize(before);
        ++p.empty;
        continue;
      } else {
        ++p.documents;
        continue;
      }
    }
    if (p.bad++ == 0) {
      p.first_bad = p.line_count;
      p.first_why = std::move(why);
    }
    if (!skip_bad_lines) return;
  }
}

// Cuts what `src` reads into pieces of about `limits.piece_bytes` of
// whole lines, in order, to `emit`, which says false to stop. A line
// longer than the limit goes as a piece of its own, `too_long`, its bytes
// dropped as they come.
absl::Status CutPieces(ByteSource& src, const DecodeLimits& limits,
                       const std::function<bool(Piece)>& emit) {
  const size_t piece =
      static_cast<size_t>(std::max<int64_t>(1, limits.piece_bytes));
  const size_t max_line = static_cast<size_t>(limits.max_line_bytes);
  std::vector<char> block(std::min(kBlock, piece));
  std::string cur;
  size_t tail = 0;        // where cur's unfinished line starts
  bool skipping = false;  // the rest of a line too long to hold
  // The piece takes cur's buffer; cur keeps what follows its first n
  // bytes (part of a line), and room for a piece more.
  const auto cut = [&](size_t n) {
    Piece p;
    p.lines = std::move(cur);
    cur.clear();
    cur.reserve(piece + block.size());
    cur.append(p.lines, n);
    p.lines.resize(n);
    p.lines.reserve(n + kJsonLinePadding);
    tail -= n;
    return emit(std::move(p));
  };
  for (;;) {
    auto n = src.Read(block.data(), block.size());
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    std::string_view got(block.data(), *n);
    if (skipping) {
      const size_t nl = got.find('\n');
      if (nl == std::string_view::npos) continue;
      got.remove_prefix(nl + 1);
      skipping = false;
    }
    const size_t old = cur.size();
    cur.append(got);
    if (const void* nl = ::memrchr(cur.data() + old, '\n', got.size())) {
      tail = static_cast<size_t>(static_cast<const char*>(nl) - cur.data()) + 1;
    }
    if (cur.size() - tail > max_line) {
      if (tail > 0 && !cut(tail)) return absl::OkStatus();
      Piece p;
      p.too_long = true;
      if (!emit(std::move(p))) return absl::OkStatus();
      cur.clear();
      tail = 0;
      skipping = true;
    } else if (cur.size() >= piece && tail > 0) {
      if (!cut(tail)) return absl::OkStatus();
    }
  }
  if (!cur.empty()) (void)cut(cur.size());
  return absl::OkStatus();
}

// Writes decoded pieces to the decoded file in input order, numbering
// lines across them.
class PieceWriter {
 public:
  PieceWriter(const InputFile& in, const PrepareFlags& f, DecodedFile& out,
              DecodeCounts* counts)
      : in_(in), f_(f), out_(out), counts_(counts) {}

  absl::Status Commit(const Piece& p) {
    if (p.bad > 0) {
      const int64_t number = lines_ + p.first_bad;
      if (!f_.skip_bad_lines) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--input ", in_.path, ":", number, ": ", p.first_why,
            " (--skip-bad-lines leaves such lines out and counts them)"));
      }
      if (counts_->bad_lines == 0) {
        counts_->first_bad = number;
        counts_->first_why = p.first_why;
      }
      counts_->bad_lines += p.bad;
    }
    counts_->empty += p.empty;
    counts_->nuls += p.nuls;
    lines_ += p.line_count;
    if (p.documents == 0) return absl::OkStatus();
    if (counts_->documents > 0) {
      if (absl::Status s = out_.Append(std::string_view("\0", 1)); !s.ok()) {
        return s;
      }
    }
    counts_->documents += p.documents;
    return out_.Append(p.text);
  }

 private:
  const InputFile& in_;
  const PrepareFlags& f_;
  DecodedFile& out_;
  DecodeCounts* counts_;
  int64_t lines_ = 0;  // lines committed
};

// JSON lines: each line's field, NUL between documents. One thread cuts
// the input into pieces; `threads` decode them, at most two each in
// flight, and the one that completes the next in order writes it.
absl::Status DecodeJsonLines(ByteSource& src, const InputFile& in,
                             const PrepareFlags& f, int threads,
                             const DecodeLimits& limits, DecodedFile& out,
                             DecodeCounts* counts) {
  PieceWriter writer(in, f, out, counts);
  if (threads <= 1) {
    JsonField field(f.field);
    absl::Status failed;
    absl::Status read = CutPieces(src, limits, [&](Piece p) {
      DecodePiece(p, field, limits, f.skip_bad_lines);
      failed = writer.Commit(p);
      return failed.ok();
    });
    return failed.ok() ? read : failed;
  }
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int64_t, Piece>> todo;  // cut, to decode
  std::map<int64_t, Piece> done;               // decoded, awaiting their turn
  int64_t cut = 0, written = 0;
  bool finished = false;  // nothing more will be cut
  absl::Status failed;
  const int64_t most = 2 * static_cast<int64_t>(threads);
  const auto work = [&] {
    JsonField field(f.field);
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return !todo.empty() || finished || !failed.ok(); });
      if (!failed.ok() || todo.empty()) return;
      auto [k, p] = std::move(todo.front());
      todo.pop_front();
      lock.unlock();
      DecodePiece(p, field, limits, f.skip_bad_lines);
      lock.lock();
      done.emplace(k, std::move(p));
      while (failed.ok() && !done.empty() && done.begin()->first == written) {
        failed = writer.Commit(done.begin()->second);
        done.erase(done.begin());
        ++written;
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  absl::Status read = CutPieces(src, limits, [&](Piece p) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return cut - written < most || !failed.ok(); });
    if (!failed.ok()) return false;
    todo.emplace_back(cut++, std::move(p));
    cv.notify_all();
    return true;
  });
  {
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
  }
  cv.notify_all();
  for (std::thread& t : pool) t.join();
  // A bad line comes before where the input failed to read.
  return failed.ok() ? read : failed;
}

absl::StatusOr<InputFile> DecodeOne(const InputFile& in, const PrepareFlags& f,
                                    const std::string& dir, int threads,
                                    const DecodeLimits& limits,
                                    const ConfinedFs& fs,
                                    DecodeCounts* counts) {
  const InputKind kind = KindOf(in.path);
  const std::string name = dir + "/" + DecodedName(in, kind, f);
  InputFile got;
  got.shown = in.path;
  got.documents = kind.json_lines;
  const auto described = [&](const std::string& path) -> absl::Status {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return Errno("stat", path);
    got.path = path;
    got.absolute = path;
    got.size = st.st_size;
    got.mtime_ns = MtimeNs(st);
    return absl::OkStatus();
  };
  auto there = fs.Exists(name, "--out");
  if (!there.ok()) return there.status();
  if (*there) {
    if (absl::Status s = described(name); !s.ok()) return s;
    return got;
  }
  auto fd = fs.Open(in.path, O_RDONLY, absl::StrCat("--input ", in.path));
  if (!fd.ok()) return fd.status();
  std::unique_ptr<ByteSource> src =
      OpenByteSource(std::move(*fd), kind.codec, in.path);
  DecodedFile out(fs, absl::StrCat(name, ".", ::getpid(), ".tmp"), name);
  if (absl::Status s = out.Open(); !s.ok()) return s;
  if (kind.json_lines) {
    if (absl::Status s =
            DecodeJsonLines(*src, in, f, threads, limits, out, counts);
        !s.ok()) {
      return s;
    }
  } else {
    std::vector<char> block(kBlock);
    for (;;) {
      auto n = src->Read(block.data(), block.size());
      if (!n.ok()) return n.status();
      if (*n == 0) break;
      if (absl::Status s = out.Append(std::string_view(block.data(), *n));
          !s.ok()) {
        return s;
      }
    }
  }
  if (absl::Status s = out.Finish(); !s.ok()) return s;
  if (absl::Status s = described(name); !s.ok()) return s;
  return got;
}

}  // namespace

InputKind KindOf(std::string_view path) {
  InputKind k;
  if (EndsWith(path, ".gz")) {
    k.codec = Codec::kGzip;
    path.remove_suffix(3);
  } else if (EndsWith(path, ".zst")) {
    k.codec = Codec::kZstd;
    path.remove_suffix(4);
  }
  k.json_lines = EndsWith(path, ".jsonl") || EndsWith(path, ".json");
  return k;
}

bool IsCorpusFileName(std::string_view name) {
  if (EndsWith(name, ".gz")) {
    name.remove_suffix(3);
  } else if (EndsWith(name, ".zst")) {
    name.remove_suffix(4);
  }
  return EndsWith(name, ".txt") || EndsWith(name, ".jsonl") ||
         EndsWith(name, ".json");
}

std::unique_ptr<ByteSource> OpenByteSource(UniqueFd fd, Codec codec,
                                           std::string name) {
  FileSource file(std::move(fd), std::move(name));
  switch (codec) {
    case Codec::kGzip:
      return std::make_unique<GzipSource>(std::move(file));
    case Codec::kZstd:
      return std::make_unique<ZstdSource>(std::move(file));
    case Codec::kNone:
      break;
  }
  return std::make_unique<PlainSource>(std::move(file));
}

static_assert(kJsonLinePadding >= simdjson::SIMDJSON_PADDING);

struct JsonField::Parser {
  simdjson::dom::parser dom;
};

JsonField::JsonField(const std::string& field)
    : path_(absl::StrSplit(field, '.')), parser_(std::make_unique<Parser>()) {}

JsonField::~JsonField() = default;

absl::Status JsonField::AppendText(std::string_view line, std::string* out,
                                   int64_t* nuls) {
  simdjson::dom::element at;
  if (simdjson::error_code e =
          parser_->dom.parse(line.data(), line.size(), false).get(at);
      e != simdjson::SUCCESS) {
    return Bad("not JSON (", simdjson::error_message(e), ")");
  }
  std::string walked;
  for (const std::string& key : path_) {
    const bool nested = !walked.empty();
    absl::StrAppend(&walked, nested ? "." : "", key);
    if (!at.is_object()) {
      return Bad(
          "no field ", walked, " (",
          nested ? "its parent is not an object" : "the line is not an object",
          ")");
    }
    if (at.get_object().value().at_key(key).get(at) != simdjson::SUCCESS) {
      return Bad("no field ", walked);
    }
  }
  std::string_view value;
  if (at.get_string().get(value) != simdjson::SUCCESS) {
    const char* type = "null";
    switch (at.type()) {
      case simdjson::dom::element_type::ARRAY:
        type = "array";
        break;
      case simdjson::dom::element_type::OBJECT:
        type = "object";
        break;
      case simdjson::dom::element_type::INT64:
      case simdjson::dom::element_type::UINT64:
      case simdjson::dom::element_type::DOUBLE:
        type = "number";
        break;
      case simdjson::dom::element_type::BOOL:
        type = "boolean";
        break;
      default:
        break;
    }
    return Bad("field ", walked, " is not a string but ", type);
  }
  if (std::memchr(value.data(), '\0', value.size()) == nullptr) {
    out->append(value);
    return absl::OkStatus();
  }
  for (char c : value) {
    if (c == '\0') {
      ++*nuls;
    } else {
      out->push_back(c);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<InputFile>> DecodeInputs(
    const std::vector<InputFile>& inputs, const PrepareFlags& f,
    const std::string& dir, int threads, const ConfinedFs& fs,
    const std::function<void(const std::string&)>& warn,
    const DecodeLimits& limits) {
  std::vector<size_t> todo;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (KindOf(inputs[i].path).decoded()) todo.push_back(i);
  }
  std::vector<InputFile> out = inputs;
  if (todo.empty()) return out;
  if (absl::Status s = fs.MakeDirs(dir, "--out"); !s.ok()) return s;
  // What a stopped run left half-written.
  auto entries = fs.List(dir, "--out");
  if (!entries.ok()) return entries.status();
  for (const ConfinedFs::Entry& e : *entries) {
    if (!e.is_dir && absl::EndsWith(e.name, ".tmp")) {
      if (absl::Status s = fs.Remove(dir + "/" + e.name, "--out"); !s.ok()) {
        return s;
      }
    }
  }
  std::vector<absl::StatusOr<InputFile>> got(todo.size(),
                                             absl::UnknownError("not run"));
  std::vector<DecodeCounts> counts(todo.size());
  std::atomic<size_t> next{0};
  // Files side by side, each on its share of the threads.
  const int n = std::max(1, std::min(threads, static_cast<int>(todo.size())));
  const int each = std::max(1, threads / n);
  const auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < todo.size();) {
      got[k] = DecodeOne(inputs[todo[k]], f, dir, each, limits, fs, &counts[k]);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (size_t k = 0; k < todo.size(); ++k) {
    if (!got[k].ok()) return got[k].status();
    out[todo[k]] = std::move(*got[k]);
    const DecodeCounts& c = counts[k];
    const std::string& name = inputs[todo[k]].path;
    if (c.bad_lines > 0) {
      warn(absl::StrCat(name, ": ", c.bad_lines, " bad line",
                        c.bad_lines == 1 ? "" : "s",
                        " left out (--skip-bad-lines); the first, line ",
                        c.first_bad, ": ", c.first_why));
    }
    if (c.empty > 0) {
      warn(absl::StrCat(name, ": ", c.empty, " document",
                        c.empty == 1 ? "" : "s", " with empty ", f.field,
                        " left out"));
    }
    if (c.nuls > 0) {
      warn(absl::StrCat(name, ": ", c.nuls, " NUL character",
                        c.nuls == 1 ? "" : "s", " left out of its text"));
    }
  }
  if (absl::Status s = fs.SyncDir(dir, "--out"); !s.ok()) return s;
  return out;
}

}  // namespace ptrain::prepare_internal
