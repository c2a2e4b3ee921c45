// ptworker as a process: bad input ends with exit code 2 and one error line
// naming the problem, and writes nothing; a tiny good run writes the run log.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/testing/shell.h"
#include "worker/engine/checkpoint.h"

namespace {

namespace fs = std::filesystem;

using Result = ptrain::testing::ShellResult;

Result RunPtworker(const std::string& args) {
  const fs::path err_file =
      fs::temp_directory_path() /
      ("ptworker_cli_err_" + std::to_string(::getpid()) + ".txt");
  return ptrain::testing::RunShell(std::string(PTWORKER_PATH) + " " + args,
                                   err_file.string());
}

class PtworkerCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ptworker_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    log_ = (dir_ / "run.jsonl").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Base() const {
    return std::string("--config ") + PT_SOURCE_DIR +
           "/examples/shakespeare-char.yaml --log-json " + log_ +
           " --peak-gflops 100 ";
  }
  void ExpectRefused(const Result& r, const std::string& needle) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(log_)) << "a refused run wrote its log";
  }
  fs::path dir_;
  std::string log_;
};

TEST_F(PtworkerCli, MissingDataFileIsOneErrorLineExitTwoNothingWritten) {
  ExpectRefused(
      RunPtworker(Base() + "--set data.path=" + (dir_ / "nope.txt").string()),
      "data.path: no such file");
}

TEST_F(PtworkerCli, BadTokenFileHeaderIsRefused) {
  const std::string bin = (dir_ / "bad.bin").string();
  std::ofstream(bin) << std::string(2000, 'x');
  ExpectRefused(
      RunPtworker(Base() + "--set \"data.path=''\" --set data.train_bin=" +
                  bin + " --set data.val_bin=" + bin),
      "data.train_bin: '" + bin + "' has bad magic");
}

TEST_F(PtworkerCli, VocabularyThatDoesNotMatchTheModelIsRefused) {
  ExpectRefused(RunPtworker(Base() + "--set model.vocab_size=50"),
                "model.vocab_size=50 does not match");
}

TEST_F(PtworkerCli, SpecErrorNamesTheFieldAndTheRule) {
  ExpectRefused(RunPtworker(Base() + "--set parallel.tp=3"),
                "parallel.tp=3 does not divide model.n_head=4");
}

TEST_F(PtworkerCli, MissingConfigFileIsRefused) {
  const Result r = RunPtworker("--config " + (dir_ / "none.yaml").string() +
                               " --log-json " + log_);
  ExpectRefused(r, "none.yaml");
}

TEST_F(PtworkerCli, GoodRunWritesOneJsonObjectPerLine) {
  const Result r =
      RunPtworker(Base() +
                  "--set train.steps=3 --set train.eval_every=2 "
                  "--set train.eval_batches=1 --set train.sample_tokens=20 "
                  "--set model.n_layer=1 --set model.n_embd=32");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(log_);
  std::string line;
  int steps = 0, evals = 0, memory = 0, samples = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const std::string type = j.at("type");
    if (type == "step") {
      ++steps;
      EXPECT_EQ(j.at("step").get<int>(), steps);
      for (const char* key : {"loss", "lr", "ms", "tok_per_s", "mfu"}) {
        EXPECT_TRUE(j.at(key).is_number()) << key;
      }
    } else if (type == "eval") {
      ++evals;
      EXPECT_TRUE(j.at("val_loss").is_number());
    } else if (type == "memory") {
      ++memory;
      EXPECT_GT(j.at("params_bytes").get<int64_t>(), 0);
      EXPECT_EQ(j.at("params_bytes"), j.at("grads_bytes"));
      EXPECT_EQ(j.at("optimizer_bytes").get<int64_t>(),
                2 * j.at("params_bytes").get<int64_t>());
      EXPECT_GT(j.at("activations_bytes").get<int64_t>(), 0);
    } else if (type == "sample") {
      ++samples;
      EXPECT_GE(j.at("text").get<std::string>().size(), 20u);
    }
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(evals, 2);  // step 2 and the last step
  EXPECT_EQ(memory, 1);
  EXPECT_EQ(samples, 1);
}

TEST_F(PtworkerCli, KillDuringCheckpointWriteLeavesThePreviousOneAsLatest) {
  const fs::path ckpt = dir_ / "ck";
  const std::string args =
      Base() + "--set model.n_layer=1 --set model.n_embd=32 " +
      "--set train.eval_every=0 --set train.eval_batches=1 " +
      "--set train.sample_tokens=0 --set checkpoint.every=5 " +
      "--set checkpoint.dir=" + ckpt.string() + " --resume-from latest ";
  ASSERT_EQ(RunPtworker(args + "--set train.steps=5").code, 0);
  ASSERT_TRUE(fs::exists(ckpt / "step-00000005" / "manifest.json"));

  // Resume towards step 10 with the test hook pausing halfway through the
  // shard of step 10, and kill -9 the rank there.
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("PTRAIN_TEST_CHECKPOINT_PAUSE_S", "120", 1);
    const std::string cmd = std::string(PTWORKER_PATH) + " " + args +
                            "--set train.steps=10 >/dev/null 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  const fs::path partial = ckpt / "step-00000010.tmp" / "shard-00000.bin";
  for (int i = 0; i < 600 && !fs::exists(partial); ++i) usleep(100000);
  ASSERT_TRUE(fs::exists(partial)) << "the save never started";
  usleep(200000);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));

  EXPECT_FALSE(fs::exists(ckpt / "step-00000010"));
  const auto all = ptrain::ListCheckpoints(ckpt.string());
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(fs::path(all[0]).filename(), "step-00000005");
  // The previous checkpoint is whole: every tensor reads and checks out.
  auto reader = ptrain::CheckpointReader::Open(all[0]);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> buf;
  for (const auto& p : ptrain::GptParamLayout((*reader)->meta().model)) {
    buf.resize(p.numel);
    ASSERT_TRUE((*reader)->Read(p.name, 0, p.numel, buf.data()).ok());
    ASSERT_TRUE((*reader)
                    ->Read(ptrain::ExpAvgSqName(p.name), 0, p.numel, buf.data())
                    .ok());
  }
  // The job comes back from it and finishes; the stale folder is replaced.
  ASSERT_EQ(RunPtworker(args + "--set train.steps=10").code, 0);
  EXPECT_TRUE(fs::exists(ckpt / "step-00000010" / "manifest.json"));
  EXPECT_FALSE(fs::exists(ckpt / "step-00000010.tmp"));
}

}  // namespace
