#include "worker/engine/data/data.h"

#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/echo.h"
#include "common/spec.h"
#include "unicode/utf8.h"
#include "worker/engine/data/token_file.h"
#include "worker/engine/model/rng.h"

namespace ptrain {

namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Calls f(c, offset) for each character of `text` in order, c its code
// point, or negative for a byte sequence that is not UTF-8 (ICU's U8_NEXT
// decides, so overlong forms and surrogates are not characters), until f
// returns false. ICU indexes with int32_t: a text is walked in windows of
// at most 1 GiB, each left where a character begins.
template <typename F>
void ForEachChar(std::string_view text, F&& f) {
  constexpr size_t kWindow = size_t{1} << 30;
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  size_t base = 0;
  while (base < text.size()) {
    const size_t left = text.size() - base;
    const auto n = static_cast<int32_t>(std::min(left, kWindow));
    // Short of a window's end by U8_MAX_LENGTH - 1 bytes, a character
    // begun there ends inside it.
    const int32_t stop = left <= kWindow ? n : n - (U8_MAX_LENGTH - 1);
    int32_t i = 0;
    while (i < stop) {
      const int32_t at = i;
      UChar32 c = 0;
      U8_NEXT(s + base, i, n, c);
      if (!f(c, base + at)) return;
    }
    base += i;
  }
}

// An llm.c token file's header: its version and token count.
struct TokenHeader {
  int32_t version = kTokenFileVersion;
  int64_t count = 0;
  int token_bytes() const { return TokenFileTokenBytes(version); }
};

// The header of an llm.c token file of `file_bytes` bytes whose first
// bytes are `head` (at least the header's when the file has them).
absl::StatusOr<TokenHeader> CheckTokenHeader(absl::string_view head,
                                             int64_t file_bytes,
                                             absl::string_view field,
                                             absl::string_view path) {
  int32_t header[kTokenFileHeaderInts];
  if (file_bytes < static_cast<int64_t>(sizeof(header)) ||
      head.size() < sizeof(header)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is ", file_bytes,
                     " bytes, shorter than the 1024-byte llm.c token header"));
  }
  std::memcpy(header, head.data(), sizeof(header));
  if (header[0] != kTokenFileMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' has bad magic ", header[0],
                     " (expected ", kTokenFileMagic, ")"));
  }
  if (header[1] != kTokenFileVersion && header[1] != kTokenFileVersion32) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' has version ", header[1],
                     " (expected ", kTokenFileVersion, ", uint16 tokens, or ",
                     kTokenFileVersion32, ", uint32 tokens)"));
  }
  TokenHeader h;
  h.version = header[1];
  const int64_t count = header[2];
  const int64_t want =
      static_cast<int64_t>(sizeof(header)) + h.token_bytes() * count;
  if (count < 0 || file_bytes != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' header says ", count, " tokens (",
                     want, " bytes) but the file has ", file_bytes, " bytes"));
  }
  h.count = count;
  return h;
}

// A token file is read at load in pieces of this many bytes.
constexpr int64_t kReadPieceBytes = int64_t{32} << 20;

// Ok when every token is below vocab_size, else the error naming the first
// that is not (tokens[i] is position base + i of the file).
template <typename Token>
absl::Status CheckTokensInVocabulary(const Token* tokens, int64_t count,
                                     int vocab_size, absl::string_view field,
                                     absl::string_view path, int64_t base = 0) {
  // The largest id, in vector registers (a corpus can be terabytes); only
  // past the vocabulary is the first offender looked for.
  Token most = 0;
  for (int64_t i = 0; i < count; ++i)
    most = tokens[i] > most ? tokens[i] : most;
  if (most < static_cast<uint32_t>(vocab_size)) return absl::OkStatus();
  int64_t first = 0;
  while (tokens[first] < static_cast<uint32_t>(vocab_size)) ++first;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": token ", tokens[first], " at position ", base + first, " of '",
      path, "' is outside the model's vocabulary of ", vocab_size));
}

// A read of a mapped token file past its end (the file was truncated while
// mapped) raises SIGBUS. The mappings are registered here so that the
// handler names the file and ends the rank with exit 1, a failure during
// training (the job restarts from its last checkpoint and maps the file
// anew), instead of a bare crash. Registration happens while loading, on
// one thread; the handler only reads.
struct MappedFile {
  std::atomic<const char*> begin{nullptr};
  const char* end = nullptr;
  char path[512] = {};
};
constexpr int kMaxMappedFiles = 4096;
MappedFile g_mapped[kMaxMappedFiles];
std::atomic<int> g_mapped_count{0};
struct sigaction g_previous_sigbus {};

void WriteStderr(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const char* addr = static_cast<const char*>(info->si_addr);
  const int n = g_mapped_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    const char* begin = g_mapped[i].begin.load(std::memory_order_acquire);
    if (begin != nullptr && addr >= begin && addr < g_mapped[i].end) {
      WriteStderr("ptworker: error: token file '");
      WriteStderr(g_mapped[i].path);
      WriteStderr(
          "' became shorter while this rank reads it (SIGBUS); write new "
          "data to a new file and rename it over the old one instead\n");
      ::_exit(1);
    }
  }
  // Not a token file: what the signal did before, for the fault to be
  // reported as it would have been.
  if (g_previous_sigbus.sa_flags & SA_SIGINFO) {
    if (g_previous_sigbus.sa_sigaction != nullptr) {
      g_previous_sigbus.sa_sigaction(sig, info, context);
      return;
    }
  } else if (g_previous_sigbus.sa_handler != SIG_IGN &&
             g_previous_sigbus.sa_handler != SIG_DFL) {
    g_previous_sigbus.sa_handler(sig);
    return;
  }
  ::signal(SIGBUS, SIG_DFL);  // the faulting read runs again and ends us
}

// Registers [begin, begin + bytes) as token file `path`; the slot's index,
// or -1 when every slot is taken (then a truncation is a bare SIGBUS).
int RegisterMapping(const char* begin, size_t bytes, absl::string_view path) {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
  // A freed slot first, else a new one.
  int slot = -1;
  const int n = g_mapped_count.load(std::memory_order_acquire);
  for (int i = 0; i < n && slot < 0; ++i) {
    if (g_mapped[i].begin.load(std::memory_order_acquire) == nullptr) slot = i;
  }
  if (slot < 0) {
    if (n == kMaxMappedFiles) return -1;
    slot = n;
  }
  MappedFile& m = g_mapped[slot];
  const size_t len = std::min(path.size(), sizeof(m.path) - 1);
  std::memcpy(m.path, path.data(), len);
  m.path[len] = '\0';
  m.end = begin + bytes;
  m.begin.store(begin, std::memory_order_release);
  if (slot == n) g_mapped_count.store(n + 1, std::memory_order_release);
  return slot;
}

void UnregisterMapping(int slot) {
  if (slot >= 0) g_mapped[slot].begin.store(nullptr, std::memory_order_release);
}

// The files `value` names: itself when it has no wildcard or is a file,
// else the files its name (the only part that may be a pattern) matches
// in its folder, sorted.
absl::StatusOr<std::vector<std::string>> TokenFiles(const std::string& field,
                                                    const std::string& value,
                                                    const ConfinedFs& fs) {
  const std::filesystem::path path(value);
  constexpr char kWild[] = "*?[";
  if (value.find_first_of(kWild) == std::string::npos) {
    return std::vector<std::string>{value};
  }
  if (auto exists = fs.Exists(value, field); exists.ok() && *exists) {
    return std::vector<std::string>{value};
  }
  const std::string folder = path.parent_path().string();
  if (folder.find_first_of(kWild) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", value,
                     "' has wildcards outside the file name; only the file "
                     "name may be a pattern"));
  }
  // The folder is listed only where the job may read.
  if (absl::Status s = fs.Check(folder.empty() ? "." : folder, field);
      !s.ok()) {
    return s;
  }
  glob_t g{};
  const int rc = ::glob(value.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0) files.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && files.empty())) {
    return absl::NotFoundError(
        absl::StrCat(field, ": no file matches '", value, "'"));
  }
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat(field, ": cannot list the files of '", value, "'"));
  }
  return files;  // glob sorts them
}

// Every file `value` names, mapped and checked, in order, each added to
// `digest` as it is read.
absl::StatusOr<TokenShards> ReadTokenFiles(const std::string& field,
                                           const std::string& value,
                                           int vocab_size, const ConfinedFs& fs,
                                           DataDigest* digest) {
  auto files = TokenFiles(field, value, fs);
  if (!files.ok()) return files.status();
  TokenShards shards;
  for (const std::string& path : *files) {
    auto fd = fs.Open(path, O_RDONLY, field);
    if (!fd.ok()) return fd.status();
    auto stream =
        TokenStream::MapTokenFile(fd->get(), field, path, vocab_size, digest);
    if (!stream.ok()) return stream.status();
    shards.push_back(std::move(*stream));
  }
  return shards;
}

// The most tokens one shard holds.
int64_t LongestShard(const TokenShards& shards) {
  int64_t most = 0;
  for (const TokenStream& s : shards) {
    most = std::max(most, static_cast<int64_t>(s.size()));
  }
  return most;
}

// The digest of splits held in memory (data.path's).
uint64_t TokenDigest(const TokenShards& train, const TokenShards& val) {
  DataDigest digest;
  for (const TokenShards* split : {&train, &val}) {
    for (const TokenStream& s : *split) {
      digest.Add(s.bytes(), s.size() * s.token_bytes());
    }
    digest.EndSplit(TokenCount(*split));
  }
  return digest.value();
}

}  // namespace

void AppendChar(char32_t c, std::string* out) {
  char buf[U8_MAX_LENGTH];
  int32_t n = 0;
  U8_APPEND_UNSAFE(buf, n, c);
  out->append(buf, n);
}

absl::StatusOr<std::vector<int32_t>> ParseTokenFile(absl::string_view b,
                                                    absl::string_view field,
                                                    absl::string_view path,
                                                    int vocab_size) {
  auto h = CheckTokenHeader(b, static_cast<int64_t>(b.size()), field, path);
  if (!h.ok()) return h.status();
  // Byte copy, not a cast: the body need not be aligned.
  const auto read = [&](auto token) -> absl::StatusOr<std::vector<int32_t>> {
    std::vector<decltype(token)> raw(h->count);
    if (h->count > 0) {
      std::memcpy(raw.data(), b.data() + kTokenFileHeaderBytes,
                  sizeof(token) * h->count);
    }
    if (absl::Status s = CheckTokensInVocabulary(raw.data(), h->count,
                                                 vocab_size, field, path);
        !s.ok()) {
      return s;
    }
    return std::vector<int32_t>(raw.begin(), raw.end());
  };
  if (h->version == kTokenFileVersion32) return read(uint32_t{0});
  return read(uint16_t{0});
}

TokenStream::TokenStream(std::vector<uint16_t> tokens)
    : owned_(std::move(tokens)), data_(owned_.data()), size_(owned_.size()) {}

TokenStream::TokenStream(std::vector<uint32_t> tokens)
    : owned32_(std::move(tokens)),
      data32_(owned32_.data()),
      wide_(true),
      size_(owned32_.size()) {}

TokenStream::TokenStream(TokenStream&& o) noexcept { *this = std::move(o); }

TokenStream& TokenStream::operator=(TokenStream&& o) noexcept {
  if (this == &o) return *this;
  Reset();
  owned_ = std::move(o.owned_);
  owned32_ = std::move(o.owned32_);
  map_ = o.map_;
  map_bytes_ = o.map_bytes_;
  guard_ = o.guard_;
  o.guard_ = -1;
  size_ = o.size_;
  wide_ = o.wide_;
  read_ = o.read_.load();
  // A moved vector keeps its storage: the pointers stay valid either way.
  data_ = map_ != nullptr || wide_ ? o.data_ : owned_.data();
  data32_ = map_ != nullptr || !wide_ ? o.data32_ : owned32_.data();
  o.map_ = nullptr;
  o.map_bytes_ = 0;
  o.data_ = nullptr;
  o.data32_ = nullptr;
  o.wide_ = false;
  o.size_ = 0;
  return *this;
}

TokenStream::~TokenStream() { Reset(); }

void TokenStream::CopyWindow(size_t at, int T, int32_t* inputs,
                             int32_t* targets) const {
  const auto copy = [&](const auto* src) {
    for (int t = 0; t < T; ++t) {
      inputs[t] = src[t];
      targets[t] = src[t + 1];
    }
  };
  if (wide_) {
    copy(data32_ + at);
  } else {
    copy(data_ + at);
  }
  if (map_ != nullptr) read_.store(true, std::memory_order_relaxed);
}

void TokenStream::ReleasePages() const {
  if (map_ == nullptr || !read_.exchange(false)) return;
  // Whatever the faults mapped: the windows' pages, the pages around them
  // (fault-around) and whole large folios.
  ::madvise(map_, map_bytes_, MADV_DONTNEED);
}

void TokenStream::Reset() {
  UnregisterMapping(guard_);
  guard_ = -1;
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  owned_.clear();
  owned32_.clear();
  data_ = nullptr;
  data32_ = nullptr;
  wide_ = false;
  size_ = 0;
}

DataDigest::DataDigest() : state_(XXH64_createState()) {
  XXH64_reset(state_, 0);
}
DataDigest::~DataDigest() { XXH64_freeState(state_); }
void DataDigest::Add(const void* bytes, size_t n) {
  XXH64_update(state_, bytes, n);
}
void DataDigest::EndSplit(int64_t tokens) {
  const uint64_t count = static_cast<uint64_t>(tokens);
  XXH64_update(state_, &count, sizeof(count));
}
uint64_t DataDigest::value() const { return XXH64_digest(state_); }

absl::StatusOr<TokenStream> TokenStream::MapTokenFile(int fd,
                                                      absl::string_view field,
                                                      absl::string_view path,
                                                      int vocab_size,
                                                      DataDigest* digest) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat(field, ": cannot stat '", path,
                                            "': ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is not a regular file"));
  }
  char head[kTokenFileHeaderInts * sizeof(int32_t)];
  const ssize_t got = ::pread(fd, head, sizeof(head), 0);
  if (got < 0) {
    return absl::InternalError(absl::StrCat(field, ": cannot read '", path,
                                            "': ", std::strerror(errno)));
  }
  auto h =
      CheckTokenHeader(absl::string_view(head, got), st.st_size, field, path);
  if (!h.ok()) return h.status();
  TokenStream out;
  out.wide_ = h->version == kTokenFileVersion32;
  if (h->count == 0) return out;
  void* map = ::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(field, ": cannot map '", path,
                                            "': ", std::strerror(errno)));
  }
  // Windows are drawn at random places: a fault reads its own pages, not
  // megabytes around them (read-around), which would also stay resident.
  ::madvise(map, st.st_size, MADV_RANDOM);
  out.map_ = map;
  out.map_bytes_ = st.st_size;
  out.guard_ = RegisterMapping(static_cast<const char*>(map), st.st_size, path);
  // The body starts 1024 bytes into a page-aligned mapping: aligned.
  const char* body = static_cast<const char*>(map) + sizeof(head);
  out.size_ = h->count;
  if (out.wide_) {
    out.data32_ = reinterpret_cast<const uint32_t*>(body);
  } else {
    out.data_ = reinterpret_cast<const uint16_t*>(body);
  }
  // Read once, in pieces, not through the mapping: the rank keeps none of
  // the file resident (its pages stay in the page cache), whatever its
  // size, and large reads go faster than a fault per page.
  const int tb = h->token_bytes();
  const int64_t piece = std::min<int64_t>(h->count, kReadPieceBytes / tb);
  std::vector<char> buf(static_cast<size_t>(piece) * tb);
  for (int64_t at = 0; at < h->count; at += piece) {
    const int64_t n = std::min(piece, h->count - at);
    const size_t bytes = static_cast<size_t>(n) * tb;
    for (size_t got = 0; got < bytes;) {
      const ssize_t r =
          ::pread(fd, buf.data() + got, bytes - got,
                  static_cast<off_t>(sizeof(head) + at * tb + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        return absl::DataLossError(absl::StrCat(
            field, ": cannot read '", path, "' at token ", at, ": ",
            r < 0 ? std::strerror(errno) : "the file is shorter than mapped"));
      }
      got += static_cast<size_t>(r);
    }
    const absl::Status s =
        out.wide_ ? CheckTokensInVocabulary(
                        reinterpret_cast<const uint32_t*>(buf.data()), n,
                        vocab_size, field, path, at)
                  : CheckTokensInVocabulary(
                        reinterpret_cast<const uint16_t*>(buf.data()), n,
                        vocab_size, field, path, at);
    if (!s.ok()) return s;
    if (digest != nullptr) digest->Add(buf.data(), bytes);
  }
  return out;
}

CharTokenizer::CharTokenizer(std::string_view vocab) {
  ForEachChar(vocab, [&](UChar32 c, size_t) {
    if (c >= 0) Add(static_cast<char32_t>(c));
    return true;
  });
  std::sort(index_.begin(), index_.end());
}

void CharTokenizer::Add(char32_t c) {
  index_.emplace_back(c, static_cast<int32_t>(chars_.size()));
  chars_.push_back(c);
  AppendChar(c, &vocab_);
}

absl::StatusOr<CharTokenizer> CharTokenizer::FromText(std::string_view text,
                                                      absl::string_view field,
                                                      absl::string_view path) {
  std::vector<bool> seen(kMaxCodePoint + 1, false);
  int64_t bad = -1;
  ForEachChar(text, [&](UChar32 c, size_t at) {
    if (c < 0) {
      bad = static_cast<int64_t>(at);
      return false;
    }
    seen[c] = true;
    return true;
  });
  if (bad >= 0) {
    // Refused rather than mapped to U+FFFD: a model trained on replacement
    // characters samples them, and the file's real encoding is one
    // conversion away.
    const int64_t line = 1 + std::count(text.begin(), text.begin() + bad, '\n');
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: '%s' is not UTF-8 text: byte 0x%02X at byte offset %d (line %d) "
        "does not begin a UTF-8 character; the char tokenizer reads UTF-8 "
        "(convert the file first, e.g. iconv -f latin1 -t utf-8)",
        field, path, static_cast<unsigned char>(text[bad]), bad, line));
  }
  CharTokenizer t;
  for (char32_t c = 0; c <= kMaxCodePoint; ++c) {
    if (!seen[c]) continue;
    if (t.size() == kMaxSize) {
      const auto distinct = std::count(seen.begin(), seen.end(), true);
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": '", path, "' has ", distinct,
          " distinct characters; the char tokenizer holds at most ", kMaxSize,
          " (token ids are 16-bit)"));
    }
    t.Add(c);
  }
  return t;  // added in code point order: index_ is sorted
}

absl::StatusOr<CharTokenizer> CharTokenizer::FromVocab(std::string_view vocab) {
  CharTokenizer t;
  std::string why;
  ForEachChar(vocab, [&](UChar32 c, size_t at) {
    if (c < 0) {
      why = absl::StrCat("byte ", at, " does not begin a UTF-8 character");
    } else if (!t.chars_.empty() &&
               static_cast<char32_t>(c) <= t.chars_.back()) {
      why = absl::StrCat(
          "character ", t.size(), " (U+", absl::Hex(c, absl::kZeroPad4),
          ") does not follow the one before in code point order");
    } else if (t.size() == kMaxSize) {
      why = absl::StrCat("it has more than ", kMaxSize, " characters");
    } else {
      t.Add(static_cast<char32_t>(c));
    }
    return why.empty();
  });
  if (!why.empty()) return absl::InvalidArgumentError(why);
  return t;
}

std::vector<int32_t> CharTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  ForEachChar(text, [&](UChar32 c, size_t) {
    if (c < 0) return true;
    const auto ch = static_cast<char32_t>(c);
    const auto it = std::lower_bound(index_.begin(), index_.end(),
                                     std::make_pair(ch, int32_t{0}));
    if (it != index_.end() && it->first == ch) ids.push_back(it->second);
    return true;
  });
  return ids;
}

std::string CharTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < size()) AppendChar(chars_[id], &out);
  }
  return out;
}

std::string CharTokenizer::Piece(int32_t id) const {
  std::string out;
  if (id >= 0 && id < size()) AppendChar(chars_[id], &out);
  return out;
}

namespace {

// data.tokenizer's tokenizer for `spec`, by name (DataTokenizerName), with
// the field that named it and, for llm.c's tokenizer file, the tokenizer
// read from it.
struct DataTokenizer {
  std::string name;
  std::string field;
  std::unique_ptr<Tokenizer> llmc;
};

absl::StatusOr<DataTokenizer> ResolveDataTokenizer(const v1::DataSpec& spec,
                                                   const ConfinedFs& fs) {
  const std::string& name = spec.tokenizer();
  if (IsTokenizerName(name)) {
    return DataTokenizer{name, "data.tokenizer", nullptr};
  }
  if (!spec.path().empty()) return DataTokenizer{};  // char
  // A blend's sources share one (LoadTokenData checks): the first's.
  if (spec.blend_size() > 0) {
    return ResolveDataTokenizer(BlendSourceData(spec, 0), fs);
  }
  // Token files: what `ptworker prepare` wrote beside them, if anything.
  const std::string prefix = TrainFilesPrefix(spec.train_bin());
  if (prefix.empty()) return DataTokenizer{};
  const auto beside = [&](const std::string& path) {
    auto exists = fs.Exists(path, "data.train_bin");
    return exists.ok() && *exists;
  };
  // The SentencePiece model it trained, which also encodes prompts.
  const std::string model = prefix + "_spm.model";
  if (beside(model)) {
    return DataTokenizer{"spm:" + model, "data.train_bin", nullptr};
  }
  const std::string path = prefix + "_tokenizer.bin";
  if (!beside(path)) return DataTokenizer{};
  auto t = ReadLlmcTokenizer(
      path, "data.train_bin: the tokenizer file",
      [&fs](const std::string& p) { return fs.ReadFile(p, "data.train_bin"); });
  if (!t.ok()) return t.status();
  // GPT-2's pieces: GPT-2's tokenizer, which also encodes prompts.
  if ((*t)->size() == kGpt2VocabSize) {
    auto gpt2 = OpenTokenizer("gpt2", "data.train_bin");
    if (gpt2.ok() && SamePieces(**t, **gpt2)) {
      return DataTokenizer{"gpt2", "data.train_bin", nullptr};
    }
  }
  return DataTokenizer{"llmc:" + path, "data.train_bin", std::move(*t)};
}

}  // namespace

absl::StatusOr<std::string> DataTokenizerName(const v1::DataSpec& spec,
                                              const ConfinedFs& fs) {
  auto t = ResolveDataTokenizer(spec, fs);
  if (!t.ok()) return t.status();
  return std::move(t->name);
}

namespace {

// The tokenizer ResolveDataTokenizer named (null where none).
absl::StatusOr<std::shared_ptr<const Tokenizer>> OpenResolved(
    DataTokenizer t, const ConfinedFs& fs) {
  if (t.llmc != nullptr) {
    return std::shared_ptr<const Tokenizer>(std::move(t.llmc));
  }
  if (t.name.empty()) return nullptr;
  const std::string field = t.field;
  auto opened =
      OpenTokenizer(t.name, field, [&fs, &field](const std::string& path) {
        return fs.ReadFile(path, field);
      });
  if (!opened.ok()) return opened.status();
  return std::shared_ptr<const Tokenizer>(std::move(*opened));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Tokenizer>> OpenDataTokenizer(
    const v1::DataSpec& spec, const ConfinedFs& fs) {
  auto t = ResolveDataTokenizer(spec, fs);
  if (!t.ok()) return t.status();
  return OpenResolved(std::move(*t), fs);
}

namespace {

// The seed of the validation split of data.path: fixed, so that runs of
// any train.seed hold out the same tokens and their val_loss compare.
constexpr uint64_t kValSplitSeed = 1;

// A text's ids (n of them) split as data.h's LoadTokenData says: m pieces
// of about kValPieceTokens (at least two sequences and targets long), one
// in each m-th of the text at an offset drawn from kValSplitSeed, hold
// floor(n·val_fraction) tokens; each maximal run of the tokens between
// them is a train shard, each run of adjacent pieces a validation shard.
void SplitTokens(const std::vector<int32_t>& ids, double val_fraction,
                 int block_size, TokenData* data) {
  const auto n = static_cast<int64_t>(ids.size());
  const auto v = static_cast<int64_t>(static_cast<double>(n) * val_fraction);
  // Wide streams for vocabularies past uint16.
  const bool wide = data->vocab_size > kMaxTokenStreamVocab;
  const auto add = [&](TokenShards* split, int64_t begin, int64_t end) {
    if (begin >= end) return;
    if (wide) {
      split->push_back(TokenStream(
          std::vector<uint32_t>(ids.begin() + begin, ids.begin() + end)));
    } else {
      split->push_back(TokenStream(
          std::vector<uint16_t>(ids.begin() + begin, ids.begin() + end)));
    }
  };
  if (v == 0) {
    add(&data->train, 0, n);
    return;
  }
  const int64_t piece =
      std::max<int64_t>(kValPieceTokens, 2 * (int64_t{block_size} + 1));
  // v / piece rounded, at least one.
  const int64_t m = std::clamp<int64_t>((v + piece / 2) / piece, 1, v);
  const uint64_t stream = StableHash("data.path validation");
  int64_t train_from = 0, val_from = 0, val_to = 0;
  for (int64_t j = 0; j < m; ++j) {
    const int64_t lo = j * n / m, hi = (j + 1) * n / m;
    const int64_t len = std::min((j + 1) * v / m - j * v / m, hi - lo);
    const auto slack = static_cast<uint64_t>(hi - lo - len);
    const int64_t at =
        lo + static_cast<int64_t>(CounterRandom64(kValSplitSeed, stream, j) %
                                  (slack + 1));
    if (at != val_to) {  // not adjacent to the piece before: a new run
      add(&data->val, val_from, val_to);
      add(&data->train, train_from, at);
      val_from = at;
    }
    val_to = at + len;
    train_from = val_to;
  }
  add(&data->val, val_from, val_to);
  add(&data->train, train_from, n);
}

// The vocabulary of a model on data under `tokenizer` (null: none):
// model.vocab_size if given (at least the tokenizer's), else the
// tokenizer's, else `otherwise`.
absl::StatusOr<int> VocabSize(int model_vocab_size, const Tokenizer* tokenizer,
                              int otherwise) {
  if (tokenizer == nullptr) {
    return model_vocab_size != 0 ? model_vocab_size : otherwise;
  }
  if (model_vocab_size != 0 && model_vocab_size < tokenizer->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.vocab_size=", model_vocab_size,
                     " is smaller than the vocabulary of data.tokenizer (",
                     tokenizer->size(), " tokens)"));
  }
  return model_vocab_size != 0 ? model_vocab_size : tokenizer->size();
}

// Whether two of DataTokenizerName's names are one tokenizer: the same
// name, or files of one kind (spm:, llmc:) with the same bytes, as two
// corpora prepared with one tokenizer have beside them.
absl::StatusOr<bool> SameTokenizer(const std::string& a, const std::string& b,
                                   const std::string& field,
                                   const ConfinedFs& fs) {
  if (a == b) return true;
  for (absl::string_view kind : {"spm:", "llmc:"}) {
    if (!absl::StartsWith(a, kind) || !absl::StartsWith(b, kind)) continue;
    auto first = fs.ReadFile(a.substr(kind.size()), field);
    if (!first.ok()) return first.status();
    auto second = fs.ReadFile(b.substr(kind.size()), field);
    if (!second.ok()) return second.status();
    return *first == *second;
  }
  return false;
}

// data.blend: each source's token files as data.train_bin/val_bin load
// them, under the first source's tokenizer, which every other must share.
absl::StatusOr<TokenData> LoadBlend(const v1::DataSpec& spec,
                                    int model_vocab_size, int block_size,
                                    const ConfinedFs& fs) {
  TokenData data;
  double total = 0;
  for (const v1::BlendSource& b : spec.blend()) total += b.weight();
  std::string first_tokenizer;
  for (int i = 0; i < spec.blend_size(); ++i) {
    const v1::DataSpec one = BlendSourceData(spec, i);
    const std::string at = absl::StrCat("data.blend[", i, "]");
    const std::string name = BlendSourceName(spec.blend(i));
    auto resolved = ResolveDataTokenizer(one, fs);
    if (!resolved.ok()) return resolved.status();
    const std::string tokenizer = resolved->name;
    if (i == 0) {
      first_tokenizer = tokenizer;
      auto words = OpenResolved(std::move(*resolved), fs);
      if (!words.ok()) return words.status();
      data.words = std::move(*words);
      auto vocab =
          VocabSize(model_vocab_size, data.words.get(), kGpt2VocabSize);
      if (!vocab.ok()) return vocab.status();
      data.vocab_size = *vocab;
    } else {
      auto same =
          SameTokenizer(first_tokenizer, tokenizer, at + ".train_bin", fs);
      if (!same.ok()) return same.status();
      if (!*same) {
        const auto shown = [](const std::string& t) {
          return t.empty() ? std::string("none") : EchoQuoted(t);
        };
        return absl::InvalidArgumentError(absl::StrCat(
            at, " (", name, "): its tokenizer (", shown(tokenizer),
            ") is not data.blend[0]'s (", shown(first_tokenizer),
            "); a blend's sources are token ids of one vocabulary: prepare "
            "them with the same --tokenizer"));
      }
    }
    data.blend.push_back({name, spec.blend(i).weight() / total});
  }
  // Every source's train files, then every source's validation files: the
  // order of the digest, which each file joins as it is read.
  DataDigest digest;
  for (const bool train : {true, false}) {
    TokenShards& split = train ? data.train : data.val;
    for (int i = 0; i < spec.blend_size(); ++i) {
      BlendPart& part = data.blend[i];
      const std::string field = absl::StrCat("data.blend[", i, "]",
                                             train ? ".train_bin" : ".val_bin");
      const v1::BlendSource& b = spec.blend(i);
      auto shards = ReadTokenFiles(field, train ? b.train_bin() : b.val_bin(),
                                   data.vocab_size, fs, &digest);
      if (!shards.ok()) return shards.status();
      const int64_t longest = LongestShard(*shards);
      if (longest < int64_t{block_size} + 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, " (", part.name, "): its longest file holds ",
                         longest, " tokens; model.block_size=", block_size,
                         " needs ", int64_t{block_size} + 1, " in one file"));
      }
      (train ? part.train_begin : part.val_begin) = split.size();
      for (TokenStream& stream : *shards) split.push_back(std::move(stream));
      (train ? part.train_end : part.val_end) = split.size();
    }
    digest.EndSplit(TokenCount(split));
  }
  data.digest = digest.value();
  return data;
}

}  // namespace

absl::StatusOr<TokenData> LoadTokenData(const v1::DataSpec& spec,
                                        int model_vocab_size, int block_size,
                                        const ConfinedFs& fs) {
  if (spec.blend_size() > 0) {
    return LoadBlend(spec, model_vocab_size, block_size, fs);
  }
  TokenData data;
  auto words = OpenDataTokenizer(spec, fs);
  if (!words.ok()) return words.status();
  data.words = std::move(*words);
  if (!spec.path().empty() && data.words != nullptr) {
    auto text = fs.ReadFile(spec.path(), "data.path", kMaxTokenizedTextBytes);
    if (absl::IsResourceExhausted(text.status())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.path '", spec.path(), "' is larger than ",
          kMaxTokenizedTextBytes >> 20,
          " MiB, the most data.tokenizer=", spec.tokenizer(),
          " tokenizes at start; prepare it once with `ptworker prepare "
          "--tokenizer ",
          spec.tokenizer(), " --input ", spec.path(),
          " --out DIR` and train on data.train_bin/data.val_bin"));
    }
    if (!text.ok()) return text.status();
    auto vocab = VocabSize(model_vocab_size, data.words.get(), 0);
    if (!vocab.ok()) return vocab.status();
    data.vocab_size = *vocab;
    SplitTokens(data.words->Encode(*text), spec.val_fraction(), block_size,
                &data);
  } else if (!spec.path().empty()) {
    auto text = fs.ReadFile(spec.path(), "data.path");
    if (!text.ok()) return text.status();
    auto tokenizer = CharTokenizer::FromText(*text, "data.path", spec.path());
    if (!tokenizer.ok()) return tokenizer.status();
    data.tokenizer = std::move(*tokenizer);
    data.has_tokenizer = true;
    data.vocab_size = data.tokenizer.size();
    if (model_vocab_size != 0 && model_vocab_size != data.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.vocab_size=", model_vocab_size,
          " does not match the vocabulary of data.path '", spec.path(), "' (",
          data.vocab_size, " distinct characters)"));
    }
    SplitTokens(data.tokenizer.Encode(*text), spec.val_fraction(), block_size,
                &data);
  } else {
    auto vocab = VocabSize(model_vocab_size, data.words.get(), kGpt2VocabSize);
    if (!vocab.ok()) return vocab.status();
    data.vocab_size = *vocab;
    DataDigest digest;
    auto train = ReadTokenFiles("data.train_bin", spec.train_bin(),
                                data.vocab_size, fs, &digest);
    if (!train.ok()) return train.status();
    digest.EndSplit(TokenCount(*train));
    auto val = ReadTokenFiles("data.val_bin", spec.val_bin(), data.vocab_size,
                              fs, &digest);
    if (!val.ok()) return val.status();
    digest.EndSplit(TokenCount(*val));
    data.train = std::move(*train);
    data.val = std::move(*val);
    data.digest = digest.value();
  }
  if (!spec.path().empty()) data.digest = TokenDigest(data.train, data.val);
  // A sequence and its shifted target lie in one shard.
  const int64_t need = int64_t{block_size} + 1;
  const int64_t train = LongestShard(data.train), val = LongestShard(data.val);
  if (train < need || val < need) {
    // A text's splits are runs of it (SplitTokens), token files' files.
    const bool text = !spec.path().empty();
    const bool shards = text || data.train.size() > 1 || data.val.size() > 1;
    return absl::InvalidArgumentError(absl::StrCat(
        "model.block_size=", block_size, " is too large for the data: the ",
        shards ? (text ? "longest run of the " : "longest file of the ") : "",
        "train split (", train, " tokens) and ", shards ? "of " : "",
        "the validation split (", val,
        " tokens) must each hold at least model.block_size+1 = ", need,
        " tokens",
        text && train < need
            ? " (a smaller data.val_fraction leaves longer train runs)"
            : ""));
  }
  return data;
}

namespace {

absl::Status WriteTokens(const std::string& path, int32_t version,
                         const void* tokens, size_t count) {
  int32_t header[kTokenFileHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(static_cast<const char*>(tokens),
            static_cast<std::streamsize>(count * TokenFileTokenBytes(version)));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteTokenFile(const std::string& path,
                            const std::vector<uint16_t>& tokens) {
  return WriteTokens(path, kTokenFileVersion, tokens.data(), tokens.size());
}

absl::Status WriteTokenFile(const std::string& path,
                            const std::vector<uint32_t>& tokens) {
  return WriteTokens(path, kTokenFileVersion32, tokens.data(), tokens.size());
}

int64_t TokenCount(const TokenShards& shards) {
  int64_t n = 0;
  for (const TokenStream& s : shards) n += static_cast<int64_t>(s.size());
  return n;
}

BatchSampler::BatchSampler(absl::Span<const TokenStream> shards, int T,
                           int global_batch, uint64_t seed,
                           std::string_view stream)
    : shards_(shards),
      T_(T),
      global_batch_(global_batch),
      seed_(seed),
      stream_(StableHash(stream)) {
  // Starting positions 0 .. n-T-1 of a shard of n tokens leave room for the
  // shifted target.
  starts_.push_back(0);
  for (const TokenStream& s : shards_) {
    const uint64_t n = s.size() > static_cast<size_t>(T) ? s.size() - T : 0;
    starts_.push_back(starts_.back() + n);
  }
  PT_CHECK(starts_.back() > 0, "no shard holds a sequence (validated)");
}

void BatchSampler::Fill(int64_t b, int first, int count, int32_t* inputs,
                        int32_t* targets) const {
  for (int i = 0; i < count; ++i) {
    const uint64_t index = static_cast<uint64_t>(b) * global_batch_ + first + i;
    const uint64_t start =
        CounterRandom64(seed_, stream_, index) % starts_.back();
    // The shard k with starts_[k] <= start < starts_[k + 1].
    const size_t k = std::upper_bound(starts_.begin(), starts_.end(), start) -
                     starts_.begin() - 1;
    shards_[k].CopyWindow(start - starts_[k], T_,
                          inputs + static_cast<int64_t>(i) * T_,
                          targets + static_cast<int64_t>(i) * T_);
  }
}

}  // namespace ptrain
