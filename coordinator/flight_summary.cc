// The words of a diagnosis: the phrases its verdicts are made of and the
// summary's sentences (Analysis::Summary, flight_analysis_internal.h).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/flight_analysis.h"
#include "coordinator/flight_analysis_internal.h"

namespace ptrain::flight_internal {

namespace {

// Culprits told one sentence each; more are counted in one.
constexpr size_t kMaxCulpritSentences = 8;
// Rank lists longer than this many runs are cut.
constexpr size_t kMaxRankListParts = 24;

// "0–4,6,7": runs of three or more as ranges (en dash).
std::string RankList(const std::vector<int>& sorted) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (j - i >= 2) {
      parts.push_back(absl::StrCat(sorted[i], "\u2013", sorted[j]));
    } else {
      for (size_t k = i; k <= j; ++k) parts.push_back(absl::StrCat(sorted[k]));
    }
    i = j + 1;
  }
  if (parts.size() > kMaxRankListParts) {
    parts.resize(kMaxRankListParts);
    parts.push_back(absl::StrCat("\u2026 (", sorted.size(), " in all)"));
  }
  return absl::StrJoin(parts, ",");
}

const FlightEntry* LastCompleted(const FlightDump& d) {
  for (auto it = d.entries.rbegin(); it != d.entries.rend(); ++it) {
    if (!it->mark && it->state == "completed") return &*it;
  }
  return nullptr;
}

}  // namespace

std::string Ranks(const std::vector<int>& sorted) {
  return absl::StrCat(sorted.size() == 1 ? "rank " : "ranks ",
                      RankList(sorted));
}

std::string Context(absl::string_view phase, int microbatch, int64_t step) {
  std::string s = absl::StrCat("in ", phase);
  if (microbatch >= 0) absl::StrAppend(&s, " of microbatch ", microbatch);
  absl::StrAppend(&s, ", step ", step);
  return s;
}

std::string CallPhrase(const FlightEntry& e) {
  std::string s = absl::StrCat(e.group, " ", e.op, " #", e.seq);
  if (e.op == "send") absl::StrAppend(&s, " to rank ", e.peer);
  if (e.op == "recv") absl::StrAppend(&s, " from rank ", e.peer);
  return s;
}

std::string EntryWhere(const FlightEntry& e) {
  return absl::StrCat(CallPhrase(e), " ",
                      Context(e.phase, e.microbatch, e.step));
}

std::string FormatUnixMicros(int64_t us) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMicros(us),
                          absl::UTCTimeZone());
}

std::string RankName(int rank, const std::string& host, int pid) {
  std::vector<std::string> parts;
  if (!host.empty()) parts.push_back(absl::StrCat("node ", host));
  if (pid > 0) parts.push_back(absl::StrCat("pid ", pid));
  std::string s = absl::StrCat("rank ", rank);
  if (!parts.empty())
    absl::StrAppend(&s, " (", absl::StrJoin(parts, ", "), ")");
  return s;
}

std::string Idle(const FlightDump& d) {
  if (d.last_activity_unix_us == 0) return "has not entered a collective yet";
  return absl::StrCat("has not entered a collective for ",
                      RoundSeconds(d.dumped_unix_us - d.last_activity_unix_us),
                      " s");
}

std::string Analysis::Summary() const {
  std::vector<std::string> sentences = TellCulprits();
  TellCycles(sentences);
  if (sentences.empty()) TellInProgress(sentences);
  if (sentences.empty()) TellStates(sentences);
  sentences[0] = absl::StrCat(Lead(), sentences[0]);
  return absl::StrJoin(sentences, "\n");
}

std::string Analysis::Lead() const {
  if (facts_.ended.empty())
    return absl::StrCat("attempt ", facts_.attempt, ": ");
  return absl::StrCat("attempt ", facts_.attempt, " ended (", facts_.ended,
                      "): ");
}

// A sentence per culprit. Culprits alike (state and cause) share one, as do
// the ranks of one mismatch, so that a lost node is one sentence, not one
// per rank.
std::vector<std::string> Analysis::TellCulprits() const {
  std::vector<Told> told = TellMismatches();
  for (const auto& [key, ranks] : Alike()) told.push_back({ranks, ""});
  std::sort(told.begin(), told.end(),
            [](const Told& a, const Told& b) { return a.ranks < b.ranks; });
  std::vector<std::string> sentences;
  std::set<int> untold;
  for (const Told& t : told) {
    if (sentences.size() < kMaxCulpritSentences) {
      // Told only for the sentences shown (each walks the waiting ranks).
      sentences.push_back(t.sentence.empty() ? TellAlike(t.ranks) : t.sentence);
    } else {
      untold.insert(t.ranks.begin(), t.ranks.end());
    }
  }
  if (!untold.empty()) {
    std::map<std::string, int> states;
    for (int c : untold) ++states[out_.ranks[c].state];
    std::vector<std::string> parts;
    for (const auto& [state, n] : states) {
      parts.push_back(absl::StrCat(n, " ", state));
    }
    sentences.push_back(absl::StrCat(
        "and ", Ranks(std::vector<int>(untold.begin(), untold.end())), " (",
        absl::StrJoin(parts, ", "), ")."));
  }
  return sentences;
}

std::vector<Analysis::Told> Analysis::TellMismatches() const {
  std::vector<Told> told;
  for (const Mismatch& m : mismatches_) {
    std::vector<std::string> parts;
    for (const auto& [call, ranks] : m.variants) {
      const std::string who =
          ranks.size() == 1
              ? RankName(ranks[0], info_[ranks[0]].host, info_[ranks[0]].pid)
              : Ranks(ranks);
      parts.push_back(absl::StrCat(who, parts.empty() ? " called " : " ",
                                   call.first, " of ", call.second, " bytes"));
    }
    told.push_back({std::vector<int>(m.ranks.begin(), m.ranks.end()),
                    absl::StrCat("mismatch in ", m.group, " #", m.seq, ": ",
                                 absl::StrJoin(parts, ", "),
                                 "; the ranks called different collectives.")});
  }
  return told;
}

// Culprits alike: compute is told rank by rank (each has its own place).
std::vector<std::pair<std::string, std::vector<int>>> Analysis::Alike() const {
  std::vector<std::pair<std::string, std::vector<int>>> alike;
  for (int c : out_.culprits) {
    const RankVerdict& v = out_.ranks[c];
    if (v.state == "mismatch") continue;
    const std::string key = v.state == "compute"
                                ? absl::StrCat("compute ", c)
                                : absl::StrCat(v.state, " ", Cause(v, false));
    auto it = std::find_if(alike.begin(), alike.end(),
                           [&](const auto& x) { return x.first == key; });
    if (it == alike.end()) {
      alike.push_back({key, {c}});
    } else {
      it->second.push_back(c);
    }
  }
  return alike;
}

std::string Analysis::Cause(const RankVerdict& v, bool plural) const {
  const char* is = plural ? "are" : "is";
  if (v.state == "stopped") {
    return absl::StrCat(is, " stopped (",
                        absl::StartsWith(v.detail, "state T")
                            ? "state T: SIGSTOP?"
                            : "state t: a debugger?",
                        ")");
  }
  if (v.state == "died") return absl::StrCat("died (", v.detail, ")");
  if (v.state == "compute") return absl::StrCat(is, " in compute ", v.where);
  return absl::StrCat(is, " not answering (", info_[v.rank].silence,
                      ": stopped, frozen or its node unreachable)");
}

// "; rank 2 waits in tp all_reduce #5, rank 1 in ... for it; rank 0 waits
// behind rank 2": the ranks waiting for `culprits`, by the call they wait
// in, then the ranks waiting for those.
std::string Analysis::Waiters(const std::vector<int>& culprits) const {
  std::set<int> direct_set;
  for (int c : culprits) {
    direct_set.insert(waiters_of_[c].begin(), waiters_of_[c].end());
  }
  for (int c : culprits) direct_set.erase(c);
  if (direct_set.empty()) return "";
  const std::vector<int> direct(direct_set.begin(), direct_set.end());
  std::vector<std::pair<std::string, std::vector<int>>> by_call;
  for (int w : direct) {
    const std::string call = CallPhrase(*info_[w].pending);
    auto it = std::find_if(by_call.begin(), by_call.end(),
                           [&](const auto& x) { return x.first == call; });
    if (it == by_call.end()) {
      by_call.push_back({call, {w}});
    } else {
      it->second.push_back(w);
    }
  }
  constexpr size_t kMaxCalls = 3;
  std::vector<std::string> parts;
  size_t rest = 0;
  for (size_t i = 0; i < by_call.size(); ++i) {
    const auto& [call, ranks] = by_call[i];
    if (i >= kMaxCalls) {
      rest += ranks.size();
      continue;
    }
    parts.push_back(absl::StrCat(
        Ranks(ranks), i > 0 ? "" : (ranks.size() == 1 ? " waits" : " wait"),
        " in ", call));
  }
  if (rest > 0) parts.push_back(absl::StrCat(rest, " more in other calls"));
  std::string s = absl::StrCat("; ", absl::StrJoin(parts, ", "), " for ",
                               culprits.size() == 1 ? "it" : "them");
  std::set<int> visited(direct.begin(), direct.end());
  visited.insert(culprits.begin(), culprits.end());
  std::vector<int> behind;
  std::deque<int> q(direct.begin(), direct.end());
  while (!q.empty()) {
    const int w = q.front();
    q.pop_front();
    for (int x : waiters_of_[w]) {
      if (visited.insert(x).second) {
        behind.push_back(x);
        q.push_back(x);
      }
    }
  }
  if (!behind.empty()) {
    std::sort(behind.begin(), behind.end());
    absl::StrAppend(&s, "; ", Ranks(behind),
                    behind.size() == 1 ? " waits" : " wait", " behind ",
                    direct.size() == 1 ? Ranks(direct) : "those");
  }
  return s;
}

std::string Analysis::TellAlike(const std::vector<int>& ranks) const {
  const RankVerdict& v = out_.ranks[ranks[0]];
  std::string s;
  if (ranks.size() == 1) {
    const int c = ranks[0];
    s = absl::StrCat(RankName(c, v.host, v.pid), " ", Cause(v, false));
    const FlightDump* d = info_[c].dump;
    if (const FlightEntry* last = d != nullptr ? LastCompleted(*d) : nullptr) {
      absl::StrAppend(&s,
                      info_[c].usable
                          ? ": it"
                          : absl::StrCat(": as of its ", d->reason, " dump it"),
                      " last completed ", EntryWhere(*last));
    }
    absl::StrAppend(&s, Waiters(ranks));
    if (info_[c].usable && info_[c].pending == nullptr) {
      absl::StrAppend(&s, "; rank ", c, " ", Idle(*d));
    }
  } else {
    std::set<std::string> hosts;
    for (int c : ranks) {
      if (!info_[c].host.empty()) hosts.insert(info_[c].host);
    }
    s = Ranks(ranks);
    constexpr size_t kMaxHosts = 4;
    if (!hosts.empty() && hosts.size() <= kMaxHosts) {
      absl::StrAppend(&s, hosts.size() == 1 ? " (node " : " (nodes ",
                      absl::StrJoin(hosts, ", "), ")");
    }
    absl::StrAppend(&s, " ", Cause(v, true), Waiters(ranks));
  }
  return s + ".";
}

// The ranks that reach a culprit (or are one) by following their waiters.
std::vector<bool> Analysis::Explained() const {
  std::vector<bool> explained(world_, false);
  std::deque<int> q;
  for (int c : out_.culprits) {
    explained[c] = true;
    q.push_back(c);
  }
  while (!q.empty()) {
    const int r = q.front();
    q.pop_front();
    for (int w : waiters_of_[r]) {
      if (!explained[w]) {
        explained[w] = true;
        q.push_back(w);
      }
    }
  }
  return explained;
}

// Tarjan's strongly connected components among the unexplained waiting
// ranks (iterative: a world may be deep), each of two or more a cycle;
// each sorted, in the order found.
std::vector<std::vector<int>> Analysis::WaitCycles() const {
  const std::vector<bool> explained = Explained();
  // Only waits long enough to matter: dumps taken moments apart can show
  // two ranks each waiting for the other's next call.
  std::vector<std::vector<int>> adj(world_);
  for (int r = 0; r < world_; ++r) {
    if (explained[r] || !LongWait(r)) continue;
    for (int m : info_[r].waits_for) {
      if (!explained[m] && LongWait(m)) adj[r].push_back(m);
    }
  }
  std::vector<std::vector<int>> cycles;
  std::vector<int> index(world_, -1), low(world_, 0), stack;
  std::vector<bool> on_stack(world_, false);
  std::vector<std::pair<int, size_t>> calls_down;
  int next_index = 0;
  auto visit = [&](int v) {
    index[v] = low[v] = next_index++;
    stack.push_back(v);
    on_stack[v] = true;
    calls_down.push_back({v, 0});
  };
  for (int root = 0; root < world_; ++root) {
    if (adj[root].empty() || index[root] >= 0) continue;
    visit(root);
    while (!calls_down.empty()) {
      const int v = calls_down.back().first;
      const size_t i = calls_down.back().second++;
      if (i < adj[v].size()) {
        const int w = adj[v][i];
        if (index[w] < 0) {
          visit(w);
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      calls_down.pop_back();
      if (!calls_down.empty()) {
        const int parent = calls_down.back().first;
        low[parent] = std::min(low[parent], low[v]);
      }
      if (low[v] != index[v]) continue;
      std::vector<int> cycle;
      int w;
      do {
        w = stack.back();
        stack.pop_back();
        on_stack[w] = false;
        cycle.push_back(w);
      } while (w != v);
      if (cycle.size() < 2) continue;
      std::sort(cycle.begin(), cycle.end());
      cycles.push_back(std::move(cycle));
    }
  }
  return cycles;
}

// Waiting ranks that reach neither a culprit nor a mismatch wait in a
// cycle (or behind one): ranks that wait for each other.
void Analysis::TellCycles(std::vector<std::string>& sentences) const {
  for (const std::vector<int>& cycle : WaitCycles()) {
    std::vector<std::string> calls;
    for (int x : cycle) {
      calls.push_back(
          absl::StrCat("rank ", x, " in ", CallPhrase(*info_[x].pending)));
    }
    sentences.push_back(absl::StrCat(Ranks(cycle), " wait for each other (",
                                     absl::StrJoin(calls, ", "), ")."));
  }
}

// No one behind: ranks in calls every member has issued (in progress,
// or stuck below what the recorder sees), and those waiting on them.
void Analysis::TellInProgress(std::vector<std::string>& sentences) const {
  std::vector<std::pair<std::string, std::vector<int>>> by_call;
  for (int r = 0; r < world_; ++r) {
    if (!LongWait(r) || !info_[r].waits_for.empty() ||
        !info_[r].group_unknown.empty()) {
      continue;
    }
    const std::string call = CallPhrase(*info_[r].pending);
    auto it = std::find_if(by_call.begin(), by_call.end(),
                           [&](const auto& x) { return x.first == call; });
    if (it == by_call.end()) {
      by_call.push_back({call, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  for (const auto& [call, ranks] : by_call) {
    sentences.push_back(absl::StrCat(
        Ranks(ranks), ranks.size() == 1 ? " waits" : " wait", " in ", call,
        ", which every rank it needs has issued (still in progress, or "
        "stuck below the flight recorder)."));
  }
}

// Nobody waits, or not for long: what each rank does.
void Analysis::TellStates(std::vector<std::string>& sentences) const {
  const bool any_dump = std::any_of(info_.begin(), info_.end(),
                                    [](const RankInfo& i) { return i.usable; });
  const bool start_dumps =
      std::all_of(info_.begin(), info_.end(), [](const RankInfo& i) {
        return i.dump != nullptr && i.dump->reason == "start";
      });
  if (!facts_.ended.empty() && !any_dump && start_dumps && world_ > 0) {
    sentences.push_back(
        "its ranks left no dump but the one each writes at its start, which "
        "says nothing of the end (ranks are asked for dumps only while the "
        "attempt runs: by ptctl diagnose, or when ptcoord finds it hung).");
    return;
  }
  std::map<std::string, std::vector<int>> by_state;
  for (const RankVerdict& v : out_.ranks) by_state[v.state].push_back(v.rank);
  std::vector<std::string> parts;
  for (const auto& [state, ranks] : by_state) {
    parts.push_back(absl::StrCat(Ranks(ranks), " ",
                                 ranks.size() == 1 ? "is " : "are ", state));
  }
  if (world_ == 0) parts.push_back("no rank is known");
  bool waits = false;
  for (int r = 0; r < world_; ++r) waits = waits || Waiting(r);
  sentences.push_back(absl::StrCat(
      waits      ? absl::StrCat("no rank has waited longer than ",
                                kCulpritWaitUs / 1000000, " s for another: ")
      : any_dump ? "no rank is behind another: "
                 : "no dump tells where its ranks were: ",
      absl::StrJoin(parts, ", "), "."));
}

}  // namespace ptrain::flight_internal
