// `ptworker profile` under mpirun: two ranks on one host give the profile
// an intra_node link with every collective fitted (alpha ≥ 0, a positive bus
// bandwidth), written by rank 0 alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/testing/shell.h"

namespace {

namespace fs = std::filesystem;

TEST(PtworkerProfileMpi, TwoRanksFitEveryCollectiveOfTheIntraNodeLink) {
  const fs::path dir = fs::temp_directory_path() /
                       ("ptworker_profile_mpi_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path out = dir / "profile.json";
  // Ranks that yield while they wait: two ranks on few cores otherwise
  // spin against each other.
  const std::string cmd =
      std::string("OMPI_MCA_mpi_yield_when_idle=1 ") + MPIEXEC +
      " --allow-run-as-root --oversubscribe --mca btl self,vader,tcp -n 2 " +
      PTWORKER_PATH + " profile --quick --out " + out.string();
  const auto r = ptrain::testing::RunShell(cmd, (dir / "err.txt").string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  const auto j = nlohmann::json::parse(ss.str());
  EXPECT_NE(j.at("source").get<std::string>().find("2 ranks"),
            std::string::npos);
  ASSERT_TRUE(j.contains("links")) << j.dump(1);
  const auto& links = j.at("links");
  EXPECT_FALSE(links.contains("inter_node")) << links.dump(1);
  ASSERT_TRUE(links.contains("intra_node")) << links.dump(1);
  for (const char* op :
       {"allreduce", "allgather", "reduce_scatter", "sendrecv", "alltoall"}) {
    ASSERT_TRUE(links.at("intra_node").contains(op)) << op;
    const auto& fit = links.at("intra_node").at(op);
    EXPECT_GE(fit.at("alpha_s").get<double>(), 0.0) << op;
    EXPECT_GT(fit.at("bus_bytes_per_s").get<double>(), 0.0) << op;
  }
  // Rank 0 wrote it, whole: no other file beside it but the test's stderr.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.path() != out;
  EXPECT_EQ(files, 1);
  fs::remove_all(dir);
}

}  // namespace
