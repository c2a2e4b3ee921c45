// Corpora larger than memory: loading token files reads each once (the
// vocabulary check, the digest) and keeps none of it resident, and a job
// on gigabytes of token shards (sparse files: the disk holds almost
// nothing) trains with its resident memory flat from step to step and far
// below the corpus's size.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/spec.h"
#include "worker/engine/data/data.h"
#include "worker/engine/data/token_file.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

// This process's resident memory in bytes: VmRSS, RssAnon, RssFile.
std::map<std::string, int64_t> Resident() {
  std::map<std::string, int64_t> out;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    for (const char* key : {"VmRSS", "RssAnon", "RssFile"}) {
      if (line.rfind(std::string(key) + ":", 0) == 0) {
        out[key] = std::stoll(line.substr(line.find(':') + 1)) * 1024;
      }
    }
  }
  return out;
}

// A token file of `tokens` uint16 tokens, all 0 but the last (1), written
// as a header and a hole: the disk holds a page or two of it.
void SparseTokenFile(const std::string& path, int64_t tokens) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ASSERT_GE(fd, 0) << path;
  int32_t header[kTokenFileHeaderInts] = {kTokenFileMagic, kTokenFileVersion,
                                          static_cast<int32_t>(tokens)};
  ASSERT_EQ(::pwrite(fd, header, sizeof(header), 0),
            static_cast<ssize_t>(sizeof(header)));
  const uint16_t last = 1;
  ASSERT_EQ(::pwrite(fd, &last, sizeof(last),
                     kTokenFileHeaderBytes + 2 * (tokens - 1)),
            static_cast<ssize_t>(sizeof(last)));
  ::close(fd);
}

class Streaming : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ptrain_streaming_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// 512 MiB of tokens loaded: checked against the vocabulary and digested,
// and still not resident. Keeping the pages (a plain read of the mapping)
// would add the whole file to RssFile.
TEST_F(Streaming, LoadingTokenFilesKeepsNoneOfThemResident) {
  const int64_t tokens = int64_t{1} << 28;
  SparseTokenFile((dir_ / "big_train.bin").string(), tokens);
  SparseTokenFile((dir_ / "big_val.bin").string(), 1 << 20);
  v1::DataSpec d;
  d.set_train_bin((dir_ / "big_train.bin").string());
  d.set_val_bin((dir_ / "big_val.bin").string());
  const int64_t before = Resident()["RssFile"];
  auto data = LoadTokenData(d, 64, 16);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->train[0].size(), static_cast<size_t>(tokens));
  EXPECT_EQ(data->train[0][tokens - 1], 1) << "the file was read";
  const int64_t after = Resident()["RssFile"];
  EXPECT_LT(after - before, int64_t{16} << 20)
      << "loading 512 MiB of tokens left " << (after - before) / (1 << 20)
      << " MiB of the file resident";
  // A token past the vocabulary is still found at the end of the file.
  auto small = LoadTokenData(d, 1, 16);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("token 1 at position " +
                                          std::to_string(tokens - 1)),
            std::string::npos)
      << small.status();
}

// A corpus of 2 GiB shards (two by default, 4 GiB; PTRAIN_STREAMING_SHARDS
// asks for more, 10 for 20 GiB): the job trains, and its resident memory
// is flat from step 3 to step 30 and a small part of the corpus (a loader
// that held the corpus, or an index of it, would not be).
TEST_F(Streaming, AJobOnGigabytesOfTokensTrainsInConstantMemory) {
  const int64_t shard = int64_t{1} << 30;  // tokens (2 GiB)
  const char* env = std::getenv("PTRAIN_STREAMING_SHARDS");
  const int shards = env != nullptr ? std::atoi(env) : 2;
  ASSERT_GE(shards, 1);
  for (int i = 0; i < shards; ++i) {
    SparseTokenFile(
        (dir_ / ("big_train_" + std::to_string(i) + ".bin")).string(), shard);
  }
  SparseTokenFile((dir_ / "big_val.bin").string(), 1 << 20);
  auto spec = LoadJobSpecFile(
      std::string(PT_SOURCE_DIR) + "/examples/shakespeare-char.yaml",
      {"model.n_layer=1", "model.n_embd=32", "model.vocab_size=64",
       "data.path=''", "data.train_bin=" + (dir_ / "big_train_*.bin").string(),
       "data.val_bin=" + (dir_ / "big_val.bin").string(), "train.steps=30",
       "train.global_batch=8", "train.eval_every=10", "train.eval_batches=2",
       "train.sample_tokens=0", "checkpoint.every=0",
       "checkpoint.dir=" + (dir_ / "ck").string()});
  ASSERT_TRUE(spec.ok()) << spec.status();
  TrainerOptions options;
  options.peak_flops = 100e9;
  options.quiet = true;
  std::vector<std::map<std::string, int64_t>> by_step;
  options.on_rank_step = [&](const RankStep&) {
    by_step.push_back(Resident());
  };
  const auto start = std::chrono::steady_clock::now();
  auto trainer = Trainer::Create(*spec, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::printf(
      "loading %d GiB of tokens took %.1f s\n", 2 * shards,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count());
  EXPECT_EQ(TokenCount((*trainer)->data().train), shards * shard);
  ASSERT_TRUE((*trainer)->Run().ok());
  ASSERT_EQ(by_step.size(), 30u);
  const auto& third = by_step[2];
  const auto& last = by_step.back();
  std::printf(
      "resident at steps 3 and 30: VmRSS %lld and %lld bytes, "
      "RssFile %lld and %lld\n",
      static_cast<long long>(third.at("VmRSS")),
      static_cast<long long>(last.at("VmRSS")),
      static_cast<long long>(third.at("RssFile")),
      static_cast<long long>(last.at("RssFile")));
  EXPECT_LT(last.at("VmRSS") - third.at("VmRSS"), int64_t{8} << 20)
      << "resident memory grew from " << third.at("VmRSS") << " to "
      << last.at("VmRSS") << " bytes between steps 3 and 30";
  EXPECT_LT(last.at("RssFile"), int64_t{256} << 20)
      << "of the " << 2 * shards << " GiB corpus, " << last.at("RssFile")
      << " bytes resident";
  EXPECT_LT(last.at("VmRSS"), int64_t{1} << 30);
}

}  // namespace
}  // namespace ptrain
