// `ptctl plan` as a user runs it: the ten best layouts as JSON (valid,
// fitting, fastest first), the spec's own with --fixed, and bad input —
// a malformed profile, a cluster no layout fits — refused with exit 2 and
// the reason named, without a coordinator.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/testing/process.h"

namespace {

namespace fs = std::filesystem;
using ptrain::testing::RunCapturing;

std::string Ptctl(const std::string& args) {
  return std::string(PT_PTCTL) + " plan " + args;
}

// The JSON of a run whose stdout is only the JSON (stderr is empty then).
nlohmann::json Json(const std::string& out) {
  return nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
}

TEST(PtctlPlan, TenBestLayoutsAsJsonFastestFirst) {
  const auto [code, out] =
      RunCapturing(Ptctl("examples/plan-llama-70b.yaml --nodes 16 "
                         "--gpus-per-node 8 --profile h100 -o json"));
  ASSERT_EQ(code, 0) << out;
  const nlohmann::json j = Json(out);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_EQ(j.at("best").size(), 10u);
  double last = 0;
  for (const auto& l : j.at("best")) {
    int world = 1;
    for (const char* d : {"dp", "tp", "pp", "cp"}) {
      world *= l.at("degrees").at(d).get<int>();
    }
    EXPECT_EQ(world, 128) << l.dump();
    EXPECT_LE(l.at("degrees").at("tp").get<int>() *
                  l.at("degrees").at("cp").get<int>(),
              8);
    EXPECT_LE(l.at("memory_bytes").get<int64_t>(),
              l.at("memory_limit_bytes").get<int64_t>());
    EXPECT_GE(l.at("step_s").get<double>(), last);
    last = l.at("step_s").get<double>();
  }
  for (const auto& l : j.at("rejected")) {
    EXPECT_LT(l.at("step_s").get<double>(), last) << l.dump();
    EXPECT_FALSE(l.at("why").get<std::string>().empty());
  }
  EXPECT_EQ(j.at("model").at("parameters").get<int64_t>() / 1000000000, 70);
}

TEST(PtctlPlan, FixedCostsTheSpecsLayoutAndSaysWhereTheStepGoes) {
  const auto [code, out] =
      RunCapturing(Ptctl("examples/plan-llama-70b.yaml --nodes 16 "
                         "--gpus-per-node 8 --profile h100 --fixed"));
  // dp=128 zero=3, two microbatches of one sequence, full recompute: fits
  // 80 GB.
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("dp=128 tp=1 pp=1 zero=3 m=2×1"), std::string::npos)
      << out;
  EXPECT_NE(out.find("the step: "), std::string::npos) << out;
  // One microbatch of two sequences does not: printed, and exit 1.
  const auto [oom, oom_out] = RunCapturing(
      Ptctl("examples/plan-llama-70b.yaml --nodes 16 --gpus-per-node 8 "
            "--profile h100 --fixed --set parallel.microbatches=1"));
  EXPECT_EQ(oom, 1) << oom_out;
  EXPECT_NE(oom_out.find("OOM by "), std::string::npos) << oom_out;
  // Its world must be the cluster's.
  const auto [wrong, why] =
      RunCapturing(Ptctl("examples/plan-llama-70b.yaml --nodes 1 "
                         "--gpus-per-node 8 --profile h100 --fixed"));
  EXPECT_EQ(wrong, 2) << why;
  EXPECT_NE(why.find("the spec's layout has 128 ranks"), std::string::npos)
      << why;
}

TEST(PtctlPlan, BadInputExitsTwoNamingWhatIsWrong) {
  const fs::path dir =
      fs::temp_directory_path() / ("ptctl_plan_" + std::to_string(getpid()));
  fs::create_directories(dir);
  {
    std::ofstream(dir / "bad.json")
        << R"({"format": "ptrain-profile/1", "name": "x", "source": "y",
               "device": "cuda", "memory_bytes": 1000,
               "matmul": [{"precision": "bf16", "pass": "forward", "m": 1,
                           "n": 1, "k": 1, "flops_per_s": -5}],
               "attention": [{"precision": "bf16", "B": 1, "T": 1, "C": 1,
                              "heads": 1, "forward_s": 1, "backward_s": 1}],
               "elementwise_bytes_per_s": 1, "optimizer_params_per_s": 1})";
  }
  const auto [bad, bad_out] = RunCapturing(Ptctl(
      "examples/plan-llama-70b.yaml --profile " + (dir / "bad.json").string()));
  EXPECT_EQ(bad, 2) << bad_out;
  EXPECT_NE(bad_out.find("matmul[0].flops_per_s must be > 0"),
            std::string::npos)
      << bad_out;
  const auto [unknown, unknown_out] =
      RunCapturing(Ptctl("examples/plan-llama-70b.yaml --profile tpu"));
  EXPECT_EQ(unknown, 2) << unknown_out;
  EXPECT_NE(unknown_out.find("a100, h100, h200"), std::string::npos);
  // 70B on two GPUs: nothing fits; the smallest cluster that holds it said.
  const auto [small, small_out] =
      RunCapturing(Ptctl("examples/plan-llama-70b.yaml --nodes 1 "
                         "--gpus-per-node 2 --profile h100"));
  EXPECT_EQ(small, 2) << small_out;
  EXPECT_NE(small_out.find("no layout fits 1 nodes × 2 GPUs"),
            std::string::npos)
      << small_out;
  EXPECT_NE(small_out.find("needs at least"), std::string::npos) << small_out;
  fs::remove_all(dir);
}

}  // namespace
