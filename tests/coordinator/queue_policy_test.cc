// The queue's policy (queue_policy.h) as plain logic: order, quotas, fair
// share's decay, EASY backfill that never delays the head, and victims of a
// preemption, fewest and lowest.
#include "coordinator/queue_policy.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ptrain {
namespace {

TEST(QueueOrder, PriorityFirstThenSmallestUsageThenSubmission) {
  const QueueKey high_late{800, 5000, 9}, normal_heavy{500, 900, 1},
      normal_light{500, 10, 5}, normal_light_early{500, 10, 2};
  EXPECT_TRUE(StartsBefore(high_late, normal_light_early));
  EXPECT_TRUE(StartsBefore(normal_light, normal_heavy));
  EXPECT_TRUE(StartsBefore(normal_light_early, normal_light));
  EXPECT_FALSE(StartsBefore(normal_heavy, normal_light));
}

TEST(FairShare, UsageHalvesEachHalfLifeAndAddsUp) {
  const absl::Time t0 = absl::FromUnixSeconds(1000000);
  FairShare fs(absl::Hours(1));
  // 4 slots for 1 s, charged at the end: about 4 slot-seconds.
  fs.Charge("alice", 4, t0, t0 + absl::Seconds(1));
  EXPECT_NEAR(fs.Usage("alice", t0 + absl::Seconds(1)), 4, 1e-3);
  EXPECT_NEAR(fs.Usage("alice", t0 + absl::Seconds(1) + absl::Hours(1)), 2,
              1e-3);
  EXPECT_NEAR(fs.Usage("alice", t0 + absl::Seconds(1) + absl::Hours(2)), 1,
              1e-3);
  EXPECT_EQ(fs.Usage("bob", t0), 0);
  // Charged in pieces or at once, the same.
  FairShare a(absl::Hours(1)), b(absl::Hours(1));
  a.Charge("u", 2, t0, t0 + absl::Minutes(30));
  a.Charge("u", 2, t0 + absl::Minutes(30), t0 + absl::Hours(1));
  b.Charge("u", 2, t0, t0 + absl::Hours(1));
  EXPECT_NEAR(a.Usage("u", t0 + absl::Hours(3)),
              b.Usage("u", t0 + absl::Hours(3)), 1e-6);
  // An hour's use at 2 slots is less than 7200 slot-seconds by its decay.
  EXPECT_LT(b.Usage("u", t0 + absl::Hours(1)), 7200);
  EXPECT_GT(b.Usage("u", t0 + absl::Hours(1)), 7200 * 0.7);
}

TEST(Quota, AUserAtAnyLimitWaitsSayingWhichAndNoneMeansNoLimit) {
  const Quota q{8, 2, 3};
  EXPECT_EQ(QuotaReason("alice", q, Holding{8, 0, 1}, Holding{1, 0, 1}),
            "user alice at quota: 8/8 slots");
  EXPECT_EQ(QuotaReason("alice", q, Holding{4, 0, 3}, Holding{1, 0, 1}),
            "user alice at quota: 3/3 running jobs");
  EXPECT_EQ(QuotaReason("alice", q, Holding{2, 2, 1}, Holding{1, 1, 1}),
            "user alice at quota: 2/2 GPUs");
  EXPECT_EQ(QuotaReason("alice", q, Holding{4, 0, 1}, Holding{4, 0, 1}), "");
  EXPECT_EQ(QuotaReason("bob", Quota{}, Holding{1000, 8, 50}, Holding{8, 8, 1}),
            "");
  EXPECT_NE(NeverFitsQuota("alice", q, Holding{9, 0, 1}), "");
  EXPECT_EQ(NeverFitsQuota("alice", q, Holding{8, 2, 1}), "");
}

// 8 slots. A runs 4 (ends in 100 s), B runs 2 (end unknown); the head
// needs 6: it starts when A ends. A candidate fits now in the 2 free slots
// when, at A's end, the head still fits beside it.
TEST(Backfill, ACandidateStartsOnlyWhereTheHeadStillFitsAtItsPlannedStart) {
  const std::vector<RunningJob> running = {{"A", 500, 100.0, true},
                                           {"B", 500, std::nullopt, true}};
  const int total = 8;
  const std::map<std::string, int> slots = {{"A", 4}, {"B", 2}};
  const auto fits = [&](int head, int candidate) {
    return [=](const std::set<std::string>& gone, bool with_candidate) {
      int used = with_candidate ? candidate : 0;
      for (const auto& [id, n] : slots) {
        if (!gone.count(id)) used += n;
      }
      return total - used >= head;
    };
  };
  // Head 6: at A's end 6 are free; a candidate of 1 would leave 5.
  EXPECT_FALSE(BackfillKeepsHeadStart(running, fits(6, 1)));
  // Head 5: a candidate of 1 leaves 5 at A's end.
  EXPECT_TRUE(BackfillKeepsHeadStart(running, fits(5, 1)));
  EXPECT_FALSE(BackfillKeepsHeadStart(running, fits(5, 2)));
  // Head 7 waits for B too, whose end is unknown: no backfill.
  EXPECT_FALSE(BackfillKeepsHeadStart(running, fits(7, 1)));
}

TEST(Preemption, TheFewestLowerPriorityJobsThenTheLowestArePicked) {
  // Slots: a 4 (low), b 2 (low), c 2 (normal), d 4 (high, above the head),
  // e 4 (low, not preemptible). 0 free; the head (normal+ 600) needs 4.
  const std::map<std::string, int> slots = {
      {"a", 4}, {"b", 2}, {"c", 2}, {"d", 4}, {"e", 4}};
  const std::vector<RunningJob> running = {{"a", 200, std::nullopt, true},
                                           {"b", 200, std::nullopt, true},
                                           {"c", 500, std::nullopt, true},
                                           {"d", 800, std::nullopt, true},
                                           {"e", 100, std::nullopt, false}};
  const auto frees = [&](int need) {
    return [=](const std::set<std::string>& victims) {
      int freed = 0;
      for (const std::string& v : victims) freed += slots.at(v);
      return freed >= need;
    };
  };
  EXPECT_EQ(PickVictims(running, 600, frees(4)),
            (std::vector<std::string>{"a"}));
  // 6: two jobs are needed; a+b (both low) rather than a+c.
  EXPECT_EQ(PickVictims(running, 600, frees(6)),
            (std::vector<std::string>{"a", "b"}));
  // 8: all three below 600.
  EXPECT_EQ(PickVictims(running, 600, frees(8)),
            (std::vector<std::string>{"a", "b", "c"}));
  // 9: no set of lower, preemptible jobs frees enough.
  EXPECT_TRUE(PickVictims(running, 600, frees(9)).empty());
  // Nothing of lower priority than the lowest.
  EXPECT_TRUE(PickVictims(running, 100, frees(1)).empty());
}

}  // namespace
}  // namespace ptrain
