// The MPI Communicator under mpirun (2, 3 and 4 ranks): every op's result
// against a value computed locally from known per-rank inputs, and its stats.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/spec.h"
#include "nlohmann/json.hpp"
#include "worker/engine/comm/comm.h"
#include "worker/engine/comm/comm_mpi.h"
#include "worker/engine/comm/flight_recorder.h"
#include "worker/engine/parallel/parallel_dims.h"

namespace ptrain {
namespace {

// Rank r's input element i. Rank-dependent in a non-symmetric way (a swap of
// ranks or slices changes results), and small multiples of 1/4 so every sum
// over <= 16 ranks is exact in fp32 whatever order MPI adds in.
float Value(int r, int64_t i) {
  return static_cast<float>((r * r + 1) * ((i * 7 + r) % 11)) + 0.25f * r;
}

float SumOverRanks(int n, int64_t i) {
  float s = 0;
  for (int r = 0; r < n; ++r) s += Value(r, i);
  return s;
}

int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int WorldSize() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

std::unique_ptr<Communicator> World(
    std::shared_ptr<CommStats> stats = std::make_shared<CommStats>()) {
  return MakeMpiCommunicator(MPI_COMM_WORLD, "world", std::move(stats));
}

// Exact element-wise equality, reporting only the first difference so a
// wrong result does not flood the log.
template <typename T>
::testing::AssertionResult ElementsEqual(const std::vector<T>& got,
                                         const std::vector<T>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "size " << got.size() << " != " << want.size();
  }
  int64_t wrong = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++wrong;
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << wrong << " of " << got.size() << " elements differ; first at "
         << first << ": got " << got[first] << ", want " << want[first]
         << " (rank " << WorldRank() << ")";
}

// Odd counts, so no op can pass by accident of even splits or vector widths.
constexpr int64_t kCount = 1001;

TEST(CommOpNameTest, NamesAreTheMetricsOpLabels) {
  EXPECT_STREQ(CommOpName(CommOp::kAllReduce), "all_reduce");
  EXPECT_STREQ(CommOpName(CommOp::kReduceScatter), "reduce_scatter");
  EXPECT_STREQ(CommOpName(CommOp::kAllGather), "all_gather");
  EXPECT_STREQ(CommOpName(CommOp::kBroadcast), "broadcast");
  EXPECT_STREQ(CommOpName(CommOp::kSend), "send");
  EXPECT_STREQ(CommOpName(CommOp::kRecv), "recv");
  EXPECT_STREQ(CommOpName(CommOp::kBarrier), "barrier");
  EXPECT_STREQ(CommOpName(CommOp::kAllToAll), "all_to_all");
}

// Rank r sends (r + 2·d) % 3 elements to rank d (none to some, the most
// to others; its own block included), each telling sender, receiver and
// position apart.
int64_t AllToAllCount(int from, int to) { return (from + 2 * to) % 3; }
float AllToAllValue(int from, int to, int64_t i) {
  return static_cast<float>(100 * from + 10 * to + i);
}

void ExpectAllToAll(Communicator& c, bool base) {
  const int n = c.size(), me = c.rank();
  std::vector<int64_t> send_counts(n), recv_counts(n);
  std::vector<float> send, want;
  for (int d = 0; d < n; ++d) {
    send_counts[d] = AllToAllCount(me, d);
    recv_counts[d] = AllToAllCount(d, me);
    for (int64_t i = 0; i < send_counts[d]; ++i) {
      send.push_back(AllToAllValue(me, d, i));
    }
    for (int64_t i = 0; i < recv_counts[d]; ++i) {
      want.push_back(AllToAllValue(d, me, i));
    }
  }
  std::vector<float> got(want.size() + 1, -1.0f);
  if (base) {
    c.Communicator::AllToAllV(send.data(), send_counts.data(), got.data(),
                              recv_counts.data());
  } else {
    c.AllToAllV(send.data(), send_counts.data(), got.data(),
                recv_counts.data());
  }
  EXPECT_EQ(got.back(), -1.0f) << "wrote past the received blocks";
  got.pop_back();
  EXPECT_TRUE(ElementsEqual(got, want));
}

// Expert parallelism's groups (ParallelDims): ep 2 carved out of dp 4 puts
// consecutive dp ranks together, and each rank's experts are held by the
// ranks of its ep coordinate (edp). Under 4 ranks.
TEST(ParallelDimsTest, ExpertGroupsAreConsecutiveDataParallelRanks) {
  if (WorldSize() != 4) GTEST_SKIP() << "a mesh of 4 ranks";
  v1::ParallelSpec p = DefaultJobSpec().parallel();
  p.set_dp(4);
  p.set_ep(2);
  auto dims = ParallelDims::Create(p, MPI_COMM_WORLD);
  ASSERT_TRUE(dims.ok()) << dims.status();
  const int me = WorldRank();
  EXPECT_EQ((*dims)->coordinate("ep"), me % 2);
  auto members = [&](Communicator* c) {
    std::vector<float> all(c->size());
    const float mine = static_cast<float>(me);
    c->AllGather(&mine, all.data(), 1);
    return all;
  };
  ASSERT_NE((*dims)->ep_comm(), nullptr);
  ASSERT_NE((*dims)->edp_comm(), nullptr);
  const float first = static_cast<float>(me - me % 2);
  EXPECT_EQ(members((*dims)->ep_comm()),
            (std::vector<float>{first, first + 1}));
  EXPECT_EQ(members((*dims)->edp_comm()),
            (std::vector<float>{float(me % 2), float(me % 2 + 2)}));
  EXPECT_EQ((*dims)->ep_comm()->group(), "ep");
  EXPECT_EQ((*dims)->edp_comm()->group(), "edp");
  EXPECT_EQ((*dims)->compute_groups().expert_dp, (*dims)->edp_comm());
}

// MPI_Alltoallv, and the point-to-point one every communicator has.
TEST(MpiCommunicatorTest, AllToAllVDeliversEachBlockToItsRankInOrder) {
  auto stats = std::make_shared<CommStats>();
  auto c = World(stats);
  ExpectAllToAll(*c, /*base=*/false);
  ExpectAllToAll(*c, /*base=*/true);
  EXPECT_EQ(stats->Get("world", CommOp::kAllToAll).calls, 1);
}

TEST(MpiCommunicatorTest, RankAndSizeAreThoseOfTheWrappedComm) {
  auto comm = World();
  EXPECT_EQ(comm->rank(), WorldRank());
  EXPECT_EQ(comm->size(), WorldSize());
  EXPECT_EQ(comm->group(), "world");
}

TEST(MpiCommunicatorTest, AllReduceFloatSumsEveryRanksValues) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  std::vector<float> data(kCount), want(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    data[i] = Value(me, i);
    want[i] = SumOverRanks(n, i);
  }
  comm->AllReduce(data.data(), kCount);
  EXPECT_TRUE(ElementsEqual(data, want));
}

TEST(MpiCommunicatorTest, AllReduceDoubleSumsInDoublePrecision) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  // 2^30 + a fraction: the fraction is lost in fp32, so a float reduction
  // behind the double overload fails here.
  auto value = [](int r, int64_t i) {
    return 1073741824.0 + 0.125 * (r * r + 1) * (i % 5 + 1) + r;
  };
  std::vector<double> data(kCount), want(kCount, 0.0);
  for (int64_t i = 0; i < kCount; ++i) {
    data[i] = value(me, i);
    for (int r = 0; r < n; ++r) want[i] += value(r, i);
  }
  comm->AllReduce(data.data(), kCount);
  EXPECT_TRUE(ElementsEqual(data, want));
}

TEST(MpiCommunicatorTest, AllReduceMaxTakesTheLargestOfEveryRank) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  // Which rank holds the maximum changes with the element.
  auto value = [](int r, int64_t i) {
    return static_cast<float>(((r + i) % 7) * 1.5 - 4.0 + 0.001 * r);
  };
  std::vector<float> data(kCount), want(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    data[i] = value(me, i);
    want[i] = value(0, i);
    for (int r = 1; r < n; ++r) want[i] = std::max(want[i], value(r, i));
  }
  comm->AllReduceMax(data.data(), kCount);
  EXPECT_TRUE(ElementsEqual(data, want));
}

TEST(MpiCommunicatorTest, AllReduceTwiceGivesSizeTimesTheSum) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  std::vector<float> data(kCount), want(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    data[i] = Value(me, i);
    want[i] = n * SumOverRanks(n, i);
  }
  comm->AllReduce(data.data(), kCount);
  comm->AllReduce(data.data(), kCount);
  EXPECT_TRUE(ElementsEqual(data, want));
}

TEST(MpiCommunicatorTest, ReduceScatterGivesEachRankTheSumOfItsSlice) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  std::vector<float> send(n * kCount), recv(kCount, -1.0f), want(kCount);
  for (int64_t j = 0; j < n * kCount; ++j) send[j] = Value(me, j);
  for (int64_t i = 0; i < kCount; ++i)
    want[i] = SumOverRanks(n, me * kCount + i);
  comm->ReduceScatter(send.data(), recv.data(), kCount);
  EXPECT_TRUE(ElementsEqual(recv, want));
}

TEST(MpiCommunicatorTest, AllGatherConcatenatesSlicesInRankOrder) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  std::vector<float> send(kCount), recv(n * kCount, -1.0f), want(n * kCount);
  for (int64_t i = 0; i < kCount; ++i) send[i] = Value(me, i);
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < kCount; ++i) want[r * kCount + i] = Value(r, i);
  }
  comm->AllGather(send.data(), recv.data(), kCount);
  EXPECT_TRUE(ElementsEqual(recv, want));
}

TEST(MpiCommunicatorTest, AllGatherInPlaceFillsTheOtherRanksSlices) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  // Only this rank's slice holds data; the rest is a marker that must be
  // overwritten.
  std::vector<float> buf(n * kCount, -7.0f), want(n * kCount);
  for (int64_t i = 0; i < kCount; ++i) buf[me * kCount + i] = Value(me, i);
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < kCount; ++i) want[r * kCount + i] = Value(r, i);
  }
  comm->AllGather(buf.data() + me * kCount, buf.data(), kCount);
  EXPECT_TRUE(ElementsEqual(buf, want));
}

TEST(MpiCommunicatorTest, BroadcastFromNonZeroRootCopiesRootsData) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  for (int root = 1; root < n; ++root) {
    std::vector<float> data(kCount), want(kCount);
    for (int64_t i = 0; i < kCount; ++i) {
      data[i] = Value(me, i);
      want[i] = Value(root, i);
    }
    comm->Broadcast(data.data(), kCount, root);
    EXPECT_TRUE(ElementsEqual(data, want)) << "root " << root;
  }
}

TEST(MpiCommunicatorTest, SendRecvRingPassesEachRanksDataToTheNext) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  std::vector<float> send(kCount), recv(kCount, -1.0f), want(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    send[i] = Value(me, i);
    want[i] = Value(prev, i);
  }
  // Blocking sends may rendezvous, so half the ring receives first; rank
  // n-1 with odd n sends first like rank 0, and rank 0 then unblocks it.
  if (me % 2 == 0) {
    comm->Send(send.data(), kCount, next, 3);
    comm->Recv(recv.data(), kCount, prev, 3);
  } else {
    comm->Recv(recv.data(), kCount, prev, 3);
    comm->Send(send.data(), kCount, next, 3);
  }
  EXPECT_TRUE(ElementsEqual(recv, want));
}

TEST(MpiCommunicatorTest, AsyncSendRecvRingPassesEachRanksDataToTheNext) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  std::vector<float> send(kCount), recv(kCount, -1.0f), want(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    send[i] = Value(me, i);
    want[i] = Value(prev, i);
  }
  auto r = comm->RecvAsync(recv.data(), kCount, prev, 5);
  auto s = comm->SendAsync(send.data(), kCount, next, 5);
  s->Wait();
  r->Wait();
  EXPECT_TRUE(ElementsEqual(recv, want));
}

TEST(MpiCommunicatorTest, AsyncCollectivesEqualBlockingOnes) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  std::vector<float> in(n * kCount);
  for (int64_t j = 0; j < n * kCount; ++j) in[j] = Value(me, j);

  {
    std::vector<float> a(in.begin(), in.begin() + kCount), b = a;
    comm->AllReduce(a.data(), kCount);
    comm->AllReduceAsync(b.data(), kCount)->Wait();
    EXPECT_TRUE(ElementsEqual(b, a)) << "all_reduce";
  }
  {
    std::vector<float> a(kCount, -1.0f), b(kCount, -2.0f);
    comm->ReduceScatter(in.data(), a.data(), kCount);
    comm->ReduceScatterAsync(in.data(), b.data(), kCount)->Wait();
    EXPECT_TRUE(ElementsEqual(b, a)) << "reduce_scatter";
  }
  {
    std::vector<float> a(n * kCount, -1.0f), b(n * kCount, -2.0f);
    comm->AllGather(in.data(), a.data(), kCount);
    comm->AllGatherAsync(in.data(), b.data(), kCount)->Wait();
    EXPECT_TRUE(ElementsEqual(b, a)) << "all_gather";
    // In place, async: only the own slice is valid before the call.
    std::vector<float> c(n * kCount, -3.0f);
    std::copy(in.begin(), in.begin() + kCount, c.begin() + me * kCount);
    comm->AllGatherAsync(c.data() + me * kCount, c.data(), kCount)->Wait();
    EXPECT_TRUE(ElementsEqual(c, a)) << "all_gather in place";
  }
  {
    const int root = n - 1;
    std::vector<float> a(in.begin(), in.begin() + kCount), b = a;
    comm->Broadcast(a.data(), kCount, root);
    comm->BroadcastAsync(b.data(), kCount, root)->Wait();
    EXPECT_TRUE(ElementsEqual(b, a)) << "broadcast";
  }
}

TEST(MpiCommunicatorTest, TestReportsCompletionThenWaitReturnsAtOnce) {
  auto stats = std::make_shared<CommStats>();
  auto comm = World(stats);
  const int n = comm->size(), me = comm->rank();
  std::vector<float> data(kCount), want(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    data[i] = Value(me, i);
    want[i] = SumOverRanks(n, i);
  }
  auto h = comm->AllReduceAsync(data.data(), kCount);
  while (!h->Test()) {
  }
  EXPECT_TRUE(h->Test());
  h->Wait();
  h.reset();
  EXPECT_TRUE(ElementsEqual(data, want));
  // Completion observed by Test, Test again, Wait and the destructor: still
  // one operation.
  EXPECT_EQ(stats->Get("world", CommOp::kAllReduce).calls, 1);
}

TEST(MpiCommunicatorTest, DestroyingAnUnfinishedHandleCompletesTheOperation) {
  auto comm = World();
  const int n = comm->size(), me = comm->rank();
  std::vector<float> data(kCount), want(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    data[i] = Value(me, i);
    want[i] = SumOverRanks(n, i);
  }
  comm->AllReduceAsync(data.data(), kCount).reset();
  EXPECT_TRUE(ElementsEqual(data, want));
}

TEST(MpiCommunicatorTest, StatsRecordCallsBytesAndPositiveSecondsPerOp) {
  auto stats = std::make_shared<CommStats>();
  auto comm = World(stats);
  const int n = comm->size(), me = comm->rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  constexpr int64_t c = 37;
  std::vector<float> a(n * c, 1.0f), b(n * c, 0.0f);
  std::vector<double> d(c, 1.0);

  comm->AllReduce(a.data(), c);
  comm->AllReduce(d.data(), c);
  comm->AllReduceAsync(a.data(), c)->Wait();
  comm->ReduceScatter(a.data(), b.data(), c);
  comm->AllGather(a.data(), b.data(), c);
  comm->AllGatherAsync(a.data(), b.data(), c)->Wait();
  comm->Broadcast(a.data(), c, 0);
  auto r = comm->RecvAsync(b.data(), c, prev, 9);
  comm->Send(a.data(), c, next, 9);
  r->Wait();
  // Blocking receive too, ordered by parity as in the ring test above.
  if (me % 2 == 0) {
    comm->SendAsync(a.data(), c, next, 10)->Wait();
    comm->Recv(b.data(), c, prev, 10);
  } else {
    comm->Recv(b.data(), c, prev, 10);
    comm->SendAsync(a.data(), c, next, 10)->Wait();
  }
  comm->Barrier();

  struct Want {
    CommOp op;
    int64_t calls, bytes;
  };
  const int64_t f = sizeof(float);
  const Want wants[] = {
      {CommOp::kAllReduce, 3, 2 * c * f + c * 8},
      {CommOp::kReduceScatter, 1, n * c * f},
      {CommOp::kAllGather, 2, 2 * n * c * f},
      {CommOp::kBroadcast, 1, c * f},
      {CommOp::kSend, 2, 2 * c * f},
      {CommOp::kRecv, 2, 2 * c * f},
      {CommOp::kBarrier, 1, 0},
  };
  for (const Want& w : wants) {
    const CommStat s = stats->Get("world", w.op);
    EXPECT_EQ(s.calls, w.calls) << CommOpName(w.op);
    EXPECT_EQ(s.bytes, w.bytes) << CommOpName(w.op);
    EXPECT_GT(s.seconds, 0.0) << CommOpName(w.op);
  }
  EXPECT_EQ(stats->Snapshot().size(), std::size(wants));

  stats->Reset();
  EXPECT_TRUE(stats->Snapshot().empty());
  EXPECT_EQ(stats->Get("world", CommOp::kAllReduce).calls, 0);
}

TEST(MpiCommunicatorTest, StatsOfTwoGroupsStaySeparate) {
  auto stats = std::make_shared<CommStats>();
  auto world = MakeMpiCommunicator(MPI_COMM_WORLD, "world", stats);
  auto dp = MakeMpiCommunicator(MPI_COMM_WORLD, "dp", stats);
  const int n = world->size();
  std::vector<float> a(n * 11, 1.0f), b(n * 11);
  world->AllReduce(a.data(), 5);
  world->AllReduce(a.data(), 5);
  dp->AllReduce(a.data(), 11);
  dp->AllGather(a.data(), b.data(), 3);

  const CommStat w = stats->Get("world", CommOp::kAllReduce);
  const CommStat d = stats->Get("dp", CommOp::kAllReduce);
  EXPECT_EQ(w.calls, 2);
  EXPECT_EQ(w.bytes, 2 * 5 * 4);
  EXPECT_EQ(d.calls, 1);
  EXPECT_EQ(d.bytes, 11 * 4);
  EXPECT_EQ(stats->Get("dp", CommOp::kAllGather).bytes, n * 3 * 4);
  EXPECT_EQ(stats->Get("world", CommOp::kAllGather).calls, 0);
  EXPECT_EQ(stats->Snapshot().size(), 3u);
  EXPECT_EQ(stats->Snapshot().count({"dp", "all_gather"}), 1u);
}

TEST(MpiCommunicatorTest, SplitGroupReducesAndGathersWithinItsHalfOnly) {
  const int world_n = WorldSize(), world_me = WorldRank();
  // Halves [0, n/2) and [n/2, n); with n odd the upper half is the larger.
  const int color = world_me < world_n / 2 ? 0 : 1;
  const int first = color == 0 ? 0 : world_n / 2;
  const int members = color == 0 ? world_n / 2 : world_n - world_n / 2;
  MPI_Comm half;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, color, world_me, &half),
            MPI_SUCCESS);
  {
    auto stats = std::make_shared<CommStats>();
    auto comm = MakeMpiCommunicator(half, "half", stats);
    EXPECT_EQ(comm->size(), members);
    EXPECT_EQ(comm->rank(), world_me - first);

    // Inputs keyed by world rank, so a sum over the wrong ranks shows.
    std::vector<float> data(kCount), want(kCount, 0.0f);
    for (int64_t i = 0; i < kCount; ++i) {
      data[i] = Value(world_me, i);
      for (int r = first; r < first + members; ++r) want[i] += Value(r, i);
    }
    comm->AllReduce(data.data(), kCount);
    EXPECT_TRUE(ElementsEqual(data, want));

    std::vector<float> send(kCount), recv(members * kCount, -1.0f),
        gathered(members * kCount);
    for (int64_t i = 0; i < kCount; ++i) send[i] = Value(world_me, i);
    for (int k = 0; k < members; ++k) {
      for (int64_t i = 0; i < kCount; ++i) {
        gathered[k * kCount + i] = Value(first + k, i);
      }
    }
    comm->AllGather(send.data(), recv.data(), kCount);
    EXPECT_TRUE(ElementsEqual(recv, gathered));

    // A broadcast from the group's last rank reaches only its own half.
    std::vector<float> b(kCount), bwant(kCount);
    for (int64_t i = 0; i < kCount; ++i) {
      b[i] = Value(world_me, i);
      bwant[i] = Value(first + members - 1, i);
    }
    comm->Broadcast(b.data(), kCount, members - 1);
    EXPECT_TRUE(ElementsEqual(b, bwant));

    EXPECT_EQ(stats->Get("half", CommOp::kAllReduce).calls, 1);
    EXPECT_EQ(stats->Get("world", CommOp::kAllReduce).calls, 0);
  }
  MPI_Comm_free(&half);
}

TEST(MpiCommunicatorTest, ZeroCountOpsCompleteAndRecordZeroBytes) {
  auto stats = std::make_shared<CommStats>();
  auto comm = World(stats);
  const int n = comm->size(), me = comm->rank();
  float x = 42.0f, y = 43.0f;
  comm->AllReduce(&x, 0);
  comm->ReduceScatter(&x, &y, 0);
  comm->AllGather(&x, &y, 0);
  comm->Broadcast(&x, 0, n - 1);
  auto r = comm->RecvAsync(&y, 0, (me + n - 1) % n, 1);
  comm->SendAsync(&x, 0, (me + 1) % n, 1)->Wait();
  r->Wait();
  EXPECT_EQ(x, 42.0f);
  EXPECT_EQ(y, 43.0f);
  EXPECT_EQ(stats->Get("world", CommOp::kAllReduce).calls, 1);
  EXPECT_EQ(stats->Get("world", CommOp::kRecv).bytes, 0);
}

// What `ptctl diagnose` relies on: every rank numbers a group's
// collectives alike, and a send or receive names the other side by its
// world rank and its place among the calls between the two.
TEST(MpiCommunicatorTest, FlightRecorderNumbersCallsAlikeAndNamesPeers) {
  const int n = WorldSize(), rank = WorldRank();
  auto recorder = std::make_shared<FlightRecorder>();
  std::vector<int> members(n);
  for (int i = 0; i < n; ++i) members[i] = i;
  recorder->SetGroup("world", members);
  auto world = MakeMpiCommunicator(MPI_COMM_WORLD, "world",
                                   std::make_shared<CommStats>(), recorder);
  float x = 1.0f;
  world->AllReduce(&x, 1);
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  float out = static_cast<float>(rank), in = -1.0f;
  auto send = world->SendAsync(&out, 1, next, 5);
  world->Recv(&in, 1, prev, 5);
  send->Wait();
  world->AllGather(&x, std::vector<float>(n).data(), 1);
  std::vector<nlohmann::json> l;
  std::istringstream dump(recorder->Dump("SIGUSR2"));
  for (std::string line; std::getline(dump, line);) {
    l.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(l.size(), 5u);
  EXPECT_EQ(l[1]["op"], "all_reduce");
  EXPECT_EQ(l[1]["seq"], 1);
  EXPECT_EQ(l[2]["op"], "send");
  EXPECT_EQ(l[2]["peer"], next);
  EXPECT_EQ(l[2]["peer_seq"], 1);
  EXPECT_EQ(l[3]["op"], "recv");
  EXPECT_EQ(l[3]["peer"], prev);
  EXPECT_EQ(l[3]["peer_seq"], 1);
  EXPECT_EQ(l[4]["op"], "all_gather");
  EXPECT_EQ(l[4]["seq"], 4);
  for (size_t i = 1; i < l.size(); ++i) {
    EXPECT_EQ(l[i]["state"], "completed") << i;
  }
  // Every rank numbered the all-gather alike.
  int seq = l[4]["seq"].get<int>(), lowest = 0, highest = 0;
  MPI_Allreduce(&seq, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&seq, &highest, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lowest, highest);
}

}  // namespace
}  // namespace ptrain
