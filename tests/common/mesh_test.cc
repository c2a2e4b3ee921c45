// The mesh's table (common/mesh.h): each rank's coordinates, the factors
// messages print, the node-local group and the layout read off a spec.
#include "common/mesh.h"

#include <set>
#include <string>
#include <vector>

#include "common/spec.h"
#include "gtest/gtest.h"

namespace ptrain {
namespace {

v1::ParallelSpec Degrees(int dp, int tp, int pp, int cp) {
  v1::ParallelSpec p = DefaultJobSpec().parallel();
  p.set_dp(dp);
  p.set_tp(tp);
  p.set_pp(pp);
  p.set_cp(cp);
  return p;
}

// rank = ((pp_rank·dp + dp_rank)·cp + cp_rank)·tp + tp_rank: tp fastest,
// then cp, dp and pp, for every rank of a mesh with every degree above 1.
TEST(Mesh, CoordinatesFollowTheRankOrderTpCpDpPp) {
  const ParallelLayout l = LayoutOf(Degrees(3, 2, 2, 2));
  ASSERT_EQ(l.world_size(), 24);
  const int dp = MeshDimensionIndex("dp"), tp = MeshDimensionIndex("tp"),
            pp = MeshDimensionIndex("pp"), cp = MeshDimensionIndex("cp");
  std::set<std::vector<int>> seen;
  for (int rank = 0; rank < 24; ++rank) {
    const std::vector<int> c = l.Coordinates(rank);
    EXPECT_EQ(((c[pp] * 3 + c[dp]) * 2 + c[cp]) * 2 + c[tp], rank);
    EXPECT_LT(c[dp], 3);
    seen.insert(c);
  }
  EXPECT_EQ(seen.size(), 24u);
}

TEST(Mesh, FactorsNameCpOnlyAboveOne) {
  EXPECT_EQ(LayoutOf(Degrees(2, 1, 3, 1)).Factors(),
            "parallel.dp × parallel.tp × parallel.pp = 2 × 1 × 3");
  EXPECT_EQ(
      LayoutOf(Degrees(2, 4, 1, 2)).Factors(),
      "parallel.dp × parallel.tp × parallel.pp × parallel.cp = 2 × 4 × 1 × 2");
  EXPECT_EQ(ParallelWorldSize(Degrees(2, 4, 1, 2)), 16);
}

// ep is carved out of each dp group (dp × cp ranks, cp varying fastest):
// consecutive members share an ep group, and a rank's ep coordinate is its
// place there. It adds no ranks, and the factors name it apart.
TEST(Mesh, ExpertParallelIsCarvedOutOfTheDataParallelGroup) {
  v1::ParallelSpec p = Degrees(4, 2, 1, 2);
  p.set_ep(4);
  const ParallelLayout l = LayoutOf(p);
  EXPECT_EQ(l.world_size(), 16);
  EXPECT_EQ(l.group_size("dp"), 8);
  const int dp = MeshDimensionIndex("dp"), cp = MeshDimensionIndex("cp"),
            ep = MeshDimensionIndex("ep");
  for (int rank = 0; rank < 16; ++rank) {
    const std::vector<int> c = l.Coordinates(rank);
    EXPECT_EQ(c[ep], (c[dp] * 2 + c[cp]) % 4) << rank;
  }
  EXPECT_EQ(l.Factors(),
            "parallel.dp × parallel.tp × parallel.pp × parallel.cp = 4 × 2 × "
            "1 × 2 (parallel.ep=4 within parallel.dp)");
  EXPECT_EQ(LayoutOf(Degrees(2, 1, 1, 1)).degree("ep"), 1);
}

// ptcoord keeps tp × cp consecutive ranks on one node.
TEST(Mesh, NodeLocalRanksAreTpTimesCp) {
  EXPECT_EQ(LayoutOf(Degrees(4, 2, 2, 3)).node_local_ranks(), 6);
  EXPECT_EQ(LayoutOf(Degrees(4, 1, 2, 1)).node_local_ranks(), 1);
}

TEST(Mesh, LayoutCarriesTheSectionsOtherOptions) {
  v1::JobSpec spec = DefaultJobSpec();
  ASSERT_TRUE(ApplyOverride(&spec, "parallel.zero=2").ok());
  ASSERT_TRUE(ApplyOverride(&spec, "parallel.microbatches=4").ok());
  ASSERT_TRUE(ApplyOverride(&spec, "parallel.offload=optimizer").ok());
  const ParallelLayout l = JobLayout(spec);
  EXPECT_EQ(l.zero, 2);
  EXPECT_EQ(l.microbatches, 4);
  EXPECT_TRUE(l.offload_optimizer);
  const v1::JobSpec shrunk = WithDataParallel(spec, 3, 7);
  EXPECT_EQ(JobLayout(shrunk).degree("dp"), 3);
  EXPECT_EQ(JobLayout(shrunk).microbatches, 7);
  v1::JobSpec reset = shrunk;
  ResetParallel(&reset);
  EXPECT_EQ(JobLayout(reset).world_size(), 1);
  EXPECT_EQ(JobLayout(reset).zero, 0);
}

}  // namespace
}  // namespace ptrain
