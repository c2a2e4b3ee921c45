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
#include <cstring>
#include <memory>
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
  absl::Status WriteAll(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t w = ::write(fd_.get(), bytes.data(), bytes.size());
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return Errno("write", tmp_);
      bytes.remove_prefix(static_cast<size_t>(w));
    }
    return absl::OkStatus();
  }

  const ConfinedFs& fs_;
  const std::string tmp_, name_;
  UniqueFd fd_;
  std::string buf_;
  int64_t size_ = 0;
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

// JSON lines: each line's field, NUL between documents.
absl::Status DecodeJsonLines(ByteSource& src, const InputFile& in,
                             const PrepareFlags& f, DecodedFile& out,
                             DecodeCounts* counts) {
  JsonField field(f.field);
  std::string buf;
  size_t pos = 0;    // where the unread part of buf starts
  int64_t line = 0;  // the number of the line at pos
  bool eof = false;
  bool skipping = false;  // the rest of a line too long to hold
  std::vector<char> block(kBlock);
  const auto bad = [&](int64_t number, const std::string& why) {
    if (!f.skip_bad_lines) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--input ", in.path, ":", number, ": ", why,
          " (--skip-bad-lines leaves such lines out and counts them)"));
    }
    if (counts->bad_lines++ == 0) {
      counts->first_bad = number;
      counts->first_why = why;
    }
    return absl::OkStatus();
  };
  for (;;) {
    const char* nl = static_cast<const char*>(
        std::memchr(buf.data() + pos, '\n', buf.size() - pos));
    if (nl == nullptr && !eof) {
      if (static_cast<int64_t>(buf.size() - pos) > kPrepareMaxJsonLineBytes) {
        if (!skipping) {
          if (absl::Status s = bad(
                  line + 1, absl::StrCat("a line longer than ",
                                         kPrepareMaxJsonLineBytes >> 20,
                                         " MiB (the most one line may hold)"));
              !s.ok()) {
            return s;
          }
          skipping = true;
        }
        buf.clear();
        pos = 0;
      }
      buf.erase(0, pos);
      pos = 0;
      auto n = src.Read(block.data(), block.size());
      if (!n.ok()) return n.status();
      if (*n == 0) {
        eof = true;
      } else {
        buf.append(block.data(), *n);
      }
      continue;
    }
    const size_t end =
        nl != nullptr ? static_cast<size_t>(nl - buf.data()) : buf.size();
    if (pos == end && nl == nullptr) break;  // the end, after a '\n'
    ++line;
    std::string_view text(buf.data() + pos, end - pos);
    pos = end + (nl != nullptr ? 1 : 0);
    if (skipping) {
      skipping = false;
      continue;
    }
    if (absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()))
            .empty()) {
      continue;
    }
    if (static_cast<int64_t>(text.size()) > kPrepareMaxJsonLineBytes) {
      if (absl::Status s =
              bad(line, absl::StrCat("a line longer than ",
                                     kPrepareMaxJsonLineBytes >> 20,
                                     " MiB (the most one line may hold)"));
          !s.ok()) {
        return s;
      }
      continue;
    }
    auto doc = field.Text(text, &counts->nuls);
    if (!doc.ok()) {
      if (absl::Status s = bad(line, std::string(doc.status().message()));
          !s.ok()) {
        return s;
      }
      continue;
    }
    if (doc->empty()) {
      ++counts->empty;
      continue;
    }
    if (counts->documents > 0) {
      if (absl::Status s = out.Append(std::string_view("\0", 1)); !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = out.Append(*doc); !s.ok()) return s;
    ++counts->documents;
    if (nl == nullptr) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<InputFile> DecodeOne(const InputFile& in, const PrepareFlags& f,
                                    const std::string& dir,
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
    if (absl::Status s = DecodeJsonLines(*src, in, f, out, counts); !s.ok()) {
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

struct JsonField::Parser {
  simdjson::dom::parser dom;
};

JsonField::JsonField(const std::string& field)
    : path_(absl::StrSplit(field, '.')), parser_(std::make_unique<Parser>()) {}

JsonField::~JsonField() = default;

absl::StatusOr<std::string> JsonField::Text(std::string_view line,
                                            int64_t* nuls) {
  simdjson::dom::element at;
  if (simdjson::error_code e =
          parser_->dom.parse(line.data(), line.size()).get(at);
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
  std::string text;
  text.reserve(value.size());
  for (char c : value) {
    if (c == '\0') {
      ++*nuls;
    } else {
      text.push_back(c);
    }
  }
  return text;
}

absl::StatusOr<std::vector<InputFile>> DecodeInputs(
    const std::vector<InputFile>& inputs, const PrepareFlags& f,
    const std::string& dir, int threads, const ConfinedFs& fs,
    const std::function<void(const std::string&)>& warn) {
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
  const auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < todo.size();) {
      got[k] = DecodeOne(inputs[todo[k]], f, dir, fs, &counts[k]);
    }
  };
  const int n = std::max(1, std::min(threads, static_cast<int>(todo.size())));
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
