// ptworker as a process: bad input ends with exit code 2 and one error line
// naming the problem, and writes nothing — sizes too large to allocate, a
// damaged or foreign checkpoint, a path that leads out of the data roots —
// never an abort; a tiny good run writes the run log.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/spec.h"
#include "common/tokenizer.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "tests/testing/shell.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace {

namespace fs = std::filesystem;

using Result = ptrain::testing::ShellResult;

// `env`: "NAME=value ..." set for the process.
Result RunPtworker(const std::string& args, const std::string& env = "") {
  const fs::path err_file =
      fs::temp_directory_path() /
      ("ptworker_cli_err_" + std::to_string(::getpid()) + ".txt");
  return ptrain::testing::RunShell(env + " " + PTWORKER_PATH + " " + args,
                                   err_file.string());
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Sets dir's manifest `step` and recomputes the digest: a manifest that
// only validation can refuse.
void SetManifestStep(const fs::path& dir, int64_t step) {
  auto m = nlohmann::json::parse(ReadAll(dir / "manifest.json"));
  m["step"] = step;
  const std::string text = m.dump(1);
  std::ofstream(dir / "manifest.json", std::ios::trunc) << text;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(text.data(), text.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += absl::StrFormat("%02x", md[i]);
  std::ofstream(dir / "manifest.sha256", std::ios::trunc)
      << hex << "  manifest.json\n";
}

// Names and contents of every file under `dir`: "nothing changed there".
std::map<std::string, std::string> Tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    out[e.path().string()] = e.is_regular_file() ? ReadAll(e.path()) : "";
  }
  return out;
}

// Starts ptworker with `args` in the background, the test hook pausing
// every checkpoint write halfway for 120 s; for the caller to kill.
pid_t StartPausingInSave(const std::string& args) {
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("PTRAIN_TEST_CHECKPOINT_PAUSE_S", "120", 1);
    const std::string cmd =
        std::string(PTWORKER_PATH) + " " + args + " >/dev/null 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
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
  // Checkpoints go under dir_ unless a test says otherwise: never into the
  // example's folder of the checkout, which holds a user's runs.
  std::string Base() const {
    return std::string("--config ") + PT_SOURCE_DIR +
           "/examples/shakespeare-char.yaml --log-json " + log_ +
           " --peak-gflops 100 --set checkpoint.dir=" +
           (dir_ / "checkpoints").string() + " ";
  }
  // A small, fast model.
  std::string Small() const {
    return Base() +
           "--set model.n_layer=1 --set model.n_embd=32 "
           "--set train.eval_every=0 --set train.eval_batches=1 "
           "--set train.sample_tokens=0 ";
  }
  // A Hugging Face round trip of `model` (defined with its tests).
  void ExpectHuggingFaceRoundTrip(const std::string& model,
                                  const std::string& architecture);
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
  EXPECT_FALSE(fs::exists(dir_ / "flight"))
      << "a refused run left a flight recorder dump";
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
  int steps = 0, evals = 0, memory = 0, samples = 0, resumes = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const std::string type = j.at("type");
    if (type == "step") {
      ++steps;
      EXPECT_EQ(j.at("step").get<int>(), steps);
      for (const char* key : {"loss", "lr", "ms", "tok_per_s", "mfu"}) {
        EXPECT_TRUE(j.at(key).is_number()) << key;
      }
      // One rank has no one to wait for.
      EXPECT_EQ(j.at("comm_exposed_ms").get<double>(), 0.0);
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
    } else if (type == "resume") {
      ++resumes;
    }
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(evals, 2);  // step 2 and the last step
  EXPECT_EQ(memory, 1);
  EXPECT_EQ(samples, 1);
  EXPECT_EQ(resumes, 0);  // a fresh run names no checkpoint it started from
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
  const pid_t pid = StartPausingInSave(args + "--set train.steps=10");
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
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ(fs::path((*all)[0]).filename(), "step-00000005");
  // The previous checkpoint is whole: every tensor reads and checks out.
  auto reader = ptrain::CheckpointReader::Open((*all)[0]);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> buf;
  for (const auto& p : ptrain::GptTensors((*reader)->meta().model)) {
    const ptrain::Box whole = ptrain::WholeBox(p.global_shape);
    buf.resize(whole.numel());
    ASSERT_TRUE((*reader)->Read(p.name, whole, buf.data()).ok());
    ASSERT_TRUE(
        (*reader)->Read(ptrain::ExpAvgSqName(p.name), whole, buf.data()).ok());
  }
  // The job comes back from it and finishes; the stale folder is replaced.
  ASSERT_EQ(RunPtworker(args + "--set train.steps=10").code, 0);
  EXPECT_TRUE(fs::exists(ckpt / "step-00000010" / "manifest.json"));
  EXPECT_FALSE(fs::exists(ckpt / "step-00000010.tmp"));
}

// The run log's records as (type, step), in order.
std::vector<std::pair<std::string, int64_t>> Records(const std::string& log) {
  std::vector<std::pair<std::string, int64_t>> out;
  std::istringstream in(ReadAll(log));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    out.emplace_back(j.at("type").get<std::string>(),
                     j.value("step", int64_t{-1}));
  }
  return out;
}

// Where (type, step) is in `records`; records.size() when it is not.
size_t Position(const std::vector<std::pair<std::string, int64_t>>& records,
                const std::string& type, int64_t step) {
  return std::find(records.begin(), records.end(), std::make_pair(type, step)) -
         records.begin();
}

// checkpoint.async_save: the loop trains on while a save is written (its
// "checkpoint" record comes after later steps' records, with the thread's
// write time), every save commits, the last one before the run ends; a
// rank killed while a background save is written leaves the previous
// checkpoint the newest, and the job comes back from it.
TEST_F(PtworkerCli, AsyncSaveTrainsOnWhileWritingAndSurvivesAKill) {
  const fs::path ckpt = dir_ / "ck";
  const std::string args = Small() +
                           "--set checkpoint.every=2 --set "
                           "checkpoint.async_save=true --set "
                           "checkpoint.keep_last=10 --set checkpoint.dir=" +
                           ckpt.string() + " --resume-from latest ";
  ASSERT_EQ(RunPtworker(args + "--set train.steps=6",
                        "PTRAIN_TEST_CHECKPOINT_PAUSE_S=1")
                .code,
            0);
  auto records = Records(log_);
  for (int step : {2, 4, 6}) {
    EXPECT_TRUE(
        fs::exists(ckpt / absl::StrFormat("step-%08d", step) / "manifest.json"))
        << step;
    EXPECT_LT(Position(records, "checkpoint", step), records.size()) << step;
  }
  EXPECT_GT(Position(records, "checkpoint", 2), Position(records, "step", 3))
      << "the loop waited for the save of step 2";
  std::istringstream in(ReadAll(log_));
  int background = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") != "checkpoint") continue;
    // Steps 2 and 4 in the background (the thread paused 1 s), 6 blocking.
    if (j.contains("write_seconds")) {
      ++background;
      EXPECT_GE(j.at("write_seconds").get<double>(), 1.0);
    }
  }
  EXPECT_EQ(background, 2);

  // Towards step 10, the save of step 8 pausing for long: the rank trains
  // on to step 10, waits there for it, and is killed.
  fs::remove(log_);
  const pid_t pid = StartPausingInSave(args + "--set train.steps=10");
  for (int i = 0; i < 600; ++i) {
    if (fs::exists(log_)) {
      records = Records(log_);
      if (Position(records, "step", 10) < records.size()) break;
    }
    usleep(100000);
  }
  const bool partial =
      fs::exists(ckpt / "step-00000008.tmp" / "shard-00000.bin");
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_LT(Position(records, "step", 10), records.size())
      << "the rank did not train on while step 8 was written";
  EXPECT_TRUE(partial) << "no half-written shard of step 8";
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(fs::exists(ckpt / "step-00000008"));
  const auto all = ptrain::ListCheckpoints(ckpt.string());
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_FALSE(all->empty());
  EXPECT_EQ(fs::path((*all)[0]).filename(), "step-00000006");

  ASSERT_EQ(RunPtworker(args + "--set train.steps=10").code, 0);
  records = Records(log_);
  EXPECT_LT(Position(records, "resume", 6), records.size());
  EXPECT_TRUE(fs::exists(ckpt / "step-00000008" / "manifest.json"));
  EXPECT_TRUE(fs::exists(ckpt / "step-00000010" / "manifest.json"));
  EXPECT_FALSE(fs::exists(ckpt / "step-00000008.tmp"));
}

// Sizes that pass as numbers but cannot be allocated: exit 2 and one line
// naming the field, never std::bad_alloc's abort. The first four are the
// reported inputs (refused by the spec's bounds or the memory estimate,
// whichever comes first); the rest are within any field bound and only the
// memory estimate can refuse them.
TEST_F(PtworkerCli, HugeSizesAreRefusedNamingTheFieldNeverAborted) {
  const std::string small = (dir_ / "small.txt").string();
  std::ofstream(small) << std::string(3000, 'a') + std::string(3000, 'b');
  const struct {
    std::string set, needle;
  } cases[] = {
      {"model.n_embd=1073741824", "model.n_embd"},
      {"train.global_batch=2147483647", "train.global_batch"},
      {"model.block_size=100000 --set data.path=" + small,
       "model.block_size=100000"},
      {"resources.threads_per_rank=2147483647", "resources.threads_per_rank"},
      {"model.n_embd=65536", "memory: each rank needs"},
      {"model.n_embd=65536", "model.n_embd=65536"},
      {"train.global_batch=1048576", "train.global_batch=1048576"},
      {"model.block_size=100000", "memory: each rank needs"},
      {"model.block_size=100000", "model.block_size=100000"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.set);
    ExpectRefused(RunPtworker(Base() + "--set " + c.set), c.needle);
  }
}

// Context parallelism that cannot run is refused before anything starts:
// a cp that does not cut block_size into 2·cp chunks, an attention path
// that cannot ring (each named), and a world that is not dp·tp·pp·cp.
TEST_F(PtworkerCli, ImpossibleContextParallelismIsRefusedExitTwo) {
  ExpectRefused(RunPtworker(Small() + "--set parallel.cp=3"),
                "parallel.cp=3 needs model.block_size divisible by 2 × "
                "parallel.cp = 6");
  ExpectRefused(
      RunPtworker(Small() + "--set parallel.cp=2 --set resources.device=cuda"),
      "parallel.cp=2 with resources.device=cuda: the GPU's ring attention");
  ExpectRefused(RunPtworker(Small() + "--set parallel.cp=2"),
                "world size 1 does not equal parallel.dp × parallel.tp × "
                "parallel.pp × parallel.cp = 1 × 1 × 1 × 2 = 2");
}

// When the allocator fails anyway (here: a 1.2 GB address-space limit
// under a 1.6 GB model the machine could hold), std::bad_alloc becomes one
// error line and exit 2, not an abort.
TEST_F(PtworkerCli, OutOfMemoryIsOneErrorLineExitTwoNotAnAbort) {
  ExpectRefused(RunPtworker(Base() + "--set model.n_embd=1024 "
                                     "--set model.n_layer=8",
                            "ulimit -v 1200000;"),
                "memory: out of memory while building the model");
}

// ONEDNN_MAX_CPU_ISA=AVX512_CORE hides AVX512_BF16 from oneDNN: the run is
// what a CPU without it gets.
TEST_F(PtworkerCli, CpuBf16WithoutAvx512Bf16IsRefused) {
  ExpectRefused(RunPtworker(Small() + "--set train.precision=bf16",
                            "ONEDNN_MAX_CPU_ISA=AVX512_CORE"),
                "train.precision=bf16 with resources.device=cpu needs a CPU "
                "with AVX512_BF16");
}

TEST_F(PtworkerCli, TestHookWithABadValueIsRefused) {
  ExpectRefused(RunPtworker(Small() + "--set train.steps=2",
                            "PTRAIN_TEST_HANG_AT_STEP=abc"),
                "PTRAIN_TEST_HANG_AT_STEP='abc' is not an integer");
}

TEST_F(PtworkerCli, FlightRecorderSizeOutOfRangeIsRefusedNamingIt) {
  ExpectRefused(RunPtworker(Small() + "--set train.steps=2",
                            "PTRAIN_FLIGHT_RECORDER_ENTRIES=-1"),
                "PTRAIN_FLIGHT_RECORDER_ENTRIES='-1' is not an integer >= 0");
  ExpectRefused(RunPtworker(Small() + "--set train.steps=2",
                            "PTRAIN_FLIGHT_RECORDER_ENTRIES=99999999"),
                "PTRAIN_FLIGHT_RECORDER_ENTRIES=99999999 must be in [0, "
                "16777216]");
}

// Under a run log every rank leaves a first dump, saying who it is, once
// it is set up (a refused run leaves none: ExpectRefused).
TEST_F(PtworkerCli, RanksLeaveTheirFlightRecorderBesideTheRunLog) {
  ASSERT_EQ(RunPtworker(Small() + "--set train.steps=3").code, 0);
  const fs::path dump =
      fs::path(log_).parent_path() / "flight" / "rank-00000.jsonl";
  std::ifstream in(dump);
  std::string header;
  ASSERT_TRUE(std::getline(in, header)) << dump;
  EXPECT_NE(header.find("\"reason\":\"start\""), std::string::npos) << header;
  EXPECT_NE(header.find("\"rank\":0"), std::string::npos) << header;
}

TEST_F(PtworkerCli, DamagedCheckpointExitsTwoExplicitlyAndIsSkippedByLatest) {
  const fs::path ckpt = dir_ / "ck";
  const std::string args = Small() + "--set checkpoint.every=5 " +
                           "--set checkpoint.dir=" + ckpt.string() + " ";
  ASSERT_EQ(RunPtworker(args + "--set train.steps=10").code, 0);
  const fs::path ten = ckpt / "step-00000010";
  SetManifestStep(ten, -5);
  fs::remove(log_);

  // Named explicitly: exit 2, one line, nothing written.
  const auto before = Tree(ckpt);
  ExpectRefused(
      RunPtworker(args + "--set train.steps=12 --resume-from " + ten.string()),
      "checkpoint " + ten.string() + " is damaged: step=-5 is outside");
  // Exported: the same refusal, no output file.
  const fs::path out = dir_ / "model.bin";
  ExpectRefused(RunPtworker("export --checkpoint " + ten.string() + " --llmc " +
                            out.string()),
                "is damaged: step=-5");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
  EXPECT_EQ(Tree(ckpt), before);

  // latest: falls back to step 5 with a warning naming the damaged one.
  const Result r =
      RunPtworker(args + "--set train.steps=12 --resume-from latest");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("skipping damaged checkpoint '" + ten.string() + "'"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("step-00000005' at step 5"), std::string::npos) << r.err;
  // The run log names the checkpoint it really started from, ahead of the
  // first step after it.
  std::ifstream in(log_);
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);) {
    records.push_back(nlohmann::json::parse(line));
  }
  const auto type_is = [](const char* t) {
    return [t](const nlohmann::json& j) { return j.at("type") == t; };
  };
  const auto resume =
      std::find_if(records.begin(), records.end(), type_is("resume"));
  const auto first_step =
      std::find_if(records.begin(), records.end(), type_is("step"));
  ASSERT_NE(resume, records.end());
  ASSERT_NE(first_step, records.end());
  EXPECT_LT(resume, first_step);
  EXPECT_EQ(resume->at("step").get<int>(), 5);
  EXPECT_EQ(resume->at("dir").get<std::string>(),
            (ckpt / "step-00000005").string());
  EXPECT_EQ(first_step->at("step").get<int>(), 6);
  EXPECT_EQ(std::count_if(records.begin(), records.end(), type_is("resume")),
            1);
  // And an intact one exports.
  EXPECT_EQ(
      RunPtworker("export --checkpoint " + (ckpt / "step-00000005").string() +
                  " --llmc " + out.string())
          .code,
      0);
  EXPECT_TRUE(fs::exists(out));
}

TEST_F(PtworkerCli, LatestRefusesACheckpointOfAnotherJob) {
  const fs::path ckpt = dir_ / "ck";
  const std::string args = Small() + "--set checkpoint.every=2 " +
                           "--set checkpoint.dir=" + ckpt.string() +
                           " --resume-from latest ";
  ASSERT_EQ(
      RunPtworker(args + "--set train.steps=2", "PTRAIN_JOB_UID=job-a").code,
      0);
  fs::remove(log_);
  const auto before = Tree(ckpt);
  ExpectRefused(
      RunPtworker(args + "--set train.steps=4", "PTRAIN_JOB_UID=job-b"),
      "belongs to job 'job-a', not to this job 'job-b'");
  EXPECT_EQ(Tree(ckpt), before);
  ASSERT_EQ(
      RunPtworker(args + "--set train.steps=4", "PTRAIN_JOB_UID=job-a").code,
      0);
}

// With PTRAIN_DATA_ROOTS set, every file is opened beneath a root: a data
// file, a checkpoint folder or an init_from file reached through a symlink
// that leads out is refused (exit 2) and nothing is written outside.
class ConfinedPtworker : public PtworkerCli {
 protected:
  void SetUp() override {
    PtworkerCli::SetUp();
    root_ = fs::canonical(dir_) / "root";
    outside_ = fs::canonical(dir_) / "outside";
    fs::create_directories(root_ / "data");
    fs::create_directories(outside_ / "ckpt");
    std::string text =
        ReadAll(fs::path(PT_SOURCE_DIR) / "data/tinyshakespeare.txt")
            .substr(0, 20000);
    std::ofstream(root_ / "data" / "text.txt") << text;
    std::ofstream(outside_ / "secret.txt") << text;
  }
  std::string Confined() const {
    return Small() + "--set train.steps=2 --set checkpoint.dir=" +
           (root_ / "ck").string() + " ";
  }
  // Runs ptworker with the roots set, as ptcoord's launcher does.
  Result Run(const std::string& args) const {
    return RunPtworker(args, "PTRAIN_DATA_ROOTS=" + root_.string());
  }
  fs::path root_, outside_;
};

TEST_F(ConfinedPtworker, DataInsideTheRootsTrainsAndCheckpoints) {
  const std::string args =
      Confined() + "--set data.path=" + (root_ / "data/text.txt").string() +
      " --set checkpoint.dir=" + (root_ / "ck").string() +
      " --set checkpoint.every=1 --resume-from latest ";
  const Result r = Run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(root_ / "ck/step-00000002/manifest.sha256"));
  // A symlink that stays inside the root is fine.
  fs::create_symlink("data/text.txt", root_ / "alias.txt");
  fs::remove(log_);
  const Result again =
      Run(Confined() + "--set data.path=" + (root_ / "alias.txt").string() +
          " --set checkpoint.dir=" + (root_ / "ck").string() +
          " --set checkpoint.every=1 --set train.steps=3 --resume-from latest");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("at step 2"), std::string::npos) << again.err;
}

TEST_F(ConfinedPtworker, DataFileSymlinkedOutsideIsRefused) {
  fs::create_symlink(outside_ / "secret.txt", root_ / "data/abs.txt");
  fs::create_symlink("../../outside/secret.txt", root_ / "data/rel.txt");
  for (const char* name : {"data/abs.txt", "data/rel.txt"}) {
    SCOPED_TRACE(name);
    ExpectRefused(
        Run(Confined() + "--set data.path=" + (root_ / name).string()),
        "data.path: '" + (root_ / name).string() +
            "' leads outside the data roots (" + root_.string() + ")");
  }
  // Lexically outside: refused before any lookup.
  ExpectRefused(
      Run(Confined() + "--set data.path=" + (outside_ / "secret.txt").string()),
      "is outside the data roots (" + root_.string() + ")");
}

TEST_F(ConfinedPtworker, CheckpointFolderSymlinkedOutsideIsRefusedUnwritten) {
  fs::create_symlink(outside_ / "ckpt", root_ / "ck");
  const auto before = Tree(outside_);
  for (const char* resume : {"", "--resume-from latest"}) {
    SCOPED_TRACE(resume);
    ExpectRefused(Run(Confined() +
                      "--set data.path=" + (root_ / "data/text.txt").string() +
                      " --set checkpoint.every=1 --set checkpoint.dir=" +
                      (root_ / "ck" / "job").string() + " " + resume),
                  "checkpoint.dir: '" + (root_ / "ck" / "job").string() +
                      "' leads outside the data roots");
  }
  EXPECT_EQ(Tree(outside_), before) << "something was written outside";
}

TEST_F(ConfinedPtworker, InitFromSymlinkedOutsideIsRefused) {
  std::ofstream(outside_ / "model.bin") << std::string(4096, '\0');
  fs::create_symlink(outside_ / "model.bin", root_ / "model.bin");
  ExpectRefused(
      Run(Confined() + "--set data.path=" + (root_ / "data/text.txt").string() +
          " --set model.init_from=llmc:" + (root_ / "model.bin").string()),
      "model.init_from: '" + (root_ / "model.bin").string() +
          "' leads outside the data roots");
}

// Standalone runs of two models in one folder (as the README's examples
// once were): each keeps what it saved however their steps interleave, and
// `latest` passes over the other model's newer checkpoint, saying so.
TEST_F(PtworkerCli, StandaloneRunsOfTwoModelsSharingAFolderKeepEachOthers) {
  const fs::path ckpt = dir_ / "shared";
  const std::string a = Small() + "--set checkpoint.keep_last=1 " +
                        "--set checkpoint.dir=" + ckpt.string() + " ";
  const std::string b = a + "--set model.n_layer=2 ";
  ASSERT_EQ(
      RunPtworker(a + "--set train.steps=4 --set checkpoint.every=2").code, 0);
  const Result r =
      RunPtworker(b + "--set train.steps=3 --set checkpoint.every=1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(ckpt / "step-00000004" / "manifest.sha256"));
  EXPECT_TRUE(fs::exists(ckpt / "step-00000003" / "manifest.sha256"));
  fs::remove(log_);
  const Result resumed = RunPtworker(
      b + "--set train.steps=5 --set checkpoint.every=5 --resume-from latest");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resume: skipping checkpoint '" +
                             (ckpt / "step-00000004").string() +
                             "' does not fit the model"),
            std::string::npos)
      << resumed.err;
  EXPECT_NE(resumed.err.find("resumed from '" +
                             (ckpt / "step-00000003").string() + "' at step 3"),
            std::string::npos)
      << resumed.err;
  // b's run went on as itself: it pruned its own step 3, not a's step 4.
  EXPECT_TRUE(fs::exists(ckpt / "step-00000004"));
  EXPECT_FALSE(fs::exists(ckpt / "step-00000003"));
  EXPECT_TRUE(fs::exists(ckpt / "step-00000005"));
}

// A fresh run into a folder where another run has a checkpoint at a step
// it would save could not save that step (no run overwrites another's): it
// is refused before it trains, so that no work is lost, and the other
// run's checkpoint stays as it was.
TEST_F(PtworkerCli,
       AFreshRunThatWouldClashWithAnotherRunsStepIsRefusedAtStart) {
  const fs::path ckpt = dir_ / "shared";
  const std::string a = Small() + "--set checkpoint.dir=" + ckpt.string() +
                        " --set train.steps=2 --set checkpoint.every=2 ";
  ASSERT_EQ(RunPtworker(a).code, 0);
  const fs::path kept = ckpt / "step-00000002" / "manifest.json";
  const std::string before = ReadAll(kept);
  fs::remove(log_);
  ExpectRefused(RunPtworker(a + "--set model.n_layer=2"),
                "holds step-00000002");
  EXPECT_EQ(ReadAll(kept), before);
  // Going on from that run is what the message offers, and it works.
  const Result resumed =
      RunPtworker(a + "--set train.steps=4 --resume-from latest");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
}

TEST_F(PtworkerCli, TextThatIsNotUtf8IsOneErrorLineNamingItsFirstBadByte) {
  const fs::path text = dir_ / "latin1.txt";
  std::ofstream(text, std::ios::binary) << "caf\xE9\n" << std::string(500, 'x');
  ExpectRefused(RunPtworker(Small() + "--set data.path=" + text.string()),
                "data.path: '" + text.string() +
                    "' is not UTF-8 text: byte 0xE9 at byte offset 3 (line 1)");
}

// Accents, CJK and emoji: the run trains and samples whole characters, and
// its log is UTF-8 JSON.
TEST_F(PtworkerCli, UnicodeTextTrainsAndItsSampleIsUtf8) {
  const fs::path text = dir_ / "mixed.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 40; ++i) out << "Café déjà vu — 東京 😀🚀 naïve\n";
  }
  const Result r =
      RunPtworker(Small() + "--set data.path=" + text.string() +
                  " --set train.steps=3 --set train.sample_tokens=80 "
                  "--set train.sample_prompt=Café --set model.block_size=16");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(log_);
  std::string line, sample;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "sample") sample = j.at("text");
  }
  ASSERT_EQ(sample.rfind("Café", 0), 0u) << sample;
  // Well-formed UTF-8 from the first byte to the last, no replacement.
  EXPECT_EQ(ptrain::FirstInvalidUtf8(sample), -1) << sample;
  EXPECT_EQ(sample.find("\uFFFD"), std::string::npos) << sample;
}

// Starts `env` ptworker `args` with train.steps=1000000 in the background,
// its stdout and stderr in `out`, and waits (a bounded while) until its run
// log `log` holds a step record; for the caller to signal and reap. -1 when
// no step came.
pid_t StartTraining(const std::string& args, const std::string& env,
                    const fs::path& out, const std::string& log) {
  const std::string cmd = "exec env " + env + " " + PTWORKER_PATH + " " + args +
                          " --set train.steps=1000000 >" + out.string() +
                          " 2>&1";
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 1200; ++i) {
    if (fs::exists(log) &&
        ReadAll(log).find("\"type\":\"step\"") != std::string::npos) {
      return pid;
    }
    usleep(100000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// Ctrl-C on a training rank saves the step it is in and ends it as SIGUSR1
// does: exit 3, that step's checkpoint committed, a "stop" record last.
TEST_F(PtworkerCli, FirstSigintStopsAfterTheStepWithItsCheckpointExitThree) {
  const fs::path ckpt = dir_ / "ck";
  const pid_t pid =
      StartTraining(Small() + "--set checkpoint.dir=" + ckpt.string(), "",
                    dir_ / "out.txt", log_);
  ASSERT_GT(pid, 0) << ReadAll(dir_ / "out.txt");
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string out = ReadAll(dir_ / "out.txt");
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 3) << out;
  const auto records = Records(log_);
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.back().first, "stop");
  const int64_t step = records.back().second;
  EXPECT_LT(Position(records, "checkpoint", step), records.size());
  EXPECT_TRUE(
      fs::exists(ckpt / absl::StrFormat("step-%08d", step) / "manifest.sha256"))
      << out;
  EXPECT_NE(out.find("SIGINT: stopping after this step"), std::string::npos)
      << out;
  EXPECT_NE(out.find("run again with --resume-from latest to go on from it"),
            std::string::npos)
      << out;
  // Run again without --resume-from: it starts fresh, and says what it
  // passes over and how to go on from it instead.
  fs::remove(log_);
  const Result again =
      RunPtworker(Small() + "--set checkpoint.dir=" + ckpt.string() +
                  " --set train.steps=1");
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find(absl::StrFormat(
                "holds 1 checkpoint(s) of an earlier run, the newest "
                "step-%08d (run 'run-",
                step)),
            std::string::npos)
      << again.err;
  EXPECT_NE(again.err.find("this run starts fresh beside them (no "
                           "--resume-from). To go on from there instead, run "
                           "with --resume-from latest"),
            std::string::npos)
      << again.err;
}

// Two runs cannot save into one folder: the second is refused before it
// trains (exit 2, one line naming the first), rather than failing at its
// first save with its steps lost; the first trains on unharmed.
TEST_F(PtworkerCli, ASecondRunIntoAFolderInUseIsRefusedBeforeItTrains) {
  const fs::path ckpt = dir_ / "ck";
  const pid_t first =
      StartTraining(Small() + "--set checkpoint.dir=" + ckpt.string(), "",
                    dir_ / "out.txt", log_);
  ASSERT_GT(first, 0) << ReadAll(dir_ / "out.txt");
  const std::string second_log = (dir_ / "second.jsonl").string();
  const Result second = RunPtworker(
      std::string("--config ") + PT_SOURCE_DIR +
      "/examples/shakespeare-char.yaml --log-json " + second_log +
      " --set model.n_layer=1 --set model.n_embd=32 --set train.steps=3 "
      "--set checkpoint.dir=" +
      ckpt.string());
  kill(first, SIGINT);
  int status = 0;
  waitpid(first, &status, 0);
  EXPECT_EQ(second.code, 2) << second.err;
  EXPECT_NE(second.err.find("checkpoint.dir '" + ckpt.string() +
                            "' is in use by another run (pid " +
                            std::to_string(first)),
            std::string::npos)
      << second.err;
  EXPECT_EQ(std::count(second.err.begin(), second.err.end(), '\n'), 1)
      << second.err;
  EXPECT_FALSE(fs::exists(second_log)) << "the refused run wrote its log";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3)
      << ReadAll(dir_ / "out.txt");
}

// A second SIGTERM does not wait for the save the first one started (held
// here for 120 s by the test hook): exit 143 at once, the half-written
// checkpoint left uncommitted.
TEST_F(PtworkerCli, SecondSigtermExitsAtOnceWithoutWaitingForTheSave) {
  const fs::path ckpt = dir_ / "ck";
  const pid_t pid = StartTraining(
      Small() + "--set checkpoint.dir=" + ckpt.string(),
      "PTRAIN_TEST_CHECKPOINT_PAUSE_S=120", dir_ / "out.txt", log_);
  ASSERT_GT(pid, 0) << ReadAll(dir_ / "out.txt");
  kill(pid, SIGTERM);
  bool saving = false;
  for (int i = 0; i < 1200 && !saving; ++i) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(ckpt, ec)) {
      saving = saving || fs::exists(e.path() / "shard-00000.bin");
    }
    if (!saving) usleep(100000);
  }
  ASSERT_TRUE(saving) << "the save never started\n"
                      << ReadAll(dir_ / "out.txt");
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << ReadAll(dir_ / "out.txt");
  const auto committed = ptrain::ListCheckpoints(ckpt.string());
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(committed->empty());
}

// ptworker `args`: its exit code and stderr, and its stdout.
std::pair<Result, std::string> RunPtworkerStdout(const std::string& args,
                                                 const fs::path& out) {
  const Result r =
      ptrain::testing::RunShell(std::string("{ ") + PTWORKER_PATH + " " + args +
                                    " >" + out.string() + "; }",
                                out.string() + ".err");
  return {r, ReadAll(out)};
}

// `ptworker sample` draws from a checkpoint's model with no data file:
// with the job's settings the very text its run logged at that step, with
// a prompt a text that continues it; a folder that is not a checkpoint is
// one error line, exit 2, nothing on stdout.
TEST_F(PtworkerCli, SampleFromACheckpointRepeatsTheRunsSampleAndTakesAPrompt) {
  const fs::path ckpt = dir_ / "ck";
  ASSERT_EQ(RunPtworker(Small() +
                        "--set train.steps=4 --set train.sample_tokens=40 "
                        "--set checkpoint.dir=" +
                        ckpt.string())
                .code,
            0);
  std::string logged;
  std::istringstream in(ReadAll(log_));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "sample") logged = j.at("text");
  }
  ASSERT_FALSE(logged.empty());
  const std::string step4 = (ckpt / "step-00000004").string();
  const fs::path out = dir_ / "sample.txt";
  auto [r, text] = RunPtworkerStdout("sample --checkpoint " + step4, out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(text, logged + "\n");

  std::tie(r, text) = RunPtworkerStdout(
      "sample --checkpoint " + step4 +
          " --prompt 'JULIET: ' --tokens 25 --temperature 0.8 --top-k 10",
      out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(text.rfind("JULIET: ", 0), 0u) << text;
  EXPECT_GT(text.size(), std::string("JULIET: \n").size()) << text;
  // Temperature 0 is greedy: the seed changes nothing.
  std::string greedy;
  for (const char* seed : {"1", "2"}) {
    std::tie(r, text) = RunPtworkerStdout(
        "sample --checkpoint " + step4 +
            " --prompt 'JULIET: ' --tokens 25 --temperature 0 --seed " + seed,
        out);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_GT(text.size(), std::string("JULIET: \n").size()) << text;
    if (greedy.empty()) greedy = text;
    EXPECT_EQ(text, greedy);
  }

  fs::remove(log_);  // ExpectRefused: a refusal writes no log
  std::tie(r, text) =
      RunPtworkerStdout("sample --checkpoint " + (dir_ / "nope").string(), out);
  ExpectRefused(
      r, "--checkpoint " + (dir_ / "nope").string() + ": no such folder");
  EXPECT_EQ(text, "");
  SetManifestStep(step4, -5);
  std::tie(r, text) = RunPtworkerStdout("sample --checkpoint " + step4, out);
  ExpectRefused(r, "is damaged: step=-5");
  EXPECT_EQ(text, "");
}

// --dry-run says what the run would be and starts nothing: the spec with
// its overrides, the layout, each rank's memory; no log, no checkpoint
// folder. Bad input is refused as a run's would be.
TEST_F(PtworkerCli,
       DryRunPrintsTheEffectiveSpecLayoutAndMemoryAndWritesNothing) {
  const fs::path ckpt = dir_ / "dry";
  const auto [r, out] = RunPtworkerStdout(
      Base() + "--set checkpoint.dir=" + ckpt.string() +
          " --set parallel.dp=2 --set train.lr=0.0005 --dry-run",
      dir_ / "dry.txt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(out.find("  lr: 5e-04\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  dp: 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("# layout: 2 ranks (parallel.dp × parallel.tp × "
                     "parallel.pp = 2 × 1 × 1)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("# memory of the rank that needs the most: host: params "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("# nothing was started or written"), std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(log_));
  EXPECT_FALSE(fs::exists(ckpt));
  // A pipeline: each stage's ranks, which differ (the first embeds).
  const auto [piped, stages] =
      RunPtworkerStdout(Base() +
                            "--set parallel.pp=2 --set model.n_layer=2 "
                            "--set parallel.microbatches=2 --dry-run",
                        dir_ / "stages.txt");
  ASSERT_EQ(piped.code, 0) << piped.err;
  const auto line = [&](const std::string& head) {
    const size_t at = stages.find(head);
    return at == std::string::npos
               ? std::string()
               : stages.substr(at, stages.find('\n', at) - at);
  };
  const std::string first = line("#   a rank of pipeline stage 0: host: ");
  const std::string second = line("#   a rank of pipeline stage 1: host: ");
  ASSERT_FALSE(first.empty()) << stages;
  ASSERT_FALSE(second.empty()) << stages;
  EXPECT_NE(first.substr(first.find(':')), second.substr(second.find(':')));
  ExpectRefused(RunPtworker(Base() + "--set train.lr=-1 --dry-run"),
                "train.lr=-1 must be > 0");
}

// A model of GPT-2 ids (data.tokenizer: gpt2): the run logs its samples as
// text, `ptworker sample` repeats them and takes a prompt through GPT-2's
// encoder, and `export --llmc-tokenizer` writes llm.c's tokenizer file
// beside the weights. A char model has no end of text for that file:
// refused, nothing written.
TEST_F(PtworkerCli, Gpt2ModelSamplesTextAndExportsItsTokenizer) {
  const fs::path text_path = dir_ / "text.txt";
  {
    std::ofstream text(text_path);
    for (int i = 0; i < 150; ++i) text << "Hello world, it's a fine day.\n";
  }
  const fs::path ckpt = dir_ / "ck";
  const Result run =
      RunPtworker(Small() + "--set data.tokenizer=gpt2 --set data.path=" +
                  text_path.string() +
                  " --set train.steps=2 --set train.sample_tokens=8 "
                  "--set train.sample_prompt=Hello --set checkpoint.dir=" +
                  ckpt.string());
  ASSERT_EQ(run.code, 0) << run.err;
  std::string logged;
  std::istringstream in(ReadAll(log_));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "sample") logged = j.at("text");
  }
  ASSERT_EQ(logged.rfind("Hello", 0), 0u) << logged;
  const std::string step2 = (ckpt / "step-00000002").string();
  const fs::path out = dir_ / "sample.txt";
  auto [r, text] = RunPtworkerStdout("sample --checkpoint " + step2, out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(text, logged + "\n");
  std::tie(r, text) = RunPtworkerStdout(
      "sample --checkpoint " + step2 + " --prompt ' world' --tokens 3", out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(text.rfind(" world", 0), 0u) << text;

  const fs::path weights = dir_ / "m.bin", tok = dir_ / "m_tokenizer.bin";
  const Result exported =
      RunPtworker("export --checkpoint " + step2 + " --llmc " +
                  weights.string() + " --llmc-tokenizer " + tok.string());
  ASSERT_EQ(exported.code, 0) << exported.err;
  const std::string bytes = ReadAll(tok);
  ASSERT_GE(bytes.size(), 1024u);
  int32_t header[4];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240328);
  EXPECT_EQ(header[2], 50257);
  EXPECT_EQ(header[3], 50256);

  fs::remove(log_);
  ASSERT_EQ(RunPtworker(Small() + "--set train.steps=1 --set checkpoint.dir=" +
                        (dir_ / "char").string())
                .code,
            0);
  fs::remove(log_);
  const fs::path char_weights = dir_ / "c.bin", char_tok = dir_ / "c_tok.bin";
  ExpectRefused(RunPtworker("export --checkpoint " +
                            (dir_ / "char/step-00000001").string() +
                            " --llmc " + char_weights.string() +
                            " --llmc-tokenizer " + char_tok.string()),
                "--llmc-tokenizer: checkpoint");
  EXPECT_FALSE(fs::exists(char_weights));
  EXPECT_FALSE(fs::exists(char_tok));
}

// `model`'s checkpoint exported as a Hugging Face folder (dir_/hf1, its
// config.json naming `architecture`), a run started from that folder with
// a learning rate too small to move a weight, its checkpoint exported again
// (dir_/hf2): the same bytes. The first run's checkpoints are in
// dir_/first.
void PtworkerCli::ExpectHuggingFaceRoundTrip(const std::string& model,
                                             const std::string& architecture) {
  const fs::path first = dir_ / "first", second = dir_ / "second";
  const fs::path hf1 = dir_ / "hf1", hf2 = dir_ / "hf2";
  ASSERT_EQ(RunPtworker(model + "--set train.steps=2 --set checkpoint.dir=" +
                        first.string())
                .code,
            0);
  Result r =
      RunPtworker("export --checkpoint " + (first / "step-00000002").string() +
                  " --hf " + hf1.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(ReadAll(hf1 / "config.json").find("\"" + architecture + "\""),
            std::string::npos);
  ASSERT_EQ(RunPtworker(model + "--set model.init_from=hf:" + hf1.string() +
                        " --set train.steps=1 --set train.lr=1e-30 "
                        "--set train.min_lr=1e-30 --set checkpoint.dir=" +
                        second.string())
                .code,
            0);
  r = RunPtworker("export --checkpoint " + (second / "step-00000001").string() +
                  " --hf " + hf2.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string bytes = ReadAll(hf1 / "model.safetensors");
  EXPECT_GT(bytes.size(), 1000u);
  EXPECT_TRUE(bytes == ReadAll(hf2 / "model.safetensors"));
  EXPECT_EQ(ReadAll(hf1 / "config.json"), ReadAll(hf2 / "config.json"));
  fs::remove(log_);
}

// A Llama goes out to a Hugging Face folder and back bit for bit. A spec
// that disagrees with the folder's config.json is refused naming the
// field, and llm.c's format (GPT-2's) refuses the model; nothing written.
TEST_F(PtworkerCli, LlamaGoesOutToAHuggingFaceFolderAndBackBitExactly) {
  ExpectHuggingFaceRoundTrip(
      Small() +
          "--set model.arch=llama --set model.n_head=4 "
          "--set model.n_kv_head=2 --set model.tie_embeddings=false "
          "--set model.rope_theta=500000 ",
      "LlamaForCausalLM");
  Result r = RunPtworker("export --checkpoint " +
                         (dir_ / "first" / "step-00000002").string() +
                         " --llmc " + (dir_ / "m.bin").string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--llmc: the model is model.arch=llama"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "m.bin"));
  // The example's spec says arch gpt.
  ExpectRefused(RunPtworker(Small() + "--set model.init_from=hf:" +
                            (dir_ / "hf1").string() + " --set train.steps=1"),
                "model.arch=gpt in the spec but llama in the Hugging Face "
                "config");
}

// A Llama with experts goes out as Mixtral and back the same way; a spec of
// other experts is refused against the folder's config.
TEST_F(PtworkerCli, MixtralGoesOutToAHuggingFaceFolderAndBackBitExactly) {
  const std::string moe =
      Small() +
      "--set model.arch=llama --set model.n_head=4 --set model.n_kv_head=2 "
      "--set model.tie_embeddings=false --set model.moe.experts=4 "
      "--set model.moe.expert_hidden=32 ";
  ExpectHuggingFaceRoundTrip(moe, "MixtralForCausalLM");
  ExpectRefused(
      RunPtworker(moe + "--set model.init_from=hf:" + (dir_ / "hf1").string() +
                  " --set model.moe.experts=8"),
      "model.moe.experts=8 in the spec but 4 in the Hugging Face "
      "config");
}

// The job's tokenizer goes with a Hugging Face export: for gpt2 a
// tokenizer.json that, opened as hf:, encodes as "gpt2" does; for spm:MODEL
// the model's own bytes as tokenizer.model; for char none, and a line says
// so. --hf-dtype bf16 writes BF16 tensors and says bfloat16; another value
// is one error line naming the flag and its values, exit 2, nothing written.
TEST_F(PtworkerCli, HuggingFaceExportCarriesTheJobsTokenizer) {
  // Shakespeare's first lines: the text of each job, and the SentencePiece
  // model's.
  const fs::path text_path = dir_ / "text.txt";
  std::vector<std::string> lines;
  {
    std::istringstream in(
        ReadAll(fs::path(PT_SOURCE_DIR) / "data/tinyshakespeare.txt"));
    std::ofstream text(text_path);
    for (std::string line; lines.size() < 2000 && std::getline(in, line);) {
      lines.push_back(line);
      text << line << "\n";
    }
  }
  const auto train = [&](const std::string& tokenizer, const fs::path& ckpt) {
    const Result r = RunPtworker(
        Small() + "--set data.tokenizer=" + tokenizer +
        " --set data.path=" + text_path.string() +
        " --set train.steps=1 --set checkpoint.dir=" + ckpt.string());
    fs::remove(log_);
    return r.code;
  };
  const fs::path out = dir_ / "stdout.txt";

  // gpt2, in fp32 and in bf16.
  ASSERT_EQ(train("gpt2", dir_ / "gpt2"), 0);
  const std::string gpt2_step = (dir_ / "gpt2" / "step-00000001").string();
  const fs::path hf = dir_ / "hf_gpt2", bf16 = dir_ / "hf_bf16";
  auto [r, said] = RunPtworkerStdout(
      "export --checkpoint " + gpt2_step + " --hf " + hf.string(), out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(said.find("fp32, tokenizer.json, tokenizer_config.json"),
            std::string::npos)
      << said;
  auto exported = ptrain::OpenTokenizer("hf:" + hf.string(), "test");
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto builtin = ptrain::OpenTokenizer("gpt2", "test");
  ASSERT_TRUE(builtin.ok());
  const std::string sample =
      "It's 10:45 -- \"naïve\" café, Ωmega!\n\n   spaces\ttabs 12345 日本語";
  EXPECT_EQ((*exported)->Encode(sample), (*builtin)->Encode(sample));
  EXPECT_EQ((*exported)->Decode((*builtin)->Encode(sample)), sample);
  const auto config =
      nlohmann::json::parse(ReadAll(hf / "tokenizer_config.json"));
  EXPECT_EQ(config.at("tokenizer_class"), "GPT2Tokenizer");
  EXPECT_EQ(config.at("model_max_length"), 64);  // the example's block_size
  const auto model_config = nlohmann::json::parse(ReadAll(hf / "config.json"));
  EXPECT_EQ(model_config.at("torch_dtype"), "float32");
  // Generation stops at the tokenizer's end of text (GPT-2's published
  // configuration has it begin the text too).
  EXPECT_EQ(model_config.at("eos_token_id"), 50256);
  EXPECT_EQ(model_config.at("bos_token_id"), 50256);

  r = RunPtworker("export --checkpoint " + gpt2_step + " --hf " +
                  bf16.string() + " --hf-dtype bf16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(
      nlohmann::json::parse(ReadAll(bf16 / "config.json")).at("torch_dtype"),
      "bfloat16");
  auto weights =
      ptrain::SafetensorsSource::Open((bf16 / "model.safetensors").string());
  ASSERT_TRUE(weights.ok()) << weights.status();
  for (const ptrain::SafetensorsEntry& e : (*weights)->header().tensors) {
    EXPECT_EQ(e.dtype, ptrain::SafetensorsDtype::kBf16) << e.name;
  }
  EXPECT_EQ(ReadAll(bf16 / "tokenizer.json"), ReadAll(hf / "tokenizer.json"));

  for (const char* bad : {"fp16", "BF16", "\"\""}) {
    const fs::path none = dir_ / "hf_none";
    const Result refused =
        RunPtworker("export --checkpoint " + gpt2_step + " --hf " +
                    none.string() + " --hf-dtype " + bad);
    EXPECT_EQ(refused.code, 2) << refused.err;
    EXPECT_NE(refused.err.find("not one of fp32, bf16"), std::string::npos)
        << refused.err;
    EXPECT_NE(refused.err.find("--hf-dtype="), std::string::npos)
        << refused.err;
    EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1)
        << refused.err;
    EXPECT_FALSE(fs::exists(none));
  }
  const Result llmc_dtype =
      RunPtworker("export --checkpoint " + gpt2_step + " --llmc " +
                  (dir_ / "m.bin").string() + " --hf-dtype bf16");
  EXPECT_EQ(llmc_dtype.code, 2) << llmc_dtype.err;
  EXPECT_NE(llmc_dtype.err.find("--hf-dtype"), std::string::npos)
      << llmc_dtype.err;
  EXPECT_FALSE(fs::exists(dir_ / "m.bin"));

  // spm:MODEL, the model ptrain trains.
  const fs::path model = dir_ / "shakespeare.model";
  size_t next = 0;
  ASSERT_TRUE(ptrain::TrainSentencePiece(
                  [&](std::string* line) {
                    if (next == lines.size()) return false;
                    *line = lines[next++];
                    return true;
                  },
                  400, "bpe", model.string())
                  .ok());
  ASSERT_EQ(train("spm:" + model.string(), dir_ / "spm"), 0);
  const fs::path hf_spm = dir_ / "hf_spm";
  r = RunPtworker("export --checkpoint " +
                  (dir_ / "spm" / "step-00000001").string() + " --hf " +
                  hf_spm.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(ReadAll(hf_spm / "tokenizer.model") == ReadAll(model));
  EXPECT_FALSE(fs::exists(hf_spm / "tokenizer.json"));
  const auto spm_config =
      nlohmann::json::parse(ReadAll(hf_spm / "tokenizer_config.json"));
  EXPECT_EQ(spm_config.at("tokenizer_class"), "LlamaTokenizer");
  EXPECT_EQ(spm_config.at("eos_token"), "</s>");
  // The model's <s> and </s> (TrainSentencePiece: 1 and 2).
  const auto spm_model_config =
      nlohmann::json::parse(ReadAll(hf_spm / "config.json"));
  EXPECT_EQ(spm_model_config.at("bos_token_id"), 1);
  EXPECT_EQ(spm_model_config.at("eos_token_id"), 2);

  // char: no tokenizer files, a line saying so.
  ASSERT_EQ(train("char", dir_ / "char"), 0);
  const fs::path hf_char = dir_ / "hf_char";
  std::tie(r, said) = RunPtworkerStdout(
      "export --checkpoint " + (dir_ / "char" / "step-00000001").string() +
          " --hf " + hf_char.string(),
      out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(said.find("wrote no tokenizer files: the char tokenizer has no "
                      "Hugging Face equivalent"),
            std::string::npos)
      << said;
  EXPECT_TRUE(fs::exists(hf_char / "model.safetensors"));
  EXPECT_FALSE(nlohmann::json::parse(ReadAll(hf_char / "config.json"))
                   .contains("eos_token_id"));
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"}) {
    EXPECT_FALSE(fs::exists(hf_char / name)) << name;
  }
}

// An MFU above 100% is never shown without saying that the peak it
// divides by is too low (here a --peak-gflops far below any CPU's): one
// warning naming the value.
TEST_F(PtworkerCli, MfuAboveOneIsWarnedOnceNamingTheTooLowPeak) {
  std::string args = Small() + "--set train.steps=5 --set train.log_every=1";
  const size_t peak = args.find("--peak-gflops 100 ");
  ASSERT_NE(peak, std::string::npos);
  args.replace(peak, std::string("--peak-gflops 100").size(),
               "--peak-gflops 0.001");
  const Result r = RunPtworker(args);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string warning =
      "is above 100%: --peak-gflops 0.001 is below what this rank reaches";
  const size_t at = r.err.find(warning);
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(warning, at + 1), std::string::npos) << r.err;
}

// CPUs this test may run on: those its ranks share.
int Cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  return CPU_COUNT(&set);
}

// Two ranks of a small model on this machine, unbound (as mpirun leaves
// more than two), `env` set; data-parallel unless `layout` says otherwise.
Result TwoRanks(const std::string& args, const std::string& env,
                const std::string& layout = "--set parallel.dp=2") {
  const fs::path err_file =
      fs::temp_directory_path() /
      ("ptworker_cli_mpi_" + std::to_string(::getpid()) + ".txt");
  return ptrain::testing::RunShell(
      "env " + env + " OMPI_MCA_mpi_yield_when_idle=1 " + MPIEXEC +
          " --allow-run-as-root --oversubscribe --bind-to none --mca btl "
          "self,vader,tcp -n 2 " +
          PTWORKER_PATH + " " + args + " " + layout + " --set train.steps=2",
      err_file.string());
}

// What a run log says: each step's loss, the last evaluation's loss, the
// last sample and the layout's cp.
struct Logged {
  std::vector<double> losses;
  double val_loss = -1;
  std::string sample;
  int cp = 0;
};
Logged ReadLog(const std::string& path) {
  Logged out;
  std::istringstream in(ReadAll(path));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    const std::string type = j.at("type");
    if (type == "step") out.losses.push_back(j.at("loss"));
    if (type == "eval") out.val_loss = j.at("val_loss");
    if (type == "sample") out.sample = j.at("text");
    if (type == "layout") out.cp = j.at("cp");
  }
  return out;
}

// A context-parallel job (cp=2): it trains as one rank does (each step's
// loss and the evaluation's within 1e-5), its layout record and its
// checkpoint's manifest say cp=2, and its sample (drawn on each cp rank
// through the cache, the ring being for training) is the very text one
// rank draws from its checkpoint, loaded at cp=1.
TEST_F(PtworkerCli, ContextParallelRunSamplesAsOneRankDoesFromItsCheckpoint) {
  const fs::path ckpt = dir_ / "ck";
  const std::string sets =
      "--set train.sample_tokens=40 --set resources.threads_per_rank=1 ";
  const Result r =
      TwoRanks(Small() + sets + "--set checkpoint.dir=" + ckpt.string(), "",
               "--set parallel.cp=2");
  ASSERT_EQ(r.code, 0) << r.err;
  const Logged cp2 = ReadLog(log_);
  fs::remove(log_);
  const Result one =
      RunPtworker(Small() + sets + "--set train.steps=2 --set checkpoint.dir=" +
                  (dir_ / "ck1").string());
  ASSERT_EQ(one.code, 0) << one.err;
  const Logged cp1 = ReadLog(log_);
  ASSERT_EQ(cp2.losses.size(), 2u);
  ASSERT_EQ(cp1.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(cp2.losses[i], cp1.losses[i], 1e-5 * cp1.losses[i]) << i;
  }
  ASSERT_GT(cp1.val_loss, 0);
  EXPECT_NEAR(cp2.val_loss, cp1.val_loss, 1e-5 * cp1.val_loss);
  EXPECT_EQ(cp2.cp, 2);
  EXPECT_EQ(cp1.cp, 1);
  const std::string logged = cp2.sample;
  ASSERT_FALSE(logged.empty());
  const std::string step2 = (ckpt / "step-00000002").string();
  const auto manifest =
      nlohmann::json::parse(ReadAll(step2 + "/manifest.json"));
  EXPECT_EQ(manifest.at("layout").at("cp"), 2);
  EXPECT_EQ(manifest.at("layout").at("world"), 2);
  auto [sampled, text] =
      RunPtworkerStdout("sample --checkpoint " + step2, dir_ / "sample.txt");
  ASSERT_EQ(sampled.code, 0) << sampled.err;
  EXPECT_EQ(text, logged + "\n");
}

TEST_F(PtworkerCli, WithoutAThreadCountEachRankTakesItsShareOfTheCores) {
  const Result r = TwoRanks(Small(), "-u OMP_NUM_THREADS");
  ASSERT_EQ(r.code, 0) << r.err;
  const int share = std::max(1, Cores() / 2);
  EXPECT_NE(r.err.find(absl::StrFormat("), %d threads, ", share)),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("oversubscribed"), std::string::npos) << r.err;
}

TEST_F(PtworkerCli, ThreadCountOversubscribingTheCoresIsWarnedWithTheNumbers) {
  const int cores = Cores();
  const Result r =
      TwoRanks(Small(), "OMP_NUM_THREADS=" + std::to_string(cores));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find(absl::StrFormat(
                "threads: 2 rank(s) on this machine x %d threads each "
                "(OMP_NUM_THREADS) = %d threads on %d cores: oversubscribed",
                cores, 2 * cores, cores)),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(absl::StrFormat("set OMP_NUM_THREADS=%d",
                                       std::max(1, cores / 2))),
            std::string::npos)
      << r.err;
}

}  // namespace
