// Checkpoints on one rank: bit-exact resume, fallback past a corrupt or
// damaged checkpoint, a manifest covered by its digest and validated number
// by number, clear refusals that leave the disk untouched, pruning that
// never touches another job's steps, and the llm.c format round trip.
#include "worker/engine/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <xxhash.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/spec.h"
#include "nlohmann/json.hpp"
#include "tests/testing/weights_copy.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Sha256Hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += absl::StrFormat("%02x", md[i]);
  }
  return out;
}

// Rewrites dir/manifest.json through `edit`. With `redigest` its digest is
// recomputed, so only validation stands between the edit and the reader.
void EditManifest(const std::string& dir,
                  const std::function<void(json&)>& edit, bool redigest) {
  json m = json::parse(ReadAll(fs::path(dir) / "manifest.json"));
  edit(m);
  const std::string text = m.dump(1);
  std::ofstream(fs::path(dir) / "manifest.json", std::ios::trunc) << text;
  if (redigest) {
    std::ofstream(fs::path(dir) / "manifest.sha256", std::ios::trunc)
        << Sha256Hex(text) << "  manifest.json\n";
  }
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("ptrain_ckpt_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  v1::JobSpec Spec(int steps, int every, std::vector<std::string> extra = {}) {
    std::vector<std::string> o = {
        "model.n_layer=2",          "model.n_head=2",
        "model.n_embd=24",          "model.block_size=16",
        "train.global_batch=4",     "train.steps=" + std::to_string(steps),
        "train.warmup_steps=3",     "train.lr=3e-3",
        "train.eval_every=0",       "train.eval_batches=1",
        "train.sample_tokens=0",    "checkpoint.every=" + std::to_string(every),
        "checkpoint.keep_last=100", "checkpoint.dir=" + root_.string()};
    o.insert(o.end(), extra.begin(), extra.end());
    auto spec = LoadJobSpecFile("examples/shakespeare-char.yaml", o);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }
  std::unique_ptr<Trainer> Make(const v1::JobSpec& spec,
                                const std::string& resume = "",
                                const std::string& job_uid = "") {
    TrainerOptions opt;
    opt.peak_flops = 1e12;
    opt.quiet = true;
    opt.resume_from = resume;
    opt.job_uid = job_uid;
    auto t = Trainer::Create(spec, opt);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  absl::Status MakeStatus(const v1::JobSpec& spec, const std::string& resume,
                          const std::string& job_uid = "") {
    TrainerOptions opt;
    opt.resume_from = resume;
    opt.job_uid = job_uid;
    return Trainer::Create(spec, opt).status();
  }
  // Checkpoints at steps 5 and 10 of one run.
  void SaveFiveAndTen(const v1::JobSpec& spec) {
    auto t = Make(spec);
    Steps(*t, 0, 5);
    ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(5).ok());
    Steps(*t, 5, 10);
    ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(10).ok());
  }
  // Checkpoint 10 of SaveFiveAndTen is damaged: "latest" falls back to 5,
  // naming it is DataLoss with `needle` in the message, and neither
  // changes the disk.
  void ExpectTenDamaged(const v1::JobSpec& spec, const std::string& needle) {
    const auto before = Snapshot();
    auto resumed = Make(spec, "latest");
    ASSERT_NE(resumed, nullptr);
    EXPECT_EQ(resumed->checkpoints().start_step(), 5);
    const absl::Status s = MakeStatus(spec, StepDir(10));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
    EXPECT_EQ(Snapshot(), before) << "a failed load changed the disk";
  }
  // Runs steps [from, to) and returns their losses.
  std::vector<float> Steps(Trainer& t, int from, int to) {
    std::vector<float> losses;
    for (int s = from; s < to; ++s) losses.push_back(t.TrainStep(s).loss);
    return losses;
  }
  // Every file under root_ with its contents hash: "the disk did not change".
  std::map<std::string, uint64_t> Snapshot() {
    std::map<std::string, uint64_t> out;
    for (const auto& e : fs::recursive_directory_iterator(root_)) {
      if (!e.is_regular_file()) continue;
      std::ifstream in(e.path(), std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), {});
      out[e.path().string()] = XXH64(bytes.data(), bytes.size(), 0);
    }
    return out;
  }
  // Saving step `step` with `t` is refused (FailedPrecondition saying
  // `needle`) and leaves the disk as it was.
  void ExpectSaveRefused(Trainer& t, int step, const std::string& needle) {
    const auto before = Snapshot();
    auto clash = t.checkpoints().SaveCheckpointAt(step);
    EXPECT_EQ(clash.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(clash.status().message().find(needle), std::string::npos)
        << clash.status();
    EXPECT_EQ(Snapshot(), before);
  }
  std::string StepDir(int step) {
    char name[32];
    std::snprintf(name, sizeof(name), "step-%08d", step);
    return (root_ / name).string();
  }
  fs::path root_;
};

TEST_F(CheckpointTest, ResumeOnTheSameLayoutIsBitExact) {
  const v1::JobSpec spec = Spec(40, 20);
  auto straight = Make(spec);
  const std::vector<float> want = Steps(*straight, 0, 40);

  auto first = Make(spec);
  Steps(*first, 0, 20);
  ASSERT_TRUE(first->checkpoints().SaveCheckpointAt(20).ok());
  first.reset();
  auto resumed = Make(spec, "latest");
  ASSERT_EQ(resumed->checkpoints().start_step(), 20);
  const std::vector<float> got = Steps(*resumed, 20, 40);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(got[i], want[20 + i]) << "step " << 21 + i;  // to the last bit
  }
  const auto a = straight->store().FullParams();
  const auto b = resumed->store().FullParams();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// train.anomaly.nan=rollback: a NaN at step 30 (the test hook) rolls the
// run back to its newest checkpoint, step 20, and it goes on past the ten
// steps of data since. From there it trains exactly — to the bit — as a
// run resumed from that checkpoint with those ten steps skipped, and its
// later checkpoints carry the skip.
TEST_F(CheckpointTest, NanRollsBackToTheCheckpointAndSkipsItsDataWindow) {
  const v1::JobSpec spec = Spec(40, 10, {"train.anomaly.nan=rollback"});
  TrainerOptions opt;
  opt.peak_flops = 1e12;
  opt.quiet = true;
  opt.nan_at_step = 30;
  fs::create_directories(root_);
  opt.log_json_path = (root_ / "run.jsonl").string();
  auto run = Trainer::Create(spec, opt);
  ASSERT_TRUE(run.ok()) << run.status();
  const absl::Status ran = (*run)->Run();
  ASSERT_TRUE(ran.ok()) << ran;
  std::vector<float> after;  // the losses of steps 21..40 after the rollback
  int rollbacks = 0;
  std::ifstream log(root_ / "run.jsonl");
  for (std::string line; std::getline(log, line);) {
    const json r = json::parse(line);
    if (r["type"] == "rollback") {
      ++rollbacks;
      EXPECT_EQ(r["step"], 30);
      EXPECT_EQ(r["to_step"], 20);
      EXPECT_EQ(r["skipped_steps"], 10);
      EXPECT_EQ(r["dir"], StepDir(20));
      EXPECT_NE(r["reason"].get<std::string>().find("loss nan at step 30"),
                std::string::npos)
          << r;
    } else if (r["type"] == "step" && rollbacks == 1) {
      after.push_back(r["loss"].get<float>());
    }
  }
  ASSERT_EQ(rollbacks, 1);
  ASSERT_EQ(after.size(), 20u);
  EXPECT_EQ((*run)->feed().skipped_steps(), 10);

  auto resumed = Make(Spec(40, 0), StepDir(20));
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->feed().skipped_steps(), 0);  // that checkpoint had none
  resumed->feed().SkipData(10);
  const std::vector<float> want = Steps(*resumed, 20, 40);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(after[i], want[i]) << "step " << 21 + i;  // to the last bit
  }
  const json manifest =
      json::parse(ReadAll(fs::path(StepDir(40)) / "manifest.json"));
  EXPECT_EQ(manifest["sampler"]["skipped_steps"], 10);
  EXPECT_EQ(Make(Spec(40, 0), StepDir(30))->feed().skipped_steps(), 10);
}

// A run resumed from an older checkpoint (step 10) of a folder that holds
// newer ones of an earlier run (20..40) rolls back, at a NaN at step 12,
// to the checkpoint its own history came through (10), never forward to
// the folder's newest: the skip is 2 steps, never negative, and every
// checkpoint it writes afterwards loads.
TEST_F(CheckpointTest, RollbackReturnsAlongItsOwnHistoryNeverForward) {
  {
    auto first = Make(Spec(40, 10));
    ASSERT_NE(first, nullptr);
    ASSERT_TRUE(first->Run().ok());
  }
  ASSERT_TRUE(fs::exists(StepDir(40)));
  const v1::JobSpec spec = Spec(80, 10, {"train.anomaly.nan=rollback"});
  TrainerOptions opt;
  opt.peak_flops = 1e12;
  opt.quiet = true;
  opt.nan_at_step = 12;
  opt.resume_from = StepDir(10);
  opt.log_json_path = (root_ / "run.jsonl").string();
  auto run = Trainer::Create(spec, opt);
  ASSERT_TRUE(run.ok()) << run.status();
  const absl::Status ran = (*run)->Run();
  ASSERT_TRUE(ran.ok()) << ran;
  int rollbacks = 0;
  std::ifstream log(root_ / "run.jsonl");
  for (std::string line; std::getline(log, line);) {
    const json r = json::parse(line);
    if (r["type"] != "rollback") continue;
    ++rollbacks;
    EXPECT_EQ(r["step"], 12);
    EXPECT_EQ(r["to_step"], 10);
    EXPECT_EQ(r["dir"], StepDir(10));
    EXPECT_EQ(r["skipped_steps"], 2);
  }
  EXPECT_EQ(rollbacks, 1);
  EXPECT_EQ((*run)->feed().skipped_steps(), 2);
  for (int step = 10; step <= 80; step += 10) {
    auto back = Make(Spec(80, 0), StepDir(step));
    ASSERT_NE(back, nullptr) << StepDir(step);
    EXPECT_EQ(back->feed().skipped_steps(), step > 40 ? 2 : 0) << StepDir(step);
  }
  auto latest = Make(Spec(90, 0), "latest");
  ASSERT_NE(latest, nullptr);
  EXPECT_EQ(latest->checkpoints().start_step(), 80);
}

// The writer checks a manifest as its reader will before it commits it: a
// value the reader refuses (a negative data skip) fails the save, and no
// step folder appears that every later resume would skip as damaged.
TEST_F(CheckpointTest, ACheckpointItsReaderWouldRefuseIsNeverCommitted) {
  auto t = Make(Spec(10, 0));
  ASSERT_NE(t, nullptr);
  Steps(*t, 0, 5);
  t->feed().SkipData(-3);
  auto saved = t->checkpoints().SaveCheckpointAt(5);
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kInternal)
      << saved.status();
  EXPECT_NE(saved.status().message().find("skipped_steps"), std::string::npos)
      << saved.status();
  EXPECT_FALSE(fs::exists(StepDir(5)));
  auto listed = ListCheckpoints(root_.string(), ConfinedFs());
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
}

// nan=stop fails the run at the bad step, before its checkpoint, saying
// why; rollbacks beyond max_rollbacks do too.
TEST_F(CheckpointTest, NanStopsTheRunOrExhaustsItsRollbacks) {
  for (const std::string policy : {"stop", "rollback"}) {
    fs::remove_all(root_);
    TrainerOptions opt;
    opt.peak_flops = 1e12;
    opt.quiet = true;
    opt.nan_at_step = 15;
    auto run = Trainer::Create(
        Spec(20, 10,
             {"train.anomaly.nan=" + policy, "train.anomaly.max_rollbacks=0"}),
        opt);
    ASSERT_TRUE(run.ok()) << run.status();
    const absl::Status s = (*run)->Run();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << policy;
    EXPECT_NE(s.message().find("loss nan at step 15"), std::string::npos) << s;
    EXPECT_NE(
        s.message().find(policy == "stop" ? "train.anomaly.nan=stop"
                                          : "train.anomaly.max_rollbacks=0"),
        std::string::npos)
        << s;
    EXPECT_FALSE(fs::exists(StepDir(20))) << policy;
  }
}

// Under bf16 the matmuls read the store's bf16 compute copy of the weights:
// wherever they may (after initialisation, after optimizer steps, which
// write it, after a save, after a resume loaded the weights) each unit's
// copy is its fp32 master weights rounded to nearest even; and a bf16
// resume stays bit-exact. (ZeRO 1-3, which need MPI: the reshard test.)
TEST_F(CheckpointTest, Bf16WeightsCopyIsTheMasterRoundedWhereverItIsRead) {
  if (!kernels::CpuHasBf16()) GTEST_SKIP() << "no bf16 instructions here";
  const v1::JobSpec spec = Spec(6, 0, {"train.precision=bf16"});
  auto t = Make(spec);
  ASSERT_NE(t, nullptr);
  testing::ExpectWeightsCopyIsTheRoundedMaster(t->store(), "initialised");
  const std::vector<float> want = Steps(*t, 0, 6);
  testing::ExpectWeightsCopyIsTheRoundedMaster(t->store(), "after 6 steps");

  auto first = Make(spec);
  Steps(*first, 0, 3);
  ASSERT_TRUE(first->checkpoints().SaveCheckpointAt(3).ok());
  testing::ExpectWeightsCopyIsTheRoundedMaster(first->store(), "after a save");
  first.reset();
  auto resumed = Make(spec, StepDir(3));
  ASSERT_NE(resumed, nullptr);
  testing::ExpectWeightsCopyIsTheRoundedMaster(resumed->store(), "resumed");
  const std::vector<float> got = Steps(*resumed, 3, 6);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], want[3 + i]) << 4 + i;
}

// checkpoint.async_save: the shard written in the background holds the
// state of the step it was started at, byte for byte what a blocking save
// of that step writes, although training goes on meanwhile (the thread
// pauses halfway, so the steps after it change the live state before the
// second half is written), and resuming from it is bit-exact.
TEST_F(CheckpointTest, BackgroundSaveWritesItsStepWhileTrainingGoesOn) {
  const v1::JobSpec spec = Spec(20, 0, {"checkpoint.async_save=true"});
  auto straight = Make(spec);
  const std::vector<float> want = Steps(*straight, 0, 20);

  TrainerOptions opt;
  opt.peak_flops = 1e12;
  opt.quiet = true;
  opt.save.pause_mid_write_s = 0.5;
  auto t = Trainer::Create(spec, opt);
  ASSERT_TRUE(t.ok()) << t.status();
  Steps(**t, 0, 10);
  auto started = (*t)->checkpoints().StartCheckpointAt(10);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_FALSE(*started);
  EXPECT_TRUE((*t)->checkpoints().background_checkpoint_pending());
  EXPECT_FALSE(fs::exists(StepDir(10))) << "committed before it was written";
  Steps(**t, 10, 15);  // while the thread sleeps halfway through the shard
  auto dir = (*t)->checkpoints().FinishBackgroundCheckpoint();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, StepDir(10));
  EXPECT_FALSE((*t)->checkpoints().background_checkpoint_pending());
  EXPECT_FALSE(fs::exists(StepDir(10) + ".tmp"));

  // The same step saved blocking, by a twin run, into another folder.
  const fs::path other = root_ / "blocking";
  auto twin = Make(Spec(20, 0, {"checkpoint.dir=" + other.string()}));
  Steps(*twin, 0, 10);
  auto blocking = twin->checkpoints().SaveCheckpointAt(10);
  ASSERT_TRUE(blocking.ok()) << blocking.status();
  const std::string shard = ReadAll(fs::path(*dir) / "shard-00000.bin");
  EXPECT_FALSE(shard.empty());
  EXPECT_TRUE(shard == ReadAll(fs::path(*blocking) / "shard-00000.bin"))
      << "the background shard differs from the blocking one";
  const json a = json::parse(ReadAll(fs::path(*dir) / "manifest.json"));
  const json b = json::parse(ReadAll(fs::path(*blocking) / "manifest.json"));
  EXPECT_EQ(a.at("tensors"), b.at("tensors"));
  EXPECT_EQ(a.at("files"), b.at("files"));

  auto resumed = Make(spec, *dir);
  ASSERT_NE(resumed, nullptr);
  ASSERT_EQ(resumed->checkpoints().start_step(), 10);
  const std::vector<float> got = Steps(*resumed, 10, 20);
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(got[i], want[10 + i]) << "step " << 11 + i;  // to the last bit
  }
}

// A blocking save (the run's last) commits a background one still pending
// first; a background save of a step this job committed already writes
// nothing and leaves nothing pending.
TEST_F(CheckpointTest, BackgroundSaveIsCommittedBeforeTheNextAndNotRepeated) {
  const v1::JobSpec spec = Spec(20, 0, {"checkpoint.async_save=true"});
  auto t = Make(spec);
  Steps(*t, 0, 3);
  auto started = t->checkpoints().StartCheckpointAt(3);
  ASSERT_TRUE(started.ok() && !*started) << started.status();
  Steps(*t, 3, 4);
  ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(4).ok());
  EXPECT_FALSE(t->checkpoints().background_checkpoint_pending());
  auto all = ListCheckpoints(root_.string());
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, (std::vector<std::string>{StepDir(4), StepDir(3)}));
  const auto before = Snapshot();
  auto again = t->checkpoints().StartCheckpointAt(3);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again);
  EXPECT_FALSE(t->checkpoints().background_checkpoint_pending());
  EXPECT_EQ(Snapshot(), before);
}

// TrainerOptions::stop_requested (ptworker's SIGUSR1): the run ends at the
// end of the step during which it was set, after a checkpoint of that step
// (blocking even under async_save), which a resume goes on from.
TEST_F(CheckpointTest, StopRequestSavesItsStepAndEndsTheRun) {
  const v1::JobSpec spec = Spec(20, 10, {"checkpoint.async_save=true"});
  const std::atomic<bool> stop{true};
  TrainerOptions opt;
  opt.peak_flops = 1e12;
  opt.quiet = true;
  opt.stop_requested = &stop;
  opt.log_json_path = (root_ / "run.jsonl").string();
  fs::create_directories(root_);
  auto t = Trainer::Create(spec, opt);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Run().ok());
  EXPECT_TRUE((*t)->stopped());
  EXPECT_FALSE((*t)->checkpoints().background_checkpoint_pending());
  auto all = ListCheckpoints(root_.string());
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, std::vector<std::string>{StepDir(1)});
  const std::string log = ReadAll(root_ / "run.jsonl");
  EXPECT_NE(log.find(R"("type":"stop")"), std::string::npos) << log;
  auto resumed = Make(spec, "latest");
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->checkpoints().start_step(), 1);
}

TEST_F(CheckpointTest, ManifestIndexesEveryTensorWithShapeAndChecksums) {
  auto t = Make(Spec(2, 0));
  Steps(*t, 0, 2);
  auto dir = t->checkpoints().SaveCheckpointAt(2);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, StepDir(2));
  EXPECT_FALSE(fs::exists(StepDir(2) + ".tmp"));
  auto reader = CheckpointReader::Open(*dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->meta().step, 2);
  EXPECT_EQ((*reader)->meta().optimizer_step, 2);
  EXPECT_EQ((*reader)->meta().tokens_seen, 2 * 4 * 16);
  EXPECT_EQ((*reader)->meta().vocab.size(), 65u);
  EXPECT_TRUE((*reader)
                  ->CheckCompatible(t->model().config(), t->store().layout())
                  .ok());
  // The manifest's digest, in sha256sum's format, is the last file written.
  EXPECT_EQ(
      ReadAll(StepDir(2) + "/manifest.sha256"),
      Sha256Hex(ReadAll(StepDir(2) + "/manifest.json")) + "  manifest.json\n");
  // Every element of every weight reads back as it is in memory.
  const auto full = t->store().FullParams();
  for (const ParamInfo& p : t->store().layout()) {
    // One rank: the whole tensor is its one box (wte's padding rows, which
    // follow it, are not in checkpoints).
    const Box whole = WholeBox(p.global_shape);
    std::vector<float> got(whole.numel());
    ASSERT_TRUE((*reader)->Read(p.name, whole, got.data()).ok());
    ASSERT_EQ(0, std::memcmp(got.data(), full.data() + p.offset,
                             got.size() * sizeof(float)))
        << p.name;
  }
}

TEST_F(CheckpointTest, FlippedByteMakesLatestFallBackAndExplicitDirFail) {
  const v1::JobSpec spec = Spec(10, 5);
  auto t = Make(spec);
  Steps(*t, 0, 5);
  ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(5).ok());
  Steps(*t, 5, 10);
  ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(10).ok());
  {
    std::fstream f(StepDir(10) + "/shard-00000.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1234);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(1234);
    f.write(&c, 1);
  }
  ExpectTenDamaged(spec, "checksum mismatch");
}

TEST_F(CheckpointTest, FolderWithoutManifestIsNotACommittedCheckpoint) {
  fs::create_directories(root_ / "step-00000007.tmp");
  std::ofstream(root_ / "step-00000007.tmp" / "shard-00000.bin") << "partial";
  const absl::Status s =
      MakeStatus(Spec(10, 5), (root_ / "step-00000007.tmp").string());
  EXPECT_NE(s.message().find("is not a committed checkpoint"),
            std::string::npos)
      << s;
  // `latest` ignores the uncommitted folder and starts fresh.
  auto t = Make(Spec(10, 5), "latest");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->checkpoints().start_step(), 0);
}

TEST_F(CheckpointTest, LatestWithoutACheckpointFolderStartsFresh) {
  // ptcoord passes --resume-from latest to every job, with or without one.
  auto t = Make(Spec(2, 0, {"checkpoint.dir=''"}), "latest");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->checkpoints().start_step(), 0);
}

TEST_F(CheckpointTest, OtherModelShapeNamesTheFirstMismatchingTensor) {
  auto t = Make(Spec(2, 0));
  Steps(*t, 0, 2);
  ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(2).ok());
  const auto before = Snapshot();
  const absl::Status s =
      MakeStatus(Spec(4, 0, {"model.n_embd=32"}), StepDir(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("tensor wte has shape [65, 24] in the checkpoint "
                             "but [65, 32] in the model"),
            std::string::npos)
      << s;
  const absl::Status deeper =
      MakeStatus(Spec(4, 0, {"model.n_layer=3"}), StepDir(2));
  EXPECT_NE(deeper.message().find("it has no tensor h.2.ln_1.weight"),
            std::string::npos)
      << deeper;
  // `latest` skips it (standalone runs of several models share folders).
  auto fresh = Make(Spec(4, 0, {"model.n_embd=32"}), "latest");
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(fresh->checkpoints().start_step(), 0);
  EXPECT_EQ(Snapshot(), before);
}

TEST_F(CheckpointTest, KeepLastPrunesOnlyAfterCommit) {
  const v1::JobSpec spec = Spec(8, 2, {"checkpoint.keep_last=2"});
  TrainerOptions opt;
  opt.peak_flops = 1e12;
  opt.quiet = true;
  auto t = Trainer::Create(spec, opt);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Run().ok());
  const auto all = ListCheckpoints(root_.string());
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0], StepDir(8));
  EXPECT_EQ((*all)[1], StepDir(6));
}

TEST_F(CheckpointTest, LlmcExportThenInitFromGivesIdenticalWeights) {
  auto t = Make(Spec(3, 0));
  Steps(*t, 0, 3);
  auto dir = t->checkpoints().SaveCheckpointAt(3);
  ASSERT_TRUE(dir.ok());
  auto reader = CheckpointReader::Open(*dir);
  ASSERT_TRUE(reader.ok());
  const std::string bin = (root_ / "model.bin").string();
  ASSERT_TRUE(ExportLlmc(**reader, (*reader)->meta().model, bin).ok());
  // Header as llm.c writes it; vocabulary padded to 128.
  std::ifstream in(bin, std::ios::binary);
  int32_t h[256];
  in.read(reinterpret_cast<char*>(h), sizeof(h));
  EXPECT_EQ(h[0], 20240326);
  EXPECT_EQ(h[1], 3);
  EXPECT_EQ(h[3], 65);
  EXPECT_EQ(h[7], 128);

  auto loaded = Make(Spec(3, 0, {"model.init_from=llmc:" + bin}));
  ASSERT_NE(loaded, nullptr);
  const auto a = t->store().FullParams(), b = loaded->store().FullParams();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));

  // The file stores wte padded to 128 rows and wpe for its own maximum
  // length; a reader serves the model's tensors only: rows past the
  // vocabulary are no part of wte.
  auto src = LlmcSource::Open(bin, (*reader)->meta().model);
  ASSERT_TRUE(src.ok()) << src.status();
  const int64_t C = (*reader)->meta().model.n_embd;
  std::vector<float> row(C);
  EXPECT_TRUE((*src)->Read("wte", Box{{64, 0}, {65, C}}, row.data()).ok());
  EXPECT_EQ((*src)->Read("wte", Box{{65, 0}, {66, C}}, row.data()).code(),
            absl::StatusCode::kNotFound);

  const absl::Status wrong = MakeStatus(
      Spec(3, 0, {"model.init_from=llmc:" + bin, "model.n_layer=3"}), "");
  EXPECT_NE(wrong.message().find("has n_layer=2 but the model has 3"),
            std::string::npos)
      << wrong;
}

TEST_F(CheckpointTest, ManifestWithoutItsDigestIsDamagedAndLatestFallsBack) {
  const v1::JobSpec spec = Spec(10, 5);
  SaveFiveAndTen(spec);
  fs::remove(StepDir(10) + "/manifest.sha256");
  ExpectTenDamaged(spec, "checkpoint " + StepDir(10) +
                             " is damaged: it has no manifest.sha256");
}

TEST_F(CheckpointTest, ManifestEditedWithoutItsDigestIsDamaged) {
  const v1::JobSpec spec = Spec(10, 5);
  SaveFiveAndTen(spec);
  EditManifest(
      StepDir(10), [](json& m) { m["tokens_seen"] = 1; }, false);
  ExpectTenDamaged(
      spec, "manifest.json does not match its SHA-256 in manifest.sha256");
}

// Swaps where two tensors' data lie in the shard file.
void SwapOffsets(json& m, const std::string& a, const std::string& b) {
  json& sa = m["tensors"][a]["shards"][0]["offset"];
  json& sb = m["tensors"][b]["shards"][0]["offset"];
  std::swap(sa, sb);
}

TEST_F(CheckpointTest, SwappedTensorOffsetsAreDetected) {
  const v1::JobSpec spec = Spec(10, 5);
  SaveFiveAndTen(spec);
  // Same size: only the digest can tell, and it does.
  EditManifest(
      StepDir(10),
      [](json& m) { SwapOffsets(m, "h.0.ln_1.weight", "h.0.ln_1.bias"); },
      false);
  absl::Status s = MakeStatus(spec, StepDir(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("does not match its SHA-256"), std::string::npos)
      << s;
  // Different sizes, digest recomputed: the tensors no longer tile the
  // shard file, and validation says so.
  EditManifest(
      StepDir(5), [](json& m) { SwapOffsets(m, "wte", "h.0.ln_1.bias"); },
      true);
  s = MakeStatus(spec, StepDir(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("is damaged: shard-00000.bin: "),
            std::string::npos)
      << s;
}

// Every class of bad number in a manifest whose digest is correct: the
// reader refuses it before reading any shard, naming the field and the rule.
TEST_F(CheckpointTest, EveryBadManifestNumberIsRefusedBeforeAnyRead) {
  const v1::JobSpec spec = Spec(2, 0);
  {
    auto t = Make(spec);
    Steps(*t, 0, 2);
    ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(2).ok());
  }
  const std::string pristine = StepDir(2);
  const json m0 = json::parse(ReadAll(fs::path(pristine) / "manifest.json"));
  const int64_t shard_bytes = m0["files"]["shard-00000.bin"]["bytes"];
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* expect;
  };
  auto file = [](json& m) -> json& { return m["files"]["shard-00000.bin"]; };
  auto wte = [](json& m) -> json& { return m["tensors"]["wte"]["shards"][0]; };
  const std::vector<Case> cases = {
      {"chunk_bytes 0", [&](json& m) { file(m)["chunk_bytes"] = 0; },
       "files.shard-00000.bin.chunk_bytes=0 is outside [4096, 16777216]"},
      {"chunk_bytes negative",
       [&](json& m) { file(m)["chunk_bytes"] = -65536; },
       "chunk_bytes=-65536 is outside"},
      {"chunk_bytes a double",
       [&](json& m) { file(m)["chunk_bytes"] = 65536.0; },
       "chunk_bytes=65536 is not an integer"},
      {"malformed hash",
       [&](json& m) { file(m)["xxh64_chunks"][0] = "not-a-hash"; },
       "xxh64_chunks[0] is not 16 lowercase hex digits"},
      {"hash a number", [&](json& m) { file(m)["xxh64_chunks"][0] = 7; },
       "xxh64_chunks[0] is not 16 lowercase hex digits"},
      {"too few hashes", [&](json& m) { file(m)["xxh64_chunks"].erase(0); },
       "xxh64_chunks must be a list of"},
      {"offset 1e15", [&](json& m) { wte(m)["offset"] = 1000000000000000LL; },
       "tensors.wte.shards[0].offset=1000000000000000 is outside"},
      {"offset 1e15 as a double", [&](json& m) { wte(m)["offset"] = 1e15; },
       "tensors.wte.shards[0].offset=1e+15 is not an integer"},
      {"offset near the end of the shard",
       [&](json& m) { wte(m)["offset"] = shard_bytes - 4; },
       "are not whole floats inside shard-00000.bin"},
      {"offset not a float boundary", [&](json& m) { wte(m)["offset"] = 2; },
       "are not whole floats"},
      {"negative box start", [&](json& m) { wte(m)["box"][0][0] = -1; },
       "tensors.wte.shards[0].box[0][0]=-1 is outside"},
      {"box start past the tensor",
       [&](json& m) { wte(m)["box"][1][0] = 1 << 30; },
       "tensors.wte.shards[0].box[1][0]=1073741824 is outside"},
      {"empty box",
       [&](json& m) {
         wte(m)["box"][0] = {5, 5};
       },
       "tensors.wte.shards[0].box[0][1]=5 is outside [6, 65]"},
      {"box end past the tensor", [&](json& m) { wte(m)["box"][1][1] = 25; },
       "tensors.wte.shards[0].box[1][1]=25 is outside [1, 24]"},
      {"box of the wrong rank", [&](json& m) { wte(m)["box"].erase(1); },
       "tensors.wte.shards[0].box must be a list of 2 [lo, hi] pairs"},
      {"box bound a double", [&](json& m) { wte(m)["box"][0][1] = 65.0; },
       "box[0][1]=65 is not an integer"},
      {"a shard missing (a gap)",
       [&](json& m) { m["tensors"]["wte"]["shards"].erase(0); },
       "tensors.wte.shards must tile [65, 24] exactly: the boxes cover 0 of "
       "the tensor's 1560 elements"},
      {"a shard twice (an overlap)",
       [&](json& m) {
         m["tensors"]["wte"]["shards"].push_back(
             m["tensors"]["wte"]["shards"][0]);
       },
       "tensors.wte.shards must tile [65, 24] exactly: boxes [0:65, 0:24] "
       "and [0:65, 0:24] overlap"},
      {"shape larger than its shards",
       [&](json& m) { m["tensors"]["wte"]["shape"][0] = 66; },
       "the boxes cover 1560 of the tensor's 1584 elements"},
      {"shape with a zero",
       [&](json& m) { m["tensors"]["wte"]["shape"][0] = 0; },
       "tensors.wte.shape[0]=0 is outside"},
      {"file size differs from the manifest",
       [&](json& m) { file(m)["bytes"] = shard_bytes + 4; },
       "shard-00000.bin: its tensors end at byte"},
      {"file outside the folder",
       [&](json& m) {
         m["files"]["../../etc/passwd"] = file(m);
         m["files"].erase("shard-00000.bin");
       },
       "files has '../../etc/passwd', not shard-RRRRR.bin"},
      {"shard of an unknown file",
       [&](json& m) { wte(m)["file"] = "shard-00001.bin"; },
       "tensors.wte.shards[0].file='shard-00001.bin' is not in files"},
      {"negative step", [&](json& m) { m["step"] = -5; },
       "step=-5 is outside [0, 281474976710656]"},
      {"huge step", [&](json& m) { m["step"] = 1e30; },
       "step=1e+30 is not an integer"},
      {"step beyond int64",
       [&](json& m) { m["step"] = 18446744073709551615ULL; },
       "step=18446744073709551615 is outside"},
      {"step of another folder", [&](json& m) { m["step"] = 3; },
       "it is folder step-00000002 but its manifest has step=3"},
      {"negative tokens_seen", [&](json& m) { m["tokens_seen"] = -1; },
       "tokens_seen=-1 is outside"},
      {"optimizer_step past step", [&](json& m) { m["optimizer_step"] = 3; },
       "optimizer_step=3 is outside [0, 2]"},
      {"layout degree zero", [&](json& m) { m["layout"]["dp"] = 0; },
       "layout.dp=0 is outside"},
      {"layout world inconsistent", [&](json& m) { m["layout"]["world"] = 2; },
       "layout.world=2 is not layout.dp"},
      {"model number a string", [&](json& m) { m["model"]["n_layer"] = "2"; },
       "model.n_layer is string, not an integer"},
      {"model heads do not divide", [&](json& m) { m["model"]["n_head"] = 5; },
       "model.n_head=5 does not divide model.n_embd=24"},
      {"model other than its tensors'",
       [&](json& m) { m["model"]["n_embd"] = 32; },
       "its tensors do not match its own model"},
      {"more layers than tensors",
       [&](json& m) { m["model"]["n_layer"] = 65536; },
       "model.n_layer=65536 needs 2359308 tensors"},
      {"missing section", [&](json& m) { m.erase("files"); },
       "files is missing"},
      {"not an object",
       [&](json& m) {
         m = json::array({1, 2});
       },
       "the manifest is not an object"},
      {"job_uid not a string", [&](json& m) { m["job_uid"] = 5; },
       "job_uid is number, not a string"},
      {"data_digest not a hash", [&](json& m) { m["data_digest"] = "12ab"; },
       "data_digest is not 16 lowercase hex digits"},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string dir =
        (root_ / ("case" + std::to_string(n++)) / "step-00000002").string();
    fs::create_directories(fs::path(dir).parent_path());
    fs::copy(pristine, dir);
    EditManifest(dir, c.edit, true);
    auto r = CheckpointReader::Open(dir);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << c.what;
    EXPECT_EQ(r.status().message().find("checkpoint " + dir + " is damaged: "),
              0u)
        << c.what << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.what << ": " << r.status();
  }
  // The pristine one itself reads.
  EXPECT_TRUE(CheckpointReader::Open(pristine).ok());
}

TEST_F(CheckpointTest, NegativeOrHugeStepIsDamagedAndLatestFallsBack) {
  const v1::JobSpec spec = Spec(10, 5);
  for (const json& step : {json(-5), json(1e30)}) {
    fs::remove_all(root_);
    SaveFiveAndTen(spec);
    EditManifest(
        StepDir(10), [&](json& m) { m["step"] = step; }, true);
    auto resumed = Make(spec, "latest");
    ASSERT_NE(resumed, nullptr);
    EXPECT_EQ(resumed->checkpoints().start_step(), 5) << step;
    const absl::Status s = MakeStatus(spec, StepDir(10));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  }
}

TEST_F(CheckpointTest, ModelSettingThatShapesDoNotShowIsChecked) {
  const v1::JobSpec spec = Spec(2, 0);
  auto t = Make(spec);
  ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(0).ok());
  auto reader = CheckpointReader::Open(StepDir(0));
  ASSERT_TRUE(reader.ok()) << reader.status();
  GptConfig other = t->model().config();
  other.n_head = 4;  // same tensor shapes, other attention
  const absl::Status s = (*reader)->CheckCompatible(other, t->store().layout());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(
      s.message().find("model.n_head=2 in the checkpoint but 4 in the model"),
      std::string::npos)
      << s;
}

// A Mixture-of-Experts checkpoint records its experts; a model with other
// experts (or none) refuses it naming them, before any tensor's name.
TEST_F(CheckpointTest, ACheckpointOfOtherExpertsIsRefusedNamingThem) {
  const v1::JobSpec spec =
      Spec(2, 0, {"model.moe.experts=4", "model.moe.expert_hidden=16"});
  auto t = Make(spec);
  ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(0).ok());
  auto reader = CheckpointReader::Open(StepDir(0));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)
                  ->CheckCompatible(t->model().config(), t->store().layout())
                  .ok());
  GptConfig other = t->model().config();
  other.moe.experts = 8;
  const absl::Status s = (*reader)->CheckCompatible(other, t->store().layout());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("model.moe.experts=4, shared_experts=0, "
                             "expert_hidden=16 and every=1 in the checkpoint "
                             "but 8, 0, 16 and 1 in the model"),
            std::string::npos)
      << s;
}

// model.moe.every: the manifest records it, a model of it resumes the
// checkpoint, and one with MoE MLPs in other blocks is refused, naming it.
TEST_F(CheckpointTest, ACheckpointOfMoeInOtherBlocksIsRefusedNamingEvery) {
  const v1::JobSpec spec =
      Spec(2, 0,
           {"model.moe.experts=4", "model.moe.expert_hidden=16",
            "model.moe.every=2"});
  auto t = Make(spec);
  ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(0).ok());
  auto reader = CheckpointReader::Open(StepDir(0));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->meta().model.moe.every, 2);
  EXPECT_TRUE((*reader)
                  ->CheckCompatible(t->model().config(), t->store().layout())
                  .ok());
  GptConfig other = t->model().config();
  other.moe.every = 1;
  const absl::Status s = (*reader)->CheckCompatible(other, t->store().layout());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("every=2 in the checkpoint but 4, 0, 16 and 1 in "
                             "the model"),
            std::string::npos)
      << s;
}

// Qwen3's attention: the manifest records head_dim and qk_norm, a model of
// them resumes the checkpoint, and one of other heads or without the norms
// is refused naming them, before any tensor's shape or name.
TEST_F(CheckpointTest, ACheckpointOfOtherHeadsOrNormsIsRefusedNamingThem) {
  const v1::JobSpec spec = Spec(
      2, 0, {"model.arch=llama", "model.head_dim=16", "model.qk_norm=true"});
  auto t = Make(spec);
  ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(0).ok());
  auto reader = CheckpointReader::Open(StepDir(0));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->meta().model.head_dim, 16);
  EXPECT_TRUE((*reader)->meta().model.qk_norm);
  EXPECT_TRUE((*reader)
                  ->CheckCompatible(t->model().config(), t->store().layout())
                  .ok());
  for (auto [edit, want] :
       std::vector<std::pair<std::function<void(GptConfig&)>, std::string>>{
           {[](GptConfig& c) { c.head_dim = 0; },
            "heads of 16 channels (model.head_dim) and model.qk_norm=true in "
            "the checkpoint but 12 and true in the model"},
           {[](GptConfig& c) { c.qk_norm = false; },
            "heads of 16 channels (model.head_dim) and model.qk_norm=true in "
            "the checkpoint but 16 and false in the model"}}) {
    GptConfig other = t->model().config();
    edit(other);
    const absl::Status s =
        (*reader)->CheckCompatible(other, t->store().layout());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
  }
  // Resumed from it: the same tensors, bit for bit.
  auto resumed = Make(spec, StepDir(0));
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->checkpoints().start_step(), 0);
}

// balance: bias: the manifest records the rate (the model reads the bias
// with it), the biases are tensors of the checkpoint, and a model balanced
// by the loss alone is refused a checkpoint without them.
TEST_F(CheckpointTest, TheSelectionBiasIsSavedWithItsRate) {
  const v1::JobSpec spec =
      Spec(2, 0,
           {"model.moe.experts=4", "model.moe.expert_hidden=16",
            "model.moe.balance=bias", "model.moe.bias_update_rate=0.5"});
  auto t = Make(spec);
  ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(0).ok());
  auto reader = CheckpointReader::Open(StepDir(0));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->meta().model.moe.bias);
  EXPECT_EQ((*reader)->meta().model.moe.bias_rate, 0.5f);
  EXPECT_TRUE((*reader)
                  ->CheckCompatible(t->model().config(), t->store().layout())
                  .ok());
  auto aux =
      Make(Spec(2, 0, {"model.moe.experts=4", "model.moe.expert_hidden=16"}));
  ASSERT_TRUE(aux->checkpoints().SaveCheckpointAt(1).ok());
  auto plain = CheckpointReader::Open(StepDir(1));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE((*plain)->meta().model.moe.bias);
  const absl::Status s =
      (*plain)->CheckCompatible(t->model().config(), t->store().layout());
  EXPECT_NE(s.message().find("has no tensor h.0.mlp.router.expert_bias"),
            std::string::npos)
      << s;
}

// model.tie_embeddings=false: the head's own table is saved and resumed
// with the rest, bit for bit; a tied model refuses the checkpoint (whose
// tensors it would all find) and the untied one a tied checkpoint, naming
// the field; llm.c's format, which ties the head, refuses to export it.
TEST_F(CheckpointTest, AnUntiedHeadResumesAndIsNotTakenForATiedOne) {
  const v1::JobSpec spec = Spec(6, 0, {"model.tie_embeddings=false"});
  auto straight = Make(spec);
  const std::vector<float> want = Steps(*straight, 0, 6);
  auto first = Make(spec);
  Steps(*first, 0, 3);
  auto dir = first->checkpoints().SaveCheckpointAt(3);
  ASSERT_TRUE(dir.ok()) << dir.status();
  first.reset();
  auto resumed = Make(spec, *dir);
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(Steps(*resumed, 3, 6),
            std::vector<float>(want.begin() + 3, want.end()));
  const auto a = straight->store().FullParams();
  const auto b = resumed->store().FullParams();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));

  const auto before = Snapshot();
  const absl::Status tied = MakeStatus(Spec(6, 0), *dir);
  EXPECT_EQ(tied.code(), absl::StatusCode::kFailedPrecondition) << tied;
  EXPECT_NE(tied.message().find("model.tie_embeddings=false in the checkpoint "
                                "but true in the model"),
            std::string::npos)
      << tied;
  auto reader = CheckpointReader::Open(*dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_FALSE((*reader)->meta().model.tie_embeddings);
  const absl::Status exported = ExportLlmc(**reader, (*reader)->meta().model,
                                           (root_ / "model.bin").string());
  EXPECT_EQ(exported.code(), absl::StatusCode::kInvalidArgument) << exported;
  EXPECT_NE(exported.message().find("(model.tie_embeddings=false)"),
            std::string::npos)
      << exported;
  EXPECT_EQ(Snapshot(), before);

  auto tied_run = Make(Spec(6, 0));
  auto tied_dir = tied_run->checkpoints().SaveCheckpointAt(0);
  ASSERT_TRUE(tied_dir.ok());
  const absl::Status untied = MakeStatus(spec, *tied_dir);
  EXPECT_NE(untied.message().find("it has no tensor lm_head.weight"),
            std::string::npos)
      << untied;
}

TEST_F(CheckpointTest, LatestRefusesAnotherJobsCheckpointNamingBothUids) {
  const v1::JobSpec spec = Spec(4, 2);
  {
    auto t = Make(spec, "", "job-a");
    Steps(*t, 0, 2);
    ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(2).ok());
  }
  auto reader = CheckpointReader::Open(StepDir(2));
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->meta().job_uid, "job-a");
  const auto before = Snapshot();
  const absl::Status s = MakeStatus(spec, "latest", "job-b");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("belongs to job 'job-a', not to this job 'job-b'"),
            std::string::npos)
      << s;
  EXPECT_EQ(Snapshot(), before);
  auto same = Make(spec, "latest", "job-a");
  ASSERT_NE(same, nullptr);
  EXPECT_EQ(same->checkpoints().start_step(), 2);
  // A standalone run has no job of its own to tell apart: it goes on from
  // the newest checkpoint of its model and data, as that job.
  auto standalone = Make(spec, "latest", "");
  ASSERT_NE(standalone, nullptr);
  EXPECT_EQ(standalone->checkpoints().start_step(), 2);
  Steps(*standalone, 2, 4);
  ASSERT_TRUE(standalone->checkpoints().SaveCheckpointAt(4).ok());
  auto uid = CheckpointJobUid(StepDir(4));
  ASSERT_TRUE(uid.ok());
  EXPECT_EQ(*uid, "job-a");
}

TEST_F(CheckpointTest, JobsSharingAFolderNeverPruneOrOverwriteEachOther) {
  const v1::JobSpec spec = Spec(8, 2, {"checkpoint.keep_last=1"});
  auto a = Make(spec, "", "job-a");
  auto b = Make(spec, "", "job-b");
  ASSERT_TRUE(a->checkpoints().SaveCheckpointAt(1).ok());
  ASSERT_TRUE(b->checkpoints().SaveCheckpointAt(2).ok());
  ASSERT_TRUE(
      a->checkpoints().SaveCheckpointAt(3).ok());  // prunes a's step 1 only
  ASSERT_TRUE(
      b->checkpoints().SaveCheckpointAt(4).ok());  // prunes b's step 2 only
  auto all = ListCheckpoints(root_.string());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<std::string>{StepDir(4), StepDir(3)}));
  // Job a reaching step 4 finds b's: refused, b's left as it was.
  ExpectSaveRefused(*a, 4, "belongs to job 'job-b'");
}

TEST_F(CheckpointTest, StepsPastEightDigitsAreListedInOrder) {
  fs::create_directories(root_ / "step-99999999");
  fs::create_directories(root_ / "step-100000000");
  fs::create_directories(root_ / "step-00000010.tmp");
  fs::create_directories(root_ / "other");
  auto all = ListCheckpoints(root_.string());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<std::string>{(root_ / "step-100000000").string(),
                                            StepDir(99999999)}));
}

TEST_F(CheckpointTest, ReadOutsideATensorIsAnErrorNotAnOverflow) {
  auto t = Make(Spec(2, 0));
  ASSERT_TRUE(t->checkpoints().SaveCheckpointAt(0).ok());
  auto reader = CheckpointReader::Open(StepDir(0));
  ASSERT_TRUE(reader.ok());
  float x[4];
  EXPECT_EQ((*reader)->Read("wte", Box{{-1, 0}, {0, 1}}, x).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*reader)->Read("wte", Box{{64, 22}, {65, 26}}, x).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      (*reader)->Read("wte", Box{{INT64_MAX - 1, 0}, {INT64_MAX, 4}}, x).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*reader)->Read("wte", Box{{0}, {1}}, x).code(),
            absl::StatusCode::kInvalidArgument);  // the wrong rank
  EXPECT_TRUE((*reader)->Read("wte", Box{{64, 20}, {65, 24}}, x).ok());
}

// Standalone runs and their ids: each prunes only what it wrote, however
// the steps of the runs sharing a folder interleave.
TEST_F(CheckpointTest, StandaloneRunsOfTwoModelsSharingAFolderKeepEachOthers) {
  // Model a saves steps 2 and 4 and keeps 4; model b saves 1, 2 and 3
  // while a's step 4, newer than all of them, stands in the folder.
  auto a = Make(Spec(4, 2, {"checkpoint.keep_last=1"}));
  ASSERT_TRUE(a->Run().ok());
  auto b = Make(Spec(3, 1, {"checkpoint.keep_last=1", "model.n_embd=32"}));
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->Run().ok());
  auto all = ListCheckpoints(root_.string());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<std::string>{StepDir(4), StepDir(3)}));
  auto a_uid = CheckpointJobUid(StepDir(4)),
       b_uid = CheckpointJobUid(StepDir(3));
  ASSERT_TRUE(a_uid.ok() && b_uid.ok());
  EXPECT_EQ(a_uid->rfind("run-", 0), 0u) << *a_uid;
  EXPECT_EQ(b_uid->rfind("run-", 0), 0u) << *b_uid;
  EXPECT_NE(*a_uid, *b_uid);
}

TEST_F(CheckpointTest, LatestSkipsAnotherModelsNewerStepAndGoesOnAsItsRun) {
  const std::vector<std::string> keep1 = {"checkpoint.keep_last=1"};
  auto a = Make(Spec(2, 2, keep1));
  ASSERT_TRUE(a->Run().ok());
  auto a_uid = CheckpointJobUid(StepDir(2));
  ASSERT_TRUE(a_uid.ok());
  auto b = Make(Spec(4, 4, {"checkpoint.keep_last=1", "model.n_embd=32"}));
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->Run().ok());
  // Model a again, further: b's step 4 is newer but of another model.
  auto resumed = Make(Spec(6, 3, keep1), "latest");
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->checkpoints().start_step(), 2);
  ASSERT_TRUE(resumed->Run().ok());
  // The resumed run is run a: it pruned a's steps 2 and 3, never b's 4.
  auto all = ListCheckpoints(root_.string());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<std::string>{StepDir(6), StepDir(4)}));
  auto uid = CheckpointJobUid(StepDir(6));
  ASSERT_TRUE(uid.ok());
  EXPECT_EQ(*uid, *a_uid);
}

TEST_F(CheckpointTest, LatestTellsDataByItsTokensNotByItsPath) {
  fs::create_directories(root_);
  const std::string text = ReadAll("data/tinyshakespeare.txt");
  // The same characters in another order: the same vocabulary, other data.
  const size_t line = text.find('\n') + 1;
  std::ofstream(root_ / "rotated.txt")
      << text.substr(line) << text.substr(0, line);
  std::ofstream(root_ / "copy.txt") << text;
  const std::string dir = "checkpoint.dir=" + (root_ / "ck").string();
  auto t =
      Make(Spec(2, 2, {"data.path=" + (root_ / "rotated.txt").string(), dir}));
  ASSERT_TRUE(t->Run().ok());
  auto other = Make(Spec(4, 0, {dir}), "latest");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->checkpoints().start_step(), 0);
  // Named, it loads: the vocabulary is the same, the folder the user's
  // choice.
  auto named =
      Make(Spec(4, 0, {dir}), (root_ / "ck" / "step-00000002").string());
  ASSERT_NE(named, nullptr);
  EXPECT_EQ(named->checkpoints().start_step(), 2);
  // The tokens, under another name, are the same data.
  auto u = Make(Spec(6, 6, {dir}));
  ASSERT_TRUE(u->Run().ok());
  auto same =
      Make(Spec(8, 0, {"data.path=" + (root_ / "copy.txt").string(), dir}),
           "latest");
  ASSERT_NE(same, nullptr);
  EXPECT_EQ(same->checkpoints().start_step(), 6);
}

TEST_F(CheckpointTest, AnotherRunsStepIsNamedAtStartAndNeverOverwritten) {
  auto a = Make(Spec(4, 2));
  ASSERT_TRUE(a->Run().ok());
  auto a_uid = CheckpointJobUid(StepDir(4));
  ASSERT_TRUE(a_uid.ok());
  // What a fresh run of 8 steps saving every 4 is told at its start.
  auto others = OtherRunsCheckpointsAt(
      root_.string(), "run-b", [](int64_t step) { return step % 4 == 0; });
  ASSERT_TRUE(others.ok()) << others.status();
  EXPECT_EQ(*others,
            std::vector<std::string>{"step-00000004 ('" + *a_uid + "')"});
  auto b = Make(Spec(8, 4));
  ASSERT_NE(b, nullptr);
  ExpectSaveRefused(*b, 4, "--set checkpoint.dir=");
  // Going on from that run is no clash: its steps are the run's own.
  auto resumed = Make(Spec(8, 4), "latest");
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->checkpoints().start_step(), 4);
  EXPECT_TRUE(resumed->checkpoints().SaveCheckpointAt(4).ok());
}

// A UTF-8 text whose characters take one to four bytes.
std::string MixedScriptText() {
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text += "Café naïve — 東京の夜 😀🚀 Ünïcödé ok\n";
  }
  return text;
}

TEST_F(CheckpointTest, UnicodeVocabularyIsRecordedAsCharactersAndResumes) {
  fs::create_directories(root_);
  const fs::path text = root_ / "mixed.txt";
  std::ofstream(text) << MixedScriptText();
  const std::vector<std::string> data = {
      "data.path=" + text.string(),
      "checkpoint.dir=" + (root_ / "ck").string()};
  auto t = Make(Spec(2, 2, data));
  ASSERT_TRUE(t->Run().ok());
  auto reader =
      CheckpointReader::Open((root_ / "ck" / "step-00000002").string());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->meta().vocab, t->data().tokenizer.vocab());
  EXPECT_EQ((*reader)->meta().model.vocab_size, t->data().tokenizer.size());
  const json m =
      json::parse(ReadAll(root_ / "ck" / "step-00000002" / "manifest.json"));
  EXPECT_EQ(m["format"], "ptrain-checkpoint-4");
  EXPECT_NE(m["vocab"].get<std::string>().find("東"), std::string::npos);
  auto resumed = Make(Spec(4, 2, data), "latest");
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->checkpoints().start_step(), 2);
}

TEST_F(CheckpointTest, FormatThreeByteVocabularyStillResumes) {
  auto t = Make(Spec(2, 2));
  ASSERT_TRUE(t->Run().ok());
  // What the previous format wrote for an ASCII text: the same vocabulary
  // bytes under format 3.
  EditManifest(
      StepDir(2), [](json& m) { m["format"] = "ptrain-checkpoint-3"; },
      /*redigest=*/true);
  auto resumed = Make(Spec(4, 2), "latest");
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->checkpoints().start_step(), 2);
}

TEST_F(CheckpointTest, VocabularyThatIsNotOneIncreasingRunOfCharsIsDamaged) {
  auto t = Make(Spec(2, 2));
  ASSERT_TRUE(t->Run().ok());
  const std::string good = t->data().tokenizer.vocab();
  std::string swapped = good;
  std::swap(swapped[10], swapped[11]);
  for (const auto& [vocab, needle] :
       std::vector<std::pair<std::string, std::string>>{
           {swapped, "vocab: character 11 (U+"},
           {good + "é", "vocab has 66 characters but model.vocab_size=65"}}) {
    SCOPED_TRACE(needle);
    EditManifest(
        StepDir(2), [&](json& m) { m["vocab"] = vocab; }, /*redigest=*/true);
    auto reader = CheckpointReader::Open(StepDir(2));
    ASSERT_FALSE(reader.ok());
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(reader.status().message().find(needle), std::string::npos)
        << reader.status();
  }
}

}  // namespace
}  // namespace ptrain
