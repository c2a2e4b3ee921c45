// Checkpoints written by an earlier build resume bit-exactly: the fixture
// (tests/worker/engine/fixtures/checkpoint_c705f18) holds a checkpoint that
// c705f18's ptworker wrote at step 4 of a small job, the losses and
// gradient norms it trained after resuming it to step 8, and the SHA-256 of
// its state at step 8. This build resumes the same checkpoint and must
// train the same bits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/digest.h"
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

TEST(CheckpointCompat, AnEarlierBuildsCheckpointResumesBitExactly) {
  const fs::path fixture = fs::path(PT_SOURCE_DIR) /
                           "tests/worker/engine/fixtures/checkpoint_c705f18";
  const nlohmann::json expected =
      nlohmann::json::parse(ReadAll(fixture / "expected.json"));
  const fs::path root = fs::temp_directory_path() /
                        ("checkpoint_compat_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "ckpt");
  fs::copy(fixture / "step-00000004", root / "ckpt/step-00000004",
           fs::copy_options::recursive);

  std::vector<std::string> overrides =
      expected["spec"]["set"].get<std::vector<std::string>>();
  overrides.push_back("data.path=" + std::string(PT_SOURCE_DIR) +
                      "/data/tinyshakespeare.txt");
  overrides.push_back("checkpoint.dir=" + (root / "ckpt").string());
  auto spec = LoadJobSpecFile(std::string(PT_SOURCE_DIR) + "/" +
                                  expected["spec"]["config"].get<std::string>(),
                              overrides);
  ASSERT_TRUE(spec.ok()) << spec.status();
  TrainerOptions options;
  options.resume_from = "latest";
  options.log_json_path = (root / "run.jsonl").string();
  options.peak_flops = 100e9;
  options.quiet = true;
  auto trainer = Trainer::Create(*spec, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_EQ((*trainer)->checkpoints().start_step(), 4);
  ASSERT_TRUE((*trainer)->Run().ok());

  std::vector<nlohmann::json> steps;
  std::ifstream log(options.log_json_path);
  for (std::string line; std::getline(log, line);) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record["type"] == "step") steps.push_back(record);
  }
  const auto& want = expected["resumed_steps"];
  ASSERT_EQ(steps.size(), want.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i]["step"], want[i]["step"]);
    // Exact: the float loss and the double norm as the earlier build logged
    // them.
    EXPECT_EQ(steps[i]["loss"].get<double>(), want[i]["loss"].get<double>())
        << "step " << want[i]["step"];
    EXPECT_EQ(steps[i]["grad_norm"].get<double>(),
              want[i]["grad_norm"].get<double>())
        << "step " << want[i]["step"];
  }
  EXPECT_EQ(Sha256Hex(ReadAll(root / "ckpt/step-00000008/shard-00000.bin")),
            expected["shard_sha256_at_step_8"].get<std::string>());
  fs::remove_all(root);
}

}  // namespace
}  // namespace ptrain
