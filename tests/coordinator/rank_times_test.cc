// RankTimesBoard: the latest attempt's step times of each rank, in the
// order they came, at most kPointsPerRank a rank, continued from a cursor,
// thinned to kMaxPoints when asked for all.
#include "coordinator/rank_times.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ptrain {
namespace {

v1::RankTimes Times(int64_t step, double ms) {
  v1::RankTimes t;
  t.set_step(step);
  t.set_steps(1);
  t.set_step_ms(ms);
  return t;
}

TEST(RankTimesBoardTest, PointsComeInOrderAndContinueFromTheCursor) {
  RankTimesBoard b;
  EXPECT_EQ(b.Since("job-1", 0).attempt, 0);
  EXPECT_TRUE(b.Since("job-1", 0).points.empty());
  b.Add("job-1", 1, 2, 0, Times(1, 10), 100);
  b.Add("job-1", 1, 2, 1, Times(1, 20), 101);
  b.Add("job-2", 1, 1, 0, Times(1, 99), 102);
  b.Add("job-1", 1, 2, 0, Times(2, 11), 103);
  RankTimesBoard::View v = b.Since("job-1", 0);
  EXPECT_EQ(v.attempt, 1);
  EXPECT_EQ(v.world_size, 2);
  ASSERT_EQ(v.points.size(), 3u);
  EXPECT_EQ(v.points[0].rank, 0);
  EXPECT_EQ(v.points[1].rank, 1);
  EXPECT_EQ(v.points[1].times.step_ms(), 20);
  EXPECT_EQ(v.points[2].times.step(), 2);
  EXPECT_EQ(v.points[2].unix_ms, 103);
  const int64_t cursor = v.next;
  EXPECT_TRUE(b.Since("job-1", cursor).points.empty());
  EXPECT_EQ(b.Since("job-1", cursor).next, cursor);
  b.Add("job-1", 1, 2, 1, Times(2, 21), 104);
  v = b.Since("job-1", cursor);
  ASSERT_EQ(v.points.size(), 1u);
  EXPECT_EQ(v.points[0].times.step_ms(), 21);
  EXPECT_GT(v.next, cursor);
}

TEST(RankTimesBoardTest, ANewAttemptReplacesTheOldOnesPoints) {
  RankTimesBoard b;
  b.Add("job-1", 1, 2, 0, Times(5, 10), 1);
  b.Add("job-1", 1, 2, 1, Times(5, 10), 2);
  b.Add("job-1", 2, 1, 0, Times(3, 30), 3);
  b.Add("job-1", 1, 2, 1, Times(6, 10), 4);  // late, of the old attempt
  RankTimesBoard::View v = b.Since("job-1", 0);
  EXPECT_EQ(v.attempt, 2);
  EXPECT_EQ(v.world_size, 1);
  ASSERT_EQ(v.points.size(), 1u);
  EXPECT_EQ(v.points[0].times.step_ms(), 30);
}

TEST(RankTimesBoardTest, EachRankKeepsItsNewestPointsAndAllIsThinned) {
  RankTimesBoard b;
  const int n = static_cast<int>(RankTimesBoard::kPointsPerRank) + 5;
  for (int i = 1; i <= n; ++i) b.Add("job-1", 1, 1, 0, Times(i, i), i);
  RankTimesBoard::View v = b.Since("job-1", 0);
  ASSERT_EQ(v.points.size(), RankTimesBoard::kPointsPerRank);
  EXPECT_EQ(v.points.front().times.step(), 6);
  EXPECT_EQ(v.points.back().times.step(), n);
  // Many ranks: everything asked for at once is thinned, the newest kept.
  RankTimesBoard many;
  const int ranks = 40;
  for (int i = 1; i <= 600; ++i) {
    for (int r = 0; r < ranks; ++r) {
      many.Add("job-1", 1, ranks, r, Times(i, r), i);
    }
  }
  v = many.Since("job-1", 0);
  EXPECT_LE(v.points.size(), RankTimesBoard::kMaxPoints);
  EXPECT_GE(v.points.size(), RankTimesBoard::kMaxPoints / 2);
  EXPECT_EQ(v.points.back().times.step(), 600);
  // From a cursor, nothing is left out.
  EXPECT_EQ(many.Since("job-1", v.next - ranks).points.size(),
            static_cast<size_t>(ranks));
}

TEST(RankTimesBoardTest, OnlyTheJobsHeardFromLastAreKept) {
  RankTimesBoard b;
  const int jobs = static_cast<int>(RankTimesBoard::kJobs);
  for (int j = 0; j <= jobs; ++j) {
    b.Add(absl::StrCat("job-", j), 1, 1, 0, Times(1, 1), j);
  }
  EXPECT_TRUE(b.Since("job-0", 0).points.empty());
  EXPECT_EQ(b.Since("job-1", 0).points.size(), 1u);
  EXPECT_EQ(b.Since(absl::StrCat("job-", jobs), 0).points.size(), 1u);
}

}  // namespace
}  // namespace ptrain
