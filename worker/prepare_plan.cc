// `ptworker prepare`'s plan: the flags, the inputs, where they are cut;
// see prepare_plan.h.
#include "worker/prepare_plan.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer.h"
#include "worker/prepare_decode.h"

namespace ptrain {
namespace prepare_internal {

namespace stdfs = std::filesystem;

absl::Status Errno(absl::string_view what, absl::string_view path) {
  return absl::UnavailableError(
      absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

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

// ---------------------------------------------------------------- flags

absl::StatusOr<TokenizerChoice> ParseTokenizer(const PrepareFlags& f) {
  TokenizerChoice c;
  const std::string& t = f.tokenizer;
  if (t == "gpt2") {
    c.kind = TokenizerKind::kGpt2;
  } else if (t.rfind("spm:", 0) == 0 && t.size() > 4) {
    c.kind = TokenizerKind::kSpm;
    c.model = t.substr(4);
  } else if (t.rfind("hf:", 0) == 0 && t.size() > 3) {
    c.kind = TokenizerKind::kHf;
    c.model = HfTokenizerFile(t.substr(3));
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
               "': not one of gpt2, spm:MODEL, spm-train:VOCAB, "
               "hf:TOKENIZER_JSON");
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

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 +
         st.st_mtim.tv_nsec;
}

namespace {

// The corpus files (IsCorpusFileName) in folder `dir` and below, sorted
// by path; hidden entries (".git") left out, symlinks to files followed.
absl::StatusOr<std::vector<std::string>> CorpusFilesIn(const std::string& dir,
                                                       const std::string& field,
                                                       const ConfinedFs& fs) {
  std::vector<std::string> files;
  std::vector<std::string> folders = {dir};
  while (!folders.empty()) {
    const std::string at = folders.back();
    folders.pop_back();
    auto entries = fs.List(at, field);
    if (!entries.ok()) return entries.status();
    for (const ConfinedFs::Entry& e : *entries) {
      if (e.name.empty() || e.name[0] == '.') continue;
      const std::string p = (stdfs::path(at) / e.name).string();
      if (e.is_dir) {
        folders.push_back(p);
      } else if (IsCorpusFileName(e.name)) {
        files.push_back(p);
      }
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

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
    // Past these, the files found in a folder it names.
    const size_t named = paths.size();
    for (size_t k = 0; k < paths.size(); ++k) {
      const std::string path = paths[k];
      const bool given = !wild && k < named;
      if (absl::Status s = fs.Check(path, field); !s.ok()) return s;
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) {
        if (given && errno == ENOENT) return Bad(field, ": no such file");
        if (given) return Errno("read", field);
        continue;  // vanished since glob listed it
      }
      if (S_ISDIR(st.st_mode) && given) {
        // A folder: the files in it and below that prepare reads.
        auto found = CorpusFilesIn(path, field, fs);
        if (!found.ok()) return found.status();
        if (found->empty()) {
          return Bad(field,
                     ": a folder with no .txt, .jsonl or .json file (or one "
                     "of them as .gz or .zst) in it or below");
        }
        paths.insert(paths.end(), found->begin(), found->end());
        continue;
      }
      if (!S_ISREG(st.st_mode)) {
        if (given) return Bad(field, ": not a file");
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

// ---------------------------------------------------------------- plan

namespace {

// The seed validation pieces are drawn from: fixed, so that every
// preparation of the same inputs holds out the same text.
constexpr uint64_t kValSeed = 1;

int64_t MulDiv(int64_t a, int64_t b, int64_t c) {
  return static_cast<int64_t>(static_cast<__int128>(a) * b / c);
}

// Uniform in [0, n] for validation piece `index`.
int64_t Draw(uint64_t index, int64_t n) {
  return static_cast<int64_t>(XXH64(&index, sizeof(index), kValSeed) %
                              static_cast<uint64_t>(n + 1));
}

// The validation pieces of the stream, as stream byte ranges in order
// (prepare.h): spans of files, each holding val_fraction of its bytes in
// pieces of at most kPrepareValPieceBytes, one in each equal part of the
// span, at a drawn offset.
std::vector<std::pair<int64_t, int64_t>> ValPieces(
    const std::vector<InputFile>& inputs, double val_fraction) {
  std::vector<std::pair<int64_t, int64_t>> pieces;
  if (val_fraction <= 0) return pieces;
  // Spans: a file whose share is kPrepareMinValShareBytes or more, or
  // consecutive smaller files up to that share; a smaller rest joins the
  // span before it.
  std::vector<std::pair<int64_t, int64_t>> spans;
  int64_t begin = 0, at = 0;
  for (const InputFile& in : inputs) {
    at += in.size;
    if (val_fraction * static_cast<double>(at - begin) >=
        kPrepareMinValShareBytes) {
      spans.emplace_back(begin, at);
      begin = at;
    }
  }
  if (at > begin) {
    if (spans.empty()) {
      spans.emplace_back(begin, at);
    } else {
      spans.back().second = at;
    }
  }
  uint64_t index = 0;
  for (const auto& [lo, hi] : spans) {
    const int64_t bytes = hi - lo;
    const double share = val_fraction * static_cast<double>(bytes);
    const int64_t total = std::max<int64_t>(1, std::llround(share));
    const int64_t m =
        (total + kPrepareValPieceBytes - 1) / kPrepareValPieceBytes;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t from = lo + MulDiv(bytes, j, m);
      const int64_t to = lo + MulDiv(bytes, j + 1, m);
      const int64_t len =
          std::min(MulDiv(total, j + 1, m) - MulDiv(total, j, m), to - from);
      const int64_t start = from + Draw(index++, to - from - len);
      if (len > 0) pieces.emplace_back(start, start + len);
    }
  }
  return pieces;
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const std::vector<InputFile>& inputs,
                              const PrepareFlags& f, const ConfinedFs& fs) {
  Plan plan;
  for (const InputFile& in : inputs) plan.total_bytes += in.size;
  const std::vector<std::pair<int64_t, int64_t>> pieces =
      ValPieces(inputs, f.val_fraction);
  std::vector<Chunk> val, train;
  size_t p = 0;    // the first piece that does not end before this file
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
    const auto cut = [&](int64_t from) {
      return CutPointInFile(fd->get(), n, from, f.chunk_bytes, in.path,
                            kPrepareValPieceBytes);
    };
    // The pieces within this file, their ends moved to cut points (a
    // piece that starts at the file's start starts there), overlaps
    // joined.
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (size_t q = p; q < pieces.size() && pieces[q].first < at + n; ++q) {
      const int64_t lo = std::max(pieces[q].first, at) - at;
      const int64_t hi = std::min(pieces[q].second, at + n) - at;
      int64_t b = 0;
      if (lo > 0) {
        auto c = cut(lo);
        if (!c.ok()) return c.status();
        b = *c;
      }
      if (b >= n) continue;
      auto e = cut(std::max(hi, b + 1));
      if (!e.ok()) return e.status();
      if (!ranges.empty() && b <= ranges.back().second) {
        ranges.back().second = std::max(ranges.back().second, *e);
      } else {
        ranges.emplace_back(b, *e);
      }
    }
    // A piece that goes on into the next file is that file's too.
    while (p < pieces.size() && pieces[p].second <= at + n) ++p;
    size_t r = 0;
    bool last_val = false;
    for (int64_t s = 0; s < n;) {
      const bool is_val = r < ranges.size() && s >= ranges[r].first;
      const int64_t bound = is_val              ? ranges[r].second
                            : r < ranges.size() ? ranges[r].first
                                                : n;
      int64_t e = bound;
      if (s + f.chunk_bytes < bound) {
        auto c = CutPointInFile(fd->get(), n, s + f.chunk_bytes, f.chunk_bytes,
                                in.path);
        if (!c.ok()) return c.status();
        e = std::min(*c, bound);
      }
      // End of text before a document's start, and where the text before
      // went to the other split: each split's stream then reads as
      // documents.
      bool first = s == 0 || is_val != last_val;
      if (!first && in.documents) {
        // A chunk that starts a document of a decoded file (its first
        // byte after a NUL) starts with end of text too.
        char before = 0;
        auto r = ReadAt(fd->get(), &before, 1, s - 1, in.path);
        if (!r.ok()) return r.status();
        first = *r == 1 && before == '\0';
      }
      (is_val ? val : train).push_back({i, s, e, first, is_val});
      if (is_val) plan.val_bytes += e - s;
      if (is_val && e == ranges[r].second) ++r;
      last_val = is_val;
      s = e;
    }
    at += n;
  }
  if (f.val_fraction > 0 && (train.empty() || val.empty())) {
    return Bad("--val-fraction ", f.val_fraction,
               ": the validation split would take ",
               train.empty() ? "all " : "none of the ", plan.total_bytes,
               " bytes of input (its pieces' ends, moved to cut points, ",
               train.empty() ? "cover it" : "meet at the input's end",
               "); give more input or --val-fraction 0");
  }
  plan.val_chunks = static_cast<int64_t>(val.size());
  plan.chunks = std::move(val);
  plan.chunks.insert(plan.chunks.end(), train.begin(), train.end());
  return plan;
}

}  // namespace prepare_internal

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

namespace {

bool Word(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return u > 0x20 && u < 0x7F;
}

// The space or character cut of CutPoint in [from, limit] (from >= 1,
// limit < n), the text's bytes [lo, lo + bytes.size()) being `bytes`,
// with lo <= from - 1 and lo + bytes.size() >= limit + 2 (or n).
int64_t FallbackCut(std::string_view bytes, int64_t lo, int64_t n, int64_t from,
                    int64_t limit) {
  const auto at = [&](int64_t p) { return bytes[static_cast<size_t>(p - lo)]; };
  for (int64_t p = from; p <= limit; ++p) {
    if (at(p) == ' ' && Word(at(p - 1)) && p + 1 < n && Word(at(p + 1))) {
      return p;
    }
  }
  for (int64_t p = from; p <= limit; ++p) {
    if ((static_cast<unsigned char>(at(p)) & 0xC0) != 0x80) return p;
  }
  return limit;
}

}  // namespace

size_t CutPoint(std::string_view text, size_t from, size_t window) {
  const size_t n = text.size();
  if (from >= n) return n;
  from = std::max<size_t>(from, 1);
  const size_t limit = from + std::max(window, kCutMinWindow);
  if (limit >= n) return NextCutPoint(text, from);
  // Positions up to limit are judged as in the whole text with two bytes
  // after them.
  const size_t line = NextCutPoint(text.substr(0, limit + 2), from);
  if (line <= limit) return line;
  return static_cast<size_t>(FallbackCut(text, 0, static_cast<int64_t>(n),
                                         static_cast<int64_t>(from),
                                         static_cast<int64_t>(limit)));
}

std::vector<size_t> ChunkEnds(std::string_view text, size_t chunk_bytes,
                              size_t window) {
  std::vector<size_t> ends;
  for (size_t s = 0; s < text.size();) {
    const size_t e = s + chunk_bytes < text.size()
                         ? CutPoint(text, s + chunk_bytes, window)
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
    auto n = prepare_internal::ReadAt(fd, buf.data(), hi - lo, lo, name);
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

absl::StatusOr<int64_t> CutPointInFile(int fd, int64_t size, int64_t from,
                                       int64_t window, std::string_view path,
                                       int64_t block) {
  if (from >= size) return size;
  from = std::max<int64_t>(from, 1);
  const int64_t limit =
      from + std::max(window, static_cast<int64_t>(kCutMinWindow));
  if (limit >= size) return NextCutPointInFile(fd, size, from, path, block);
  // The file as if it ended two bytes past limit: the same answer up to
  // limit, and nothing read past it.
  const int64_t hi = std::min(size, limit + 2);
  auto line = NextCutPointInFile(fd, hi, from, path, block);
  if (!line.ok() || *line <= limit) return line;
  const int64_t lo = from - 1;
  std::string bytes(static_cast<size_t>(hi - lo), '\0');
  const absl::string_view name(path.data(), path.size());
  auto n = prepare_internal::ReadAt(fd, bytes.data(), hi - lo, lo, name);
  if (!n.ok()) return n.status();
  if (*n != hi - lo) {
    return absl::UnavailableError(
        absl::StrCat(name, ": became shorter while being read"));
  }
  return FallbackCut(bytes, lo, size, from, limit);
}

}  // namespace ptrain
