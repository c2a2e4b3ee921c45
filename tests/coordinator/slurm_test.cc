// The Slurm launcher's pure parts: the sbatch line, the batch script and
// the reading of `scontrol show job -o`.
#include "coordinator/slurm.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace ptrain {
namespace {

LaunchRequest Request() {
  LaunchRequest r;
  r.job_id = "job-0007";
  r.attempt = 3;
  r.job_dir = "/state/jobs/job-0007";
  r.world_size = 8;
  r.ptworker = "/opt/ptrain/bin/ptworker";
  r.work_dir = "/work";
  return r;
}

bool Has(const std::vector<std::string>& argv, const std::string& a) {
  return std::find(argv.begin(), argv.end(), a) != argv.end();
}

TEST(SlurmTest, SbatchAsksForOneTaskPerRankAndNeverRequeues) {
  SlurmOptions o;
  o.partition = "gpu";
  o.account = "ml";
  o.extra = {"--qos=high"};
  const std::vector<std::string> argv =
      SbatchCommand(Request(), "/state/jobs/job-0007/attempt-3", 4, 2, o);
  EXPECT_EQ(argv.front(), "sbatch");
  EXPECT_TRUE(Has(argv, "--parsable"));
  EXPECT_TRUE(Has(argv, "--job-name=ptrain-job-0007-3"));
  EXPECT_TRUE(Has(argv, "--ntasks=8"));
  EXPECT_TRUE(Has(argv, "--ntasks-per-node=4"));
  EXPECT_TRUE(Has(argv, "--nodes=2"));
  EXPECT_TRUE(Has(argv, "--cpus-per-task=2"));
  EXPECT_TRUE(Has(argv, "--no-requeue"));
  EXPECT_TRUE(Has(argv, "--partition=gpu"));
  EXPECT_TRUE(Has(argv, "--account=ml"));
  EXPECT_TRUE(Has(argv, "--qos=high"));
  EXPECT_TRUE(Has(argv, "--output=/state/jobs/job-0007/attempt-3/stdout.log"));
  EXPECT_TRUE(Has(argv, "--error=/state/jobs/job-0007/attempt-3/stderr.log"));
  EXPECT_EQ(argv.back(), "/state/jobs/job-0007/attempt-3/slurm.sh");
  // ranks_per_node 0: Slurm spreads the tasks as it likes.
  EXPECT_FALSE(absl::StrContains(
      absl::StrJoin(SbatchCommand(Request(), "/a", 0, 1, {}), " "),
      "--ntasks-per-node"));
}

TEST(SlurmTest, ScriptRunsTheRanksWithPmixAndRecordsTheExitCode) {
  LaunchRequest r = Request();
  r.job_dir = "/state/it's here";
  const std::string s = SlurmBatchScript(r, "/state/it's here/attempt-3", 3);
  EXPECT_TRUE(absl::StartsWith(s, "#!/bin/sh\n")) << s;
  // Each task on 3 cores of its own: srun takes neither from sbatch.
  EXPECT_TRUE(absl::StrContains(s,
                                "'srun' '--mpi=pmix' '--kill-on-bad-exit=1' "
                                "'--cpus-per-task=3' '--cpu-bind=cores'"))
      << s;
  EXPECT_TRUE(absl::StrContains(s,
                                "'/opt/ptrain/bin/ptworker' '--config' "
                                "'/state/it'\\''s here/spec.yaml'"))
      << s;
  EXPECT_TRUE(absl::StrContains(s, "'--resume-from' 'latest'")) << s;
  // The code overwrites the pending exit_code ptcoord wrote (launcher.h).
  EXPECT_TRUE(absl::StrContains(s,
                                "printf '%-15d\\n' \"$rc\" 1<>'/state/it'\\''s "
                                "here/attempt-3'/exit_code"))
      << s;
  EXPECT_TRUE(absl::StrContains(s, "exit $rc")) << s;
}

TEST(SlurmTest, ParsesScontrolsOneLineJob) {
  const std::string line =
      "JobId=42 JobName=ptrain-job-0001-1 UserId=root(0) GroupId=root(0) "
      "Priority=1 JobState=FAILED Reason=NonZeroExitCode Dependency=(null) "
      "Restarts=0 ExitCode=1:0 RunTime=00:00:03 NodeList=node[1-2] "
      "NumNodes=2\n";
  std::optional<SlurmJob> j = ParseScontrolJob(line);
  ASSERT_TRUE(j.has_value());
  EXPECT_EQ(j->state, "FAILED");
  EXPECT_EQ(j->reason, "NonZeroExitCode");
  EXPECT_EQ(j->exit_code, 1);
  EXPECT_EQ(j->signal, 0);
  EXPECT_EQ(j->nodes, "node[1-2]");
  j = ParseScontrolJob("JobId=43 JobState=CANCELLED ExitCode=0:15");
  ASSERT_TRUE(j.has_value());
  EXPECT_EQ(j->signal, 15);
  EXPECT_FALSE(
      ParseScontrolJob("slurm_load_jobs error: Invalid job id").has_value());
}

TEST(SlurmTest, EndedStates) {
  for (const char* s :
       {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}) {
    EXPECT_FALSE(SlurmJobEnded(s)) << s;
  }
  for (const char* s : {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL",
                        "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL"}) {
    EXPECT_TRUE(SlurmJobEnded(s)) << s;
  }
}

TEST(SlurmTest, SinfoNodesTellUsableFromLost) {
  const std::vector<SlurmNode> nodes = ParseSinfoNodes(
      "n1 idle 2\nn2 down* 2\nn3 alloc* 4\nn4 drain 2\nn5 mix 8\n"
      "garbage\nn6 fail 2\n");
  ASSERT_EQ(nodes.size(), 6u);
  EXPECT_EQ(nodes[2].name, "n3");
  EXPECT_EQ(nodes[2].cpus, 4);
  std::vector<std::string> usable, lost;
  for (const SlurmNode& n : nodes) {
    if (SlurmNodeUsable(n.state)) usable.push_back(n.name);
    if (SlurmNodeLost(n.state)) lost.push_back(n.name);
  }
  // Not responding (alloc*) is lost before slurmctld marks it down; a
  // drained node is neither.
  EXPECT_EQ(usable, (std::vector<std::string>{"n1", "n5"}));
  EXPECT_EQ(lost, (std::vector<std::string>{"n2", "n3", "n6"}));
}

TEST(SlurmTest, TaskCapacityCountsWholeTasksWithinRanksPerNode) {
  EXPECT_EQ(SlurmTaskCapacity({2, 2}, 1, 0), 4);
  EXPECT_EQ(SlurmTaskCapacity({2, 2}, 1, 1), 2);
  EXPECT_EQ(SlurmTaskCapacity({3, 8}, 2, 0), 1 + 4);
  EXPECT_EQ(SlurmTaskCapacity({}, 1, 0), 0);
}

}  // namespace
}  // namespace ptrain
