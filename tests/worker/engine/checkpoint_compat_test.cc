// Checkpoints written by an earlier build resume as that build resumed
// them. The fixture (tests/worker/engine/fixtures/checkpoint_c705f18) holds
// a checkpoint that c705f18's ptworker wrote at step 4 of a small job and
// the losses and gradient norms it trained after resuming it to step 8.
// This build loads the same checkpoint: saved again, its state is the same
// bytes; trained on, it gives the earlier build's losses and norms to a
// relative 1e-6 on any CPU. (Bit for bit only on the fixture's own CPU: the
// weight gradients' matmuls sum in blocks oneDNN sizes by the caches, which
// moves their last bits from one CPU model to another even at the same
// instruction set and thread count. What a resume can lose instead — Adam's
// step count, the learning-rate schedule's place, the data position — moves
// the loss by 1e-4 or more within these four steps.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/spec.h"
#include "nlohmann/json.hpp"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class CheckpointCompat : public ::testing::Test {
 protected:
  void SetUp() override {
    fixture_ = fs::path(PT_SOURCE_DIR) /
               "tests/worker/engine/fixtures/checkpoint_c705f18";
    expected_ = nlohmann::json::parse(ReadAll(fixture_ / "expected.json"));
    root_ = fs::temp_directory_path() /
            ("checkpoint_compat_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "old");
    fs::copy(fixture_ / "step-00000004", root_ / "old/step-00000004",
             fs::copy_options::recursive);
  }
  void TearDown() override { fs::remove_all(root_); }

  // The fixture's job resumed from its checkpoint (a named folder), saving
  // under root_/new.
  std::unique_ptr<Trainer> Resume() {
    std::vector<std::string> overrides =
        expected_["spec"]["set"].get<std::vector<std::string>>();
    overrides.push_back("data.path=" + std::string(PT_SOURCE_DIR) +
                        "/data/tinyshakespeare.txt");
    overrides.push_back("checkpoint.dir=" + (root_ / "new").string());
    auto spec =
        LoadJobSpecFile(std::string(PT_SOURCE_DIR) + "/" +
                            expected_["spec"]["config"].get<std::string>(),
                        overrides);
    EXPECT_TRUE(spec.ok()) << spec.status();
    if (!spec.ok()) return nullptr;
    TrainerOptions options;
    options.resume_from = (root_ / "old/step-00000004").string();
    options.log_json_path = (root_ / "run.jsonl").string();
    options.peak_flops = 100e9;
    options.quiet = true;
    auto trainer = Trainer::Create(*spec, options);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (!trainer.ok()) return nullptr;
    EXPECT_EQ((*trainer)->checkpoints().start_step(), 4);
    return std::move(*trainer);
  }

  fs::path fixture_, root_;
  nlohmann::json expected_;
};

TEST_F(CheckpointCompat, AnEarlierBuildsCheckpointLoadsBitExactly) {
  std::unique_ptr<Trainer> trainer = Resume();
  ASSERT_NE(trainer, nullptr);
  auto dir = trainer->checkpoints().SaveCheckpointAt(4);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(ReadAll(fs::path(*dir) / "shard-00000.bin"),
            ReadAll(fixture_ / "step-00000004/shard-00000.bin"))
      << "the state loaded from the earlier build's checkpoint, saved again, "
         "is not the same bytes";
}

TEST_F(CheckpointCompat, AnEarlierBuildsCheckpointTrainsOnAsItDid) {
  std::unique_ptr<Trainer> trainer = Resume();
  ASSERT_NE(trainer, nullptr);
  ASSERT_TRUE(trainer->Run().ok());

  std::vector<nlohmann::json> steps;
  std::ifstream log(root_ / "run.jsonl");
  for (std::string line; std::getline(log, line);) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record["type"] == "step") steps.push_back(record);
  }
  const auto& want = expected_["resumed_steps"];
  ASSERT_EQ(steps.size(), want.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i]["step"], want[i]["step"]);
    for (const char* field : {"loss", "grad_norm"}) {
      const double got = steps[i][field].get<double>();
      const double earlier = want[i][field].get<double>();
      EXPECT_NEAR(got, earlier, 1e-6 * earlier)
          << field << " at step " << want[i]["step"];
    }
  }
}

}  // namespace
}  // namespace ptrain
