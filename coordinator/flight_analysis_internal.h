// What the files of the flight recorder analysis (flight_analysis.h) share
// among themselves; not an interface of ptcoord's.
#ifndef PTRAIN_COORDINATOR_FLIGHT_ANALYSIS_INTERNAL_H_
#define PTRAIN_COORDINATOR_FLIGHT_ANALYSIS_INTERNAL_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "coordinator/flight_analysis.h"

namespace ptrain::flight_internal {

// Far above any job's; it bounds what a damaged dump can make us allocate.
inline constexpr int kMaxWorldSize = 1 << 20;

// Microseconds as whole seconds, rounded; no overflow for any int64.
inline int64_t RoundSeconds(int64_t us) {
  return us / 1000000 + (us % 1000000 >= 500000 ? 1 : 0);
}

inline bool IsP2pOp(absl::string_view op) {
  return op == "send" || op == "recv";
}

// The phrases the verdicts and the summary are made of (flight_summary.cc).

// "rank 5" or "ranks 0–4,6,7": runs of three or more as ranges (en dash),
// over 24 runs cut.
std::string Ranks(const std::vector<int>& sorted);
// "in forward of microbatch 3, step 812" (no microbatch when it is -1).
std::string Context(absl::string_view phase, int microbatch, int64_t step);
// "tp all_reduce #1835" or "pp recv #96 from rank 4".
std::string CallPhrase(const FlightEntry& e);
// The call and where it was made: "tp all_reduce #1835 in forward of ...".
std::string EntryWhere(const FlightEntry& e);
// "2024-05-01 12:00:00 UTC".
std::string FormatUnixMicros(int64_t us);
// "rank 5 (node b, pid 4242)", leaving out what is unknown.
std::string RankName(int rank, const std::string& host, int pid);
// How long a rank in no call has been out of collectives, by its dump.
std::string Idle(const FlightDump& d);

// What the analysis holds of one world rank.
struct RankInfo {
  const FlightDump* dump = nullptr;      // its newest dump, fresh or not
  bool usable = false;                   // that dump answered the request
  const FlightEntry* pending = nullptr;  // usable only
  std::set<int> waits_for;
  std::string group_unknown;  // its pending call's group, members unknown
  bool waited_for = false;    // some waiting rank waits for it
  // No dump answered: why, for the summary ("no dump at all", "no dump
  // since its start dump", "its dump is damaged").
  std::string silence;
  std::string host;
  int pid = 0;
};

// Ranks that called different collectives as one (group members, seq).
struct Mismatch {
  std::string group;
  std::vector<int> members;
  int64_t seq = 0;
  std::set<int> ranks;
  // (op, bytes) -> the ranks that called it, lowest rank first
  std::vector<std::pair<std::pair<std::string, int64_t>, std::vector<int>>>
      variants;
};

// What the members of one collective call have issued of it.
struct CallCheck {
  std::vector<int> behind;  // members that have not issued it
  // (op, bytes) -> the members whose entry for it the ring still holds
  std::map<std::pair<std::string, int64_t>, std::vector<int>> calls;
};

// One Diagnose: the steps in the order Run takes them, each filling in what
// the next ones read (flight_analysis.cc); Summary and the methods under it
// tell the result (flight_summary.cc). `facts` and `dumps` must outlive it.
class Analysis {
 public:
  Analysis(const AttemptFacts& facts, const std::map<int, FlightDump>& dumps,
           std::vector<std::string> damaged)
      : facts_(facts), dumps_(dumps) {
    out_.attempt = facts.attempt;
    out_.ended = facts.ended;
    out_.damaged = std::move(damaged);
  }
  Analysis(const Analysis&) = delete;
  Analysis& operator=(const Analysis&) = delete;

  // The diagnosis; call once (it hands over what it built).
  Diagnosis Run();

 private:
  // The culprits alike told in one sentence, or a sentence made already.
  struct Told {
    std::vector<int> ranks;  // ascending
    std::string sentence;    // "": culprits alike, told by TellAlike
  };

  // Collecting the usable dumps.
  int WorldSize() const;
  void CollectDumps();
  void NoteDamagedRanks();

  // Who each waiting rank waits for; calls that disagree.
  void FindWaits();
  void WaitForPeer(int r, const FlightEntry& call);
  void WaitForMembers(int r, const FlightEntry& call,
                      const std::vector<int>& members);
  void AddMismatch(const std::string& group, const std::vector<int>& members,
                   int64_t seq, int a, const std::vector<int>& b);

  // Following the waits to the ranks in no call.
  void FollowWaits();
  bool Waiting(int r) const { return info_[r].pending != nullptr; }
  // How long waiting rank r had waited in its call when it dumped
  // (unknown: as long as can be); 0 for a rank in no call.
  int64_t WaitedUs(int r) const;
  bool LongWait(int r) const {
    return Waiting(r) && WaitedUs(r) > kCulpritWaitUs;
  }
  // The longest wait of the ranks that wait for r, directly or behind
  // others.
  int64_t LongestWaitOn(int r) const;
  // " (as of its SIGTERM dump)" for the dumps of an ended attempt, whose
  // ranks are gone; "" while it runs.
  std::string AsOf(const FlightDump& d) const;

  // The verdict on each rank.
  std::string Look(int r) const;
  std::string DiedOrStopped(int r, RankVerdict& v) const;
  // Microseconds rank r has not been heard from, when that marks it as
  // stopped (AttemptFacts::heard_unix_us); 0 otherwise.
  int64_t SilentFor(int r) const;
  void ClassifyRank(int r);
  void ClassifyWaiting(const RankInfo& ri, RankVerdict& v) const;
  void ClassifyRunning(int r, RankVerdict& v) const;
  void ClassifySilent(int r, RankVerdict& v);
  void ClassifyMismatches();
  void FindCulprits();

  // The summary's sentences, the first of them led by "attempt N: ".
  std::string Summary() const;
  std::vector<std::string> TellCulprits() const;
  std::vector<Told> TellMismatches() const;
  std::vector<std::pair<std::string, std::vector<int>>> Alike() const;
  std::string Cause(const RankVerdict& v, bool plural) const;
  std::string Waiters(const std::vector<int>& culprits) const;
  std::string TellAlike(const std::vector<int>& ranks) const;
  std::vector<bool> Explained() const;
  std::vector<std::vector<int>> WaitCycles() const;
  void TellCycles(std::vector<std::string>& sentences) const;
  void TellInProgress(std::vector<std::string>& sentences) const;
  void TellStates(std::vector<std::string>& sentences) const;
  // "… ended (how): " before the first sentence of an ended attempt.
  std::string Lead() const;

  const AttemptFacts& facts_;
  const std::map<int, FlightDump>& dumps_;
  Diagnosis out_;
  int world_ = 0;
  std::vector<RankInfo> info_;
  // Ranks whose dump file was damaged ("rank-00003.jsonl: ...").
  std::set<int> damaged_ranks_;
  // (group, members, seq) of each collective call checked -> what its
  // members have issued of it.
  std::map<std::tuple<std::string, std::vector<int>, int64_t>, CallCheck>
      checked_;
  std::vector<Mismatch> mismatches_;
  std::set<int> mismatched_;
  std::vector<std::vector<int>> waiters_of_;  // reverse edges
  std::set<int> ends_;
};

}  // namespace ptrain::flight_internal

#endif  // PTRAIN_COORDINATOR_FLIGHT_ANALYSIS_INTERNAL_H_
