// `ptworker prepare` in-process: chunks cut where GPT-2's pre-tokenizer
// cuts too, shards that decode to their inputs, the same bytes whatever
// the thread count and however often the run is stopped, refusals of a
// folder that is another preparation's. The process-level contract (exit
// codes, error lines) is ptworker_prepare_test.cc's.
#include "worker/prepare.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/byte_level.h"
#include "common/confined_fs.h"
#include "common/tokenizer.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "worker/engine/data/data.h"
#include "worker/prepare_decode.h"
#include "worker/prepare_plan.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kEot = 50256;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::string Shakespeare(size_t bytes) {
  return ReadAll("data/tinyshakespeare.txt").substr(0, bytes);
}

// Text where a careless cut changes GPT-2's words: spaces before line
// ends, runs of blank lines, "\r\n", tabs, contractions, non-ASCII.
std::string Tricky() {
  std::string t;
  for (int i = 0; i < 40; ++i) {
    t += "First line\nSecond line \nthird\n\n\nfourth:  \n  indented\n";
    t += "tab\there\n\tx\nCRLF line\r\nnext\r\n\r\nafter blank\r\nA\r\n";
    t += "don't\n'tis\n'll be\n\xE6\x97\xA5\xE6\x9C\xAC\nna\xC3\xAFve\n";
    t += "123 456\n789\n \nX\n?!\n...\n-- ";
    t += std::to_string(i * 7919);
    t += "\n";
  }
  return t;
}

const Tokenizer& Gpt2() {
  static const std::unique_ptr<Tokenizer> t = [] {
    auto opened = OpenTokenizer("gpt2", "test");
    EXPECT_TRUE(opened.ok()) << opened.status();
    return std::move(*opened);
  }();
  return *t;
}

std::vector<int32_t> EncodeChunks(std::string_view text,
                                  const std::vector<size_t>& ends) {
  std::vector<int32_t> ids;
  size_t begin = 0;
  for (size_t end : ends) {
    const std::vector<int32_t> part =
        Gpt2().Encode(text.substr(begin, end - begin));
    ids.insert(ids.end(), part.begin(), part.end());
    begin = end;
  }
  return ids;
}

TEST(PrepareChunks, ChunksEncodeToTheWholeTextsIds) {
  for (const std::string& text :
       {Shakespeare(60000), Tricky(), Tricky() + Shakespeare(5000)}) {
    const std::vector<int32_t> whole = Gpt2().Encode(text);
    for (size_t chunk : {1, 7, 64, 1000}) {
      // A window as long as the text: line cut points only.
      const std::vector<size_t> ends = ChunkEnds(text, chunk, text.size());
      ASSERT_GT(ends.size(), 3u) << "chunk " << chunk;
      EXPECT_EQ(EncodeChunks(text, ends), whole) << "chunk " << chunk;
    }
  }
}

// The property above is not vacuous: cutting after every line end (the
// obvious rule) changes the ids of the same text.
TEST(PrepareChunks, CuttingAtEveryLineEndWouldChangeTheIds) {
  const std::string text = Tricky();
  std::vector<size_t> ends;
  for (size_t p = 1; p < text.size(); ++p) {
    if (text[p - 1] == '\n') ends.push_back(p);
  }
  ends.push_back(text.size());
  EXPECT_NE(EncodeChunks(text, ends), Gpt2().Encode(text));
}

TEST(PrepareChunks, CutPointsFollowTheRule) {
  EXPECT_EQ(NextCutPoint("ab\ncd", 0), 3u);
  EXPECT_EQ(NextCutPoint("ab \ncd", 0), 6u);    // space before the '\n'
  EXPECT_EQ(NextCutPoint("ab\n cd", 0), 6u);    // space after it
  EXPECT_EQ(NextCutPoint("ab\r\ncd", 0), 3u);   // between '\r' and '\n'
  EXPECT_EQ(NextCutPoint("ab\r\n cd", 0), 7u);  // space after "\r\n"
  EXPECT_EQ(NextCutPoint("ab\ncd\nef", 4), 6u);
  EXPECT_EQ(NextCutPoint("ab\n\xC3\xA9", 0), 5u);  // not ASCII after it
  EXPECT_EQ(ChunkEnds("no cut point in here at all", 4, 100),
            std::vector<size_t>{27});
}

// Reading the file a window at a time finds the cut points the text has,
// at every start and every window size (the windows' edges included).
TEST(PrepareChunks, FileScanFindsTheTextsCutPoints) {
  const fs::path path = fs::temp_directory_path() /
                        ("prepare_scan_" + std::to_string(::getpid()));
  const std::string text = Tricky().substr(0, 400) + "end\r\nX";
  WriteAll(path, text);
  const int fd = ::open(path.c_str(), O_RDONLY);
  fs::remove(path);  // open: read on until closed
  ASSERT_GE(fd, 0);
  for (int64_t block : {1, 2, 3, 5, 8, 64, 1 << 16}) {
    for (size_t from = 0; from <= text.size(); ++from) {
      auto got = NextCutPointInFile(fd, static_cast<int64_t>(text.size()),
                                    static_cast<int64_t>(from), "f", block);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(*got, static_cast<int64_t>(NextCutPoint(text, from)))
          << "from " << from << ", block " << block;
    }
  }
  ::close(fd);
}

bool Printable(char c) { return c > 0x20 && c < 0x7F; }

// Where CutPoint falls back to when no line starts within its window.
bool IsSpaceCut(std::string_view t, size_t p) {
  return p > 0 && p + 1 < t.size() && t[p] == ' ' && Printable(t[p - 1]) &&
         Printable(t[p + 1]);
}

bool IsCharacterStart(std::string_view t, size_t p) {
  return (static_cast<unsigned char>(t[p]) & 0xC0) != 0x80;
}

TEST(PrepareChunks, CutPointsFallBackToSpacesThenCharacters) {
  // A line cut point within the window wins over an earlier space.
  EXPECT_EQ(CutPoint("ab cd ef\ngh ij", 1, 9), 9u);
  // None: the first space between printable characters.
  EXPECT_EQ(CutPoint("abcdefgh ijklmnop", 2, 10), 8u);
  EXPECT_EQ(CutPoint("abcd  efgh ijkl", 1, 10), 10u);  // not at "  "
  // Neither: the first character start.
  EXPECT_EQ(CutPoint("abcd  efgh ijkl", 1, 6), 1u);
  const std::string japanese = "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E";
  EXPECT_EQ(CutPoint(japanese + japanese, 1, 4), 3u);
  EXPECT_EQ(CutPoint(japanese + japanese, 1, 1), 3u);  // window 4 at least
  // Bytes of no character: the window's end.
  EXPECT_EQ(CutPoint(std::string(20, '\x80'), 1, 4), 5u);
  // The text ends within the window: its end.
  EXPECT_EQ(CutPoint("abc def", 2, 10), 7u);
}

// A line as long as the text: chunks stay within twice the chunk size,
// cut at spaces, and their ids are still the whole's.
TEST(PrepareChunks, ALongLineIsCutAtSpacesKeepingTheIds) {
  std::string text = Shakespeare(60000);
  std::replace(text.begin(), text.end(), '\n', ' ');
  const std::vector<int32_t> whole = Gpt2().Encode(text);
  for (size_t chunk : {64, 300, 4096}) {
    const std::vector<size_t> ends = ChunkEnds(text, chunk, chunk);
    ASSERT_GT(ends.size(), text.size() / (2 * chunk)) << "chunk " << chunk;
    size_t begin = 0;
    for (size_t end : ends) {
      EXPECT_LE(end - begin, 2 * chunk);
      if (end < text.size()) {
        EXPECT_TRUE(IsSpaceCut(text, end)) << end;
      }
      begin = end;
    }
    EXPECT_EQ(EncodeChunks(text, ends), whole) << "chunk " << chunk;
  }
}

// Text without a space or a line: cut between characters, never inside
// one, within twice the chunk size.
TEST(PrepareChunks, TextWithoutSpacesIsCutBetweenCharacters) {
  std::string text;
  for (int i = 0; i < 3000; ++i) {
    text += "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99";
    text += i % 7 == 0 ? "caf\xC3\xA9" : "\xF0\x9F\x98\x80";
    if (i % 500 == 0) text += "\xFF\x80\x80";  // not UTF-8
  }
  for (size_t chunk : {5, 100, 1000}) {
    const std::vector<size_t> ends = ChunkEnds(text, chunk, chunk);
    size_t begin = 0;
    std::string whole_as_utf8;
    for (size_t end : ends) {
      EXPECT_LE(end - begin, 2 * chunk);
      if (end < text.size()) {
        EXPECT_TRUE(IsCharacterStart(text, end)) << end;
      }
      whole_as_utf8 += ToValidUtf8(text.substr(begin, end - begin));
      begin = end;
    }
    EXPECT_EQ(begin, text.size());
    // What SentencePiece reads of the chunks is what it reads of the text.
    EXPECT_EQ(whole_as_utf8, ToValidUtf8(text)) << "chunk " << chunk;
  }
}

// CutPointInFile reads a window at a time and finds what CutPoint finds
// in the whole text, for every start, window and block.
TEST(PrepareChunks, FileScanFindsTheTextsFallbackCutPoints) {
  const fs::path path = fs::temp_directory_path() /
                        ("prepare_scan2_" + std::to_string(::getpid()));
  std::string line = Shakespeare(300);
  std::replace(line.begin(), line.end(), '\n', ' ');
  const std::string text = Tricky().substr(0, 200) + line +
                           "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E" +
                           std::string(9, '\x80') + "ab\r\nX";
  WriteAll(path, text);
  const int fd = ::open(path.c_str(), O_RDONLY);
  fs::remove(path);
  ASSERT_GE(fd, 0);
  for (int64_t window : {1, 4, 9, 40}) {
    for (int64_t block : {1, 3, 64}) {
      for (size_t from = 0; from <= text.size(); ++from) {
        auto got =
            CutPointInFile(fd, static_cast<int64_t>(text.size()),
                           static_cast<int64_t>(from), window, "f", block);
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_EQ(*got, static_cast<int64_t>(CutPoint(text, from, window)))
            << "from " << from << ", window " << window << ", block " << block;
      }
    }
  }
  ::close(fd);
}

// A folder's files by name: "the same bytes".
std::map<std::string, std::string> Tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    out[e.path().filename().string()] = ReadAll(e.path());
  }
  return out;
}

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A parameterized test's name has a '/'.
    std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = fs::temp_directory_path() /
           ("prepare_test_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "corpus");
    // Documents: a.txt, b.txt, c.txt (empty: skipped), d.txt (not UTF-8
    // in two chunks).
    texts_ = {Shakespeare(30000), Tricky(), "",
              "caf\xE9 au lait\n" + Shakespeare(6000) + "\xFF\xFE end\n"};
    for (size_t i = 0; i < texts_.size(); ++i) {
      WriteAll(Doc(i), texts_[i]);
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path Doc(size_t i) const {
    return dir_ / "corpus" /
           (std::string(1, static_cast<char>('a' + i)) + ".txt");
  }

  PrepareFlags Flags(const std::string& out) const {
    PrepareFlags f;
    f.tokenizer = "gpt2";
    f.inputs = {(dir_ / "corpus" / "*.txt").string()};
    f.out = (dir_ / out).string();
    f.val_fraction = 0.1;
    f.shard_tokens = 1024;
    f.threads = 2;
    f.chunk_bytes = 2048;
    f.quiet = true;
    return f;
  }

  // The tokens of a split's shards in order; each shard checked as
  // llm.c's token file.
  std::vector<uint16_t> Tokens(const std::string& out, const std::string& split,
                               int vocab = 50257, int* shards = nullptr) {
    std::vector<uint16_t> all;
    std::vector<int64_t> sizes;
    for (const auto& [name, bytes] : Tree(dir_ / out)) {
      if (name.find("_" + split + "_") == std::string::npos) continue;
      auto t = ParseTokenFile(bytes, "test", name, vocab);
      EXPECT_TRUE(t.ok()) << t.status();
      if (!t.ok()) continue;
      sizes.push_back(static_cast<int64_t>(t->size()));
      all.insert(all.end(), t->begin(), t->end());
    }
    // Every shard but a split's last is full.
    for (size_t i = 0; i + 1 < sizes.size(); ++i) EXPECT_EQ(sizes[i], 1024);
    if (shards != nullptr) *shards = static_cast<int>(sizes.size());
    return all;
  }

  nlohmann::json Manifest(const std::string& out) {
    return nlohmann::json::parse(ReadAll(dir_ / out / (out + "_prepare.json")));
  }

  void SaveManifest(const std::string& out, const nlohmann::json& m) {
    WriteAll(dir_ / out / (out + "_prepare.json"), m.dump(1));
  }

  // Replaces the corpus with `texts` (a.txt, b.txt, …).
  void Corpus(std::vector<std::string> texts) {
    fs::remove_all(dir_ / "corpus");
    fs::create_directories(dir_ / "corpus");
    texts_ = std::move(texts);
    for (size_t i = 0; i < texts_.size(); ++i) WriteAll(Doc(i), texts_[i]);
  }

  // The plan Prepare(f) writes (prepare_plan.h).
  prepare_internal::Plan Planned(PrepareFlags f) const {
    if (f.chunk_bytes == 0) {
      f.chunk_bytes =
          f.tokenizer == "gpt2" ? kPrepareChunkBytes : kPrepareSpmChunkBytes;
    }
    auto inputs = prepare_internal::ResolveInputs(f.inputs, ConfinedFs());
    EXPECT_TRUE(inputs.ok()) << inputs.status();
    auto plan = prepare_internal::MakePlan(*inputs, f, ConfinedFs());
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *plan;
  }

  // The text of chunk `c` (its file is texts_[c.file]: no empty file
  // before a non-empty one is left out of the indexes, as in SetUp).
  std::string_view Text(const prepare_internal::Chunk& c) const {
    return std::string_view(texts_[c.file]).substr(c.begin, c.end - c.begin);
  }

  // The pieces of a split's stream as the plan writes it: the text from
  // each chunk that follows end of text up to the next such.
  std::vector<std::string> Pieces(const prepare_internal::Plan& plan,
                                  bool val) const {
    std::vector<std::string> pieces;
    for (const prepare_internal::Chunk& c : plan.chunks) {
      if (c.val != val) continue;
      if (c.first) pieces.emplace_back();
      EXPECT_FALSE(pieces.empty());
      if (!pieces.empty()) pieces.back() += Text(c);
    }
    return pieces;
  }

  // `tokens` cut at each end of text `eot`, each part decoded.
  static std::vector<std::string> Decoded(
      const std::vector<uint16_t>& tokens, int32_t eot,
      const std::function<std::string(const std::vector<int32_t>&)>& decode) {
    std::vector<std::vector<int32_t>> parts;
    for (uint16_t id : tokens) {
      if (id == eot) {
        parts.emplace_back();
      } else {
        EXPECT_FALSE(parts.empty());
        if (!parts.empty()) parts.back().push_back(id);
      }
    }
    std::vector<std::string> out;
    for (const auto& p : parts) out.push_back(decode(p));
    return out;
  }

  // Prepare(f) is refused as bad input with a message holding each of
  // `what`, and changes nothing in folder `out`.
  void ExpectRefused(
      const PrepareFlags& f, const std::string& out,
      const std::vector<std::string>& what,
      absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    const bool existed = fs::exists(dir_ / out);
    const auto before =
        existed ? Tree(dir_ / out) : std::map<std::string, std::string>();
    auto r = Prepare(f);
    EXPECT_EQ(r.status().code(), code) << r.status();
    for (const std::string& w : what) {
      EXPECT_NE(r.status().message().find(w), std::string::npos)
          << "wanted: " << w << "\ngot: " << r.status();
    }
    EXPECT_EQ(fs::exists(dir_ / out), existed);
    if (existed) {
      EXPECT_TRUE(Tree(dir_ / out) == before);
    }
  }

  fs::path dir_;
  std::vector<std::string> texts_;
};

// Without validation the stream is each document whole, its ids those of
// the whole file although it is cut into chunks.
TEST_F(PrepareTest, ShardsHoldEachDocumentAsTheWholeFileEncodes) {
  PrepareFlags f = Flags("out");
  f.val_fraction = 0;
  ::testing::internal::CaptureStderr();
  auto r = Prepare(f);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(r.ok()) << r.status();
  int val_shards = 0, train_shards = 0;
  EXPECT_TRUE(Tokens("out", "val", 50257, &val_shards).empty());
  const std::vector<uint16_t> all =
      Tokens("out", "train", 50257, &train_shards);
  std::vector<uint16_t> want;
  for (const std::string& text : texts_) {
    if (text.empty()) continue;
    want.push_back(kEot);
    for (int32_t id : Gpt2().Encode(text)) want.push_back(id);
  }
  EXPECT_EQ(all, want);
  EXPECT_EQ(r->tokens, static_cast<int64_t>(want.size()));
  EXPECT_EQ(r->val_shards, 0);
  EXPECT_EQ(r->train_shards, train_shards);
  EXPECT_GE(train_shards, 10);
  // Each file's bytes say once that they are not UTF-8, at the first.
  EXPECT_NE(err.find("d.txt: not UTF-8 at byte 3; encoded as bytes\n"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("not UTF-8", err.find("not UTF-8") + 1), std::string::npos)
      << err;
}

// With validation: the plan's chunks tile every document; the validation
// shards hold its validation chunks, then the train shards its train
// chunks, each in stream order, end of text before each document and
// before text that follows the other split's.
TEST_F(PrepareTest, ShardsHoldTheValidationChunksThenTheTrainChunks) {
  ::testing::internal::CaptureStderr();
  auto r = Prepare(Flags("out"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(r.ok()) << r.status();
  const prepare_internal::Plan plan = Planned(Flags("out"));
  std::vector<prepare_internal::Chunk> order = plan.chunks;
  std::stable_sort(
      order.begin(), order.end(), [](const auto& a, const auto& b) {
        return a.file != b.file ? a.file < b.file : a.begin < b.begin;
      });
  int64_t val_bytes = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& c = order[k];
    const bool starts = k == 0 || order[k - 1].file != c.file;
    EXPECT_EQ(c.begin, starts ? 0 : order[k - 1].end) << "chunk " << k;
    EXPECT_LT(c.begin, c.end);
    EXPECT_EQ(c.first, starts || order[k - 1].val != c.val) << "chunk " << k;
    if (k + 1 == order.size() || order[k + 1].file != c.file) {
      EXPECT_EQ(c.end, static_cast<int64_t>(texts_[c.file].size()));
    }
    if (c.val) val_bytes += c.end - c.begin;
  }
  for (int64_t k = 0; k < static_cast<int64_t>(plan.chunks.size()); ++k) {
    EXPECT_EQ(plan.chunks[k].val, k < plan.val_chunks);
  }
  EXPECT_EQ(Manifest("out")["val_input_bytes"], val_bytes);
  int val_shards = 0, train_shards = 0;
  for (const bool val : {true, false}) {
    std::vector<uint16_t> want;
    for (const auto& c : plan.chunks) {
      if (c.val != val) continue;
      if (c.first) want.push_back(kEot);
      for (int32_t id : Gpt2().Encode(std::string(Text(c)))) want.push_back(id);
    }
    EXPECT_EQ(Tokens("out", val ? "val" : "train", 50257,
                     val ? &val_shards : &train_shards),
              want);
  }
  EXPECT_EQ(r->val_shards, val_shards);
  EXPECT_EQ(r->train_shards, train_shards);
  EXPECT_GE(val_shards, 1);
  EXPECT_GE(train_shards, 10);
  // Still one warning for d.txt.
  EXPECT_NE(err.find("d.txt: not UTF-8 at byte "), std::string::npos) << err;
  EXPECT_EQ(err.find("not UTF-8", err.find("not UTF-8") + 1), std::string::npos)
      << err;
}

// The validation split samples every input file, the one that sorts first
// no more than the others: names, then Shakespeare, then lines of
// numbers; each validation piece is text of one of them, every one has
// some, Shakespeare in both halves, and the split holds about
// --val-fraction of the bytes.
TEST_F(PrepareTest, ValidationSamplesEveryInputFile) {
  std::string names, numbers;
  for (int i = 0; names.size() < 20000; ++i) {
    names += "name" + std::string(1, static_cast<char>('a' + i % 26)) +
             std::string(1, static_cast<char>('a' + i / 26 % 26)) + "\n";
  }
  for (int i = 0; numbers.size() < 15000; ++i) {
    numbers += "number " + std::to_string(i * 7919) + " is odd\n";
  }
  Corpus({names, Shakespeare(80000), numbers});
  PrepareFlags f = Flags("out");
  ASSERT_TRUE(Prepare(f).ok());
  const std::vector<std::string> pieces = Decoded(
      Tokens("out", "val"), kEot,
      [](const std::vector<int32_t>& ids) { return Gpt2().Decode(ids); });
  ASSERT_FALSE(pieces.empty());
  std::set<std::pair<size_t, bool>> seen;  // (file, in its second half)
  int64_t bytes = 0;
  for (const std::string& piece : pieces) {
    int found = 0;
    for (size_t k = 0; k < texts_.size(); ++k) {
      const size_t at = texts_[k].find(piece);
      if (at == std::string::npos) continue;
      ++found;
      seen.insert({k, at >= texts_[k].size() / 2});
    }
    EXPECT_EQ(found, 1) << piece;
    bytes += static_cast<int64_t>(piece.size());
  }
  EXPECT_TRUE(seen.count({0, false}) + seen.count({0, true}) > 0) << "names";
  EXPECT_TRUE(seen.count({1, false}) > 0 && seen.count({1, true}) > 0)
      << "Shakespeare, both halves";
  EXPECT_TRUE(seen.count({2, false}) + seen.count({2, true}) > 0) << "numbers";
  const double total =
      static_cast<double>(names.size() + 80000 + numbers.size());
  EXPECT_EQ(Manifest("out")["val_input_bytes"], bytes);
  EXPECT_NEAR(static_cast<double>(bytes) / total, 0.1, 0.02);
}

// Files too small to hold out a share of their own are held out together:
// fifty of 200 bytes give about a tenth of their bytes, not a line each
// (a line is more than a tenth of a file).
TEST_F(PrepareTest, SmallFilesGiveAboutTheirShareTogether) {
  fs::remove_all(dir_ / "corpus");
  fs::create_directories(dir_ / "corpus");
  const std::string text = Shakespeare(60000);
  for (int i = 0; i < 50; ++i) {
    WriteAll(dir_ / "corpus" / ("s" + std::to_string(10 + i) + ".txt"),
             text.substr(static_cast<size_t>(i) * 997, 200));
  }
  ASSERT_TRUE(Prepare(Flags("out")).ok());
  const int64_t bytes = Manifest("out")["val_input_bytes"].get<int64_t>();
  EXPECT_NEAR(static_cast<double>(bytes) / (50 * 200), 0.1, 0.03) << bytes;
  EXPECT_FALSE(Tokens("out", "val").empty());
}

TEST_F(PrepareTest, NoValidationShardAtFractionZero) {
  PrepareFlags f = Flags("out");
  f.val_fraction = 0;
  auto r = Prepare(f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->val_shards, 0);
  EXPECT_TRUE(Tokens("out", "val").empty());
  EXPECT_EQ(Manifest("out")["val_input_bytes"], 0);
}

TEST_F(PrepareTest, TheThreadCountDoesNotChangeOneByte) {
  std::map<std::string, std::string> first;
  for (int threads : {1, 2, 3}) {
    // The same name in other folders.
    PrepareFlags f = Flags("out");
    f.out = (dir_ / "t" / std::to_string(threads) / "out").string();
    f.threads = threads;
    fs::create_directories(dir_ / "t" / std::to_string(threads));
    auto r = Prepare(f);
    ASSERT_TRUE(r.ok()) << r.status();
    const auto tree = Tree(f.out);
    if (threads == 1) {
      first = tree;
      EXPECT_GT(first.size(), 10u);
    } else {
      EXPECT_TRUE(tree == first) << threads << " threads";
    }
  }
}

// Both ways of writing a shard: an unnamed file linked in, and NAME.tmp
// renamed (where O_TMPFILE does not work).
class PrepareResumeTest : public PrepareTest,
                          public ::testing::WithParamInterface<bool> {};

TEST_P(PrepareResumeTest, StoppedRunsContinueToTheSameBytes) {
  ASSERT_TRUE(Prepare(Flags("ref")).ok());
  PrepareFlags f = Flags("out");
  f.named_temporaries = GetParam();
  f.out = (dir_ / "again" / "ref").string();  // the same name, "ref"
  fs::create_directories(dir_ / "again");
  // Stopped as a crash would stop it, twice, then finished on another
  // thread count; shards end inside chunks (1024 tokens, ~600 a chunk).
  f.stop_after_shards = 3;
  auto r = Prepare(f);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  const nlohmann::json stopped =
      nlohmann::json::parse(ReadAll(fs::path(f.out) / "ref_prepare.json"));
  EXPECT_FALSE(stopped["complete"]);
  EXPECT_EQ(stopped["shards"].size(), 3u);
  EXPECT_GT(stopped["next"]["token"], 0) << stopped["next"];
  ASSERT_EQ(Prepare(f).status().code(), absl::StatusCode::kAborted);
  // What a kill leaves, and what is not prepare's.
  WriteAll(fs::path(f.out) / "ref_train_000009.bin.tmp", "half");
  WriteAll(fs::path(f.out) / "ref_tokenizer.bin.12345.tmp", "half");
  WriteAll(fs::path(f.out) / "ref_prepare.json.777.tmp", "half");
  WriteAll(fs::path(f.out) / "ref_prepare.json.x.tmp", "mine too");
  WriteAll(fs::path(f.out) / "notes.txt", "mine");
  f.stop_after_shards = 0;
  f.threads = 3;
  auto done = Prepare(f);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(done->already_complete);
  auto tree = Tree(f.out);
  EXPECT_EQ(tree["notes.txt"], "mine");
  EXPECT_EQ(tree["ref_prepare.json.x.tmp"], "mine too");
  tree.erase("notes.txt");
  tree.erase("ref_prepare.json.x.tmp");
  EXPECT_TRUE(tree == Tree(dir_ / "ref"));
}

INSTANTIATE_TEST_SUITE_P(TemporaryFiles, PrepareResumeTest,
                         ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Named" : "Unnamed";
                         });

TEST_F(PrepareTest, ACompleteRerunWritesNothing) {
  auto r = Prepare(Flags("out"));
  ASSERT_TRUE(r.ok());
  std::map<std::string, fs::file_time_type> times;
  for (const auto& e : fs::directory_iterator(dir_ / "out")) {
    times[e.path().filename().string()] = e.last_write_time();
  }
  const auto tree = Tree(dir_ / "out");
  auto again = Prepare(Flags("out"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->already_complete);
  EXPECT_EQ(again->tokens, r->tokens);
  EXPECT_EQ(again->train_shards, r->train_shards);
  EXPECT_TRUE(Tree(dir_ / "out") == tree);
  for (const auto& e : fs::directory_iterator(dir_ / "out")) {
    EXPECT_EQ(e.last_write_time(), times[e.path().filename().string()]);
  }
}

TEST_F(PrepareTest, AnotherPreparationsFolderIsRefused) {
  ASSERT_TRUE(Prepare(Flags("out")).ok());
  const auto tree = Tree(dir_ / "out");
  const auto refused = [&](const PrepareFlags& f, const std::string& what) {
    auto r = Prepare(f);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << r.status();
    const std::string msg(r.status().message());
    EXPECT_NE(msg.find("--out " + f.out), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find("choose another --out"), std::string::npos) << msg;
    EXPECT_TRUE(Tree(dir_ / "out") == tree);
  };
  PrepareFlags f = Flags("out");
  f.shard_tokens = 2048;
  refused(f, "--shard-tokens was 1024, now 2048");
  f = Flags("out");
  f.val_fraction = 0.2;
  refused(f, "--val-fraction");
  f = Flags("out");
  f.tokenizer = "spm-train:300";
  refused(f, "tokenizer gpt2, not spm-train:300");
  f = Flags("out");
  f.inputs = {Doc(0).string()};
  refused(f, "4 input files, --input names 1");
  // An input edited since.
  WriteAll(Doc(1), texts_[1] + "more\n");
  refused(Flags("out"), "b.txt changed since");
}

TEST_F(PrepareTest, ShardsWithoutAManifestAreNotContinued) {
  fs::create_directories(dir_ / "out");
  WriteAll(dir_ / "out" / "out_train_000000.bin", "old");
  auto r = Prepare(Flags("out"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("out_train_000000.bin"),
            std::string::npos)
      << r.status();
  EXPECT_EQ(Tree(dir_ / "out").size(), 1u);
}

// One line of 120 kB: its chunks stay within twice the chunk size (cut at
// spaces, so the ids of a run of them are those of the whole run), the
// validation pieces too, which hold about a tenth of it.
TEST_F(PrepareTest, ALongLineIsCutIntoBoundedChunks) {
  std::string line = Shakespeare(120000);
  std::replace(line.begin(), line.end(), '\n', ' ');
  Corpus({line});
  PrepareFlags f = Flags("out");
  auto r = Prepare(f);
  ASSERT_TRUE(r.ok()) << r.status();
  const nlohmann::json m = Manifest("out");
  const prepare_internal::Plan plan = Planned(f);
  EXPECT_EQ(m["chunks"], plan.chunks.size());
  EXPECT_GE(m["chunks"].get<int64_t>(),
            static_cast<int64_t>(line.size()) / (2 * f.chunk_bytes));
  for (const auto& c : plan.chunks) {
    EXPECT_LE(c.end - c.begin, 2 * f.chunk_bytes);
  }
  // Three pieces of 4000 bytes, each end moved to the next space.
  const auto target = static_cast<int64_t>(std::ceil(0.1 * line.size()));
  EXPECT_NEAR(m["val_input_bytes"].get<int64_t>(), target, 3 * 2 * 20);
  for (const bool val : {true, false}) {
    std::vector<uint16_t> want;
    for (const std::string& piece : Pieces(plan, val)) {
      want.push_back(kEot);
      for (int32_t id : Gpt2().Encode(piece)) want.push_back(id);
    }
    EXPECT_EQ(Tokens("out", val ? "val" : "train"), want);
  }
}

// SentencePiece skips sentences longer than it takes: a corpus whose only
// line is over 1 MiB is given to it in pieces, and the model trains.
TEST_F(PrepareTest, SentencePieceTrainsOnALineOverOneMebibyte) {
  std::string line = ReadAll("data/tinyshakespeare.txt");
  std::replace(line.begin(), line.end(), '\n', ' ');
  ASSERT_GT(line.size(), size_t{1} << 20);
  Corpus({line});
  PrepareFlags f = Flags("spm");
  f.tokenizer = "spm-train:400";
  f.chunk_bytes = 0;  // SentencePiece's
  f.shard_tokens = 1 << 20;
  auto r = Prepare(f);
  ASSERT_TRUE(r.ok()) << r.status();
  auto t =
      OpenTokenizer("spm:" + (dir_ / "spm" / "spm_spm.model").string(), "test");
  ASSERT_TRUE(t.ok()) << t.status();
  const prepare_internal::Plan plan = Planned(f);
  for (const bool val : {true, false}) {
    EXPECT_EQ(
        Decoded(
            Tokens("spm", val ? "val" : "train", 400), (*t)->end_of_text(),
            [&](const std::vector<int32_t>& ids) { return (*t)->Decode(ids); }),
        Pieces(plan, val));
  }
}

TEST_F(PrepareTest, AManifestOfAnotherShapeIsRefusedNamingTheField) {
  ASSERT_TRUE(Prepare(Flags("out")).ok());
  const nlohmann::json good = Manifest("out");
  const std::string lead =
      "out_prepare.json is not a manifest of this version of ptworker "
      "prepare: ";
  const auto refused = [&](const std::string& pointer,
                           const nlohmann::json& value,
                           const std::string& rule) {
    nlohmann::json m = good;
    m[nlohmann::json::json_pointer(pointer)] = value;
    SaveManifest("out", m);
    ExpectRefused(Flags("out"), "out", {lead + rule, "choose another --out"});
  };
  refused("/tokens", "many", "tokens must be an integer >= 0");
  refused("/shards/0/tokens", -5, "shards[0].tokens must be an integer >= 1");
  refused("/shards/1/end/token", 1.5,
          "shards[1].end.token must be an integer >= 0");
  refused("/next", nlohmann::json::array(), "next must be an object");
  refused("/settings/inputs/1/size", "big",
          "settings.inputs[1].size must be an integer >= 0");
  refused("/settings/tokenizer/kind", 3,
          "settings.tokenizer.kind must be one of \"gpt2\", \"spm\", "
          "\"spm-train\"");
  refused("/settings/val_fraction", "0.1",
          "settings.val_fraction must be a number");
  refused("/complete", "yes", "complete must be true or false");
  refused("/format", "ptrain-prepare-2", "format must be \"ptrain-prepare-3\"");
  refused("/shards", nlohmann::json::object(), "shards must be an array");
  refused("/vocab_size", 18446744073709551615ull,
          "vocab_size must be an integer >= 1");
  nlohmann::json no_end = good;
  no_end["shards"][0].erase("end");
  SaveManifest("out", no_end);
  ExpectRefused(Flags("out"), "out", {lead + "shards[0].end must be there"});
  SaveManifest("out", nlohmann::json::array());
  ExpectRefused(Flags("out"), "out",
                {lead + "the file must hold a JSON object"});
  WriteAll(dir_ / "out" / "out_prepare.json", "{\"format\":");
  ExpectRefused(Flags("out"), "out", {"out_prepare.json is not JSON"});
}

// A manifest must say what the folder holds: continuing from a `next`
// that is not where its shards end would write the same data again.
TEST_F(PrepareTest, AManifestThatDisagreesWithItsShardsIsRefused) {
  PrepareFlags f = Flags("out");
  f.stop_after_shards = 3;
  ASSERT_EQ(Prepare(f).status().code(), absl::StatusCode::kAborted);
  f.stop_after_shards = 0;
  const nlohmann::json good = Manifest("out");
  ASSERT_EQ(good["shards"].size(), 3u);
  const std::string last = good["shards"][2]["file"];
  const auto refused = [&](const nlohmann::json& m,
                           const std::vector<std::string>& what) {
    SaveManifest("out", m);
    ExpectRefused(f, "out", what);
  };
  nlohmann::json m = good;
  m["next"] = {{"chunk", 0}, {"token", 0}};
  refused(m, {"out_prepare.json goes on at chunk 0, token 0 (next), but its "
              "last shard " +
                  last + " ends at chunk " + good["next"]["chunk"].dump() +
                  ", token " + good["next"]["token"].dump(),
              "choose another --out"});
  m = good;
  m["shards"] = nlohmann::json::array();
  m["tokens"] = 0;
  m["next"] = {{"chunk", 0}, {"token", 0}};
  refused(m, {"out_prepare.json does not list out_train_000000.bin and 2 "
              "more shards that the folder holds"});
  m = good;
  m["tokens"] = good["tokens"].get<int64_t>() + 1;
  refused(m, {"counts " + std::to_string(good["tokens"].get<int64_t>() + 1) +
              " tokens (tokens), its shards hold " + good["tokens"].dump()});
  m = good;
  m["shards"][2]["file"] = "out_train_000007.bin";
  refused(m, {"lists out_train_000007.bin as shard 3 (shards[2])",
              "it must be " + last});
  m = good;
  m["complete"] = true;
  refused(m, {"is complete, but its shards end at chunk"});
  // As it was: it goes on to the bytes of a run never stopped.
  SaveManifest("out", good);
  ASSERT_TRUE(Prepare(f).ok());
  PrepareFlags g = Flags("ref");
  g.out = (dir_ / "again" / "out").string();
  fs::create_directories(dir_ / "again");
  ASSERT_TRUE(Prepare(g).ok());
  EXPECT_TRUE(Tree(dir_ / "out") == Tree(dir_ / "again" / "out"));
}

// Two runs start on a new --out at once: the one that creates it second
// is refused as bad input (exit 2), as when the folder already was the
// other's, and leaves the other's work as it is.
TEST_F(PrepareTest, OfTwoRunsOnANewFolderTheSecondIsRefused) {
  PrepareFlags f = Flags("out");
  std::map<std::string, std::string> other;
  f.before_create = [&] {
    auto r = Prepare(Flags("out"));
    ASSERT_TRUE(r.ok()) << r.status();
    other = Tree(dir_ / "out");
  };
  auto r = Prepare(f);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
      << r.status();
  EXPECT_NE(
      r.status().message().find(
          "--out " + f.out + ": another ptworker prepare created it meanwhile"),
      std::string::npos)
      << r.status();
  EXPECT_FALSE(other.empty());
  EXPECT_TRUE(Tree(dir_ / "out") == other);
  // A folder another run holds (its lock) is refused the same way.
  fs::create_directories(dir_ / "held");
  const int fd = ::open((dir_ / "held").c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  ExpectRefused(Flags("held"), "held",
                {"another ptworker prepare is writing there"},
                absl::StatusCode::kFailedPrecondition);
  ::close(fd);
  EXPECT_TRUE(Prepare(Flags("held")).ok());
}

// A tokenizer file or SentencePiece model in --out is written over only
// when it holds the bytes this preparation writes (a run killed before
// its manifest left it, say); another is refused, nothing written.
TEST_F(PrepareTest, TokenizerFilesThatAreNotThisPreparationsAreKept) {
  ASSERT_TRUE(Prepare(Flags("ref")).ok());
  fs::create_directories(dir_ / "out");
  WriteAll(dir_ / "out" / "out_tokenizer.bin", "someone else's");
  ExpectRefused(Flags("out"), "out",
                {"--out " + (dir_ / "out").string() +
                     ": holds out_tokenizer.bin, which is not the llm.c "
                     "tokenizer file of --tokenizer gpt2 (its bytes differ)",
                 "choose another --out"});
  // The file this preparation writes: kept, the run goes on.
  fs::copy_file(dir_ / "ref" / "ref_tokenizer.bin",
                dir_ / "out" / "out_tokenizer.bin",
                fs::copy_options::overwrite_existing);
  ASSERT_TRUE(Prepare(Flags("out")).ok());
  EXPECT_EQ(ReadAll(dir_ / "out" / "out_tokenizer.bin"),
            ReadAll(dir_ / "ref" / "ref_tokenizer.bin"));
  // Not files: a folder, a link.
  fs::create_directories(dir_ / "dir" / "dir_tokenizer.bin");
  ExpectRefused(Flags("dir"), "dir",
                {": holds dir_tokenizer.bin, which is not a plain file"});
  fs::create_directories(dir_ / "link");
  fs::create_symlink(dir_ / "ref" / "ref_tokenizer.bin",
                     dir_ / "link" / "link_tokenizer.bin");
  ExpectRefused(Flags("link"), "link",
                {": holds link_tokenizer.bin, which is not a plain file"});
  fs::create_directories(dir_ / "json" / "json_prepare.json");
  ExpectRefused(Flags("json"), "json",
                {": json_prepare.json is a folder, not a manifest"});
  // spm-train's model.
  Corpus({Shakespeare(40000)});
  PrepareFlags f = Flags("spm");
  f.tokenizer = "spm-train:400";
  fs::create_directories(dir_ / "spm");
  WriteAll(dir_ / "spm" / "spm_spm.model", "another model");
  ExpectRefused(f, "spm",
                {": holds spm_spm.model, which is not the model spm-train:400 "
                 "trains on --input (its bytes differ)"});
}

TEST_F(PrepareTest, TheLlmcTokenizerFileSpellsTheShards) {
  ASSERT_TRUE(Prepare(Flags("out")).ok());
  auto t =
      ReadLlmcTokenizer((dir_ / "out" / "out_tokenizer.bin").string(), "test");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->size(), 50257);
  EXPECT_EQ((*t)->end_of_text(), kEot);
  const prepare_internal::Plan plan = Planned(Flags("out"));
  for (const bool val : {true, false}) {
    EXPECT_EQ(Decoded(Tokens("out", val ? "val" : "train"), kEot,
                      [&](const std::vector<int32_t>& ids) {
                        std::string text;
                        for (int32_t id : ids) text += (*t)->Piece(id);
                        return text;
                      }),
              Pieces(plan, val));
  }
}

TEST_F(PrepareTest, TrainedSentencePieceShardsDecodeToTheInputs) {
  texts_ = {Shakespeare(40000), Shakespeare(60000).substr(40000)};
  fs::remove_all(dir_ / "corpus");
  fs::create_directories(dir_ / "corpus");
  for (size_t i = 0; i < texts_.size(); ++i) WriteAll(Doc(i), texts_[i]);
  PrepareFlags f = Flags("spm");
  f.tokenizer = "spm-train:512";
  f.chunk_bytes = 4096;
  auto r = Prepare(f);
  ASSERT_TRUE(r.ok()) << r.status();
  const fs::path model = dir_ / "spm" / "spm_spm.model";
  ASSERT_TRUE(fs::exists(model));
  auto t = OpenTokenizer("spm:" + model.string(), "test");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->size(), 512);
  const prepare_internal::Plan plan = Planned(f);
  for (const bool val : {true, false}) {
    EXPECT_EQ(
        Decoded(
            Tokens("spm", val ? "val" : "train", 512), (*t)->end_of_text(),
            [&](const std::vector<int32_t>& ids) { return (*t)->Decode(ids); }),
        Pieces(plan, val));
  }
  std::vector<uint16_t> all = Tokens("spm", "val", 512);
  const std::vector<uint16_t> train = Tokens("spm", "train", 512);
  all.insert(all.end(), train.begin(), train.end());
  // The same model given as spm:MODEL gives the same tokens; the manifest
  // records its digest.
  PrepareFlags g = Flags("given");
  g.tokenizer = "spm:" + model.string();
  g.chunk_bytes = 4096;
  ASSERT_TRUE(Prepare(g).ok());
  std::vector<uint16_t> given = Tokens("given", "val", 512);
  const std::vector<uint16_t> given_train = Tokens("given", "train", 512);
  given.insert(given.end(), given_train.begin(), given_train.end());
  EXPECT_EQ(given, all);
  EXPECT_EQ(Manifest("given")["settings"]["tokenizer"]["model_sha256"]
                .get<std::string>()
                .size(),
            64u);
  EXPECT_FALSE(fs::exists(dir_ / "given" / "given_spm.model"));
}

// A tokenizer of more than 65536 ids (a tokenizer.json: every byte, then
// 35000 words of four letters, alone and after a space, taken whole by
// ignore_merges): shards of version 2, uint32 tokens, which the data loader
// maps back to the same ids.
TEST_F(PrepareTest, AVocabularyPastUint16WritesVersion2ShardsTheLoaderReads) {
  constexpr int kWords = 35000;
  const auto word = [](int k) {
    std::string w(4, 'a');
    for (char& c : w) {
      c = static_cast<char>('a' + k % 26);
      k /= 26;
    }
    return w;
  };
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[ByteLevelChar(static_cast<unsigned char>(b))] = b;
  }
  for (int k = 0; k < kWords; ++k) {
    vocab[word(k)] = 256 + 2 * k;
    vocab["\xC4\xA0" + word(k)] = 257 + 2 * k;  // "Ġ": a space before
  }
  const nlohmann::json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const nlohmann::json file = {{"added_tokens",
                                {{{"id", 256 + 2 * kWords},
                                  {"content", "<|endoftext|>"},
                                  {"special", true}}}},
                               {"normalizer", nullptr},
                               {"pre_tokenizer", byte_level},
                               {"decoder", byte_level},
                               {"model",
                                {{"type", "BPE"},
                                 {"ignore_merges", true},
                                 {"vocab", vocab},
                                 {"merges", nlohmann::json::array()}}}};
  fs::create_directories(dir_ / "big");
  WriteAll(dir_ / "big" / "tokenizer.json", file.dump());
  const std::string name = "hf:" + (dir_ / "big").string();
  auto tokenizer = OpenTokenizer(name, "test");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const int vocab_size = (*tokenizer)->size();
  ASSERT_EQ(vocab_size, 257 + 2 * kWords);

  std::vector<std::string> texts(2);
  for (int i = 0; i < 3000; ++i) {
    texts[i % 2] += word((i * 7919) % kWords) + (i % 10 == 9 ? "\n" : " ");
  }
  Corpus(texts);
  PrepareFlags f = Flags("wide");
  f.tokenizer = name;
  f.val_fraction = 0;
  auto r = Prepare(f);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> want;
  for (const std::string& text : texts) {
    want.push_back((*tokenizer)->end_of_text());
    for (int32_t id : (*tokenizer)->Encode(text)) want.push_back(id);
  }
  ASSERT_GT(*std::max_element(want.begin(), want.end()), 65535);

  std::vector<int32_t> all;
  int shards = 0;
  for (const auto& [file_name, bytes] : Tree(dir_ / "wide")) {
    if (file_name.find("_train_") == std::string::npos) continue;
    ++shards;
    int32_t header[3];
    ASSERT_GE(bytes.size(), sizeof(header));
    std::memcpy(header, bytes.data(), sizeof(header));
    EXPECT_EQ(header[0], 20240520);
    EXPECT_EQ(header[1], 2) << file_name;
    EXPECT_EQ(bytes.size(), 1024 + 4 * static_cast<size_t>(header[2]));
    auto t = ParseTokenFile(bytes, "test", file_name, vocab_size);
    ASSERT_TRUE(t.ok()) << t.status();
    all.insert(all.end(), t->begin(), t->end());
  }
  EXPECT_GT(shards, 1);
  EXPECT_EQ(all, want);

  // The loader maps the same shards, wide.
  v1::DataSpec spec;
  spec.set_train_bin((dir_ / "wide" / "wide_train_*.bin").string());
  spec.set_val_bin((dir_ / "wide" / "wide_train_*.bin").string());
  spec.set_tokenizer(name);
  auto data = LoadTokenData(spec, 0, 8);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->vocab_size, vocab_size);
  std::vector<int32_t> loaded;
  for (const TokenStream& s : data->train) {
    EXPECT_TRUE(s.wide());
    for (size_t i = 0; i < s.size(); ++i) loaded.push_back(s[i]);
  }
  EXPECT_EQ(loaded, want);
  // A batch holds the wide ids as they are.
  BatchSampler sampler(&data->train, 8, 4, 1, "train");
  std::vector<int32_t> in(32), tg(32);
  sampler.Fill(0, 0, 4, in.data(), tg.data());
  EXPECT_GT(*std::max_element(in.begin(), in.end()), 0);
  for (int i = 0; i < 32; ++i) {
    if (i % 8 < 7) {
      EXPECT_EQ(in[i + 1], tg[i]);
    }
  }
  bool high = false;
  for (int b = 0; b < 20 && !high; ++b) {
    sampler.Fill(b, 0, 4, in.data(), tg.data());
    high = *std::max_element(in.begin(), in.end()) > 65535;
  }
  EXPECT_TRUE(high);
}

// ---------------------------------------------------------------- corpora

// JSON lines of `docs` in field "text", other fields beside it.
std::string JsonLines(const std::vector<std::string>& docs) {
  std::string out;
  for (size_t i = 0; i < docs.size(); ++i) {
    out +=
        nlohmann::json({{"id", i}, {"text", docs[i]}, {"lang", "en"}}).dump() +
        "\n";
  }
  return out;
}

void WriteGzip(const fs::path& path, const std::string& bytes) {
  gzFile g = ::gzopen(path.c_str(), "wb");
  ASSERT_NE(g, nullptr);
  // Two members: gzip -d reads them as one stream, and so must prepare.
  const size_t half = bytes.size() / 2;
  ASSERT_EQ(::gzwrite(g, bytes.data(), static_cast<unsigned>(half)),
            static_cast<int>(half));
  ASSERT_EQ(::gzclose(g), Z_OK);
  g = ::gzopen(path.c_str(), "ab");
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(::gzwrite(g, bytes.data() + half,
                      static_cast<unsigned>(bytes.size() - half)),
            static_cast<int>(bytes.size() - half));
  ASSERT_EQ(::gzclose(g), Z_OK);
}

void WriteZstd(const fs::path& path, const std::string& bytes) {
  std::string out(ZSTD_compressBound(bytes.size()), '\0');
  const size_t n =
      ZSTD_compress(out.data(), out.size(), bytes.data(), bytes.size(), 3);
  ASSERT_FALSE(ZSTD_isError(n));
  out.resize(n);
  WriteAll(path, out);
}

// The documents the corpus tests share: long ones (cut into many chunks,
// a chunk holding the end of one and the start of the next) and short.
std::vector<std::string> Documents() {
  const std::string s = Shakespeare(40000);
  return {s.substr(0, 9000),  "A short one.", Tricky(),
          s.substr(9000, 50), s.substr(9050), "caf\xC3\xA9 \xE6\x97\xA5"};
}

// The stream of documents as prepare writes them: end of text, then
// each one's ids.
std::vector<uint16_t> Stream(const std::vector<std::string>& docs) {
  std::vector<uint16_t> want;
  for (const std::string& d : docs) {
    want.push_back(kEot);
    for (int32_t id : Gpt2().Encode(d)) want.push_back(id);
  }
  return want;
}

// Each line of a JSON lines file is a document: end of text before each,
// each encoded whole although chunks cut across them.
TEST_F(PrepareTest, EachJsonLineIsADocumentEncodedWhole) {
  Corpus({});
  const std::vector<std::string> docs = Documents();
  WriteAll(dir_ / "corpus" / "a.jsonl", JsonLines(docs));
  WriteAll(dir_ / "corpus" / "b.txt", "a text file after it\n");
  PrepareFlags f = Flags("out");
  f.inputs = {(dir_ / "corpus" / "a.jsonl").string(),
              (dir_ / "corpus" / "b.txt").string()};
  f.val_fraction = 0;
  auto r = Prepare(f);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> all = docs;
  all.push_back("a text file after it\n");
  EXPECT_EQ(Tokens("out", "train"), Stream(all));
  // The decoded text is gone once the shards are whole.
  EXPECT_FALSE(fs::exists(dir_ / "out" / "out_decoded"));
}

// The same text compressed gives the same shards, byte for byte, with a
// validation split: gzip (two members), zstd, JSON lines and text.
TEST_F(PrepareTest, CompressedInputsGiveTheShardsOfTheirText) {
  Corpus({});
  const std::string lines = JsonLines(Documents());
  const std::string text = Shakespeare(20000);
  fs::create_directories(dir_ / "plain");
  fs::create_directories(dir_ / "packed");
  WriteAll(dir_ / "plain" / "a.jsonl", lines);
  WriteAll(dir_ / "plain" / "b.txt", text);
  WriteAll(dir_ / "plain" / "c.jsonl", lines);
  WriteGzip(dir_ / "packed" / "a.jsonl.gz", lines);
  WriteZstd(dir_ / "packed" / "b.txt.zst", text);
  WriteZstd(dir_ / "packed" / "c.jsonl.zst", lines);
  std::map<std::string, std::string> trees[2];
  int k = 0;
  for (const char* corpus : {"plain", "packed"}) {
    PrepareFlags f = Flags(corpus);
    f.out = (dir_ / "o" / corpus / "out").string();
    fs::create_directories(dir_ / "o" / corpus);
    f.inputs = {(dir_ / corpus).string()};  // a folder
    auto r = Prepare(f);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->val_shards, 0);
    trees[k] = Tree(f.out);
    trees[k].erase("out_prepare.json");  // names its inputs
    ++k;
  }
  EXPECT_GT(trees[0].size(), 5u);
  EXPECT_TRUE(trees[0] == trees[1]);
  for (const auto& [k, v] : trees[0]) {
    EXPECT_EQ(v.size(), trees[1][k].size()) << k;
  }
}

// A chunk that starts right after a separator (a document without a
// line or space to cut at, one byte shorter than the chunk) starts with
// end of text.
TEST_F(PrepareTest, ADocumentThatStartsAChunkHasItsEndOfText) {
  Corpus({});
  const std::vector<std::string> docs = {std::string(2047, 'a'),
                                         std::string(3000, 'b'), "c"};
  WriteAll(dir_ / "corpus" / "a.jsonl", JsonLines(docs));
  PrepareFlags f = Flags("out");
  f.inputs = {(dir_ / "corpus" / "a.jsonl").string()};
  f.val_fraction = 0;
  auto r = Prepare(f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Tokens("out", "train"), Stream(docs));
}

TEST_F(PrepareTest, TheFieldMayBeANestedOne) {
  Corpus({});
  WriteAll(dir_ / "corpus" / "a.jsonl",
           "{\"meta\": {\"body\": \"first\"}, \"text\": \"not this\"}\n"
           "\n"
           "{\"meta\": {\"body\": \"second\\nline\"}}\r\n");
  PrepareFlags f = Flags("out");
  f.inputs = {(dir_ / "corpus" / "a.jsonl").string()};
  f.val_fraction = 0;
  f.field = "meta.body";
  auto r = Prepare(f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Tokens("out", "train"), Stream({"first", "second\nline"}));
}

// A bad line is refused naming the file and line, and leaves nothing;
// with --skip-bad-lines it is left out and counted.
TEST_F(PrepareTest, ABadJsonLineIsRefusedOrSkippedAndCounted) {
  Corpus({});
  const fs::path a = dir_ / "corpus" / "a.jsonl";
  struct Case {
    std::string line, says;
  };
  for (const Case& c : std::vector<Case>{
           {"{\"text\": \"cut", "a.jsonl:2: not JSON"},
           {"{\"body\": \"x\"}", "a.jsonl:2: no field text"},
           {"{\"text\": 7}", "a.jsonl:2: field text is not a string"},
           {"[\"text\"]", "a.jsonl:2: no field text"}}) {
    WriteAll(a, "{\"text\": \"good\"}\n" + c.line + "\n{\"text\": \"too\"}\n");
    PrepareFlags f = Flags("out");
    f.inputs = {a.string()};
    f.val_fraction = 0;
    ExpectRefused(f, "out", {c.says, "--skip-bad-lines"});
    f.skip_bad_lines = true;
    ::testing::internal::CaptureStderr();
    auto r = Prepare(f);
    const std::string err = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(Tokens("out", "train"), Stream({"good", "too"}));
    EXPECT_NE(err.find("a.jsonl: 1 bad line left out"), std::string::npos)
        << err;
    fs::remove_all(dir_ / "out");
  }
}

TEST_F(PrepareTest, ATruncatedCompressedInputIsRefused) {
  Corpus({});
  const std::string lines = JsonLines(Documents());
  WriteGzip(dir_ / "corpus" / "a.jsonl.gz", lines);
  WriteZstd(dir_ / "corpus" / "b.jsonl.zst", lines);
  for (const char* name : {"a.jsonl.gz", "b.jsonl.zst"}) {
    const fs::path p = dir_ / "corpus" / name;
    const std::string whole = ReadAll(p);
    WriteAll(p, whole.substr(0, whole.size() - 9));
    PrepareFlags f = Flags("out");
    f.inputs = {p.string()};
    ExpectRefused(f, "out", {name, "truncated"});
    WriteAll(p, whole);
  }
  // Not compressed at all.
  WriteAll(dir_ / "corpus" / "c.jsonl.zst", lines);
  PrepareFlags f = Flags("out");
  f.inputs = {(dir_ / "corpus" / "c.jsonl.zst").string()};
  ExpectRefused(f, "out", {"c.jsonl.zst: not zstd"});
}

// A run stopped as a crash would stop it, in the middle of its shards,
// continues to the bytes of one that was not, its decoded inputs reused.
TEST_F(PrepareTest, AStoppedRunOfJsonLinesContinuesToTheSameBytes) {
  Corpus({});
  WriteZstd(dir_ / "corpus" / "a.jsonl.zst", JsonLines(Documents()));
  WriteGzip(dir_ / "corpus" / "b.jsonl.gz", JsonLines({Shakespeare(30000)}));
  PrepareFlags f = Flags("ref");
  f.inputs = {(dir_ / "corpus").string()};
  ASSERT_TRUE(Prepare(f).ok());
  fs::create_directories(dir_ / "again");
  f.out = (dir_ / "again" / "ref").string();
  f.stop_after_shards = 3;
  ASSERT_EQ(Prepare(f).status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(fs::is_directory(dir_ / "again" / "ref" / "ref_decoded"));
  WriteAll(dir_ / "again" / "ref" / "ref_decoded" / "x.txt.99.tmp", "half");
  f.stop_after_shards = 0;
  f.threads = 1;
  auto done = Prepare(f);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(done->already_complete);
  EXPECT_TRUE(Tree(f.out) == Tree(dir_ / "ref"));
  auto again = Prepare(f);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->already_complete);
  // Another field is another preparation.
  f.field = "body";
  ExpectRefused(f, "again/ref", {"--field was \"text\", now \"body\""});
}

TEST_F(PrepareTest, AFolderGivesItsCorpusFilesInOrder) {
  Corpus({});
  fs::create_directories(dir_ / "corpus" / "sub");
  fs::create_directories(dir_ / "corpus" / ".git");
  WriteAll(dir_ / "corpus" / "b.jsonl", JsonLines({"bee"}));
  WriteAll(dir_ / "corpus" / "sub" / "a.txt", "ay");
  WriteAll(dir_ / "corpus" / "README.md", "not a document");
  WriteAll(dir_ / "corpus" / ".git" / "c.txt", "hidden");
  WriteAll(dir_ / "corpus" / "c.txt", "sea");
  PrepareFlags f = Flags("out");
  f.inputs = {(dir_ / "corpus").string()};
  f.val_fraction = 0;
  auto r = Prepare(f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Tokens("out", "train"), Stream({"bee", "sea", "ay"}));
  fs::remove_all(dir_ / "corpus" / "sub");
  fs::remove(dir_ / "corpus" / "b.jsonl");
  fs::remove(dir_ / "corpus" / "c.txt");
  f.out = (dir_ / "none").string();
  ExpectRefused(f, "none", {"a folder with no .txt, .jsonl or .json file"});
}

// JSON lines decode to the same text whatever the pieces they are cut in
// and the threads that decode them: documents in order, NUL between;
// bad lines counted, and the first named by its line in the whole file.
TEST_F(PrepareTest, JsonLinesDecodeAlikeInAnyPiecesOnAnyThreads) {
  using prepare_internal::DecodeInputs;
  using prepare_internal::DecodeLimits;
  constexpr int64_t kMaxLine = 200;
  const std::string s = Shakespeare(6000);
  std::string lines;
  std::string want;  // the decoded text
  int64_t line = 0, documents = 0, first_bad = 0, bad = 0;
  const auto good = [&](const std::string& text) {
    lines += nlohmann::json({{"text", text}}).dump() + "\n";
    ++line;
    if (documents++ > 0) want.push_back('\0');
    want += text;
  };
  const auto refused = [&](const std::string& raw) {
    lines += raw + "\n";
    if (++bad == 1) first_bad = line + 1;
    ++line;
  };
  for (int i = 0; i < 40; ++i) {
    good(s.substr(i * 101 % 5000, i % 7 * 13 + 1));
    if (i == 9) refused(std::string(kMaxLine + 1, 'x'));  // too long
    if (i == 17) refused("{\"text\": \"cut");
    if (i == 23) {
      lines += "  \t\r\n";  // whitespace: no document, not bad
      ++line;
      lines += "{\"text\": \"\"}\n";  // empty: left out, counted apart
      ++line;
    }
    if (i == 31) {
      // A line too long whose bytes come in several reads and pieces.
      refused("{\"text\": \"" + std::string(3 * kMaxLine, 'y') + "\"}");
    }
  }
  good("the last line, without its end");
  lines.pop_back();
  WriteAll(dir_ / "corpus" / "a.jsonl", lines);
  WriteZstd(dir_ / "corpus" / "b.jsonl.zst", lines);
  const std::string where = absl::StrCat(":", first_bad,
                                         ": a line longer "
                                         "than ",
                                         kMaxLine, " bytes");
  for (const char* name : {"a.jsonl", "b.jsonl.zst"}) {
    auto inputs = prepare_internal::ResolveInputs(
        {(dir_ / "corpus" / name).string()}, {});
    ASSERT_TRUE(inputs.ok()) << inputs.status();
    for (int64_t piece : {1, 5, 64, 300, 4096, 1 << 20}) {
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(
            absl::StrCat(name, " piece ", piece, " threads ", threads));
        const std::string dir =
            (dir_ / absl::StrCat("d", piece, "_", threads)).string();
        PrepareFlags f = Flags("out");
        f.skip_bad_lines = true;
        std::vector<std::string> warned;
        const auto warn = [&](const std::string& w) { warned.push_back(w); };
        const DecodeLimits limits{piece, kMaxLine};
        auto got = DecodeInputs(*inputs, f, dir, threads, {}, warn, limits);
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_EQ(got->size(), 1u);
        EXPECT_TRUE((*got)[0].documents);
        EXPECT_EQ(ReadAll((*got)[0].path), want);
        const std::string& path = (*inputs)[0].path;
        EXPECT_EQ(
            warned,
            std::vector<std::string>(
                {absl::StrCat(path, ": ", bad,
                              " bad lines left out (--skip-bad-lines); "
                              "the first, line ",
                              first_bad, where.substr(where.find(':', 1)),
                              " (the most one line may hold)"),
                 absl::StrCat(path, ": 1 document with empty text left out")}));
        fs::remove_all(dir);
        // Without --skip-bad-lines, the first bad line is refused.
        f.skip_bad_lines = false;
        got = DecodeInputs(*inputs, f, dir, threads, {}, warn, limits);
        ASSERT_FALSE(got.ok());
        EXPECT_NE(got.status().message().find(std::string(name) + where),
                  std::string_view::npos)
            << got.status();
        fs::remove_all(dir);
      }
    }
  }
}

TEST_F(PrepareTest, JsonLinesWithoutTextAreRefused) {
  Corpus({});
  WriteAll(dir_ / "corpus" / "a.jsonl", "{\"text\": \"\"}\n\n");
  PrepareFlags f = Flags("out");
  f.inputs = {(dir_ / "corpus" / "a.jsonl").string()};
  ExpectRefused(f, "out", {"the inputs hold no text"});
}

}  // namespace
}  // namespace ptrain
