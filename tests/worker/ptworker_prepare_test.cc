// `ptworker prepare` as a process: bad input exits 2 with one error line
// naming the flag and leaves no file behind; a run the test hook ends as a
// crash would continues, when run again, to the bytes of one that was never
// stopped; a complete preparation run again says so and exits 0.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/testing/shell.h"

namespace {

namespace fs = std::filesystem;

using Result = ptrain::testing::ShellResult;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Names and contents of every file under `dir` ("" when there is none).
std::map<std::string, std::string> Tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    out[e.path().lexically_relative(dir).string()] =
        e.is_regular_file() ? ReadAll(e.path()) : "";
  }
  return out;
}

// Protocol buffers' wire format, for a SentencePiece model made by hand.
void Varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void Field(int number, const std::string& bytes, std::string* out) {
  Varint(static_cast<uint64_t>(number) << 3 | 2, out);
  Varint(bytes.size(), out);
  *out += bytes;
}

// A unigram model of `n` pieces: <unk>, <s>, </s>, then "p0", "p1", ...
std::string BigSentencePieceModel(int n) {
  std::string model;
  for (int i = 0; i < n; ++i) {
    std::string piece;
    const char* special[] = {"<unk>", "<s>", "</s>"};
    Field(1, i < 3 ? special[i] : "p" + std::to_string(i), &piece);
    const float score = i < 3 ? 0.0f : -static_cast<float>(i);
    Varint(2 << 3 | 5, &piece);
    piece.append(reinterpret_cast<const char*>(&score), sizeof(score));
    Varint(3 << 3 | 0, &piece);
    Varint(i == 0 ? 2 : i < 3 ? 3 : 1, &piece);  // UNKNOWN, CONTROL, NORMAL
    Field(1, piece, &model);
  }
  return model;
}

class PtworkerPrepare : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ptworker_prepare_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "corpus");
    const std::string text =
        ReadAll(std::string(PT_SOURCE_DIR) + "/data/tinyshakespeare.txt");
    WriteAll(dir_ / "corpus" / "a.txt", text.substr(0, 20000));
    WriteAll(dir_ / "corpus" / "b.txt", text.substr(20000, 12000));
    WriteAll(dir_ / "corpus" / "empty.txt", "");
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result Run(const std::string& args, const std::string& env = "") {
    return ptrain::testing::RunShell(
        env + " " + PTWORKER_PATH + " prepare " + args,
        (dir_ / "stderr.txt").string());
  }

  std::string Corpus() const {
    return "--input '" + (dir_ / "corpus" / "*.txt").string() + "' ";
  }

  // Flags that make several shards of the corpus; `out` under dir_.
  std::string Args(const std::string& out, const std::string& shard = "1024",
                   const std::string& more =
                       "--val-fraction 0.05 "
                       "--threads 2") const {
    return "--tokenizer gpt2 " + Corpus() + "--out " + (dir_ / out).string() +
           " --shard-tokens " + shard + " " + more;
  }

  // Exit 2, one line on stderr naming `needle`, `out` as it was.
  void ExpectRefused(const std::string& args, const std::string& needle,
                     const std::string& out = "out") {
    const bool existed = fs::exists(dir_ / out);
    const auto before = Tree(dir_ / out);
    const Result r = Run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("ptworker: error: " + needle), std::string::npos)
        << args << "\n"
        << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(fs::exists(dir_ / out), existed) << args;
    EXPECT_TRUE(Tree(dir_ / out) == before) << args;
  }

  // stdout of `ptworker prepare args`.
  std::string Stdout(const std::string& args) {
    const std::string cmd =
        std::string(PTWORKER_PATH) + " prepare " + args + " 2>/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    for (size_t n; p != nullptr && (n = std::fread(buf, 1, sizeof(buf), p));) {
      out.append(buf, n);
    }
    if (p != nullptr) ::pclose(p);
    return out;
  }

  // Runs `ptworker prepare args`: its exit code and its peak resident
  // memory in KiB.
  std::pair<int, long> RunMeasured(const std::string& args) {
    const std::string cmd = std::string("exec ") + PTWORKER_PATH + " prepare " +
                            args + " >/dev/null 2>" +
                            (dir_ / "stderr.txt").string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
      ::_exit(127);
    }
    int status = 0;
    struct rusage ru {};
    if (pid < 0 || ::wait4(pid, &status, 0, &ru) != pid) return {-1, 0};
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ru.ru_maxrss};
  }

  fs::path dir_;
};

TEST_F(PtworkerPrepare, BadInputsExit2NamingTheFlagAndWriteNothing) {
  const std::string out = "--out " + (dir_ / "out").string() + " ";
  ExpectRefused(
      "--tokenizer gpt2 --input '" + (dir_ / "x" / "*.txt").string() + "' " +
          out,
      "--input '" + (dir_ / "x" / "*.txt").string() + "': matches no file");
  ExpectRefused(
      "--tokenizer gpt2 --input " + (dir_ / "nofile").string() + " " + out,
      "--input '" + (dir_ / "nofile").string() + "': no such file");
  ExpectRefused("--tokenizer gpt2 --input " +
                    (dir_ / "corpus" / "empty.txt").string() + " " + out,
                "--input: every file the inputs name is empty");
}

// JSON lines through the command: a bad line exits 2 naming the file and
// line; --skip-bad-lines and --field reach the preparation.
TEST_F(PtworkerPrepare, JsonLinesFlagsAndABadLine) {
  const fs::path lines = dir_ / "corpus" / "c.jsonl";
  WriteAll(lines,
           "{\"body\": \"one document\"}\n{\"body\": 3}\n"
           "{\"body\": \"two\"}\n");
  const std::string args = "--tokenizer gpt2 --input " + lines.string() +
                           " --val-fraction 0 --field body --out " +
                           (dir_ / "out").string();
  ExpectRefused(args, "--input " + lines.string() +
                          ":2: field body is not a string but number");
  const Result r = Run(args + " --skip-bad-lines");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find(lines.string() + ": 1 bad line left out "
                                        "(--skip-bad-lines); the first, line "
                                        "2: field body is not a string"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "out" / "out_train_000000.bin"));
}

TEST_F(PtworkerPrepare, BadTokenizersExit2NamingTheFlagAndWriteNothing) {
  const std::string out = "--out " + (dir_ / "out").string() + " ";
  ExpectRefused("--tokenizer gpt3 " + Corpus() + out,
                "--tokenizer 'gpt3': not one of gpt2, spm:MODEL, "
                "spm-train:VOCAB");
  ExpectRefused("--tokenizer spm-train:100 " + Corpus() + out,
                "--tokenizer 'spm-train:100': VOCAB must be an integer in "
                "[260, 65536]");
  ExpectRefused("--tokenizer spm-train:70000 " + Corpus() + out,
                "--tokenizer 'spm-train:70000'");
  ExpectRefused("--tokenizer spm-train:x " + Corpus() + out,
                "--tokenizer 'spm-train:x'");
  ExpectRefused("--tokenizer spm-train:512 --spm-type word " + Corpus() + out,
                "--spm-type 'word': not one of bpe, unigram");
  ExpectRefused("--tokenizer gpt2 --spm-type bpe " + Corpus() + out,
                "--spm-type is for --tokenizer spm-train:VOCAB only");
}

TEST_F(PtworkerPrepare, BadNumbersAndFoldersExit2NamingTheFlag) {
  ExpectRefused(Args("out", "1024", "--val-fraction 0.6"),
                "--val-fraction 0.6: must be in [0, 0.5]");
  ExpectRefused(Args("out", "1000"),
                "--shard-tokens 1000: must be in [1024, 2147483647]");
  ExpectRefused(Args("out", "1024", "--threads -1"), "--threads -1");
  ExpectRefused("--tokenizer gpt2 " + Corpus() + "--out " +
                    (dir_ / "no" / "out").string(),
                "--out " + (dir_ / "no" / "out").string() +
                    ": its parent folder " + (dir_ / "no").string() +
                    " does not exist",
                "no");
  ExpectRefused(
      "--tokenizer gpt2 " + Corpus() + "--out " +
          (dir_ / "corpus" / "a.txt").string(),
      "--out " + (dir_ / "corpus" / "a.txt").string() + ": not a folder",
      "corpus");
}

TEST_F(PtworkerPrepare, OutFoldersThatCannotBeTheOutputExit2NamingTheRule) {
  // A symbolic link to nowhere: prepare would not create its target.
  fs::create_symlink(dir_ / "nowhere", dir_ / "link");
  ExpectRefused(
      "--tokenizer gpt2 " + Corpus() + "--out " + (dir_ / "link").string(),
      "--out " + (dir_ / "link").string() + ": a symbolic link to " +
          (dir_ / "nowhere").string() + ", which does not exist",
      "nowhere");
  EXPECT_TRUE(fs::is_symlink(dir_ / "link"));
  // A name the files' names do not fit after (NAME_tokenizer.bin.PID.tmp),
  // or no file name at all.
  for (size_t n : {224, 300}) {
    const std::string name(n, 'n');
    ExpectRefused(
        "--tokenizer gpt2 " + Corpus() + "--out " + (dir_ / name).string(),
        "--out " + (dir_ / name).string() + ": its last part is " +
            std::to_string(n) + " bytes; it prefixes the names of the files",
        n < 255 ? name : "out");
  }
  const std::string long_part(300, 'p');
  ExpectRefused("--tokenizer gpt2 " + Corpus() + "--out " +
                    (dir_ / long_part / "out").string(),
                "--out " + (dir_ / long_part / "out").string() +
                    ": a part of the path is longer than 255 bytes");
  // A name of 223 bytes fits.
  const std::string fits(223, 'f');
  const Result ok = Run(Args(fits));
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_TRUE(fs::exists(dir_ / fits / (fits + "_prepare.json")));
}

TEST_F(PtworkerPrepare, AManifestOfAnotherShapeExits2NamingTheField) {
  ASSERT_EQ(Run(Args("out")).code, 0);
  const fs::path manifest = dir_ / "out" / "out_prepare.json";
  nlohmann::json m = nlohmann::json::parse(ReadAll(manifest));
  m["tokens"] = std::to_string(m["tokens"].get<int64_t>());
  WriteAll(manifest, m.dump(1));
  ExpectRefused(Args("out"),
                "--out " + (dir_ / "out").string() +
                    ": out_prepare.json is not a manifest of this version of "
                    "ptworker prepare: tokens must be an integer >= 0");
}

TEST_F(PtworkerPrepare, AFolderAnotherRunHoldsExits2) {
  fs::create_directories(dir_ / "out");
  const int fd = ::open((dir_ / "out").c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  ExpectRefused(Args("out"), "--out " + (dir_ / "out").string() +
                                 ": another ptworker prepare is writing there");
  ::close(fd);
  EXPECT_EQ(Run(Args("out")).code, 0);
}

// SentencePiece's encoder takes memory in proportion to its input: a line
// of 2 MB is encoded in chunks of at most 128 KiB, in no more memory than
// the same text in lines (it took over 200 MB more when the line was one
// chunk; 200 MB lines ended in std::bad_alloc).
TEST_F(PtworkerPrepare, ALongLineIsEncodedInBoundedMemory) {
  const Result model = Run("--tokenizer spm-train:400 " + Corpus() + "--out " +
                           (dir_ / "model").string());
  ASSERT_EQ(model.code, 0) << model.err;
  const std::string shakespeare =
      ReadAll(std::string(PT_SOURCE_DIR) + "/data/tinyshakespeare.txt");
  std::string lines = shakespeare + shakespeare;
  lines.resize(2'000'000);
  std::string line = lines;
  std::replace(line.begin(), line.end(), '\n', ' ');
  WriteAll(dir_ / "lines.txt", lines);
  WriteAll(dir_ / "line.txt", line);
  const auto run = [&](const std::string& input) {
    return RunMeasured(
        "--tokenizer spm:" + (dir_ / "model" / "model_spm.model").string() +
        " --input " + (dir_ / input).string() + " --out " +
        (dir_ / ("out_" + input.substr(0, input.size() - 4))).string() +
        " --val-fraction 0 --threads 2");
  };
  const auto [lines_code, lines_kib] = run("lines.txt");
  const auto [line_code, line_kib] = run("line.txt");
  ASSERT_EQ(lines_code, 0) << ReadAll(dir_ / "stderr.txt");
  ASSERT_EQ(line_code, 0) << ReadAll(dir_ / "stderr.txt");
  EXPECT_LT(line_kib, lines_kib + 64 * 1024)
      << "peak RSS " << line_kib << " KiB for one line, " << lines_kib
      << " KiB for lines";
}

TEST_F(PtworkerPrepare, TokenizersThatDoNotLoadAreRefused) {
  const std::string out = "--out " + (dir_ / "out").string();
  WriteAll(dir_ / "junk.model", "not a model");
  ExpectRefused("--tokenizer spm:" + (dir_ / "junk.model").string() + " " +
                    Corpus() + out,
                "--tokenizer: spm:" + (dir_ / "junk.model").string() +
                    ": not a SentencePiece model that loads");
  ExpectRefused("--tokenizer spm:" + (dir_ / "none.model").string() + " " +
                    Corpus() + out,
                "--tokenizer");
  // A tokenizer.json of another model, in the folder named.
  fs::create_directories(dir_ / "hf");
  WriteAll(
      dir_ / "hf" / "tokenizer.json",
      R"({"decoder": {"type": "ByteLevel"}, "model": {"type": "WordPiece"}})");
  ExpectRefused(
      "--tokenizer hf:" + (dir_ / "hf").string() + " " + Corpus() + out,
      "--tokenizer: hf:" + (dir_ / "hf" / "tokenizer.json").string() +
          R"(: model.type: "WordPiece" is not implemented)");
}

// 70003 pieces: ids past 65535, which version 2 token files hold as uint32.
TEST_F(PtworkerPrepare, VocabulariesPastUint16WriteVersion2Shards) {
  WriteAll(dir_ / "big.model", BigSentencePieceModel(70003));
  const Result r = Run("--tokenizer spm:" + (dir_ / "big.model").string() +
                       " " + Corpus() + "--out " + (dir_ / "out").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string shard = ReadAll(dir_ / "out" / "out_train_000000.bin");
  int32_t header[3] = {};
  ASSERT_GE(shard.size(), sizeof(header));
  std::memcpy(header, shard.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 2);
  EXPECT_EQ(shard.size(), 1024 + 4 * static_cast<size_t>(header[2]));
}

TEST_F(PtworkerPrepare, AnotherPreparationsFolderIsRefused) {
  ASSERT_EQ(Run(Args("out")).code, 0);
  ExpectRefused(
      Args("out", "2048"),
      "--out " + (dir_ / "out").string() +
          ": holds a preparation with other settings: --shard-tokens was "
          "1024, now 2048; remove the folder");
  fs::create_directories(dir_ / "other");
  WriteAll(dir_ / "other" / "other_val_000000.bin", "x");
  ExpectRefused(Args("other"),
                "--out " + (dir_ / "other").string() +
                    ": holds shards (other_val_000000.bin) but no "
                    "other_prepare.json",
                "other");
}

TEST_F(PtworkerPrepare, AStopLikeACrashThenARerunGiveTheUnstoppedBytes) {
  const Result ref = Run(Args("ref"));
  ASSERT_EQ(ref.code, 0) << ref.err;
  fs::create_directories(dir_ / "again");
  const std::string again =
      Args("again/ref", "1024", "--val-fraction 0.05 --threads 1");
  const Result stopped = Run(again, "PTRAIN_TEST_PREPARE_STOP_AFTER_SHARDS=3");
  EXPECT_EQ(stopped.code, 1) << stopped.err;
  const auto partial = Tree(dir_ / "again" / "ref");
  EXPECT_NE(partial.at("ref_prepare.json").find("\"complete\": false"),
            std::string::npos);
  const Result rest = Run(again);
  ASSERT_EQ(rest.code, 0) << rest.err;
  EXPECT_TRUE(Tree(dir_ / "again" / "ref") == Tree(dir_ / "ref"));
  // Run again once complete: nothing to do, nothing written.
  const auto done = Tree(dir_ / "ref");
  const Result rerun = Run(Args("ref"));
  EXPECT_EQ(rerun.code, 0) << rerun.err;
  EXPECT_TRUE(Tree(dir_ / "ref") == done);
  EXPECT_NE(Stdout(Args("ref")).find((dir_ / "ref").string() + " is complete"),
            std::string::npos);
}

}  // namespace
