// The MFU denominator: the best matmul peak this machine measured stands
// over a low measurement taken under load, per host, CPU, backend and
// thread count; an MFU above 100% always comes with a warning that the peak
// was low.
#include "worker/engine/model/flops.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "nlohmann/json.hpp"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

class PeakCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("flops_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    cache_ = (dir_ / "ptrain" / "matmul-peak.json").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string cache_;
};

TEST_F(PeakCache, LowMeasurementOnALoadedMachineGivesWayToTheBestSeen) {
  EXPECT_EQ(BestPeakFlops(400e9, "host | cpu | 2 threads", cache_), 400e9);
  EXPECT_EQ(BestPeakFlops(65e9, "host | cpu | 2 threads", cache_), 400e9);
  EXPECT_EQ(BestPeakFlops(495e9, "host | cpu | 2 threads", cache_), 495e9);
  EXPECT_EQ(BestPeakFlops(300e9, "host | cpu | 2 threads", cache_), 495e9);
  // Another thread count is another peak.
  EXPECT_EQ(BestPeakFlops(200e9, "host | cpu | 1 threads", cache_), 200e9);
  EXPECT_EQ(BestPeakFlops(300e9, "host | cpu | 2 threads", cache_), 495e9);
}

TEST_F(PeakCache, DamagedOrMissingCacheIsTheMeasurementAndIsRewritten) {
  EXPECT_EQ(BestPeakFlops(100e9, "k", ""), 100e9);  // no cache at all
  fs::create_directories(fs::path(cache_).parent_path());
  std::ofstream(cache_) << "{not json";
  EXPECT_EQ(BestPeakFlops(100e9, "k", cache_), 100e9);
  std::ifstream in(cache_);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("k").get<double>(), 100e9);
  // A value that is not a number is no peak either.
  std::ofstream(cache_, std::ios::trunc) << R"({"k": "fast"})";
  EXPECT_EQ(BestPeakFlops(90e9, "k", cache_), 90e9);
}

TEST_F(PeakCache, KeyNamesWhatIsMeasuredAndTheThreads) {
  const std::string two = PeakCacheKey("cpu sgemm", 2);
  EXPECT_NE(two.find("cpu sgemm"), std::string::npos) << two;
  EXPECT_NE(two.find("2 threads"), std::string::npos) << two;
  EXPECT_NE(two, PeakCacheKey("cpu sgemm", 1));
  EXPECT_NE(two, PeakCacheKey("cpu (bf16 matmuls)", 2));
}

TEST_F(PeakCache, LivesInTheUsersCacheFolder) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = xdg != nullptr ? xdg : "";
  setenv("XDG_CACHE_HOME", "/somewhere/cache", 1);
  EXPECT_EQ(PeakCachePath(), "/somewhere/cache/ptrain/matmul-peak.json");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(PeakCachePath(), "/home/u/.cache/ptrain/matmul-peak.json");
  if (xdg != nullptr) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

TEST(MfuWarning, AboveOneSaysThePeakWasLowAndHowToFixIt) {
  EXPECT_EQ(MfuAbovePeakWarning(0.99, 100e9, true), "");
  EXPECT_EQ(MfuAbovePeakWarning(1.0, 100e9, false), "");
  const std::string measured = MfuAbovePeakWarning(1.85, 123.4e9, true);
  EXPECT_NE(measured.find("MFU 185% is above 100%"), std::string::npos)
      << measured;
  EXPECT_NE(measured.find("(123.4 GFLOP/s per rank) was low"),
            std::string::npos)
      << measured;
  EXPECT_NE(measured.find("--peak-gflops"), std::string::npos) << measured;
  const std::string given = MfuAbovePeakWarning(2.09, 50e9, false);
  EXPECT_NE(given.find("MFU 209% is above 100%: --peak-gflops 50 is below"),
            std::string::npos)
      << given;
}

}  // namespace
}  // namespace ptrain
