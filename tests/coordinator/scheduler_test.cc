// Scheduler: FIFO gang scheduling — all slots at once, in order, no
// backfill past a blocked head, oversized jobs refused.
#include "coordinator/scheduler.h"

#include "gtest/gtest.h"

namespace ptrain {
namespace {

TEST(SchedulerTest, StartsJobsInOrderWhileAllTheirSlotsFit) {
  Scheduler s(4);
  EXPECT_EQ(s.Pick({{"a", 2}, {"b", 2}, {"c", 1}}, 0),
            (std::vector<std::string>{"a", "b"}));
}

TEST(SchedulerTest, BlockedHeadBlocksSmallerJobsBehindIt) {
  Scheduler s(4);
  EXPECT_TRUE(s.Pick({{"big", 4}, {"small", 1}}, 1).empty());
}

TEST(SchedulerTest, UsedSlotsAreNotHandedOut) {
  Scheduler s(4);
  EXPECT_EQ(s.Pick({{"a", 2}, {"b", 1}}, 2), (std::vector<std::string>{"a"}));
  EXPECT_TRUE(s.Pick({{"a", 1}}, 4).empty());
}

TEST(SchedulerTest, JobLargerThanPoolIsRefused) {
  Scheduler s(4);
  EXPECT_TRUE(s.CheckFits(4).ok());
  const absl::Status st = s.CheckFits(8);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("parallel.dp*tp*pp=8"), absl::string_view::npos)
      << st;
  EXPECT_FALSE(s.CheckFits(0).ok());
}

}  // namespace
}  // namespace ptrain
