// Diagnose (flight_analysis.h, docs/diagnose.md): who waits for whom in the
// dumps, the culprits and each rank's verdict; flight_summary.cc tells them.
#include "coordinator/flight_analysis.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "coordinator/flight_analysis_internal.h"

namespace ptrain {

namespace flight_internal {

namespace {

std::string DumpFileName(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.jsonl", rank);
  return name;
}

// The oldest unfinished call: the one the rank is blocked in (calls of a
// rank complete in order on each stream; the oldest holds the others).
const FlightEntry* Pending(const FlightDump& d) {
  for (const FlightEntry& e : d.entries) {
    if (!e.mark && e.state != "completed") return &e;
  }
  return nullptr;
}

// Whether `m` has issued call `seq` of `group`: an entry at or past it, or
// its oldest entry of the group past it (the ring dropped the older ones).
// *at: m's entry at `seq` when the ring still holds it.
bool IssuedCollective(const FlightDump& m, const std::string& group,
                      int64_t seq, const FlightEntry** at) {
  *at = nullptr;
  int64_t newest = 0;
  for (const FlightEntry& e : m.entries) {
    if (e.mark || e.group != group) continue;
    newest = std::max(newest, e.seq);
    if (e.seq == seq) *at = &e;
  }
  return newest >= seq;
}

// Whether `m` has issued its `k`-th call `op` to (send) or from (recv)
// `rank` in `group`; as above for entries the ring dropped.
bool IssuedP2p(const FlightDump& m, const std::string& group,
               absl::string_view op, int rank, int64_t k) {
  int64_t newest = 0;
  for (const FlightEntry& e : m.entries) {
    if (e.mark || e.group != group || e.op != op || e.peer != rank) continue;
    newest = std::max(newest, e.peer_seq);
  }
  return newest >= k;
}

// ParseFlightDump checks this; dumps built otherwise are checked again
// before their ranks index anything.
bool RanksWithin(const FlightDump& d, int world) {
  for (const auto& [name, members] : d.groups) {
    for (int m : members) {
      if (m < 0 || m >= world) return false;
    }
  }
  for (const FlightEntry& e : d.entries) {
    if (!e.mark && IsP2pOp(e.op) && (e.peer < 0 || e.peer >= world)) {
      return false;
    }
  }
  return true;
}

// The rank's call `seq` of `group`, when its ring still holds it.
const FlightEntry* EntryAt(const FlightDump& d, const std::string& group,
                           int64_t seq) {
  for (const FlightEntry& e : d.entries) {
    if (!e.mark && e.group == group && e.seq == seq) return &e;
  }
  return nullptr;
}

}  // namespace

Diagnosis Analysis::Run() {
  world_ = WorldSize();
  CollectDumps();
  FindWaits();
  FollowWaits();
  // The state of each rank; process_state only where the verdict hinges
  // on it.
  out_.ranks.resize(world_);
  for (int r = 0; r < world_; ++r) ClassifyRank(r);
  ClassifyMismatches();
  FindCulprits();
  out_.summary = Summary();
  return std::move(out_);
}

// The world: the caller's, else the size most dumps agree on.
int Analysis::WorldSize() const {
  int world = facts_.world_size;
  if (world <= 0) {
    std::map<int, int> votes;
    for (const auto& [rank, d] : dumps_) ++votes[d.world_size];
    int best = 0;
    for (const auto& [size, n] : votes) {
      if (n > best) best = n, world = size;
    }
  }
  if (world <= 0 && !facts_.exits.empty()) {
    world = std::min(facts_.exits.rbegin()->first, kMaxWorldSize - 1) + 1;
  }
  return std::clamp(world, 0, kMaxWorldSize);
}

void Analysis::CollectDumps() {
  info_.resize(world_);
  int64_t since = facts_.requested_unix_us;
  if (since == 0) {
    int64_t newest = 0;
    for (const auto& [rank, d] : dumps_) {
      if (d.reason != "start") newest = std::max(newest, d.dumped_unix_us);
    }
    since = std::max<int64_t>(0, newest - kDumpRoundUs);
  }
  for (const auto& [rank, d] : dumps_) {
    const std::string name = DumpFileName(rank);
    if (rank < 0 || rank >= world_) {
      out_.damaged.push_back(
          absl::StrCat(name, ": rank outside [0, ", world_, ")"));
      continue;
    }
    if (d.rank != rank) {
      out_.damaged.push_back(
          absl::StrCat(name, ": its header says rank ", d.rank));
      continue;
    }
    if (d.world_size != world_) {
      out_.damaged.push_back(absl::StrCat(name, ": world_size ", d.world_size,
                                          ", the attempt's is ", world_));
      continue;
    }
    if (!RanksWithin(d, world_)) {
      out_.damaged.push_back(
          absl::StrCat(name, ": names a rank outside [0, ", world_, ")"));
      continue;
    }
    RankInfo& r = info_[rank];
    r.dump = &d;
    r.host = d.host;
    r.pid = d.pid;
    // A start dump only says who the rank is: it answers no request, and
    // its place (setup, step 0) is not where the rank is now.
    r.usable = d.reason != "start" && d.dumped_unix_us >= since;
    if (r.usable) r.pending = Pending(d);
  }
  NoteDamagedRanks();
  for (const auto& [rank, where] : facts_.exited_processes) {
    if (rank < 0 || rank >= world_ || info_[rank].dump != nullptr) continue;
    info_[rank].host = where.first;
    info_[rank].pid = where.second;
  }
}

void Analysis::NoteDamagedRanks() {
  for (absl::string_view d : out_.damaged) {
    int rank = -1;
    if (absl::ConsumePrefix(&d, "rank-") && d.size() > 7 &&
        absl::SimpleAtoi(d.substr(0, d.find('.')), &rank)) {
      damaged_ranks_.insert(rank);
    }
  }
}

void Analysis::FindWaits() {
  for (int r = 0; r < world_; ++r) {
    const FlightEntry* call = info_[r].pending;
    if (call == nullptr) continue;
    auto members_it = info_[r].dump->groups.find(call->group);
    if (IsP2pOp(call->op)) {
      WaitForPeer(r, *call);
      continue;
    }
    if (members_it == info_[r].dump->groups.end()) {
      info_[r].group_unknown = call->group;
      continue;
    }
    WaitForMembers(r, *call, members_it->second);
  }
}

void Analysis::WaitForPeer(int r, const FlightEntry& call) {
  const int p = call.peer;
  const RankInfo& peer = info_[p];
  // The k-th receive from p is p's k-th send to r, and the reverse.
  const char* matching = call.op == "recv" ? "send" : "recv";
  if (!peer.usable ||
      !IssuedP2p(*peer.dump, call.group, matching, r, call.peer_seq)) {
    info_[r].waits_for.insert(p);
  }
}

void Analysis::WaitForMembers(int r, const FlightEntry& call,
                              const std::vector<int>& members) {
  // The ranks of one call see the same members: checked once per call,
  // not once per waiting member (a world barrier of n ranks is n², not
  // n³).
  auto [it, fresh] =
      checked_.try_emplace(std::make_tuple(call.group, members, call.seq));
  CallCheck& check = it->second;
  if (fresh) {
    for (int m : members) {
      const FlightEntry* at = nullptr;
      if (!info_[m].usable ||
          !IssuedCollective(*info_[m].dump, call.group, call.seq, &at)) {
        check.behind.push_back(m);
      } else if (at != nullptr) {
        check.calls[{at->op, at->bytes}].push_back(m);
      }
    }
  }
  info_[r].waits_for.insert(check.behind.begin(), check.behind.end());
  info_[r].waits_for.erase(r);
  for (const auto& [op_bytes, ranks] : check.calls) {
    if (op_bytes == std::make_pair(call.op, call.bytes)) continue;
    AddMismatch(call.group, members, call.seq, r, ranks);
  }
}

// Rank a called otherwise than ranks b at `seq` of the group `members`.
void Analysis::AddMismatch(const std::string& group,
                           const std::vector<int>& members, int64_t seq, int a,
                           const std::vector<int>& b) {
  Mismatch* m = nullptr;
  for (Mismatch& x : mismatches_) {
    if (x.group == group && x.members == members && x.seq == seq) m = &x;
  }
  if (m == nullptr) {
    mismatches_.push_back({group, members, seq, {}, {}});
    m = &mismatches_.back();
  }
  m->ranks.insert(a);
  m->ranks.insert(b.begin(), b.end());
  mismatched_.insert(a);
  mismatched_.insert(b.begin(), b.end());
}

// Following "behind" from every waiting rank ends at ranks in no call.
void Analysis::FollowWaits() {
  waiters_of_.resize(world_);
  std::deque<int> queue;
  std::vector<bool> seen(world_, false);
  for (int r = 0; r < world_; ++r) {
    for (int m : info_[r].waits_for) {
      waiters_of_[m].push_back(r);
      info_[m].waited_for = true;
    }
    if (Waiting(r)) {
      queue.push_back(r);
      seen[r] = true;
    }
  }
  while (!queue.empty()) {
    const int r = queue.front();
    queue.pop_front();
    if (!Waiting(r)) {
      ends_.insert(r);
      continue;
    }
    for (int m : info_[r].waits_for) {
      if (!seen[m]) {
        seen[m] = true;
        queue.push_back(m);
      }
    }
  }
}

int64_t Analysis::WaitedUs(int r) const {
  const FlightEntry* call = info_[r].pending;
  if (call == nullptr) return 0;
  const int64_t since =
      call->enqueue_us > 0 ? call->enqueue_us : call->start_us;
  if (since <= 0) return std::numeric_limits<int64_t>::max();
  return std::max<int64_t>(0, info_[r].dump->dumped_unix_us - since);
}

int64_t Analysis::LongestWaitOn(int r) const {
  int64_t longest = 0;
  std::vector<bool> seen(world_, false);
  std::deque<int> queue(waiters_of_[r].begin(), waiters_of_[r].end());
  while (!queue.empty()) {
    const int w = queue.front();
    queue.pop_front();
    if (seen[w]) continue;
    seen[w] = true;
    longest = std::max(longest, WaitedUs(w));
    queue.insert(queue.end(), waiters_of_[w].begin(), waiters_of_[w].end());
  }
  return longest;
}

std::string Analysis::AsOf(const FlightDump& d) const {
  if (facts_.ended.empty()) return "";
  return absl::StrCat(" (as of its ", d.reason, " dump)");
}

std::string Analysis::Look(int r) const {
  if (!facts_.process_state || info_[r].host.empty() || info_[r].pid <= 0) {
    return "";
  }
  return facts_.process_state(info_[r].host, info_[r].pid);
}

// A rank that died or stopped, from mpirun's word or its process (state
// left alone when neither says so); returns the process state seen.
std::string Analysis::DiedOrStopped(int r, RankVerdict& v) const {
  auto exit = facts_.exits.find(r);
  if (exit != facts_.exits.end() && !exit->second.empty()) {
    v.state = "died";
    v.detail = exit->second;
    return "";
  }
  const std::string ps = Look(r);
  if (ps == "T") {
    v.state = "stopped";
    v.detail = "state T (stopped: SIGSTOP?)";
  } else if (ps == "t") {
    v.state = "stopped";
    v.detail = "state t (traced: a debugger?)";
  } else if (ps == "gone" || ps == "Z") {
    v.state = "died";
    v.detail = "its process is gone";
  } else if (const int64_t silent = SilentFor(r); silent > 0) {
    v.state = "stopped";
    v.detail = absl::StrCat("no heartbeat for ", RoundSeconds(silent),
                            " s while the other ranks' go on (stopped: "
                            "SIGSTOP?, or its node froze)");
  }
  return ps;
}

int64_t Analysis::SilentFor(int r) const {
  const int64_t every = facts_.heartbeat_every_us;
  const auto heard = facts_.heard_unix_us.find(r);
  if (every <= 0 || facts_.now_unix_us <= 0 ||
      heard == facts_.heard_unix_us.end()) {
    return 0;
  }
  // Three missed while another rank was heard within two. (A hang is
  // found after four: restart.hang_timeout_s is four heartbeats.)
  const int64_t silent = facts_.now_unix_us - heard->second;
  if (silent <= 3 * every) return 0;
  for (const auto& [other, at] : facts_.heard_unix_us) {
    if (other != r && facts_.now_unix_us - at <= 2 * every) return silent;
  }
  return 0;
}

void Analysis::ClassifyRank(int r) {
  const RankInfo& ri = info_[r];
  RankVerdict& v = out_.ranks[r];
  v.rank = r;
  v.host = ri.host;
  v.pid = ri.pid;
  v.waits_for.assign(ri.waits_for.begin(), ri.waits_for.end());
  // Of an ended attempt mpirun's word on a rank's end is the last: what its
  // dump shows came before.
  if (auto exit = facts_.exits.find(r); !facts_.ended.empty() &&
                                        exit != facts_.exits.end() &&
                                        !exit->second.empty() && ri.usable) {
    v.where =
        ri.pending != nullptr
            ? EntryWhere(*ri.pending) + AsOf(*ri.dump)
            : Context(ri.dump->phase, ri.dump->microbatch, ri.dump->step) +
                  AsOf(*ri.dump);
    v.state = "died";
    v.detail = exit->second;
    return;
  }
  if (ri.usable && ri.pending != nullptr) {
    ClassifyWaiting(ri, v);
  } else if (ri.usable) {
    ClassifyRunning(r, v);
  } else {
    ClassifySilent(r, v);
  }
}

void Analysis::ClassifyWaiting(const RankInfo& ri, RankVerdict& v) const {
  v.state = "waiting";
  v.where = EntryWhere(*ri.pending) + AsOf(*ri.dump);
  if (!ri.waits_for.empty()) {
    v.detail = absl::StrCat("waits for ", Ranks(v.waits_for));
  } else if (!ri.group_unknown.empty()) {
    v.detail =
        absl::StrCat("the members of group ", ri.group_unknown, " are unknown");
  } else if (IsP2pOp(ri.pending->op)) {
    v.detail =
        absl::StrCat("rank ", ri.pending->peer, " has issued the matching ",
                     ri.pending->op == "recv" ? "send" : "recv");
  } else {
    v.detail = "every member has issued it";
  }
  if (ri.pending->state == "queued") {
    absl::StrAppend(&v.detail, "; queued: its stream has not reached it");
  }
}

void Analysis::ClassifyRunning(int r, RankVerdict& v) const {
  const FlightDump* d = info_[r].dump;
  v.where = Context(d->phase, d->microbatch, d->step) + AsOf(*d);
  // Of an ended attempt the rank ran no more; while it runs, it runs.
  const char* free = facts_.ended.empty() ? "running" : "ended";
  v.state = free;
  if (!ends_.count(r)) return;
  // The dump may predate a stop or death when the request time is
  // unknown (any dump counts), so mpirun and the process have a say.
  DiedOrStopped(r, v);
  if (v.state != free) return;
  const int64_t waited = LongestWaitOn(r);
  if (waited <= kCulpritWaitUs) {
    // Others wait for it, for moments: what a healthy job does.
    v.detail =
        absl::StrCat("waited for ", RoundSeconds(waited), " s, under the ",
                     kCulpritWaitUs / 1000000, " s that make a culprit");
    return;
  }
  v.state = "compute";
  v.detail = Idle(*d);
}

// No dump answered: the last one (if any) says where it was.
void Analysis::ClassifySilent(int r, RankVerdict& v) {
  const FlightDump* d = info_[r].dump;
  // Where it was by its last dump (a start dump says nothing of that), or
  // by its last report when that is newer.
  if (d != nullptr && d->reason != "start") {
    const FlightEntry* p = Pending(*d);
    v.where =
        absl::StrCat(p != nullptr ? EntryWhere(*p)
                                  : Context(d->phase, d->microbatch, d->step),
                     " (as of its ", d->reason, " dump)");
  }
  if (auto rep = facts_.reported.find(r);
      rep != facts_.reported.end() &&
      rep->second.unix_us > (d != nullptr ? d->dumped_unix_us : 0) &&
      rep->second.step > (d != nullptr ? d->step - 1 : -1)) {
    v.where =
        absl::StrCat("past step ", rep->second.step, " (as of its last report");
    if (facts_.now_unix_us > rep->second.unix_us) {
      absl::StrAppend(&v.where, ", ",
                      RoundSeconds(facts_.now_unix_us - rep->second.unix_us),
                      " s ago");
    }
    absl::StrAppend(&v.where, ")");
  }
  const std::string ps = DiedOrStopped(r, v);
  if (!v.state.empty()) return;
  if (d == nullptr) {
    v.detail =
        damaged_ranks_.count(r) ? "its dump is damaged" : "no dump at all";
    info_[r].silence = v.detail;
  } else {
    info_[r].silence = absl::StrCat("no dump since its ", d->reason, " dump");
    v.detail = absl::StrCat("no dump since ", d->reason, " at ",
                            FormatUnixMicros(d->dumped_unix_us));
    if (facts_.now_unix_us > d->dumped_unix_us) {
      absl::StrAppend(&v.detail, " (",
                      RoundSeconds(facts_.now_unix_us - d->dumped_unix_us),
                      " s ago)");
    }
  }
  if (!ps.empty()) {
    absl::StrAppend(&v.detail, "; its process is in state ", ps);
    absl::StrAppend(&info_[r].silence, ", its process in state ", ps);
  }
  if (info_[r].waited_for) {
    v.state = "not_answering";
    absl::StrAppend(&v.detail, "; stopped, frozen or its node unreachable");
  } else {
    v.state = facts_.ended.empty() ? "unknown" : "ended";
  }
}

// Each mismatch's ranks by the call they made, lowest rank first.
void Analysis::ClassifyMismatches() {
  for (Mismatch& m : mismatches_) {
    for (int o : m.ranks) {
      const FlightEntry* e = EntryAt(*info_[o].dump, m.group, m.seq);
      if (e == nullptr) continue;
      const std::pair<std::string, int64_t> call{e->op, e->bytes};
      auto it = std::find_if(m.variants.begin(), m.variants.end(),
                             [&](const auto& x) { return x.first == call; });
      if (it == m.variants.end()) {
        m.variants.push_back({call, {o}});
      } else {
        it->second.push_back(o);
      }
    }
    for (const auto& [call, ranks] : m.variants) {
      std::vector<std::string> others;
      for (const auto& [other, other_ranks] : m.variants) {
        if (other == call) continue;
        others.push_back(absl::StrCat(other.first, " of ", other.second,
                                      " bytes on ", Ranks(other_ranks)));
      }
      for (int r : ranks) {
        RankVerdict& v = out_.ranks[r];
        v.state = "mismatch";
        v.where = EntryWhere(*EntryAt(*info_[r].dump, m.group, m.seq));
        v.detail = absl::StrCat(m.group, " #", m.seq, ": ", call.first, " of ",
                                call.second, " bytes here, ",
                                absl::StrJoin(others, ", "));
      }
    }
  }
  for (int r : mismatched_) out_.ranks[r].state = "mismatch";
}

// Culprits: the ends of waiting (once waited for long enough), the ranks
// that disagree, and ranks that died or stopped though nobody waits for them
// yet.
void Analysis::FindCulprits() {
  std::set<int> culprits;
  // An end waited for only for moments is no culprit (kCulpritWaitUs).
  for (int r : ends_) {
    const std::string& s = out_.ranks[r].state;
    if (s != "running" && s != "ended") culprits.insert(r);
  }
  culprits.insert(mismatched_.begin(), mismatched_.end());
  for (int r = 0; r < world_; ++r) {
    const std::string& s = out_.ranks[r].state;
    if (s == "died" || s == "stopped") culprits.insert(r);
  }
  out_.culprits.assign(culprits.begin(), culprits.end());
}

}  // namespace flight_internal

Diagnosis Diagnose(const AttemptFacts& facts,
                   const std::map<int, FlightDump>& dumps,
                   std::vector<std::string> damaged) {
  return flight_internal::Analysis(facts, dumps, std::move(damaged)).Run();
}

}  // namespace ptrain
