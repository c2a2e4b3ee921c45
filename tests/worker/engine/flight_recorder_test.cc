// The flight recorder's ring, numbering and dump (docs/diagnose.md),
// without MPI: calls are recorded as the communicators record them.
#include "worker/engine/comm/flight_recorder.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ptrain {
namespace {

std::vector<nlohmann::json> Lines(const std::string& dump) {
  std::vector<nlohmann::json> out;
  std::istringstream in(dump);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(FlightRecorder, KeepsTheNewestEntriesOldestFirstAndCountsAll) {
  FlightRecorder r(4);
  for (int i = 0; i < 10; ++i)
    r.Completed(r.Issued("tp", CommOp::kAllReduce, 8));
  const std::vector<nlohmann::json> lines = Lines(r.Dump("SIGUSR2"));
  ASSERT_EQ(lines.size(), 5u);  // the header and the ring
  EXPECT_EQ(lines[0]["type"], "header");
  EXPECT_EQ(lines[0]["capacity"], 4);
  EXPECT_EQ(lines[0]["recorded"], 10);
  for (int i = 1; i <= 4; ++i) {
    EXPECT_EQ(lines[i]["id"], 6 + i) << i;
    EXPECT_EQ(lines[i]["seq"], 6 + i) << i;
  }
  EXPECT_EQ(r.recorded(), 10u);
}

TEST(FlightRecorder, NumbersCallsPerGroupAndPointToPointPerPeerAndDirection) {
  FlightRecorder r;
  r.SetGroup("pp", {1, 5, 9});  // group ranks 0, 1, 2 are world 1, 5, 9
  r.Issued("tp", CommOp::kAllReduce, 8);
  r.Issued("pp", CommOp::kSend, 16, /*peer=*/2);
  r.Issued("pp", CommOp::kRecv, 16, /*peer=*/2);
  r.Issued("pp", CommOp::kSend, 16, /*peer=*/2);
  r.Issued("pp", CommOp::kSend, 16, /*peer=*/0);
  r.Issued("tp", CommOp::kAllGather, 32);
  const std::vector<nlohmann::json> l = Lines(r.Dump("SIGUSR2"));
  ASSERT_EQ(l.size(), 7u);
  EXPECT_EQ(l[1]["seq"], 1);
  EXPECT_EQ(l[1]["peer"], -1);
  EXPECT_EQ(l[1]["peer_seq"], 0);
  EXPECT_EQ(l[2]["seq"], 1);   // pp's own numbering
  EXPECT_EQ(l[2]["peer"], 9);  // the world rank
  EXPECT_EQ(l[2]["peer_seq"], 1);
  EXPECT_EQ(l[3]["op"], "recv");
  EXPECT_EQ(l[3]["peer_seq"], 1);  // receives count apart from sends
  EXPECT_EQ(l[4]["peer_seq"], 2);
  EXPECT_EQ(l[5]["peer"], 1);
  EXPECT_EQ(l[5]["peer_seq"], 1);  // each peer counts apart
  EXPECT_EQ(l[5]["seq"], 4);
  EXPECT_EQ(l[6]["seq"], 2);
  EXPECT_EQ(l[6]["bytes"], 32);
}

TEST(FlightRecorder, CallsGoFromQueuedOrStartedToCompletedWithTheirTimes) {
  FlightRecorder r;
  const uint64_t blocking = r.Issued("dp", CommOp::kAllReduce, 4);
  const uint64_t queued = r.Issued("dp", CommOp::kAllReduce, 4, -1, true);
  const uint64_t never = r.Issued("dp", CommOp::kAllReduce, 4, -1, true);
  r.Started(queued);
  r.Completed(blocking);
  const std::vector<nlohmann::json> l = Lines(r.Dump("SIGUSR2"));
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[1]["state"], "completed");
  EXPECT_GE(l[1]["end_us"].get<int64_t>(), l[1]["start_us"].get<int64_t>());
  EXPECT_EQ(l[2]["state"], "started");
  EXPECT_GT(l[2]["start_us"].get<int64_t>(), 0);
  EXPECT_FALSE(l[2].contains("end_us"));
  EXPECT_EQ(l[3]["state"], "queued");
  EXPECT_EQ(l[3]["start_us"], 0);
  EXPECT_EQ(l[3]["id"], never);
  EXPECT_EQ(l[0]["last_activity_unix_us"], l[1]["end_us"]);
}

TEST(FlightRecorder, OffRecordsNothingAndOnAgainStartsAFreshRing) {
  FlightRecorder r(8);
  const uint64_t before = r.Issued("tp", CommOp::kAllReduce, 4);
  r.SetCapacity(0);
  EXPECT_EQ(r.Issued("tp", CommOp::kAllReduce, 4), 0u);
  r.Enter(FlightPhase::kForward, 0);
  r.Completed(before);  // dropped with the ring: nothing to complete
  std::vector<nlohmann::json> l = Lines(r.Dump("SIGUSR2"));
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0]["capacity"], 0);
  EXPECT_EQ(r.ProgressAgeMillis(), -1);
  r.SetCapacity(4);
  r.Issued("tp", CommOp::kAllReduce, 4);
  l = Lines(r.Dump("SIGUSR2"));
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[1]["seq"], 2);  // numbering goes on: ranks still agree
  EXPECT_EQ(l[0]["capacity"], 4);
}

TEST(FlightRecorder, ProgressIsACompletedCallOrAPhaseEntered) {
  FlightRecorder r;
  EXPECT_EQ(r.ProgressAgeMillis(), -1);
  const uint64_t id = r.Issued("tp", CommOp::kAllReduce, 4);
  EXPECT_EQ(r.ProgressAgeMillis(), -1);  // entering a call is not progress
  r.Completed(id);
  EXPECT_GE(r.ProgressAgeMillis(), 0);
  EXPECT_LT(r.ProgressAgeMillis(), 1000);
  FlightRecorder marks;
  marks.Enter(FlightPhase::kForward, 0);
  EXPECT_GE(marks.ProgressAgeMillis(), 0);
}

TEST(FlightRecorder, ACallOutlivingTheRingLeavesTheNewerEntryAlone) {
  FlightRecorder r(2);
  const uint64_t old = r.Issued("dp", CommOp::kAllReduce, 4);
  r.Issued("tp", CommOp::kAllReduce, 4);
  r.Issued("tp", CommOp::kAllReduce, 4);  // takes old's slot
  r.Completed(old);
  const std::vector<nlohmann::json> l = Lines(r.Dump("SIGUSR2"));
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[2]["id"], 3);
  EXPECT_EQ(l[2]["state"], "started");
  EXPECT_GT(l[0]["last_activity_unix_us"].get<int64_t>(), 0);
}

TEST(FlightRecorder, CallsCarryTheStepMicrobatchAndPhaseMarkedBeforeThem) {
  FlightRecorder r;
  r.SetStep(7);
  r.Enter(FlightPhase::kForward, 3);
  r.Enter(FlightPhase::kForward, 3);  // no change: no mark
  r.Issued("tp", CommOp::kAllReduce, 4);
  r.Enter(FlightPhase::kOptimizer);
  r.Issued("dp", CommOp::kReduceScatter, 4);
  const std::vector<nlohmann::json> l = Lines(r.Dump("SIGTERM"));
  ASSERT_EQ(l.size(), 5u);
  EXPECT_EQ(l[0]["reason"], "SIGTERM");
  EXPECT_EQ(l[0]["step"], 7);
  EXPECT_EQ(l[0]["phase"], "optimizer");
  EXPECT_EQ(l[0]["microbatch"], -1);
  EXPECT_EQ(l[1]["type"], "mark");
  EXPECT_EQ(l[1]["phase"], "forward");
  EXPECT_EQ(l[1]["microbatch"], 3);
  EXPECT_EQ(l[2]["phase"], "forward");
  EXPECT_EQ(l[2]["microbatch"], 3);
  EXPECT_EQ(l[2]["step"], 7);
  EXPECT_EQ(l[3]["type"], "mark");
  EXPECT_EQ(l[4]["phase"], "optimizer");
  EXPECT_EQ(l[4]["microbatch"], -1);
}

TEST(FlightRecorder, HeaderSaysWhoTheRankIsAndItsGroups) {
  FlightRecorder r;
  r.SetIdentity({5, 8, {{"dp", 1}, {"tp", 1}, {"pp", 1}, {"cp", 0}}});
  r.SetGroup("tp", {4, 5});
  r.SetGroup("pp", {1, 5});
  const nlohmann::json h = Lines(r.Dump("start"))[0];
  EXPECT_EQ(h["rank"], 5);
  EXPECT_EQ(h["world_size"], 8);
  EXPECT_EQ(h["pid"], static_cast<int64_t>(getpid()));
  EXPECT_EQ(h["groups"]["tp"], nlohmann::json({4, 5}));
  EXPECT_EQ(h["groups"]["pp"], nlohmann::json({1, 5}));
  EXPECT_EQ(h["coords"]["tp"], 1);
  EXPECT_EQ(h["version"], 1);
  EXPECT_FALSE(h["host"].get<std::string>().empty());
}

TEST(FlightRecorder, DumpReplacesTheFileWholeAndLeavesNoTemporary) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("flight_" + std::to_string(getpid())) / "attempt-1";
  fs::remove_all(dir.parent_path());
  const std::string path = FlightDumpPath((dir / "run.jsonl").string(), 3);
  EXPECT_EQ(path, (dir / "flight" / "rank-00003.jsonl").string());
  FlightRecorder r;
  ASSERT_TRUE(r.DumpTo(path, "start").ok());
  r.Issued("tp", CommOp::kAllReduce, 4);
  ASSERT_TRUE(r.DumpTo(path, "SIGUSR2").ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<nlohmann::json> l = Lines(text.str());
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0]["reason"], "SIGUSR2");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir / "flight")) {
    ++files;
    EXPECT_EQ(e.path().extension(), ".jsonl") << e.path();
  }
  EXPECT_EQ(files, 1);
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(FlightDumpPath("", 12), "flight/rank-00012.jsonl");
  fs::remove_all(dir.parent_path());
}

}  // namespace
}  // namespace ptrain
