// Pipeline schedules: the textbook orders, every pass exactly once, orders
// that neighbours can follow without deadlock, the activation-stash bound,
// and the bubble a simulation of each yields against the analytic one.
#include "worker/engine/parallel/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace ptrain {
namespace {

std::string Order(ScheduleKind kind, int pp, int rank, int m, int v = 1) {
  std::string out;
  for (const PipeAction& a : PipelineOrder(kind, pp, rank, m, v)) {
    if (!out.empty()) out += " ";
    out += ToString(a, v > 1);
  }
  return out;
}

TEST(PipelineOrder, GpipeRunsEveryForwardThenEveryBackward) {
  EXPECT_EQ(Order(ScheduleKind::kGpipe, 4, 0, 4), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(Order(ScheduleKind::kGpipe, 4, 3, 4), "F0 F1 F2 F3 B0 B1 B2 B3");
}

TEST(PipelineOrder, OneFOneBMatchesTheTextbook) {
  // pp = 4, m = 8: rank r warms up with pp-r-1 forwards.
  EXPECT_EQ(Order(ScheduleKind::k1F1B, 4, 0, 8),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(Order(ScheduleKind::k1F1B, 4, 1, 8),
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(Order(ScheduleKind::k1F1B, 4, 3, 8),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer microbatches than stages: warm-up is cut at m.
  EXPECT_EQ(Order(ScheduleKind::k1F1B, 4, 0, 2), "F0 F1 B0 B1");
}

TEST(PipelineOrder, InterleavedMatchesTheTextbook) {
  // pp = 2, v = 2, m = 4: microbatches go through chunk 0 in pairs, then
  // chunk 1; rank 0 warms up with (pp-1)·2 + (v-1)·pp = 4 forwards.
  EXPECT_EQ(Order(ScheduleKind::kInterleaved, 2, 0, 4, 2),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "
            "B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(Order(ScheduleKind::kInterleaved, 2, 1, 4, 2),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 "
            "F3.1 B3.1 B2.0 B3.0");
}

struct Case {
  ScheduleKind kind;
  int pp, m, v;
};

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (int pp : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 8, 16}) {
      out.push_back({ScheduleKind::kGpipe, pp, m, 1});
      out.push_back({ScheduleKind::k1F1B, pp, m, 1});
      for (int v : {2, 3}) {
        if (m % pp == 0) out.push_back({ScheduleKind::kInterleaved, pp, m, v});
      }
    }
  }
  return out;
}

std::string Name(const Case& c) {
  return std::string(ScheduleName(c.kind)) + " pp=" + std::to_string(c.pp) +
         " m=" + std::to_string(c.m) + " v=" + std::to_string(c.v);
}

TEST(PipelineOrder, EveryPassRunsOnceAndBackwardFollowsItsForward) {
  for (const Case& c : Cases()) {
    for (int r = 0; r < c.pp; ++r) {
      std::set<std::tuple<int, int, int>> seen;
      for (const PipeAction& a : PipelineOrder(c.kind, c.pp, r, c.m, c.v)) {
        ASSERT_GE(a.microbatch, 0);
        ASSERT_LT(a.microbatch, c.m);
        ASSERT_GE(a.chunk, 0);
        ASSERT_LT(a.chunk, c.v);
        EXPECT_TRUE(seen.insert({a.kind, a.microbatch, a.chunk}).second)
            << Name(c) << " rank " << r << " runs " << ToString(a, true)
            << " twice";
        if (a.kind == PipeAction::kBackward) {
          EXPECT_TRUE(seen.count({PipeAction::kForward, a.microbatch, a.chunk}))
              << Name(c) << " rank " << r << ": " << ToString(a, true)
              << " before its forward";
        }
      }
      EXPECT_EQ(seen.size(), size_t(2 * c.m * c.v)) << Name(c);
    }
  }
}

TEST(PipelineOrder, NeighboursNeverDeadlock) {
  for (const Case& c : Cases()) {
    EXPECT_FALSE(SimulatePipeline(c.kind, c.pp, c.m, c.v, 1, 2).deadlock)
        << Name(c);
  }
}

TEST(PipelineOrder, StashBound) {
  for (const Case& c : Cases()) {
    for (int r = 0; r < c.pp; ++r) {
      const int most = MaxInFlight(PipelineOrder(c.kind, c.pp, r, c.m, c.v));
      switch (c.kind) {
        case ScheduleKind::kGpipe:  // every microbatch at once
          EXPECT_EQ(most, c.m) << Name(c);
          break;
        case ScheduleKind::k1F1B:  // at most pp - r, never more than pp
          EXPECT_EQ(most, std::min(c.pp - r, c.m)) << Name(c) << " rank " << r;
          break;
        case ScheduleKind::kInterleaved:  // the warm-up plus one
          if (c.m > c.pp) {
            EXPECT_EQ(most, std::min((c.pp - r - 1) * 2 + (c.v - 1) * c.pp + 1,
                                     c.m * c.v))
                << Name(c) << " rank " << r;
          }
          break;
        case ScheduleKind::kZeroBubble:  // not in Cases: ZeroBubbleOrder's
          break;
      }
    }
  }
}

TEST(ScheduleKindOf, ReadsBackEveryScheduleName) {
  for (ScheduleKind k :
       {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
        ScheduleKind::kZeroBubble}) {
    EXPECT_EQ(ScheduleKindOf(ScheduleName(k)), k) << ScheduleName(k);
  }
}

// parallel.schedule=zb1p runs ZeroBubbleOrder, and each rank's activation
// slots are what that order holds at most (a microbatch until its W).
TEST(PipelineOrder, Zb1pIsTheZeroBubbleOrderAndItsSlotsWhatItHolds) {
  for (int pp : {2, 3, 4}) {
    for (int m : {1, 2, 4, 8, 13}) {
      for (int r = 0; r < pp; ++r) {
        const std::vector<PipeAction> order =
            PipelineOrder(ScheduleKind::kZeroBubble, pp, r, m, 1);
        EXPECT_EQ(order, ZeroBubbleOrder(pp, r, m));
        EXPECT_EQ(ChunkSlots(ScheduleKind::kZeroBubble, pp, r, m, 1),
                  std::vector<int>{MaxInFlight(order)})
            << "pp " << pp << " m " << m << " rank " << r;
        // As many as 1F1B's first rank at most.
        EXPECT_LE(MaxInFlight(order), std::min(pp, m));
      }
    }
  }
}

// Without a pipeline microbatches run one after another, whatever the
// schedule says: one slot.
TEST(ChunkSlots, OneSlotWithoutAPipeline) {
  for (ScheduleKind k : {ScheduleKind::kGpipe, ScheduleKind::k1F1B}) {
    EXPECT_EQ(ChunkSlots(k, 1, 0, 8, 1), std::vector<int>{1})
        << ScheduleName(k);
  }
}

// ChunkSlots lists only enough microbatches for the warm-up and two
// periods: it must agree with counting every pass of the whole order, for
// microbatch counts below, at and far above that.
TEST(ChunkSlots, EqualsEachChunksMostInFlightOverTheWholeOrder) {
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1F1B,
                            ScheduleKind::kInterleaved}) {
    for (int pp : {2, 3, 4}) {
      for (int v : {1, 2, 3, 4}) {
        if ((kind == ScheduleKind::kInterleaved) != (v > 1)) continue;
        for (int m = pp; m <= 24 * pp; m += pp) {
          for (int r = 0; r < pp; ++r) {
            std::vector<int> want(v, 0), now(v, 0);
            for (const PipeAction& a : PipelineOrder(kind, pp, r, m, v)) {
              now[a.chunk] += a.kind == PipeAction::kForward ? 1 : -1;
              want[a.chunk] = std::max(want[a.chunk], now[a.chunk]);
            }
            EXPECT_EQ(ChunkSlots(kind, pp, r, m, v), want)
                << ScheduleName(kind) << " pp " << pp << " v " << v << " m "
                << m << " rank " << r;
          }
        }
      }
    }
  }
}

TEST(PipelineSimulation, GpipeAndOneFOneBHaveTheAnalyticBubble) {
  for (const Case& c : Cases()) {
    if (c.kind == ScheduleKind::kInterleaved) continue;
    const PipelineSimulation sim = SimulatePipeline(c.kind, c.pp, c.m, 1, 1, 2);
    EXPECT_NEAR(sim.makespan, (c.m + c.pp - 1) * 3.0, 1e-9) << Name(c);
    EXPECT_NEAR(sim.bubble_fraction(), AnalyticBubble(c.pp, c.m), 1e-9)
        << Name(c);
  }
}

// A slower last stage (the head and the loss) sets the pace: stage 0 fills
// it, then it runs every microbatch back to back, then stage 0 drains:
// F0 + m·(F1 + B1) + B0, and stage 0 idles for the difference.
TEST(PipelineSimulation, TheSlowestStageSetsThePaceOfOneFOneB) {
  for (int m : {2, 8, 16}) {
    const PipelineSimulation sim = SimulatePipeline(
        ScheduleKind::k1F1B, 2, m, 1, std::vector<double>{1.0, 1.1},
        std::vector<double>{2.0, 2.2});
    EXPECT_NEAR(sim.makespan, 1.0 + m * 3.3 + 2.0, 1e-9) << m;
    EXPECT_NEAR(sim.idle[0], sim.makespan - m * 3.0, 1e-9) << m;
    EXPECT_NEAR(sim.idle[1], sim.makespan - m * 3.3, 1e-9) << m;
  }
}

TEST(PipelineSimulation, InterleavingCutsTheBubbleByAboutV) {
  for (int pp : {2, 4}) {
    for (int m : {8, 16}) {
      const double plain = SimulatePipeline(ScheduleKind::k1F1B, pp, m, 1, 1, 2)
                               .bubble_fraction();
      for (int v : {2, 3}) {
        const double inter =
            SimulatePipeline(ScheduleKind::kInterleaved, pp, m, v, 1, 2)
                .bubble_fraction();
        std::printf("pp=%d m=%d v=%d: bubble %.3f -> %.3f (%.2fx less)\n", pp,
                    m, v, plain, inter, plain / inter);
        EXPECT_GE(plain / inter, 0.6 * v) << "pp=" << pp << " m=" << m;
      }
    }
  }
}

std::string ZeroBubble(int pp, int rank, int m) {
  std::string out;
  for (const PipeAction& a : ZeroBubbleOrder(pp, rank, m)) {
    if (!out.empty()) out += " ";
    out += ToString(a);
  }
  return out;
}

// ZB-H1: 1F1B's F and B, rank r's W r microbatches behind its B.
TEST(ZeroBubbleOrder, IsOneFOneBWithWeightPassesLaggingByTheRank) {
  EXPECT_EQ(ZeroBubble(2, 0, 4), "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3");
  EXPECT_EQ(ZeroBubble(2, 1, 4), "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3");
  EXPECT_EQ(ZeroBubble(4, 3, 4), "F0 B0 F1 B1 F2 B2 F3 B3 W0 W1 W2 W3");
  // Without a pipeline: F, B, W of each microbatch in turn.
  EXPECT_EQ(ZeroBubble(1, 0, 2), "F0 B0 W0 F1 B1 W1");
}

// Every F, B and W once, B after its F and W after its B; F and B in
// 1F1B's order; never more microbatches held than 1F1B holds on its first
// rank; no deadlock.
TEST(ZeroBubbleOrder, EveryPassOnceInOrderWithinOneFOneBsStash) {
  for (int pp : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 8, 16}) {
      std::vector<std::vector<PipeAction>> orders;
      for (int r = 0; r < pp; ++r) {
        const std::vector<PipeAction> order = ZeroBubbleOrder(pp, r, m);
        std::set<std::pair<int, int>> seen;
        std::vector<PipeAction> fb;
        for (const PipeAction& a : order) {
          EXPECT_EQ(a.chunk, 0);
          EXPECT_TRUE(seen.insert({a.kind, a.microbatch}).second)
              << "pp " << pp << " m " << m << " rank " << r << " "
              << ToString(a) << " twice";
          if (a.kind != PipeAction::kForward) {
            EXPECT_TRUE(seen.count({a.kind - 1, a.microbatch}))
                << "pp " << pp << " m " << m << " rank " << r << " "
                << ToString(a) << " before its "
                << (a.kind == PipeAction::kBackward ? "F" : "B");
          }
          if (a.kind != PipeAction::kWeight) fb.push_back(a);
        }
        EXPECT_EQ(seen.size(), size_t(3 * m));
        EXPECT_EQ(fb, PipelineOrder(ScheduleKind::k1F1B, pp, r, m, 1))
            << "pp " << pp << " m " << m << " rank " << r;
        EXPECT_LE(MaxInFlight(order), std::min(pp, m))
            << "pp " << pp << " m " << m << " rank " << r;
        orders.push_back(order);
      }
      EXPECT_FALSE(SimulateOrders(orders, 1, std::vector<double>(pp, 1.0),
                                  std::vector<double>(pp, 1.0),
                                  std::vector<double>(pp, 1.0))
                       .deadlock)
          << "pp " << pp << " m " << m;
    }
  }
}

// With F, B and W of equal time, 1F1B (its backward B + W) idles
// (pp-1)·3 units a rank; ZB-H1 about (pp-1)·(F + B - W) = (pp-1): the
// bubble a third, and at most half, of 1F1B's. Losses are the same
// passes in another order: the engine's concern, not the schedule's.
TEST(ZeroBubbleOrder, CutsOneFOneBsBubbleToAboutAThird) {
  for (int pp : {2, 4}) {
    for (int m : {4, 8, 16}) {
      const PipelineSimulation plain =
          SimulatePipeline(ScheduleKind::k1F1B, pp, m, 1, 1.0, 2.0);
      std::vector<std::vector<PipeAction>> orders;
      for (int r = 0; r < pp; ++r) orders.push_back(ZeroBubbleOrder(pp, r, m));
      const std::vector<double> one(pp, 1.0);
      const PipelineSimulation zb = SimulateOrders(orders, 1, one, one, one);
      ASSERT_FALSE(zb.deadlock);
      std::printf("pp=%d m=%d: bubble 1f1b %.3f, zb1p %.3f (%.2fx)\n", pp, m,
                  plain.bubble_fraction(), zb.bubble_fraction(),
                  zb.bubble_fraction() / plain.bubble_fraction());
      EXPECT_LE(zb.bubble_fraction(), 0.5 * plain.bubble_fraction())
          << "pp " << pp << " m " << m;
      for (int r = 0; r < pp; ++r) {
        EXPECT_NEAR(zb.idle[r], pp - 1.0, 1e-9) << "pp " << pp << " m " << m;
      }
    }
  }
}

}  // namespace
}  // namespace ptrain
