// The analysis of flight recorder dumps (coordinator/flight_analysis.h):
// dumps parsed or refused by line, and hung jobs told by who is behind.
#include "coordinator/flight_analysis.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ptrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kSecond = 1000000;
// When the dumps were asked for; fresh dumps come a second later.
constexpr int64_t kAsked = 1700000000 * kSecond;
constexpr int64_t kFresh = kAsked + kSecond;

// One rank's dump written the way the flight recorder writes it: a header
// and the entries, seq and peer_seq counted per group and peer.
class DumpBuilder {
 public:
  DumpBuilder(int rank, int world) : rank_(rank), world_(world) {}

  DumpBuilder& Group(const std::string& name, std::vector<int> members) {
    groups_[name] = members;
    return *this;
  }
  DumpBuilder& Reason(const std::string& reason, int64_t dumped_us) {
    reason_ = reason;
    dumped_us_ = dumped_us;
    return *this;
  }
  DumpBuilder& At(const std::string& phase, int microbatch, int64_t step) {
    phase_ = phase;
    microbatch_ = microbatch;
    step_ = step;
    return *this;
  }
  DumpBuilder& LastActivity(int64_t us) {
    last_activity_us_ = us;
    return *this;
  }
  // The ring rotated: entries from now on have ids past `id`, and `group`'s
  // calls numbered past `seq`.
  DumpBuilder& Skip(uint64_t id, const std::string& group, int64_t seq) {
    next_id_ = id + 1;
    seq_[group] = seq;
    return *this;
  }
  DumpBuilder& Capacity(int capacity) {
    capacity_ = capacity;
    return *this;
  }
  // How long the calls not completed by the dump have waited in it (a
  // hang's: a minute, unless told).
  DumpBuilder& Waited(int64_t us) {
    waited_us_ = us;
    return *this;
  }
  DumpBuilder& Mark() {
    lines_.push_back({{"type", "mark"},
                      {"id", next_id_++},
                      {"step", step_},
                      {"microbatch", microbatch_},
                      {"phase", phase_},
                      {"unix_us", dumped_us_ - 5 * kSecond}});
    return *this;
  }
  DumpBuilder& Comm(const std::string& group, const std::string& op,
                    int64_t bytes, int peer = -1,
                    const std::string& state = "completed") {
    const bool p2p = op == "send" || op == "recv";
    json line = {
        {"type", "comm"},
        {"id", next_id_++},
        {"group", group},
        {"seq", ++seq_[group]},
        {"op", op},
        {"bytes", bytes},
        {"peer", p2p ? peer : -1},
        {"peer_seq", p2p ? ++p2p_[{group, peer, op}] : 0},
        {"step", step_},
        {"microbatch", microbatch_},
        {"phase", phase_},
        {"enqueue_us",
         dumped_us_ - (state == "completed" ? 2 * kSecond : waited_us_)},
        {"start_us",
         dumped_us_ - (state == "completed" ? 2 * kSecond : waited_us_)},
        {"state", state}};
    if (state == "completed") line["end_us"] = dumped_us_ - kSecond;
    lines_.push_back(line);
    return *this;
  }

  std::string Text() const {
    json header = {
        {"type", "header"},
        {"version", 1},
        {"rank", rank_},
        {"world_size", world_},
        {"pid", 100 + rank_},
        {"host", absl::StrCat("n", rank_)},
        {"coords", {{"dp", 0}, {"tp", rank_ % 2}, {"pp", rank_ / 2}}},
        {"groups", groups_},
        {"reason", reason_},
        {"dumped_unix_us", dumped_us_},
        {"step", step_},
        {"microbatch", microbatch_},
        {"phase", phase_},
        {"last_activity_unix_us",
         last_activity_us_ != 0 ? last_activity_us_ : dumped_us_ - kSecond},
        {"capacity", capacity_},
        {"recorded", next_id_ - 1}};
    std::string out = header.dump() + "\n";
    for (const json& line : lines_) out += line.dump() + "\n";
    return out;
  }

  FlightDump Parsed() const {
    absl::StatusOr<FlightDump> d = ParseFlightDump(Text());
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : FlightDump{};
  }

 private:
  const int rank_, world_;
  std::map<std::string, std::vector<int>> groups_;
  std::string reason_ = "SIGUSR2";
  int64_t dumped_us_ = kFresh;
  std::string phase_ = "forward";
  int microbatch_ = 0;
  int64_t step_ = 9;
  int64_t last_activity_us_ = 0;
  int capacity_ = 2048;
  int64_t waited_us_ = 60 * kSecond;
  uint64_t next_id_ = 1;
  std::vector<json> lines_;
  std::map<std::string, int64_t> seq_;
  std::map<std::tuple<std::string, int, std::string>, int64_t> p2p_;
};

::testing::AssertionResult Contains(absl::string_view text,
                                    absl::string_view part) {
  if (absl::StrContains(text, part)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\"" << part << "\" not in \"" << text << "\"";
}

// tp2·pp2: tp innermost (rank = pp·2 + tp).
DumpBuilder Rank(int rank) {
  DumpBuilder b(rank, 4);
  b.Group("tp", rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3});
  b.Group("pp",
          rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3});
  b.Group("world", {0, 1, 2, 3});
  return b;
}

// The hang of the tests: in backward of step 9, rank 2 waits in
// tp all_reduce #5 for rank 3; ranks 0 and 1 wait to receive from stage 1.
// Rank 3 is left to each test.
std::map<int, FlightDump> HungWithout3() {
  std::map<int, FlightDump> dumps;
  for (int r : {0, 1}) {
    DumpBuilder b = Rank(r);
    for (int i = 0; i < 5; ++i) b.Comm("tp", "all_reduce", 4096);
    b.Comm("pp", "send", 1024, r + 2);
    b.At("backward", 0, 9).Mark();
    b.Comm("pp", "recv", 1024, r + 2, "started");
    dumps[r] = b.Parsed();
  }
  DumpBuilder b2 = Rank(2);
  for (int i = 0; i < 4; ++i) b2.Comm("tp", "all_reduce", 4096);
  b2.Comm("pp", "recv", 1024, 0);
  b2.Comm("tp", "all_reduce", 4096, -1, "started");
  dumps[2] = b2.Parsed();
  return dumps;
}

// Rank 3's start dump, from before the request.
FlightDump StaleStart3() {
  return Rank(3)
      .Reason("start", kAsked - 100 * kSecond)
      .At("setup", -1, 0)
      .Parsed();
}

AttemptFacts Facts() {
  AttemptFacts f;
  f.attempt = 2;
  f.world_size = 4;
  f.requested_unix_us = kAsked;
  f.now_unix_us = kFresh + kSecond;
  return f;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// --- parsing ---

TEST(FlightAnalysisParseTest, HeaderCommAndMarkReadBack) {
  const std::string text = Rank(1)
                               .At("backward", 3, 812)
                               .Mark()
                               .Comm("pp", "recv", 2048, 3, "started")
                               .Text();
  absl::StatusOr<FlightDump> d = ParseFlightDump(text);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->rank, 1);
  EXPECT_EQ(d->world_size, 4);
  EXPECT_EQ(d->pid, 101);
  EXPECT_EQ(d->host, "n1");
  EXPECT_EQ(d->reason, "SIGUSR2");
  EXPECT_EQ(d->phase, "backward");
  EXPECT_EQ(d->microbatch, 3);
  EXPECT_EQ(d->step, 812);
  EXPECT_EQ(d->dumped_unix_us, kFresh);
  EXPECT_EQ(d->capacity, 2048);
  EXPECT_EQ(d->recorded, 2);
  EXPECT_EQ(d->coords.at("tp"), 1);
  EXPECT_EQ(d->groups.at("pp"), (std::vector<int>{1, 3}));
  ASSERT_EQ(d->entries.size(), 2u);
  const FlightEntry& mark = d->entries[0];
  EXPECT_TRUE(mark.mark);
  EXPECT_EQ(mark.id, 1u);
  EXPECT_EQ(mark.phase, "backward");
  EXPECT_EQ(mark.start_us, kFresh - 5 * kSecond);
  const FlightEntry& recv = d->entries[1];
  EXPECT_FALSE(recv.mark);
  EXPECT_EQ(recv.id, 2u);
  EXPECT_EQ(recv.group, "pp");
  EXPECT_EQ(recv.op, "recv");
  EXPECT_EQ(recv.seq, 1);
  EXPECT_EQ(recv.bytes, 2048);
  EXPECT_EQ(recv.peer, 3);
  EXPECT_EQ(recv.peer_seq, 1);
  EXPECT_EQ(recv.state, "started");
  EXPECT_EQ(recv.end_us, 0);
  EXPECT_EQ(recv.microbatch, 3);
  EXPECT_EQ(recv.step, 812);
}

// Replaces line `n` (from 1) of `text` by what `edit` makes of its JSON.
template <typename Edit>
std::string EditLine(const std::string& text, int n, Edit edit) {
  std::vector<std::string> lines = Lines(text);
  json j = json::parse(lines[n - 1]);
  edit(j);
  lines[n - 1] = j.dump();
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

std::string ThreeLines() {
  return Rank(0).Comm("tp", "all_reduce", 8).Comm("tp", "all_reduce", 8).Text();
}

void ExpectRefused(const std::string& text, const std::string& line,
                   const std::string& names) {
  absl::StatusOr<FlightDump> d = ParseFlightDump(text);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(d.status().message(), line + ": "))
      << d.status();
  EXPECT_TRUE(Contains(d.status().message(), names));
}

TEST(FlightAnalysisParseTest, DamageIsRefusedNamingLineAndRule) {
  ASSERT_TRUE(ParseFlightDump(ThreeLines()).ok());
  std::vector<std::string> lines = Lines(ThreeLines());
  ExpectRefused(lines[0] + "\n" + lines[1] + "\n{\"type\": \"comm\",\n",
                "line 3", "not JSON");
  ExpectRefused(EditLine(ThreeLines(), 2, [](json& j) { j.erase("seq"); }),
                "line 2", "\"seq\"");
  ExpectRefused(
      EditLine(ThreeLines(), 2, [](json& j) { j["op"] = "all_to_all"; }),
      "line 2", "op \"all_to_all\"");
  ExpectRefused(EditLine(ThreeLines(), 1, [](json& j) { j["rank"] = 4; }),
                "line 1", "rank 4");
  ExpectRefused(lines[1] + "\n" + lines[0] + "\n", "line 1", "header");
  ExpectRefused(EditLine(ThreeLines(), 3, [](json& j) { j["bytes"] = -1; }),
                "line 3", "\"bytes\"");
  ExpectRefused(EditLine(ThreeLines(), 3, [](json& j) { j["seq"] = "2"; }),
                "line 3", "\"seq\"");
  ExpectRefused(EditLine(ThreeLines(), 3, [](json& j) { j["state"] = "x"; }),
                "line 3", "state \"x\"");
  ExpectRefused(EditLine(ThreeLines(), 3, [](json& j) { j["type"] = "x"; }),
                "line 3", "type \"x\"");
  ExpectRefused(EditLine(ThreeLines(), 3, [](json& j) { j["id"] = 1; }),
                "line 3", "id 1");
  ExpectRefused(
      EditLine(ThreeLines(), 3, [](json& j) { j["state"] = "started"; }),
      "line 3", "end_us");
  ExpectRefused(ThreeLines() + lines[0] + "\n", "line 4", "second header");
  ExpectRefused(EditLine(ThreeLines(), 1,
                         [](json& j) {
                           j["groups"]["tp"] = {0, 9};
                         }),
                "line 1", "groups.tp");
  ExpectRefused("", "line 1", "no header");
}

// --- the analysis ---

TEST(FlightAnalysisTest, StoppedRankIsTheCulpritTheOthersWaitFor) {
  std::map<int, FlightDump> dumps = HungWithout3();
  dumps[3] = StaleStart3();
  AttemptFacts facts = Facts();
  std::vector<std::pair<std::string, int>> looked_up;
  facts.process_state = [&](const std::string& host, int pid) {
    looked_up.push_back({host, pid});
    return host == "n3" && pid == 103 ? "T" : "S";
  };
  const Diagnosis d = Diagnose(facts, dumps);

  EXPECT_EQ(d.culprits, std::vector<int>({3}));
  ASSERT_EQ(d.ranks.size(), 4u);
  EXPECT_EQ(d.ranks[3].state, "stopped");
  EXPECT_TRUE(Contains(d.ranks[3].detail, "state T"));
  EXPECT_EQ(d.ranks[3].host, "n3");
  EXPECT_EQ(d.ranks[3].pid, 103);
  EXPECT_EQ(d.ranks[2].state, "waiting");
  EXPECT_EQ(d.ranks[2].waits_for, std::vector<int>({3}));
  EXPECT_TRUE(Contains(d.ranks[2].where, "tp all_reduce #5"));
  // Rank 2 has not sent to rank 0 yet, which waits to receive from it.
  EXPECT_EQ(d.ranks[0].waits_for, std::vector<int>({2}));
  EXPECT_TRUE(Contains(d.ranks[0].where, "pp recv #2 from rank 2"));
  EXPECT_EQ(d.ranks[1].waits_for, std::vector<int>({3}));
  EXPECT_EQ(d.ranks[0].state, "waiting");
  EXPECT_EQ(d.ranks[1].state, "waiting");
  EXPECT_TRUE(
      absl::StartsWith(d.summary, "attempt 2: rank 3 (node n3, pid 103)"))
      << d.summary;
  EXPECT_TRUE(Contains(d.summary, "is stopped"));
  EXPECT_TRUE(Contains(d.summary, "tp all_reduce #5"));
  EXPECT_TRUE(d.damaged.empty());
  // Only the rank the verdict hinges on is looked up.
  EXPECT_EQ(looked_up, (std::vector<std::pair<std::string, int>>{{"n3", 103}}));
}

TEST(FlightAnalysisTest, OldestUnfinishedCallIsTheOneWaitedIn) {
  std::map<int, FlightDump> dumps = HungWithout3();
  // Rank 2's stream holds its send to rank 0 behind tp all_reduce #5.
  DumpBuilder b2 = Rank(2);
  for (int i = 0; i < 4; ++i) b2.Comm("tp", "all_reduce", 4096);
  b2.Comm("pp", "recv", 1024, 0);
  b2.Comm("tp", "all_reduce", 4096, -1, "started");
  b2.Comm("pp", "send", 1024, 0, "queued");
  dumps[2] = b2.Parsed();
  const Diagnosis d = Diagnose(Facts(), dumps);
  EXPECT_TRUE(Contains(d.ranks[2].where, "tp all_reduce #5"));
  EXPECT_EQ(d.ranks[2].waits_for, std::vector<int>({3}));
  // The send is issued: rank 0 is not behind rank 2 any more.
  EXPECT_TRUE(d.ranks[0].waits_for.empty());
  EXPECT_EQ(d.culprits, std::vector<int>({3}));
}

TEST(FlightAnalysisTest, RankThatExitedWithoutADumpDied) {
  AttemptFacts facts = Facts();
  facts.exits[3] = "exited on signal 9 (Killed)";
  const Diagnosis d = Diagnose(facts, HungWithout3());

  EXPECT_EQ(d.culprits, std::vector<int>({3}));
  EXPECT_EQ(d.ranks[3].state, "died");
  EXPECT_EQ(d.ranks[3].detail, "exited on signal 9 (Killed)");
  EXPECT_EQ(d.ranks[2].waits_for, std::vector<int>({3}));
  EXPECT_TRUE(Contains(d.summary, "exited on signal 9 (Killed)"));
}

TEST(FlightAnalysisTest, GoneProcessOfAStaleDumpDied) {
  std::map<int, FlightDump> dumps = HungWithout3();
  dumps[3] = StaleStart3();
  AttemptFacts facts = Facts();
  facts.process_state = [](const std::string&, int) { return "gone"; };
  const Diagnosis d = Diagnose(facts, dumps);
  EXPECT_EQ(d.culprits, std::vector<int>({3}));
  EXPECT_EQ(d.ranks[3].state, "died");
  EXPECT_TRUE(Contains(d.ranks[3].detail, "gone"));
}

TEST(FlightAnalysisTest, RankWithNoDumpAndNothingKnownIsNotAnswering) {
  const Diagnosis d = Diagnose(Facts(), HungWithout3());
  EXPECT_EQ(d.culprits, std::vector<int>({3}));
  EXPECT_EQ(d.ranks[3].state, "not_answering");
  EXPECT_TRUE(Contains(d.ranks[3].detail, "no dump at all"));
  EXPECT_EQ(d.ranks[3].host, "");
  EXPECT_EQ(d.ranks[3].pid, 0);
}

TEST(FlightAnalysisTest, StaleDumpOfARunningProcessIsNotAnswering) {
  std::map<int, FlightDump> dumps = HungWithout3();
  dumps[3] = StaleStart3();
  AttemptFacts facts = Facts();
  facts.process_state = [](const std::string&, int) { return "D"; };
  const Diagnosis d = Diagnose(facts, dumps);
  EXPECT_EQ(d.culprits, std::vector<int>({3}));
  EXPECT_EQ(d.ranks[3].state, "not_answering");
  EXPECT_TRUE(Contains(d.ranks[3].detail, "no dump since start"));
  EXPECT_TRUE(Contains(d.ranks[3].detail, "state D"));
}

// Where ptcoord cannot see the process (another node), a rank whose
// heartbeats stopped while the others' go on is stopped; one heard lately
// is not, and neither is one when nobody has been heard (ptcoord itself
// could not listen).
TEST(FlightAnalysisTest, RankSilentWhileTheOthersAreHeardIsStopped) {
  std::map<int, FlightDump> dumps = HungWithout3();
  dumps[3] = StaleStart3();
  AttemptFacts facts = Facts();
  facts.heartbeat_every_us = kSecond;
  for (int r : {0, 1, 2}) facts.heard_unix_us[r] = facts.now_unix_us;
  facts.heard_unix_us[3] = facts.now_unix_us - 61 * kSecond;
  Diagnosis d = Diagnose(facts, dumps);
  EXPECT_EQ(d.culprits, std::vector<int>({3}));
  EXPECT_EQ(d.ranks[3].state, "stopped");
  EXPECT_TRUE(Contains(d.ranks[3].detail, "no heartbeat for 61 s"))
      << d.ranks[3].detail;
  facts.heard_unix_us[3] = facts.now_unix_us - 3 * kSecond;
  EXPECT_EQ(Diagnose(facts, dumps).ranks[3].state, "not_answering");
  for (auto& [r, at] : facts.heard_unix_us) at -= 100 * kSecond;
  EXPECT_EQ(Diagnose(facts, dumps).ranks[3].state, "not_answering");
}

TEST(FlightAnalysisTest, RankInNoCallIsInComputeForTheTimeSinceItsLastCall) {
  std::map<int, FlightDump> dumps = HungWithout3();
  DumpBuilder b3 = Rank(3);
  for (int i = 0; i < 4; ++i) b3.Comm("tp", "all_reduce", 4096);
  b3.At("forward", 2, 9).LastActivity(kFresh - 61 * kSecond);
  dumps[3] = b3.Parsed();
  AttemptFacts facts = Facts();
  facts.process_state = [](const std::string&, int) { return "R"; };
  const Diagnosis d = Diagnose(facts, dumps);

  EXPECT_EQ(d.culprits, std::vector<int>({3}));
  EXPECT_EQ(d.ranks[3].state, "compute");
  EXPECT_EQ(d.ranks[3].detail, "has not entered a collective for 61 s");
  EXPECT_EQ(d.ranks[3].where, "in forward of microbatch 2, step 9");
  EXPECT_EQ(d.ranks[2].waits_for, std::vector<int>({3}));
  EXPECT_TRUE(Contains(d.summary, "61 s"));
  EXPECT_TRUE(Contains(d.summary, "last completed tp all_reduce #4"));
}

TEST(FlightAnalysisTest, DifferentCollectivesAtOneSeqAreAMismatch) {
  std::map<int, FlightDump> dumps;
  for (int r = 0; r < 4; ++r) {
    DumpBuilder b = Rank(r);
    for (int i = 0; i < 6; ++i) b.Comm("tp", "all_reduce", 4096);
    if (r == 0) b.Comm("tp", "all_reduce", 4096, -1, "started");
    if (r == 1) b.Comm("tp", "all_gather", 4096, -1, "started");
    dumps[r] = b.Parsed();
  }
  const Diagnosis d = Diagnose(Facts(), dumps);

  EXPECT_EQ(d.culprits, std::vector<int>({0, 1}));
  EXPECT_EQ(d.ranks[0].state, "mismatch");
  EXPECT_EQ(d.ranks[1].state, "mismatch");
  EXPECT_TRUE(Contains(d.ranks[0].where, "tp all_reduce #7"));
  EXPECT_TRUE(Contains(d.ranks[1].where, "tp all_gather #7"));
  EXPECT_TRUE(Contains(d.ranks[0].detail, "all_gather"));
  EXPECT_EQ(d.ranks[2].state, "running");
  EXPECT_TRUE(Contains(d.summary, "tp #7"));
  EXPECT_TRUE(Contains(d.summary, "all_reduce"));
  EXPECT_TRUE(Contains(d.summary, "all_gather"));
}

TEST(FlightAnalysisTest, SameCollectiveOfAnotherSizeIsAMismatch) {
  std::map<int, FlightDump> dumps;
  for (int r = 0; r < 4; ++r) {
    DumpBuilder b = Rank(r);
    if (r < 2) b.Comm("tp", "all_reduce", r == 0 ? 4096 : 2048, -1, "started");
    dumps[r] = b.Parsed();
  }
  const Diagnosis d = Diagnose(Facts(), dumps);
  EXPECT_EQ(d.culprits, std::vector<int>({0, 1}));
  EXPECT_EQ(d.ranks[1].state, "mismatch");
}

TEST(FlightAnalysisTest, CallsTheRingDroppedCountAsIssued) {
  std::map<int, FlightDump> dumps = HungWithout3();
  // Rank 2 waits in tp #5; rank 3's ring starts at tp #8 (#1–#7 dropped).
  DumpBuilder b3 = Rank(3).Capacity(8).Skip(2000, "tp", 7);
  for (int i = 0; i < 4; ++i) b3.Comm("tp", "all_reduce", 4096);
  b3.Comm("pp", "send", 1024, 1);
  dumps[3] = b3.Parsed();
  const Diagnosis d = Diagnose(Facts(), dumps);
  EXPECT_TRUE(d.ranks[2].waits_for.empty());
  EXPECT_EQ(d.ranks[3].state, "running");
  EXPECT_TRUE(d.culprits.empty());
  EXPECT_TRUE(
      Contains(d.summary, "tp all_reduce #5, which every rank it needs"));

  // A ring that ends before #5 has not issued it.
  DumpBuilder behind = Rank(3).Capacity(8).Skip(2000, "tp", 0);
  for (int i = 0; i < 4; ++i) behind.Comm("tp", "all_reduce", 4096);
  behind.Comm("pp", "send", 1024, 1);
  dumps[3] = behind.Parsed();
  const Diagnosis d2 = Diagnose(Facts(), dumps);
  EXPECT_EQ(d2.ranks[2].waits_for, std::vector<int>({3}));
  EXPECT_EQ(d2.culprits, std::vector<int>({3}));
}

TEST(FlightAnalysisTest, RanksReceivingFromEachOtherWaitForEachOther) {
  std::map<int, FlightDump> dumps;
  for (int r = 0; r < 4; ++r) {
    DumpBuilder b = Rank(r);
    if (r == 0) b.Comm("pp", "recv", 64, 2, "started");
    if (r == 2) b.Comm("pp", "recv", 64, 0, "started");
    dumps[r] = b.Parsed();
  }
  const Diagnosis d = Diagnose(Facts(), dumps);
  EXPECT_TRUE(d.culprits.empty());
  EXPECT_EQ(d.ranks[0].waits_for, std::vector<int>({2}));
  EXPECT_EQ(d.ranks[2].waits_for, std::vector<int>({0}));
  EXPECT_TRUE(Contains(d.summary, "ranks 0,2 wait for each other"));
}

TEST(FlightAnalysisTest, NothingWaitingNamesNoCulprit) {
  std::map<int, FlightDump> dumps;
  for (int r = 0; r < 4; ++r) dumps[r] = Rank(r).Parsed();
  const Diagnosis d = Diagnose(Facts(), dumps);
  EXPECT_TRUE(d.culprits.empty());
  for (const RankVerdict& v : d.ranks) EXPECT_EQ(v.state, "running");
  EXPECT_TRUE(Contains(d.summary, "no rank is behind"));
}

TEST(FlightAnalysisTest, DumpOfAnotherWorldIsNamedAndSkipped) {
  std::map<int, FlightDump> dumps = HungWithout3();
  DumpBuilder other(3, 8);
  other.Group("tp", {2, 3});
  dumps[3] = other.Parsed();
  const Diagnosis d = Diagnose(Facts(), dumps);
  ASSERT_EQ(d.damaged.size(), 1u);
  EXPECT_TRUE(Contains(d.damaged[0], "rank-00003.jsonl"));
  EXPECT_EQ(d.ranks[3].state, "not_answering");
}

TEST(FlightAnalysisTest, JsonCarriesCulpritsAndEveryRanksState) {
  std::map<int, FlightDump> dumps = HungWithout3();
  dumps[3] = StaleStart3();
  AttemptFacts facts = Facts();
  facts.process_state = [](const std::string&, int) { return "T"; };
  const json j = Diagnose(facts, dumps).Json();
  EXPECT_EQ(j["attempt"], 2);
  EXPECT_EQ(j["culprits"], json::array({3}));
  ASSERT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["ranks"][3]["state"], "stopped");
  EXPECT_EQ(j["ranks"][3]["host"], "n3");
  EXPECT_EQ(j["ranks"][3]["pid"], 103);
  EXPECT_EQ(j["ranks"][2]["state"], "waiting");
  EXPECT_EQ(j["ranks"][2]["waits_for"], json::array({3}));
  EXPECT_EQ(j["ranks"][0]["state"], "waiting");
  EXPECT_TRUE(Contains(j["summary"].get<std::string>(), "rank 3"));
}

TEST(FlightAnalysisTest, TextOfEightRanksFitsOneScreen) {
  // tp8: rank 5 stopped, the others in tp all_reduce #3.
  std::map<int, FlightDump> dumps;
  for (int r = 0; r < 8; ++r) {
    DumpBuilder b(r, 8);
    b.Group("tp", {0, 1, 2, 3, 4, 5, 6, 7});
    b.Comm("tp", "all_reduce", 64).Comm("tp", "all_reduce", 64);
    if (r == 5) {
      b.Reason("SIGUSR2", kAsked - 50 * kSecond);
    } else {
      b.Comm("tp", "all_reduce", 64, -1, "started");
    }
    dumps[r] = b.Parsed();
  }
  AttemptFacts facts = Facts();
  facts.world_size = 0;  // taken from the dumps
  facts.process_state = [](const std::string&, int) { return "T"; };
  const Diagnosis d = Diagnose(facts, dumps);
  EXPECT_EQ(d.culprits, std::vector<int>({5}));
  EXPECT_TRUE(
      Contains(d.summary, "ranks 0\u20134,6,7 wait in tp all_reduce #3"));
  const std::string text = d.Text();
  const std::vector<std::string> lines = Lines(text);
  EXPECT_LE(lines.size(), 24u) << text;
  EXPECT_TRUE(absl::StartsWith(text, d.summary.substr(0, 20))) << text;
  // The table: a header and a row per rank.
  const auto header = std::find_if(lines.begin(), lines.end(), [](auto& l) {
    return absl::StartsWith(l, "RANK");
  });
  ASSERT_NE(header, lines.end()) << text;
  EXPECT_EQ(lines.end() - header, 9) << text;
}

TEST(FlightAnalysisTest, TextOfManyRanksShowsCulpritsAndCountsTheRest) {
  constexpr int kWorld = 64;
  std::map<int, FlightDump> dumps;
  std::vector<int> all(kWorld);
  for (int r = 0; r < kWorld; ++r) all[r] = r;
  for (int r = 0; r < kWorld; ++r) {
    if (r == 40) continue;
    DumpBuilder b(r, kWorld);
    b.Group("world", all);
    b.Comm("world", "barrier", 0, -1, "started");
    dumps[r] = b.Parsed();
  }
  AttemptFacts facts = Facts();
  facts.world_size = kWorld;
  facts.exits[40] = "exited on signal 11 (Segmentation fault)";
  const Diagnosis d = Diagnose(facts, dumps);
  EXPECT_EQ(d.culprits, std::vector<int>({40}));
  const std::string text = d.Text();
  const std::vector<std::string> lines = Lines(text);
  EXPECT_LE(lines.size(), 40u) << text;
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](auto& l) {
    return absl::StartsWith(l, "40 ") && absl::StrContains(l, "died");
  })) << text;
  EXPECT_TRUE(Contains(text, "more ranks"));
}

// Half of a 64-rank world that never answered: ranks 0–31 wait in a world
// barrier for ranks 32–63.
std::map<int, FlightDump> HalfAnswered() {
  constexpr int kWorld = 64;
  std::vector<int> all(kWorld);
  for (int r = 0; r < kWorld; ++r) all[r] = r;
  std::map<int, FlightDump> dumps;
  for (int r = 0; r < kWorld / 2; ++r) {
    DumpBuilder b(r, kWorld);
    b.Group("world", all);
    b.Comm("world", "barrier", 0, -1, "started");
    dumps[r] = b.Parsed();
  }
  return dumps;
}

TEST(FlightAnalysisTest, CulpritsAlikeShareOneSentence) {
  AttemptFacts facts = Facts();
  facts.world_size = 64;
  const Diagnosis d = Diagnose(facts, HalfAnswered());
  EXPECT_EQ(d.culprits.size(), 32u);
  const std::vector<std::string> sentences = Lines(d.summary);
  ASSERT_EQ(sentences.size(), 1u) << d.summary;
  EXPECT_TRUE(Contains(sentences[0], "ranks 32\u201363 are not answering"));
  EXPECT_TRUE(Contains(sentences[0],
                       "ranks 0\u201331 wait in world barrier #1 for them"));
  EXPECT_LE(Lines(d.Text()).size(), 40u) << d.Text();
}

TEST(FlightAnalysisTest, ManyCulpritsAreCountedInOneSentence) {
  AttemptFacts facts = Facts();
  facts.world_size = 64;
  for (int r = 32; r < 64; ++r) {
    facts.exits[r] = absl::StrCat("exited with status ", r);
  }
  const Diagnosis d = Diagnose(facts, HalfAnswered());
  EXPECT_EQ(d.culprits.size(), 32u);
  const std::vector<std::string> sentences = Lines(d.summary);
  ASSERT_EQ(sentences.size(), 9u) << d.summary;
  EXPECT_TRUE(Contains(sentences[0], "rank 32 died (exited with status 32)"));
  EXPECT_TRUE(Contains(sentences.back(), "ranks 40\u201363"));
  EXPECT_TRUE(Contains(sentences.back(), "24 died"));
  EXPECT_LE(Lines(d.Text()).size(), 60u) << d.Text();
}

// A healthy job's ranks wait for each other for moments: rank 1 has waited
// 0.2 s to receive from rank 0, which computes. Nobody is a culprit until
// a wait passes kCulpritWaitUs.
std::map<int, FlightDump> BriefWait(int64_t waited_us) {
  std::map<int, FlightDump> dumps;
  for (int r = 0; r < 4; ++r) {
    DumpBuilder b = Rank(r);
    b.Comm("tp", "all_reduce", 64);
    if (r == 2) b.Waited(waited_us).Comm("pp", "recv", 1024, 0, "started");
    dumps[r] = b.Parsed();
  }
  return dumps;
}

TEST(FlightAnalysisTest, ABriefWaitNamesNoCulprit) {
  AttemptFacts facts = Facts();
  facts.process_state = [](const std::string&, int) { return "R"; };
  const Diagnosis d = Diagnose(facts, BriefWait(kSecond / 5));
  EXPECT_TRUE(d.culprits.empty()) << d.summary;
  EXPECT_EQ(d.ranks[0].state, "running");
  EXPECT_EQ(d.ranks[2].state, "waiting");
  EXPECT_EQ(d.ranks[2].waits_for, std::vector<int>({0}));
  EXPECT_TRUE(Contains(
      d.summary, absl::StrCat("no rank has waited longer than ",
                              kCulpritWaitUs / kSecond, " s for another")));
  EXPECT_FALSE(absl::StrContains(d.summary, "compute")) << d.summary;
}

TEST(FlightAnalysisTest, AWaitPastTheThresholdNamesTheRankWaitedFor) {
  AttemptFacts facts = Facts();
  facts.process_state = [](const std::string&, int) { return "R"; };
  Diagnosis d = Diagnose(facts, BriefWait(kCulpritWaitUs));
  EXPECT_TRUE(d.culprits.empty()) << "at the threshold: " << d.summary;
  d = Diagnose(facts, BriefWait(kCulpritWaitUs + kSecond));
  EXPECT_EQ(d.culprits, std::vector<int>({0})) << d.summary;
  EXPECT_EQ(d.ranks[0].state, "compute");
}

TEST(FlightAnalysisTest, BriefWaitsAreNeitherCyclesNorCallsInProgress) {
  std::map<int, FlightDump> dumps;
  for (int r = 0; r < 4; ++r) {
    DumpBuilder b = Rank(r).Waited(kSecond / 10);
    if (r == 0) b.Comm("pp", "recv", 64, 2, "started");
    if (r == 2) b.Comm("pp", "recv", 64, 0, "started");
    if (r == 1) b.Comm("world", "barrier", 0, -1, "started");
    dumps[r] = b.Parsed();
  }
  const Diagnosis d = Diagnose(Facts(), dumps);
  EXPECT_TRUE(d.culprits.empty());
  EXPECT_FALSE(absl::StrContains(d.summary, "each other")) << d.summary;
  EXPECT_FALSE(absl::StrContains(d.summary, "in progress")) << d.summary;
  EXPECT_TRUE(Contains(d.summary, "no rank has waited longer than"));
}

// An ended attempt whose ranks were never asked: their start dumps say who
// they were, not where they ended.
TEST(FlightAnalysisTest, EndedAttemptWithOnlyStartDumpsIsToldAsEnded) {
  std::map<int, FlightDump> dumps;
  for (int r = 0; r < 4; ++r) {
    dumps[r] = Rank(r).Reason("start", kAsked).At("setup", -1, 0).Parsed();
  }
  AttemptFacts facts = Facts();
  facts.requested_unix_us = 0;
  facts.ended = "succeeded";
  const Diagnosis d = Diagnose(facts, dumps);
  EXPECT_TRUE(d.culprits.empty());
  EXPECT_TRUE(absl::StartsWith(d.summary, "attempt 2 ended (succeeded): "))
      << d.summary;
  EXPECT_TRUE(Contains(d.summary,
                       "no dump but the one each writes at its "
                       "start"));
  for (const RankVerdict& v : d.ranks) {
    EXPECT_EQ(v.state, "ended") << v.rank;
    EXPECT_FALSE(absl::StrContains(v.where, "setup")) << v.where;
    EXPECT_EQ(v.pid, 100 + v.rank);
  }
  EXPECT_EQ(d.Json()["ended"], "succeeded");
  EXPECT_FALSE(absl::StrContains(d.Text(), "running")) << d.Text();
}

TEST(FlightAnalysisTest, EndedAttemptsRanksAreToldAsOfTheirLastDump) {
  std::map<int, FlightDump> dumps = HungWithout3();
  dumps[3] = Rank(3).Reason("SIGTERM", kFresh).At("forward", 1, 9).Parsed();
  AttemptFacts facts = Facts();
  facts.requested_unix_us = 0;
  facts.ended = "cancelled";
  const Diagnosis d = Diagnose(facts, dumps);
  EXPECT_TRUE(absl::StartsWith(d.summary, "attempt 2 ended (cancelled): "))
      << d.summary;
  EXPECT_EQ(d.ranks[3].where,
            "in forward of microbatch 1, step 9 (as of its SIGTERM dump)");
  EXPECT_TRUE(Contains(d.ranks[2].where, "(as of its SIGUSR2 dump)"));
}

TEST(FlightAnalysisTest, EndedAttemptsRankMpirunSawDieDiedWhateverItsDump) {
  std::map<int, FlightDump> dumps = HungWithout3();
  dumps[3] = Rank(3).Reason("SIGTERM", kFresh).At("forward", 1, 9).Parsed();
  AttemptFacts facts = Facts();
  facts.requested_unix_us = 0;
  facts.ended = "failed, exit code 1";
  facts.exits[2] = "exited on signal 11 (Segmentation fault)";
  const Diagnosis d = Diagnose(facts, dumps);
  EXPECT_EQ(d.ranks[2].state, "died");
  EXPECT_EQ(d.ranks[2].detail, "exited on signal 11 (Segmentation fault)");
  EXPECT_TRUE(Contains(d.ranks[2].where, "tp all_reduce #5"));
  EXPECT_TRUE(std::count(d.culprits.begin(), d.culprits.end(), 2));
}

// A rank killed long after it answered an earlier request: that old dump
// says nothing of the end, mpirun's word does.
TEST(FlightAnalysisTest, EndedAttemptsDumpFromAnEarlierRequestIsNotItsEnd) {
  std::map<int, FlightDump> dumps = HungWithout3();
  dumps[3] = Rank(3)
                 .Reason("SIGUSR2", kFresh - kDumpRoundUs - kSecond)
                 .Comm("tp", "all_reduce", 4096, -1, "started")
                 .Parsed();
  AttemptFacts facts = Facts();
  facts.requested_unix_us = 0;
  facts.ended = "failed, exit code 137";
  facts.exits[3] = "exited on signal 9 (Killed)";
  Diagnosis d = Diagnose(facts, dumps);
  EXPECT_EQ(d.culprits, std::vector<int>({3})) << d.summary;
  EXPECT_EQ(d.ranks[3].state, "died");
  EXPECT_TRUE(Contains(d.ranks[3].where, "(as of its SIGUSR2 dump)"));
  // Unknown to mpirun, it gave no word on the end; of the same round its
  // dump would: it waited in its call then.
  facts.exits.clear();
  EXPECT_EQ(Diagnose(facts, dumps).ranks[3].state, "not_answering");
  dumps[3] = Rank(3)
                 .Reason("SIGUSR2", kFresh - kDumpRoundUs + kSecond)
                 .Comm("tp", "all_reduce", 4096, -1, "started")
                 .Parsed();
  EXPECT_EQ(Diagnose(facts, dumps).ranks[3].state, "waiting");
}

// SIGSTOPped at step 483: its newest dump is its start dump, its last
// heartbeat said step 483.
TEST(FlightAnalysisTest, StoppedRanksPlaceIsItsLastReportWhenNewerThanItsDump) {
  std::map<int, FlightDump> dumps = HungWithout3();
  dumps[3] = StaleStart3();
  AttemptFacts facts = Facts();
  facts.process_state = [](const std::string&, int) { return "T"; };
  facts.reported[3] = {483, facts.now_unix_us - 12 * kSecond};
  Diagnosis d = Diagnose(facts, dumps);
  EXPECT_EQ(d.ranks[3].state, "stopped");
  EXPECT_EQ(d.ranks[3].where,
            "past step 483 (as of its last report, 12 s ago)");
  // A report older than its dump leaves the dump's word.
  dumps[3] = Rank(3)
                 .Reason("SIGUSR2", kAsked - 50 * kSecond)
                 .At("backward", 0, 9)
                 .Parsed();
  facts.reported[3] = {8, kAsked - 60 * kSecond};
  d = Diagnose(facts, dumps);
  EXPECT_EQ(d.ranks[3].where,
            "in backward of microbatch 0, step 9 (as of its SIGUSR2 dump)");
}

// What the dumps hold reaches the JSON as valid UTF-8 and one line each:
// a key with a line break or cut inside a character is escaped.
TEST(FlightAnalysisParseTest, RefusalsNameKeysInOneLineOfAscii) {
  std::string key = "tp\n";
  while (key.size() < 300) key += "\u00e9";  // é, two bytes each
  for (const char* field : {"coords", "groups"}) {
    const std::string text =
        EditLine(ThreeLines(), 1, [&](json& j) { j[field][key] = "x"; });
    absl::StatusOr<FlightDump> d = ParseFlightDump(text);
    ASSERT_FALSE(d.ok()) << field;
    const std::string m(d.status().message());
    EXPECT_FALSE(absl::StrContains(m, "\n")) << m;
    EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](char c) {
      return c >= 0x20 && c < 0x7f;
    })) << m;
    Diagnosis diagnosis = Diagnose(Facts(), {}, {"rank-00000.jsonl: " + m});
    EXPECT_NO_THROW(diagnosis.Json().dump());
  }
}

// --- reading an attempt's folder ---

class FlightAnalysisDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/flight_analysis_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    fs::create_directories(fs::path(dir_) / "flight");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& relative, const std::string& text) {
    std::ofstream(fs::path(dir_) / relative, std::ios::binary) << text;
  }

  std::string dir_;
};

TEST_F(FlightAnalysisDirTest, DamagedDumpIsNamedAndMpirunsExitIsRead) {
  for (int r : {0, 2}) {
    DumpBuilder b = Rank(r);
    if (r == 0) {
      for (int i = 0; i < 5; ++i) b.Comm("tp", "all_reduce", 4096);
      b.Comm("pp", "send", 1024, 2);
      b.Comm("pp", "recv", 1024, 2, "started");
    } else {
      for (int i = 0; i < 4; ++i) b.Comm("tp", "all_reduce", 4096);
      b.Comm("pp", "recv", 1024, 0);
      b.Comm("tp", "all_reduce", 4096, -1, "started");
    }
    Write(absl::StrCat("flight/rank-0000", r, ".jsonl"), b.Text());
  }
  const std::string text1 = Rank(1).Comm("tp", "all_reduce", 8).Text();
  Write("flight/rank-00001.jsonl", Lines(text1)[0] + "\n{\"type\": comm}\n");
  // Neither the writer's temporary file nor the stored analysis is a dump.
  Write("flight/.rank-00003.jsonl.tmp", "garbage");
  Write("flight/analysis.json", "{}");
  Write("stderr.log",
        "some noise\n"
        "[1,3]<stderr>:mpirun noticed that process rank 3 with PID 4242 on "
        "node b exited on signal 9 (Killed).\n");
  AttemptFacts facts = Facts();
  absl::StatusOr<Diagnosis> d = DiagnoseAttemptDir(dir_, facts);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->damaged.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(d->damaged[0], "rank-00001.jsonl: line 2"))
      << d->damaged[0];
  EXPECT_EQ(d->culprits, std::vector<int>({3}));
  EXPECT_EQ(d->ranks[3].state, "died");
  EXPECT_EQ(d->ranks[3].detail, "exited on signal 9 (Killed)");
  EXPECT_EQ(d->ranks[3].host, "b");
  EXPECT_EQ(d->ranks[3].pid, 4242);
  EXPECT_EQ(d->ranks[1].detail, "its dump is damaged");
  EXPECT_EQ(d->ranks[2].waits_for, std::vector<int>({3}));
  EXPECT_TRUE(Contains(d->summary, "rank 3 (node b, pid 4242) died"));
}

TEST_F(FlightAnalysisDirTest, MpirunLineWithoutPrefixAndCallersExitsWin) {
  Write("flight/rank-00000.jsonl", Rank(0).Text());
  Write("stderr.log",
        "mpirun noticed that process rank 2 with PID 77 on node c exited on "
        "signal 6 (Aborted).\n");
  absl::StatusOr<Diagnosis> d = DiagnoseAttemptDir(dir_, Facts());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->ranks[2].state, "died");
  EXPECT_EQ(d->ranks[2].detail, "exited on signal 6 (Aborted)");

  AttemptFacts told = Facts();
  told.exits[1] = "exited on signal 15 (Terminated)";
  d = DiagnoseAttemptDir(dir_, told);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->ranks[1].state, "died");
  EXPECT_NE(d->ranks[2].state, "died");
}

TEST_F(FlightAnalysisDirTest, DumpOverTheCapIsTooLarge) {
  Write("flight/rank-00000.jsonl", Rank(0).Text());
  Write("flight/rank-00001.jsonl", "");
  fs::resize_file(fs::path(dir_) / "flight/rank-00001.jsonl",
                  (uintmax_t{64} << 20) + 1);
  absl::StatusOr<Diagnosis> d = DiagnoseAttemptDir(dir_, Facts());
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->damaged.size(), 1u);
  EXPECT_TRUE(Contains(d->damaged[0], "rank-00001.jsonl: too large"));
}

// Anyone who writes in the attempt's folder (its ranks; with --launcher
// nodes every node) can put anything there: each is named and skipped,
// without a wait and without reading more than a dump may hold.
TEST_F(FlightAnalysisDirTest, HostileFilesAreSkippedNamedWithoutBlocking) {
  const fs::path flight = fs::path(dir_) / "flight";
  Write("flight/rank-00000.jsonl", Rank(0).Text());
  ASSERT_EQ(::mkfifo((flight / "rank-00001.jsonl").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", flight / "rank-00002.jsonl");
  fs::create_directory(flight / "rank-00003.jsonl");
  ASSERT_EQ(::mkfifo((fs::path(dir_) / "stderr.log").c_str(), 0600), 0);
  std::promise<absl::StatusOr<Diagnosis>> done;
  std::future<absl::StatusOr<Diagnosis>> result = done.get_future();
  std::thread reader(
      [&] { done.set_value(DiagnoseAttemptDir(dir_, Facts())); });
  if (result.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "DiagnoseAttemptDir blocked";
    // Writers that open and close end each blocked open, until it is done.
    while (result.wait_for(std::chrono::milliseconds(100)) !=
           std::future_status::ready) {
      for (const fs::path& p :
           {flight / "rank-00001.jsonl", fs::path(dir_) / "stderr.log"}) {
        ::close(::open(p.c_str(), O_WRONLY | O_NONBLOCK));
      }
    }
  }
  reader.join();
  absl::StatusOr<Diagnosis> d = result.get();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->damaged,
            (std::vector<std::string>{
                "rank-00001.jsonl: is a FIFO, not a regular file",
                "rank-00002.jsonl: is a symbolic link, not a regular file",
                "rank-00003.jsonl: is a directory, not a regular file",
                "stderr.log: is a FIFO, not a regular file (mpirun's word on "
                "exits not read)"}));
  for (int r : {1, 2, 3}) EXPECT_EQ(d->ranks[r].detail, "its dump is damaged");
  const std::string text = d->Text();
  EXPECT_TRUE(Contains(text,
                       "skipped: rank-00001.jsonl: is a FIFO, not a "
                       "regular file\n"));
  // The headers ptcoord polls while it waits for answers skip them too.
  std::vector<DumpHeader> headers = ReadDumpHeaders(dir_);
  ASSERT_EQ(headers.size(), 1u);
  EXPECT_EQ(headers[0].rank, 0);
  EXPECT_EQ(headers[0].reason, "SIGUSR2");
}

// A dump whose first line never ends (zeros, as /dev/zero would give) is
// not a header: at most kMaxDumpLineBytes of it are read.
TEST_F(FlightAnalysisDirTest, EndlessFirstLineIsNoHeader) {
  Write("flight/rank-00000.jsonl", Rank(0).Text());
  Write("flight/rank-00001.jsonl", "");
  fs::resize_file(fs::path(dir_) / "flight/rank-00001.jsonl",
                  uintmax_t{1} << 40);
  std::vector<DumpHeader> headers = ReadDumpHeaders(dir_);
  ASSERT_EQ(headers.size(), 1u);
  EXPECT_EQ(headers[0].rank, 0);
  absl::StatusOr<Diagnosis> d = DiagnoseAttemptDir(dir_, Facts());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(Contains(d->damaged.at(0), "rank-00001.jsonl: too large"));
}

TEST_F(FlightAnalysisDirTest, FlightFolderThatIsALinkIsNotFollowed) {
  const std::string elsewhere = dir_ + "/elsewhere";
  fs::create_directories(elsewhere);
  std::ofstream(elsewhere + "/rank-00000.jsonl") << Rank(0).Text();
  fs::remove_all(fs::path(dir_) / "flight");
  fs::create_directory_symlink(elsewhere, fs::path(dir_) / "flight");
  absl::StatusOr<Diagnosis> d = DiagnoseAttemptDir(dir_, Facts());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound) << d.status();
  EXPECT_TRUE(Contains(d.status().message(), "not a folder")) << d.status();
  EXPECT_TRUE(ReadDumpHeaders(dir_).empty());
}

// A rank's stderr can say anything: an mpirun line whose node or words
// are not short ASCII is not mpirun's, and the JSON stays valid.
TEST_F(FlightAnalysisDirTest, MpirunLineWithBytesMpirunNeverWritesIsIgnored) {
  Write("flight/rank-00000.jsonl", Rank(0).Text());
  Write("stderr.log",
        "mpirun noticed that process rank 1 with PID 7 on node \xff\xfe "
        "exited on signal 9 (Killed).\n"
        "mpirun noticed that process rank 2 with PID 8 on node c exited on "
        "signal \x01 9.\n");
  absl::StatusOr<Diagnosis> d = DiagnoseAttemptDir(dir_, Facts());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_NE(d->ranks[1].state, "died");
  EXPECT_NE(d->ranks[2].state, "died");
  EXPECT_NO_THROW(d->Json().dump());
}

TEST_F(FlightAnalysisDirTest, FolderWithoutDumpsIsNotFound) {
  absl::StatusOr<Diagnosis> d = DiagnoseAttemptDir(dir_, Facts());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound) << d.status();
  fs::remove_all(fs::path(dir_) / "flight");
  d = DiagnoseAttemptDir(dir_, Facts());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound) << d.status();
}

}  // namespace
}  // namespace ptrain
