// `ptworker profile`: the alpha–beta fit recovers the latency and bus
// bandwidth of synthetic timings (and keeps both in range on timings that
// fit no line); as a process, --quick writes a profile of the documented
// schema with every figure positive, at one thread and at every core, and
// bad flags exit 2 naming the flag, writing nothing.
#include "worker/profile.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "planner/profile.h"
#include "tests/testing/shell.h"

namespace {

namespace fs = std::filesystem;

using ptrain::Collective;
using ptrain::FitLink;
using ptrain::LinkFit;
using ptrain::LinkPoint;

// Timings of time = alpha + f(p)·bytes / busbw over sizes and group sizes.
std::vector<LinkPoint> Synthetic(Collective c, double alpha, double busbw,
                                 const std::vector<int>& ranks) {
  std::vector<LinkPoint> points;
  for (int p : ranks) {
    for (double bytes = 4096; bytes <= 64 << 20; bytes *= 4) {
      points.push_back(
          {bytes, p, alpha + ptrain::BusFactor(c, p) * bytes / busbw});
    }
  }
  return points;
}

TEST(ProfileFit, RecoversAlphaAndBusBandwidthOfEachCollective) {
  for (Collective c : ptrain::kCollectives) {
    const LinkFit fit = FitLink(c, Synthetic(c, 7.5e-6, 2.5e10, {2, 4, 8}));
    EXPECT_NEAR(fit.alpha_s, 7.5e-6, 7.5e-6 * 1e-6)
        << ptrain::CollectiveName(c);
    EXPECT_NEAR(fit.bus_bytes_per_s, 2.5e10, 2.5e10 * 1e-6)
        << ptrain::CollectiveName(c);
  }
}

TEST(ProfileFit, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(ptrain::BusFactor(Collective::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(ptrain::BusFactor(Collective::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(ptrain::BusFactor(Collective::kReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(ptrain::BusFactor(Collective::kAllToAll, 4), 0.75);
  EXPECT_DOUBLE_EQ(ptrain::BusFactor(Collective::kSendRecv, 4), 1.0);
}

// The group size enters through f(p) only: all-reduce timings over groups
// of 2 (f = 1) and 8 (f = 1.75) at one bandwidth give that bandwidth.
TEST(ProfileFit, GroupSizesShareOneBusBandwidth) {
  std::vector<LinkPoint> points;
  for (double bytes : {1e4, 1e6, 1e8}) {
    points.push_back({bytes, 2, 1e-5 + 1.0 * bytes / 1e10});
    points.push_back({bytes, 8, 1e-5 + 1.75 * bytes / 1e10});
  }
  const LinkFit fit = FitLink(Collective::kAllReduce, points);
  EXPECT_NEAR(fit.bus_bytes_per_s, 1e10, 1e10 * 1e-6);
  EXPECT_NEAR(fit.alpha_s, 1e-5, 1e-5 * 1e-6);
}

TEST(ProfileFit, NegativeInterceptIsClampedToZeroAlpha) {
  // Time growing as the square of the size: the best line crosses zero
  // above the smallest message.
  const std::vector<LinkPoint> points = {
      {1e3, 2, 1e-7}, {1e4, 2, 1e-5}, {1e5, 2, 1e-3}};
  const LinkFit fit = FitLink(Collective::kSendRecv, points);
  EXPECT_EQ(fit.alpha_s, 0.0);
  EXPECT_GT(fit.bus_bytes_per_s, 0.0);
  EXPECT_TRUE(std::isfinite(fit.bus_bytes_per_s));
}

TEST(ProfileFit, TimeThatDoesNotGrowKeepsAPositiveFiniteBandwidth) {
  const std::vector<LinkPoint> points = {
      {1e3, 2, 2e-5}, {1e6, 2, 2e-5}, {1e8, 2, 1.9e-5}};
  const LinkFit fit = FitLink(Collective::kAllGather, points);
  EXPECT_GT(fit.bus_bytes_per_s, 0.0);
  EXPECT_TRUE(std::isfinite(fit.bus_bytes_per_s));
  EXPECT_GT(fit.alpha_s, 1.8e-5);
  EXPECT_LT(fit.alpha_s, 2.1e-5);
}

class ProfileCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ptworker_profile_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  ptrain::testing::ShellResult Run(const std::string& args) {
    return ptrain::testing::RunShell(
        std::string(PTWORKER_PATH) + " profile " + args,
        (dir_ / "err.txt").string());
  }

  fs::path dir_;
};

nlohmann::json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

TEST_F(ProfileCommand, QuickProfileHasTheSchemaAndPositiveFigures) {
  const fs::path out = dir_ / "profile.json";
  const auto r = Run("--quick --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = ReadJson(out);
  // The layout planner reads it.
  absl::StatusOr<ptrain::planner::HardwareProfile> read =
      ptrain::planner::LoadProfile(out.string());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->cores, j.at("cores").get<int>());
  EXPECT_EQ(j.at("format"), "ptrain-profile/1");
  EXPECT_EQ(j.at("device"), "cpu");
  EXPECT_NE(j.at("name").get<std::string>().find("-cpu"), std::string::npos);
  EXPECT_NE(j.at("source").get<std::string>().find("1 ranks"),
            std::string::npos);
  EXPECT_GT(j.at("memory_bytes").get<int64_t>(), 0);
  const int cores = j.at("cores").get<int>();
  EXPECT_GT(cores, 0);
  // Each shape's forward and backward, at one thread and at every core.
  std::set<int> matmul_threads, attention_threads;
  int forward = 0, backward = 0;
  ASSERT_FALSE(j.at("matmul").empty());
  for (const auto& e : j.at("matmul")) {
    EXPECT_EQ(e.at("precision"), "fp32");
    EXPECT_GT(e.at("m").get<int>(), 0);
    EXPECT_GT(e.at("n").get<int>(), 0);
    EXPECT_GT(e.at("k").get<int>(), 0);
    EXPECT_GT(e.at("flops_per_s").get<double>(), 0.0) << e.dump();
    (e.at("pass") == "forward" ? forward : backward) += 1;
    EXPECT_TRUE(e.at("pass") == "forward" || e.at("pass") == "backward");
    matmul_threads.insert(e.at("threads").get<int>());
  }
  EXPECT_EQ(forward, backward);
  ASSERT_FALSE(j.at("attention").empty());
  for (const auto& e : j.at("attention")) {
    for (const char* key : {"B", "T", "C", "heads"}) {
      EXPECT_GT(e.at(key).get<int>(), 0) << key;
    }
    EXPECT_EQ(e.at("C").get<int>() % e.at("heads").get<int>(), 0);
    EXPECT_GT(e.at("forward_s").get<double>(), 0.0) << e.dump();
    EXPECT_GT(e.at("backward_s").get<double>(), 0.0) << e.dump();
    attention_threads.insert(e.at("threads").get<int>());
  }
  std::set<int> expected = {1, cores};
  EXPECT_EQ(matmul_threads, expected);
  EXPECT_EQ(attention_threads, expected);
  EXPECT_GT(j.at("elementwise_bytes_per_s").get<double>(), 0.0);
  EXPECT_GT(j.at("optimizer_params_per_s").get<double>(), 0.0);
  // One rank: no links.
  EXPECT_FALSE(j.contains("links"));
  // Written whole: nothing but the profile (and the test's stderr) there.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.path() != out;
  EXPECT_EQ(files, 1);
}

TEST_F(ProfileCommand, UnknownDeviceExitsTwoNamingTheFlag) {
  const fs::path out = dir_ / "profile.json";
  const auto r = Run("--device tpu --out " + out.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(ProfileCommand, OutInAMissingFolderExitsTwoNamingTheFlag) {
  const auto r = Run("--quick --out /nonexistent/dir/p.json");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--out"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists("/nonexistent/dir"));
}

TEST_F(ProfileCommand, MissingOutExitsTwoNamingTheFlag) {
  const auto r = Run("--quick");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--out"), std::string::npos) << r.err;
}

}  // namespace
