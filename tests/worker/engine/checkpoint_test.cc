// Checkpoints on one rank: bit-exact resume, fallback past a corrupt
// checkpoint, clear refusals that leave the disk untouched, pruning, and the
// llm.c format round trip.
#include "worker/engine/checkpoint.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/spec.h"
#include "worker/engine/trainer.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

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
                                const std::string& resume = "") {
    TrainerOptions opt;
    opt.peak_flops = 1e12;
    opt.quiet = true;
    opt.resume_from = resume;
    auto t = Trainer::Create(spec, opt);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  absl::Status MakeStatus(const v1::JobSpec& spec, const std::string& resume) {
    TrainerOptions opt;
    opt.resume_from = resume;
    return Trainer::Create(spec, opt).status();
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
  ASSERT_TRUE(first->SaveCheckpointAt(20).ok());
  first.reset();
  auto resumed = Make(spec, "latest");
  ASSERT_EQ(resumed->start_step(), 20);
  const std::vector<float> got = Steps(*resumed, 20, 40);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(got[i], want[20 + i]) << "step " << 21 + i;  // to the last bit
  }
  const auto a = straight->store().FullParams();
  const auto b = resumed->store().FullParams();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST_F(CheckpointTest, ManifestIndexesEveryTensorWithShapeAndChecksums) {
  auto t = Make(Spec(2, 0));
  Steps(*t, 0, 2);
  auto dir = t->SaveCheckpointAt(2);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, StepDir(2));
  EXPECT_FALSE(fs::exists(StepDir(2) + ".tmp"));
  auto reader = CheckpointReader::Open(*dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->meta().step, 2);
  EXPECT_EQ((*reader)->meta().optimizer_step, 2);
  EXPECT_EQ((*reader)->meta().tokens_seen, 2 * 4 * 16);
  EXPECT_EQ((*reader)->meta().vocab.size(), 65u);
  EXPECT_TRUE((*reader)->CheckCompatible(t->store().layout()).ok());
  // Every element of every weight reads back as it is in memory.
  const auto full = t->store().FullParams();
  for (const ParamInfo& p : t->store().layout()) {
    std::vector<float> got(p.numel);
    ASSERT_TRUE((*reader)->Read(p.name, 0, p.numel, got.data()).ok());
    ASSERT_EQ(0, std::memcmp(got.data(), full.data() + p.offset,
                             p.numel * sizeof(float)))
        << p.name;
  }
}

TEST_F(CheckpointTest, FlippedByteMakesLatestFallBackAndExplicitDirFail) {
  const v1::JobSpec spec = Spec(10, 5);
  auto t = Make(spec);
  Steps(*t, 0, 5);
  ASSERT_TRUE(t->SaveCheckpointAt(5).ok());
  Steps(*t, 5, 10);
  ASSERT_TRUE(t->SaveCheckpointAt(10).ok());
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
  const auto before = Snapshot();
  auto resumed = Make(spec, "latest");
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->start_step(), 5);
  const absl::Status s = MakeStatus(spec, StepDir(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s;
  EXPECT_EQ(Snapshot(), before) << "a failed load changed the disk";
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
  EXPECT_EQ(t->start_step(), 0);
}

TEST_F(CheckpointTest, OtherModelShapeNamesTheFirstMismatchingTensor) {
  auto t = Make(Spec(2, 0));
  Steps(*t, 0, 2);
  ASSERT_TRUE(t->SaveCheckpointAt(2).ok());
  const auto before = Snapshot();
  const absl::Status s = MakeStatus(Spec(4, 0, {"model.n_embd=32"}), "latest");
  EXPECT_NE(s.message().find("tensor wte has shape [65, 24] in the checkpoint "
                             "but [65, 32] in the model"),
            std::string::npos)
      << s;
  const absl::Status deeper =
      MakeStatus(Spec(4, 0, {"model.n_layer=3"}), "latest");
  EXPECT_NE(deeper.message().find("it has no tensor h.2.ln_1.weight"),
            std::string::npos)
      << deeper;
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
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], StepDir(8));
  EXPECT_EQ(all[1], StepDir(6));
}

TEST_F(CheckpointTest, LlmcExportThenInitFromGivesIdenticalWeights) {
  auto t = Make(Spec(3, 0));
  Steps(*t, 0, 3);
  auto dir = t->SaveCheckpointAt(3);
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

  const absl::Status wrong = MakeStatus(
      Spec(3, 0, {"model.init_from=llmc:" + bin, "model.n_layer=3"}), "");
  EXPECT_NE(wrong.message().find("has n_layer=2 but the model has 3"),
            std::string::npos)
      << wrong;
}

}  // namespace
}  // namespace ptrain
