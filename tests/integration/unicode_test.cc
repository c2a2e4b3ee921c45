// End to end through a real ptcoord, ptctl and ptworker: a corpus in many
// scripts (accents, CJK, emoji) trains with the char tokenizer to SUCCEEDED
// on its first attempt, and its sample, in the run log and in `ptctl logs`,
// is whole UTF-8 characters. Not a test of the model: of everything around
// it that carries its text.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "common/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/process.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kToken[] = "unicode-test-token";
constexpr char kPrompt[] = "Café";

// Each line mixes one- to four-byte characters.
constexpr const char* kLines[] = {
    "Café au lait, crème brûlée, déjà vu — naïve façade.\n",
    "東京の夜は静かです。北京欢迎你。서울의 봄.\n",
    "Emoji 😀🚀🎉 and flags 🇫🇷🇯🇵, ZWJ 👩‍💻.\n",
    "Ελληνικά, русский язык, עברית, العربية.\n",
};

using ptrain::testing::RunCapturing;

class UnicodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("unicode_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    fs::create_directories(dir_ / "ckpt");
    std::ofstream(dir_ / "tokens") << kToken << "\n";
    std::ofstream corpus(dir_ / "data" / "mixed.txt");
    for (int i = 0; i < 60; ++i) corpus << kLines[i % 4];
  }
  void TearDown() override {
    if (coordinator_ > 0) {
      kill(coordinator_, SIGTERM);
      waitpid(coordinator_, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  // ptcoord on a free port, its data roots this test's folders.
  void StartCoordinator() {
    const std::string log = (dir_ / "ptcoord.log").string();
    const std::vector<std::string> argv = {PT_PTCOORD,
                                           "--listen",
                                           "127.0.0.1:0",
                                           "--state-dir",
                                           state(),
                                           "--local-slots",
                                           "2",
                                           "--token-file",
                                           (dir_ / "tokens").string(),
                                           "--data-root",
                                           data_root(),
                                           "--data-root",
                                           (dir_ / "ckpt").string(),
                                           "--log-level",
                                           "warn"};
    coordinator_ = ptrain::testing::StartLogged(argv, log);
    const fs::path address = fs::path(state()) / "address";
    for (int i = 0; i < 300 && !fs::exists(address); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(fs::exists(address)) << RunCapturing("cat " + log).second;
    std::ifstream(address) >> address_;
  }
  std::pair<int, std::string> Ptctl(const std::string& args) {
    return RunCapturing(absl::StrCat("cd ", PT_SOURCE_DIR, " && ", PT_PTCTL,
                                     " --server ", address_, " --token ",
                                     kToken, " ", args));
  }
  std::string state() const { return (dir_ / "state").string(); }
  std::string data_root() const { return (dir_ / "data").string(); }

  fs::path dir_;
  pid_t coordinator_ = 0;
  std::string address_;
};

TEST_F(UnicodeTest, MixedScriptCorpusSucceedsFirstTimeWithAUtf8Sample) {
  StartCoordinator();
  const std::string data = (dir_ / "data" / "mixed.txt").string();
  const auto [rc, out] = Ptctl(absl::StrCat(
      "submit examples/shakespeare-char.yaml --watch --set data.path=", data,
      " --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 "
      "--set model.block_size=16 --set train.steps=20 --set "
      "train.eval_every=10 --set train.sample_every=10 --set "
      "train.sample_tokens=120 --set train.sample_prompt=",
      kPrompt, " --set restart.max_restarts=0 --set checkpoint.dir=",
      (dir_ / "ckpt").string()));
  ASSERT_EQ(rc, 0) << out;
  const std::string id = out.substr(0, out.find('\n'));
  const auto got = Ptctl("-o json get " + id);
  ASSERT_EQ(got.first, 0) << got.second;
  const json job = json::parse(got.second)["job"];
  EXPECT_EQ(job["state"], "JOB_STATE_SUCCEEDED") << got.second;
  EXPECT_EQ(job["attempts"], 1) << got.second;

  // Samples at step 10 and at the end, each the prompt and then whole
  // characters, the run log's lines UTF-8 JSON throughout.
  std::ifstream log(fs::path(state()) / "jobs" / id / "attempt-1" /
                    "run.jsonl");
  std::vector<std::string> samples;
  std::string line;
  while (std::getline(log, line)) {
    ASSERT_EQ(ptrain::FirstInvalidUtf8(line), -1) << line;
    const json record = json::parse(line);
    if (record["type"] == "sample") samples.push_back(record["text"]);
  }
  ASSERT_EQ(samples.size(), 2u);
  for (const std::string& text : samples) {
    EXPECT_EQ(text.rfind(kPrompt, 0), 0u) << text;
    EXPECT_GT(text.size(), std::string(kPrompt).size() + 120) << text;
    EXPECT_EQ(ptrain::FirstInvalidUtf8(text), -1) << text;
    EXPECT_EQ(text.find("\uFFFD"), std::string::npos) << text;
  }
  // ptctl shows the rank's output as it was written (mpirun tags each
  // line): the last sample's first line among it, UTF-8 throughout.
  const auto logs = Ptctl("logs " + id);
  ASSERT_EQ(logs.first, 0) << logs.second;
  EXPECT_EQ(ptrain::FirstInvalidUtf8(logs.second), -1);
  const std::string& last = samples.back();
  EXPECT_NE(logs.second.find(last.substr(0, last.find('\n'))),
            std::string::npos)
      << logs.second;
}

}  // namespace
