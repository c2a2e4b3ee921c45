// Scheduler: FIFO gang scheduling — all slots (and GPUs) at once, in order,
// no backfill past a blocked head, oversized jobs refused.
#include "coordinator/scheduler.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/spec.h"
#include "coordinator/launcher.h"
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

// A GPU job takes a GPU per rank as well as a slot: with 2 GPUs and 8
// slots, two one-rank GPU jobs start, the third waits and (FIFO) so does
// the CPU job behind it; a job without GPUs is not held back by them.
TEST(SchedulerTest, GpuJobsWaitForFreeGpusInOrder) {
  Scheduler s(8, 2);
  EXPECT_EQ(
      s.Pick({{"g1", 1, 1}, {"g2", 1, 1}, {"g3", 1, 1}, {"cpu", 1, 0}}, 0, 0),
      (std::vector<std::string>{"g1", "g2"}));
  EXPECT_EQ(s.Pick({{"cpu", 2, 0}, {"g", 2, 2}}, 0, 0),
            (std::vector<std::string>{"cpu", "g"}));
  EXPECT_TRUE(s.Pick({{"g", 1, 1}, {"cpu", 1, 0}}, 2, 2).empty());
  EXPECT_EQ(s.Pick({{"g", 1, 1}}, 7, 1), (std::vector<std::string>{"g"}));
  EXPECT_TRUE(Scheduler(8).Pick({{"g", 1, 1}}, 0, 0).empty());  // no GPUs
}

TEST(SchedulerTest, JobLargerThanPoolIsRefused) {
  Scheduler s(4);
  EXPECT_TRUE(s.CheckFits(4).ok());
  const absl::Status st = s.CheckFits(8);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("parallel.dp*tp*pp*cp=8"),
            absl::string_view::npos)
      << st;
  EXPECT_FALSE(s.CheckFits(0).ok());
}

// Every placement below is checked for the gang rule (exactly `world`
// ranks) and the node rule (each node's share a multiple of tp, within its
// free slots and ranks_per_node).
void ExpectValid(const std::vector<NodeRanks>& place,
                 const std::vector<FreeNode>& nodes, int world, int tp,
                 int per_node) {
  int total = 0;
  for (const NodeRanks& p : place) {
    total += p.ranks;
    EXPECT_EQ(p.ranks % tp, 0) << p.name;
    if (per_node > 0) {
      EXPECT_LE(p.ranks, per_node) << p.name;
    }
    bool found = false;
    for (const FreeNode& n : nodes) {
      if (n.name == p.name) {
        found = true;
        EXPECT_LE(p.ranks, n.free) << p.name;
      }
    }
    EXPECT_TRUE(found) << p.name;
  }
  EXPECT_EQ(total, world);
}

TEST(PlaceRanksTest, FillsTheFreestNodesFirstAndListsThemByName) {
  const std::vector<FreeNode> nodes = {{"b", 2}, {"a", 2}, {"c", 4}};
  const std::vector<NodeRanks> place = PlaceRanks(nodes, 6, 1, 0);
  EXPECT_EQ(place, (std::vector<NodeRanks>{{"a", 2}, {"c", 4}}));
  ExpectValid(place, nodes, 6, 1, 0);
}

TEST(PlaceRanksTest, KeepsTensorParallelGroupsInsideANode) {
  // 3 free slots take one tp=2 group, not one and a half.
  const std::vector<FreeNode> nodes = {{"a", 3}, {"b", 3}};
  EXPECT_EQ(PlaceRanks(nodes, 4, 2, 0),
            (std::vector<NodeRanks>{{"a", 2}, {"b", 2}}));
  EXPECT_TRUE(PlaceRanks(nodes, 6, 2, 0).empty());
  EXPECT_TRUE(PlaceRanks({{"a", 3}}, 4, 4, 0).empty());
}

// A context-parallel ring stays on one node with the tensor-parallel
// groups inside it: tp·cp consecutive ranks per node group.
TEST(PlaceRanksTest, KeepsContextParallelRingsInsideANode) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.mutable_parallel()->set_tp(2);
  spec.mutable_parallel()->set_cp(2);
  spec.mutable_parallel()->set_dp(2);
  ASSERT_EQ(WorldSize(spec), 8);
  ASSERT_EQ(NodeGroup(spec), 4);
  // 6 free slots take one ring of 4, not one and a half.
  const std::vector<FreeNode> nodes = {{"a", 6}, {"b", 4}};
  EXPECT_EQ(PlaceRanks(nodes, WorldSize(spec), NodeGroup(spec), 0),
            (std::vector<NodeRanks>{{"a", 4}, {"b", 4}}));
  EXPECT_TRUE(
      PlaceRanks({{"a", 6}, {"b", 3}}, WorldSize(spec), NodeGroup(spec), 0)
          .empty());
}

TEST(PlaceRanksTest, HonoursRanksPerNode) {
  const std::vector<FreeNode> nodes = {{"a", 8}, {"b", 8}};
  EXPECT_EQ(PlaceRanks(nodes, 8, 2, 4),
            (std::vector<NodeRanks>{{"a", 4}, {"b", 4}}));
  EXPECT_TRUE(PlaceRanks(nodes, 8, 1, 2).empty());
}

TEST(PlaceRanksTest, GangOrNothingOverManyShapes) {
  for (int world = 1; world <= 12; ++world) {
    for (int tp : {1, 2, 4}) {
      if (world % tp != 0) continue;
      for (int per_node : {0, 2, 4}) {
        const std::vector<FreeNode> nodes = {{"n1", 3}, {"n2", 4}, {"n3", 2}};
        const std::vector<NodeRanks> place =
            PlaceRanks(nodes, world, tp, per_node);
        if (place.empty()) continue;
        ExpectValid(place, nodes, world, tp, per_node);
      }
    }
  }
  // Enough room is found: 9 slots, world 8 at tp=1.
  EXPECT_FALSE(PlaceRanks({{"n1", 3}, {"n2", 4}, {"n3", 2}}, 8, 1, 0).empty());
  EXPECT_TRUE(PlaceRanks({}, 1, 1, 0).empty());
}

// A valid spec to shrink: the defaults, with a name and data.
v1::JobSpec Spec() {
  v1::JobSpec spec = DefaultJobSpec();
  spec.set_name("t");
  spec.mutable_data()->set_path("data/tinyshakespeare.txt");
  return spec;
}

v1::Node MakeNode(const std::string& name, int slots, int gpus,
                  v1::NodeState state = v1::NODE_STATE_UP,
                  bool draining = false) {
  v1::Node n;
  n.mutable_spec()->set_name(name);
  n.mutable_spec()->set_slots(slots);
  n.mutable_spec()->set_gpus(gpus);
  n.set_state(state);
  n.set_draining(draining);
  return n;
}

TEST(FreeNodesTest, SlotsLeftOnUpUndrainedNodes) {
  const std::vector<v1::Node> nodes = {
      MakeNode("a", 4, 0), MakeNode("b", 4, 2),
      MakeNode("down", 4, 2, v1::NODE_STATE_DOWN),
      MakeNode("drained", 4, 2, v1::NODE_STATE_UP, /*draining=*/true)};
  const std::vector<FreeNode> free =
      FreeNodesOf(nodes, {{"a", 1}, {"b", 4}}, {}, /*gpus=*/false);
  ASSERT_EQ(free.size(), 1u);
  EXPECT_EQ(free[0].name, "a");
  EXPECT_EQ(free[0].free, 3);
}

TEST(FreeNodesTest, GpuJobsTakeOnlyNodesWithUnusedGpusOneRankEach) {
  const std::vector<v1::Node> nodes = {MakeNode("cpu-only", 8, 0),
                                       MakeNode("two-gpus", 8, 2),
                                       MakeNode("busy", 8, 1)};
  // "busy" runs a GPU job of one rank; "two-gpus" a cpu job of 7 ranks.
  const std::vector<FreeNode> free = FreeNodesOf(
      nodes, {{"two-gpus", 7}, {"busy", 1}}, {{"busy", 1}}, /*gpus=*/true);
  ASSERT_EQ(free.size(), 1u);
  EXPECT_EQ(free[0].name, "two-gpus");
  EXPECT_EQ(free[0].free, 1);  // one slot left, though two GPUs are free
  // A cpu job sees every slot, GPU or not.
  EXPECT_EQ(FreeNodesOf(nodes, {}, {}, /*gpus=*/false).size(), 3u);
  // Nowhere to place a GPU job: no node has a GPU.
  EXPECT_TRUE(PlaceRanks(FreeNodesOf({MakeNode("cpu-only", 8, 0)}, {}, {},
                                     /*gpus=*/true),
                         1, 1, 0)
                  .empty());
}

TEST(FreeNodesTest, NewRanksTakeTheLowestGpusNoRunningJobHolds) {
  EXPECT_EQ(TakeGpus({}, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(TakeGpus({0, 2}, 3), (std::vector<int>{1, 3, 4}));
  EXPECT_EQ(TakeGpus({1}, 0), std::vector<int>{});
}

TEST(ShrinkDpTest, KeepsTheGlobalBatchAndEachRanksMicrobatch) {
  v1::JobSpec spec = Spec();
  spec.mutable_parallel()->set_dp(4);
  spec.mutable_parallel()->set_tp(1);
  spec.mutable_parallel()->set_microbatches(1);
  spec.mutable_train()->set_global_batch(32);
  absl::StatusOr<v1::JobSpec> two = ShrinkDp(spec, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->parallel().dp(), 2);
  EXPECT_EQ(two->parallel().microbatches(), 2);
  EXPECT_EQ(two->train().global_batch(), 32);
  const int micro = spec.train().global_batch() /
                    (spec.parallel().dp() * spec.parallel().microbatches());
  EXPECT_EQ(two->train().global_batch() /
                (two->parallel().dp() * two->parallel().microbatches()),
            micro);
  // 4 * 1 sequences per microbatch round cannot be split over 3 ranks.
  EXPECT_FALSE(ShrinkDp(spec, 3).ok());
  EXPECT_FALSE(ShrinkDp(spec, 4).ok());
  EXPECT_FALSE(ShrinkDp(spec, 0).ok());
}

TEST(ShrinkDpTest, ResultIsAValidSpec) {
  v1::JobSpec spec = Spec();
  spec.mutable_model()->set_n_layer(4);
  spec.mutable_parallel()->set_dp(4);
  spec.mutable_parallel()->set_pp(2);
  spec.mutable_parallel()->set_microbatches(2);
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  for (int dp : {1, 2}) {
    absl::StatusOr<v1::JobSpec> s = ShrinkDp(spec, dp);
    ASSERT_TRUE(s.ok()) << dp << ": " << s.status();
    EXPECT_TRUE(ValidateJobSpec(*s).ok()) << dp;
    EXPECT_EQ(s->parallel().pp(), 2);
    EXPECT_EQ(s->parallel().microbatches(), 8 / dp);
  }
  // 8 sequences per round over 3 ranks: refused, naming the rule.
  absl::StatusOr<v1::JobSpec> three = ShrinkDp(spec, 3);
  ASSERT_FALSE(three.ok());
  EXPECT_TRUE(absl::StrContains(three.status().message(), "does not divide"))
      << three.status();
}

TEST(SchedulerTest, EachSlotHasCpusOfItsOwnAndJobsTakeFreeSlots) {
  // 8 CPUs (0-3, 8-11: what affinity may leave), 4 slots of 2.
  const std::vector<int> cpus = {0, 1, 2, 3, 8, 9, 10, 11};
  const std::vector<std::vector<int>> slots = SlotCpus(cpus, 4);
  EXPECT_EQ(slots,
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {8, 9}, {10, 11}}));
  // 3 slots of 2: CPUs 10 and 11 stay unused.
  EXPECT_EQ(SlotCpus(cpus, 3).back(), (std::vector<int>{8, 9}));
  // More slots than CPUs: no binding.
  EXPECT_TRUE(SlotCpus({0, 1}, 4).empty());
  EXPECT_TRUE(SlotCpus({}, 1).empty());
  // A job holding slot 1 and a CPU of slot 3 (an odd record): the next
  // two-rank job gets slots 0 and 2, a third finds too few.
  v1::Job held;
  v1::Placement* p = held.add_placement();
  p->set_node("h");
  p->set_ranks(1);
  for (int c : {2, 3, 11}) p->add_cpus(c);
  const RunningJobs running = {&held};
  const std::set<int> taken = CpusHeld(running)["h"];
  EXPECT_EQ(taken, (std::set<int>{2, 3, 11}));
  EXPECT_EQ(TakeSlotCpus(slots, taken, 2), (std::vector<int>{0, 1, 8, 9}));
  EXPECT_TRUE(TakeSlotCpus(slots, taken, 3).empty());
  EXPECT_TRUE(TakeSlotCpus(slots, {0, 2, 8, 10}, 1).empty());
}

TEST(LauncherTest, BoundRanksGetARankfileAndThreadsForTheirCpus) {
  LaunchRequest r;
  r.job_dir = "/state/jobs/job-1";
  r.world_size = 2;
  r.cores = 8;
  r.ptworker = "/bin/ptworker";
  r.rank_cpus = {{4, 5, 6}, {9, 10, 11}};
  EXPECT_EQ(Rankfile(r),
            "rank 0=localhost slot=4,5,6\nrank 1=localhost slot=9,10,11\n");
  auto has = [](const std::vector<std::string>& argv,
                const std::vector<std::string>& run) {
    return std::search(argv.begin(), argv.end(), run.begin(), run.end()) !=
           argv.end();
  };
  const std::vector<std::string> bound = AttemptCommand(r, "/a");
  EXPECT_TRUE(has(bound, {"--rankfile", "/a/rankfile"}));
  EXPECT_TRUE(has(bound, {"--mca", "rmaps_rank_file_physical", "1"}));
  EXPECT_FALSE(has(bound, {"--bind-to", "none"}));
  EXPECT_EQ(AttemptEnvironment(r).at("OMP_NUM_THREADS"), "3");
  // The spec's threads_per_rank wins.
  r.threads = 2;
  EXPECT_EQ(AttemptEnvironment(r).at("OMP_NUM_THREADS"), "2");
  // Not bound: mpirun binds nothing either, threads share the cores.
  r.threads = 0;
  r.rank_cpus.clear();
  const std::vector<std::string> free = AttemptCommand(r, "/a");
  EXPECT_TRUE(has(free, {"--bind-to", "none"}));
  EXPECT_FALSE(has(free, {"--rankfile", "/a/rankfile"}));
  EXPECT_EQ(AttemptEnvironment(r).at("OMP_NUM_THREADS"), "4");
}

// On nodes: each rank's host in the rankfile is its node as the hostfile
// names it, and the threads are the fewest CPUs a rank has (nodes may cut
// their slots differently).
TEST(LauncherTest, RanksOnNodesAreBoundOnTheirOwnNode) {
  v1::Job job;
  job.set_world_size(3);
  v1::Placement* a = job.add_placement();
  a->set_node("n1");
  a->set_ranks(2);
  for (int c : {0, 1, 2, 3}) a->add_cpus(c);
  v1::Placement* b = job.add_placement();
  b->set_node("n2");
  b->set_ranks(1);
  for (int c : {6, 7, 8}) b->add_cpus(c);
  LaunchRequest r;
  r.world_size = 3;
  r.placement = {{"n1", 2}, {"n2", 1}};
  r.rank_cpus = RankCpus(job);
  ASSERT_EQ(r.rank_cpus,
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {6, 7, 8}}));
  EXPECT_EQ(Rankfile(r),
            "rank 0=n1 slot=0,1\nrank 1=n1 slot=2,3\nrank 2=n2 slot=6,7,8\n");
  EXPECT_EQ(AttemptEnvironment(r).at("OMP_NUM_THREADS"), "2");
  // A node without CPUs (an older daemon, more slots than CPUs) leaves
  // every rank unbound; so does a placement short of the world.
  b->clear_cpus();
  EXPECT_TRUE(RankCpus(job).empty());
  for (int c : {6, 7, 8}) b->add_cpus(c);
  job.set_world_size(4);
  EXPECT_TRUE(RankCpus(job).empty());
}

// A forked job's attempts resume from their own newest checkpoint, else
// from the checkpoint the job was forked from.
TEST(LauncherTest, AForkedJobsAttemptGoesOnFromItsSource) {
  LaunchRequest r;
  r.job_dir = "/state/jobs/job-2";
  r.world_size = 1;
  r.ptworker = "/bin/ptworker";
  r.fork_from = "/ckpt/a/step-00000010";
  const std::vector<std::string> argv = AttemptCommand(r, "/a");
  const std::vector<std::string> tail = {
      "--resume-from", "latest", "--fork-from", "/ckpt/a/step-00000010"};
  EXPECT_TRUE(std::search(argv.begin(), argv.end(), tail.begin(), tail.end()) !=
              argv.end());
  r.fork_from.clear();
  const std::vector<std::string> plain = AttemptCommand(r, "/a");
  EXPECT_EQ(std::find(plain.begin(), plain.end(), "--fork-from"), plain.end());
}

TEST(LauncherTest, HostfileListsTheNodesInRankOrder) {
  EXPECT_EQ(Hostfile({{"n1", 2}, {"n2", 4}}),
            "n1 slots=2 max_slots=2\nn2 slots=4 max_slots=4\n");
}

TEST(LauncherTest, AttemptOnNodesGoesThroughTheAgent) {
  LaunchRequest r;
  r.job_dir = "/state/jobs/job-1";
  r.world_size = 4;
  r.ptworker = "/bin/ptworker";
  r.placement = {{"n1", 2}, {"n2", 2}};
  r.rsh_agent = "/bin/ptrsh";
  r.cluster_network = "10.0.0.0/24";
  const std::vector<std::string> argv = AttemptCommand(r, "/a");
  auto has = [&](const std::string& a, const std::string& b) {
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (argv[i] == a && argv[i + 1] == b) return true;
    }
    return false;
  };
  auto mca = [&](const std::string& k, const std::string& v) {
    for (size_t i = 0; i + 2 < argv.size(); ++i) {
      if (argv[i] == "--mca" && argv[i + 1] == k && argv[i + 2] == v) {
        return true;
      }
    }
    return false;
  };
  EXPECT_TRUE(mca("plm_rsh_agent", "/bin/ptrsh"));
  EXPECT_TRUE(mca("plm_rsh_no_tree_spawn", "1"));
  EXPECT_TRUE(mca("orte_leave_session_attached", "1"));
  EXPECT_TRUE(mca("oob_tcp_keepalive_time", "5"));
  EXPECT_TRUE(mca("oob_tcp_if_include", "10.0.0.0/24"));
  EXPECT_TRUE(mca("btl_tcp_if_include", "10.0.0.0/24"));
  EXPECT_TRUE(has("--hostfile", "/state/jobs/job-1/hostfile"));
  EXPECT_TRUE(has("-n", "4"));
  // Each rank's GPU reaches every rank, and an empty list too (so that
  // ptcoord's own environment does not leak into the ranks').
  EXPECT_TRUE(has("-x", "PTRAIN_RANK_GPUS"));
  r.rank_gpus = {2, 3, 0, 1};
  EXPECT_EQ(AttemptEnvironment(r).at("PTRAIN_RANK_GPUS"), "2,3,0,1");
  r.rank_gpus.clear();
  EXPECT_EQ(AttemptEnvironment(r).at("PTRAIN_RANK_GPUS"), "");
  // On one host: no agent, no hostfile.
  r.placement.clear();
  const std::vector<std::string> local = AttemptCommand(r, "/a");
  for (const std::string& a : local) {
    EXPECT_FALSE(absl::StrContains(a, "ptrsh")) << a;
    EXPECT_NE(a, "--hostfile");
  }
}

}  // namespace
}  // namespace ptrain
