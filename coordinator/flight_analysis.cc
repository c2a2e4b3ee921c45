// Parsing and analysis of flight recorder dumps (coordinator/
// flight_analysis.h); the rules are those of docs/diagnose.md.
#include "coordinator/flight_analysis.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"

namespace ptrain {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
// Far above any job's; it bounds what a damaged dump can make us allocate.
constexpr int kMaxWorldSize = 1 << 20;
// Bigger dump files are refused unread: a ring of 2048 entries is well under
// 1 MiB, so 64 MiB is damage, not a big job.
constexpr int64_t kMaxDumpBytes = int64_t{64} << 20;
// Strings of a dump end up in one-screen text: short and printable.
constexpr size_t kMaxStringBytes = 256;
constexpr int kMaxTableRows = 32;
// Culprits told one sentence each; more are counted in one.
constexpr size_t kMaxCulpritSentences = 8;
// Rank lists longer than this many runs are cut.
constexpr size_t kMaxRankListParts = 24;
constexpr int kTextWidth = 80;

bool IsCollectiveOp(absl::string_view op) {
  return op == "all_reduce" || op == "reduce_scatter" || op == "all_gather" ||
         op == "broadcast" || op == "barrier";
}
bool IsP2pOp(absl::string_view op) { return op == "send" || op == "recv"; }
bool IsState(absl::string_view s) {
  return s == "queued" || s == "started" || s == "completed";
}

// The keys of one JSON line, read with their rules; the first broken rule
// is kept (with the line number) and later reads do nothing.
class Fields {
 public:
  Fields(const json& j, int line) : j_(j), line_(line) {}

  int64_t Int(const char* key, int64_t lo, int64_t hi) {
    if (!status_.ok()) return lo;
    auto it = j_.find(key);
    if (it == j_.end()) return Fail(absl::StrCat("key \"", key, "\" missing"));
    if (!it->is_number_integer()) {
      return Fail(absl::StrCat("key \"", key, "\" is not an integer"));
    }
    if (it->is_number_unsigned() && it->get<uint64_t>() > kInt64Max) {
      return Fail(absl::StrCat("key \"", key, "\" is out of range"));
    }
    const int64_t v = it->get<int64_t>();
    if (v < lo || v > hi) {
      return Fail(hi == kInt64Max
                      ? absl::StrCat("key \"", key, "\" is ", v,
                                     ", must be at least ", lo)
                      : absl::StrCat("key \"", key, "\" is ", v, ", outside [",
                                     lo, ", ", hi, "]"));
    }
    return v;
  }

  std::string Str(const char* key) {
    if (!status_.ok()) return "";
    auto it = j_.find(key);
    if (it == j_.end()) {
      Fail(absl::StrCat("key \"", key, "\" missing"));
      return "";
    }
    if (!it->is_string()) {
      Fail(absl::StrCat("key \"", key, "\" is not a string"));
      return "";
    }
    std::string s = it->get<std::string>();
    if (s.empty() || s.size() > kMaxStringBytes ||
        std::any_of(s.begin(), s.end(), [](char c) {
          return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
        })) {
      Fail(absl::StrCat("key \"", key, "\" must be 1 to ", kMaxStringBytes,
                        " printable bytes"));
      return "";
    }
    return s;
  }

  bool Has(const char* key) const { return j_.contains(key); }
  const json& Get(const char* key) const { return j_.at(key); }

  int64_t Fail(absl::string_view what) {
    if (status_.ok()) {
      status_ =
          absl::InvalidArgumentError(absl::StrCat("line ", line_, ": ", what));
    }
    return 0;
  }
  const absl::Status& status() const { return status_; }

 private:
  const json& j_;
  const int line_;
  absl::Status status_;
};

void ParseHeader(Fields& f, FlightDump& d) {
  const int64_t version = f.Int("version", 0, kInt64Max);
  if (f.status().ok() && version != 1) {
    f.Fail(absl::StrCat("version ", version, " is not supported (only 1)"));
  }
  d.world_size = static_cast<int>(f.Int("world_size", 1, kMaxWorldSize));
  const int64_t rank = f.Int("rank", 0, kIntMax);
  if (f.status().ok() && rank >= d.world_size) {
    f.Fail(absl::StrCat("rank ", rank, " outside [0, ", d.world_size,
                        ") (world_size)"));
  }
  d.rank = static_cast<int>(rank);
  d.pid = static_cast<int>(f.Int("pid", 0, kIntMax));
  d.host = f.Str("host");
  if (f.status().ok()) {
    if (!f.Has("coords") || !f.Get("coords").is_object()) {
      f.Fail("key \"coords\" missing or not an object");
    } else {
      for (const auto& [name, v] : f.Get("coords").items()) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
            v.get<int64_t>() > kIntMax || name.size() > kMaxStringBytes) {
          f.Fail(absl::StrCat("coords.", name.substr(0, kMaxStringBytes),
                              " is not an integer at least 0"));
          break;
        }
        d.coords[name] = v.get<int>();
      }
    }
  }
  if (f.status().ok()) {
    if (!f.Has("groups") || !f.Get("groups").is_object()) {
      f.Fail("key \"groups\" missing or not an object");
    } else {
      for (const auto& [name, members] : f.Get("groups").items()) {
        const std::string shown = name.substr(0, kMaxStringBytes);
        if (name.empty() || name.size() > kMaxStringBytes ||
            !members.is_array() || members.empty()) {
          f.Fail(absl::StrCat("groups.", shown,
                              " is not a non-empty list of ranks"));
          break;
        }
        std::vector<int>& ranks = d.groups[name];
        for (const json& m : members) {
          if (!m.is_number_integer() || m.get<int64_t>() < 0 ||
              m.get<int64_t>() >= d.world_size) {
            f.Fail(absl::StrCat("groups.", shown, " holds ", m.dump(),
                                ", not a rank in [0, ", d.world_size, ")"));
            break;
          }
          ranks.push_back(m.get<int>());
        }
        if (!f.status().ok()) break;
      }
    }
  }
  d.reason = f.Str("reason");
  d.dumped_unix_us = f.Int("dumped_unix_us", 0, kInt64Max);
  d.step = f.Int("step", 0, kInt64Max);
  d.microbatch = static_cast<int>(f.Int("microbatch", -1, kIntMax));
  d.phase = f.Str("phase");
  d.last_activity_unix_us = f.Int("last_activity_unix_us", 0, kInt64Max);
  d.capacity = static_cast<int>(f.Int("capacity", 1, kIntMax));
  d.recorded = f.Int("recorded", 0, kInt64Max);
}

void ParseComm(Fields& f, const FlightDump& d, FlightEntry& e) {
  e.id = static_cast<uint64_t>(f.Int("id", 1, kInt64Max));
  e.group = f.Str("group");
  e.seq = f.Int("seq", 1, kInt64Max);
  e.op = f.Str("op");
  if (f.status().ok() && !IsCollectiveOp(e.op) && !IsP2pOp(e.op)) {
    f.Fail(absl::StrCat("unknown op \"", e.op, "\""));
  }
  e.bytes = f.Int("bytes", 0, kInt64Max);
  if (IsP2pOp(e.op)) {
    e.peer = static_cast<int>(f.Int("peer", 0, d.world_size - 1));
    e.peer_seq = f.Int("peer_seq", 1, kInt64Max);
  } else {
    e.peer = static_cast<int>(f.Int("peer", -1, -1));
    e.peer_seq = f.Int("peer_seq", 0, 0);
  }
  e.step = f.Int("step", 0, kInt64Max);
  e.microbatch = static_cast<int>(f.Int("microbatch", -1, kIntMax));
  e.phase = f.Str("phase");
  e.enqueue_us = f.Int("enqueue_us", 0, kInt64Max);
  e.start_us = f.Int("start_us", 0, kInt64Max);
  e.state = f.Str("state");
  if (f.status().ok() && !IsState(e.state)) {
    f.Fail(absl::StrCat("unknown state \"", e.state, "\""));
  }
  // end_us is there exactly when the call completed (docs/diagnose.md).
  if (e.state == "completed") {
    e.end_us = f.Int("end_us", 0, kInt64Max);
  } else if (f.status().ok() && f.Has("end_us")) {
    f.Fail(absl::StrCat("key \"end_us\" on a call ", e.state));
  }
}

void ParseMark(Fields& f, FlightEntry& e) {
  e.mark = true;
  e.id = static_cast<uint64_t>(f.Int("id", 1, kInt64Max));
  e.step = f.Int("step", 0, kInt64Max);
  e.microbatch = static_cast<int>(f.Int("microbatch", -1, kIntMax));
  e.phase = f.Str("phase");
  e.start_us = f.Int("unix_us", 0, kInt64Max);
}

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

// "rank 5" or "ranks 0–4,6,7".
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

// "tp all_reduce #1835" or "pp recv #96 from rank 4".
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

const FlightEntry* LastCompleted(const FlightDump& d) {
  for (auto it = d.entries.rbegin(); it != d.entries.rend(); ++it) {
    if (!it->mark && it->state == "completed") return &*it;
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

// The rank's call `seq` of `group`, when its ring still holds it.
const FlightEntry* EntryAt(const FlightDump& d, const std::string& group,
                           int64_t seq) {
  for (const FlightEntry& e : d.entries) {
    if (!e.mark && e.group == group && e.seq == seq) return &e;
  }
  return nullptr;
}

// How long a rank in no call has been out of collectives, by its dump.
std::string Idle(const FlightDump& d) {
  if (d.last_activity_unix_us == 0) return "has not entered a collective yet";
  return absl::StrCat(
      "has not entered a collective for ",
      (d.dumped_unix_us - d.last_activity_unix_us + 500000) / 1000000, " s");
}

// "rank 5 (node b, pid 4242)", leaving out what is unknown.
std::string RankName(int rank, const std::string& host, int pid) {
  std::vector<std::string> parts;
  if (!host.empty()) parts.push_back(absl::StrCat("node ", host));
  if (pid > 0) parts.push_back(absl::StrCat("pid ", pid));
  std::string s = absl::StrCat("rank ", rank);
  if (!parts.empty())
    absl::StrAppend(&s, " (", absl::StrJoin(parts, ", "), ")");
  return s;
}

// Greedy word wrap; continuation lines indented by two spaces. Width counts
// characters, not UTF-8 bytes.
std::string Wrap(absl::string_view line, int width) {
  auto columns = [](absl::string_view s) {
    int n = 0;
    for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    return n;
  };
  std::string out;
  int used = 0;
  for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    const int w = columns(word);
    if (used > 0 && used + 1 + w > width) {
      out += "\n  ";
      used = 2;
    } else if (used > 0) {
      out += ' ';
      ++used;
    }
    absl::StrAppend(&out, word);
    used += w;
  }
  return out;
}

}  // namespace

absl::StatusOr<FlightDump> ParseFlightDump(absl::string_view text) {
  FlightDump d;
  bool have_header = false;
  uint64_t previous_id = 0;
  int line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == absl::string_view::npos) end = text.size();
    const absl::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    const json j = json::parse(line.begin(), line.end(), nullptr,
                               /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": not JSON"));
    }
    if (!j.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": not a JSON object"));
    }
    Fields f(j, line_no);
    const std::string type = f.Str("type");
    if (!f.status().ok()) return f.status();
    if (type != "header" && type != "comm" && type != "mark") {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": unknown type \"", type, "\""));
    }
    if (!have_header && type != "header") {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": type \"", type,
                       "\" before the header (the header comes first)"));
    }
    if (type == "header") {
      if (have_header) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_no, ": a second header"));
      }
      ParseHeader(f, d);
      if (!f.status().ok()) return f.status();
      have_header = true;
      continue;
    }
    FlightEntry e;
    if (type == "comm") {
      ParseComm(f, d, e);
    } else {
      ParseMark(f, e);
    }
    if (!f.status().ok()) return f.status();
    if (e.id <= previous_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": id ", e.id,
                       " not above the previous entry's ", previous_id));
    }
    if (e.id > static_cast<uint64_t>(d.recorded)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_no, ": id ", e.id, " beyond recorded ", d.recorded));
    }
    if (d.entries.size() >= static_cast<size_t>(d.capacity)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_no, ": more entries than capacity ", d.capacity));
    }
    previous_id = e.id;
    d.entries.push_back(std::move(e));
  }
  if (!have_header) {
    return absl::InvalidArgumentError("line 1: empty (no header)");
  }
  return d;
}

Diagnosis Diagnose(const AttemptFacts& facts,
                   const std::map<int, FlightDump>& dumps,
                   std::vector<std::string> damaged) {
  Diagnosis out;
  out.attempt = facts.attempt;
  out.damaged = std::move(damaged);

  // The world: the caller's, else the size most dumps agree on.
  int world = facts.world_size;
  if (world <= 0) {
    std::map<int, int> votes;
    for (const auto& [rank, d] : dumps) ++votes[d.world_size];
    int best = 0;
    for (const auto& [size, n] : votes) {
      if (n > best) best = n, world = size;
    }
  }
  if (world <= 0 && !facts.exits.empty()) {
    world = std::min(facts.exits.rbegin()->first, kMaxWorldSize - 1) + 1;
  }
  world = std::clamp(world, 0, kMaxWorldSize);

  std::vector<RankInfo> info(world);
  for (const auto& [rank, d] : dumps) {
    const std::string name = DumpFileName(rank);
    if (rank < 0 || rank >= world) {
      out.damaged.push_back(
          absl::StrCat(name, ": rank outside [0, ", world, ")"));
      continue;
    }
    if (d.rank != rank) {
      out.damaged.push_back(
          absl::StrCat(name, ": its header says rank ", d.rank));
      continue;
    }
    if (d.world_size != world) {
      out.damaged.push_back(absl::StrCat(name, ": world_size ", d.world_size,
                                         ", the attempt's is ", world));
      continue;
    }
    if (!RanksWithin(d, world)) {
      out.damaged.push_back(
          absl::StrCat(name, ": names a rank outside [0, ", world, ")"));
      continue;
    }
    RankInfo& r = info[rank];
    r.dump = &d;
    r.host = d.host;
    r.pid = d.pid;
    r.usable = facts.requested_unix_us == 0 ||
               d.dumped_unix_us >= facts.requested_unix_us;
    if (r.usable) r.pending = Pending(d);
  }
  // Ranks whose dump file was damaged ("rank-00003.jsonl: ...").
  std::set<int> damaged_ranks;
  for (absl::string_view d : out.damaged) {
    int rank = -1;
    if (absl::ConsumePrefix(&d, "rank-") && d.size() > 7 &&
        absl::SimpleAtoi(d.substr(0, d.find('.')), &rank)) {
      damaged_ranks.insert(rank);
    }
  }

  for (const auto& [rank, where] : facts.exited_processes) {
    if (rank < 0 || rank >= world || info[rank].dump != nullptr) continue;
    info[rank].host = where.first;
    info[rank].pid = where.second;
  }

  // Who each waiting rank waits for; calls that disagree.
  struct CallCheck {
    std::vector<int> behind;  // members that have not issued it
    // (op, bytes) -> the members whose entry for it the ring still holds
    std::map<std::pair<std::string, int64_t>, std::vector<int>> calls;
  };
  std::map<std::tuple<std::string, std::vector<int>, int64_t>, CallCheck>
      checked;
  std::vector<Mismatch> mismatches;
  std::set<int> mismatched;
  // Rank a called otherwise than ranks b at `seq` of the group `members`.
  auto add_mismatch = [&](const std::string& group,
                          const std::vector<int>& members, int64_t seq, int a,
                          const std::vector<int>& b) {
    Mismatch* m = nullptr;
    for (Mismatch& x : mismatches) {
      if (x.group == group && x.members == members && x.seq == seq) m = &x;
    }
    if (m == nullptr) {
      mismatches.push_back({group, members, seq, {}, {}});
      m = &mismatches.back();
    }
    m->ranks.insert(a);
    m->ranks.insert(b.begin(), b.end());
    mismatched.insert(a);
    mismatched.insert(b.begin(), b.end());
  };
  for (int r = 0; r < world; ++r) {
    const FlightEntry* call = info[r].pending;
    if (call == nullptr) continue;
    auto members_it = info[r].dump->groups.find(call->group);
    if (IsP2pOp(call->op)) {
      const int p = call->peer;
      const RankInfo& peer = info[p];
      // The k-th receive from p is p's k-th send to r, and the reverse.
      const char* matching = call->op == "recv" ? "send" : "recv";
      if (!peer.usable ||
          !IssuedP2p(*peer.dump, call->group, matching, r, call->peer_seq)) {
        info[r].waits_for.insert(p);
      }
      continue;
    }
    if (members_it == info[r].dump->groups.end()) {
      info[r].group_unknown = call->group;
      continue;
    }
    // The ranks of one call see the same members: checked once per call,
    // not once per waiting member (a world barrier of n ranks is n², not
    // n³).
    const std::vector<int>& members = members_it->second;
    auto [it, fresh] =
        checked.try_emplace(std::make_tuple(call->group, members, call->seq));
    CallCheck& check = it->second;
    if (fresh) {
      for (int m : members) {
        const FlightEntry* at = nullptr;
        if (!info[m].usable ||
            !IssuedCollective(*info[m].dump, call->group, call->seq, &at)) {
          check.behind.push_back(m);
        } else if (at != nullptr) {
          check.calls[{at->op, at->bytes}].push_back(m);
        }
      }
    }
    info[r].waits_for.insert(check.behind.begin(), check.behind.end());
    info[r].waits_for.erase(r);
    for (const auto& [op_bytes, ranks] : check.calls) {
      if (op_bytes == std::make_pair(call->op, call->bytes)) continue;
      add_mismatch(call->group, members, call->seq, r, ranks);
    }
  }

  // Following "behind" from every waiting rank ends at ranks in no call.
  auto waiting = [&](int r) { return info[r].pending != nullptr; };
  std::vector<std::vector<int>> waiters_of(world);  // reverse edges
  std::deque<int> queue;
  std::vector<bool> seen(world, false);
  for (int r = 0; r < world; ++r) {
    for (int m : info[r].waits_for) {
      waiters_of[m].push_back(r);
      info[m].waited_for = true;
    }
    if (waiting(r)) {
      queue.push_back(r);
      seen[r] = true;
    }
  }
  std::set<int> ends;
  while (!queue.empty()) {
    const int r = queue.front();
    queue.pop_front();
    if (!waiting(r)) {
      ends.insert(r);
      continue;
    }
    for (int m : info[r].waits_for) {
      if (!seen[m]) {
        seen[m] = true;
        queue.push_back(m);
      }
    }
  }

  // The state of each rank; process_state only where the verdict hinges
  // on it.
  out.ranks.resize(world);
  auto look = [&](int r) -> std::string {
    if (!facts.process_state || info[r].host.empty() || info[r].pid <= 0) {
      return "";
    }
    return facts.process_state(info[r].host, info[r].pid);
  };
  // A rank that died or stopped, from mpirun's word or its process (state
  // left alone when neither says so); returns the process state seen.
  auto died_or_stopped = [&](int r, RankVerdict& v) -> std::string {
    auto exit = facts.exits.find(r);
    if (exit != facts.exits.end() && !exit->second.empty()) {
      v.state = "died";
      v.detail = exit->second;
      return "";
    }
    const std::string ps = look(r);
    if (ps == "T") {
      v.state = "stopped";
      v.detail = "state T (stopped: SIGSTOP?)";
    } else if (ps == "t") {
      v.state = "stopped";
      v.detail = "state t (traced: a debugger?)";
    } else if (ps == "gone" || ps == "Z") {
      v.state = "died";
      v.detail = "its process is gone";
    }
    return ps;
  };
  for (int r = 0; r < world; ++r) {
    const RankInfo& ri = info[r];
    RankVerdict& v = out.ranks[r];
    v.rank = r;
    v.host = ri.host;
    v.pid = ri.pid;
    v.waits_for.assign(ri.waits_for.begin(), ri.waits_for.end());
    const FlightDump* d = ri.dump;
    if (ri.usable && ri.pending != nullptr) {
      v.state = "waiting";
      v.where = EntryWhere(*ri.pending);
      if (!ri.waits_for.empty()) {
        v.detail = absl::StrCat("waits for ", Ranks(v.waits_for));
      } else if (!ri.group_unknown.empty()) {
        v.detail = absl::StrCat("the members of group ", ri.group_unknown,
                                " are unknown");
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
      continue;
    }
    if (ri.usable) {
      v.where = Context(d->phase, d->microbatch, d->step);
      v.state = "running";
      if (!ends.count(r)) continue;
      // The dump may predate a stop or death when the request time is
      // unknown (any dump counts), so mpirun and the process have a say.
      died_or_stopped(r, v);
      if (v.state != "running") continue;
      v.state = "compute";
      v.detail = Idle(*d);
      continue;
    }
    // No dump answered: the last one (if any) says where it was.
    if (d != nullptr) {
      const FlightEntry* p = Pending(*d);
      v.where =
          absl::StrCat(p != nullptr ? EntryWhere(*p)
                                    : Context(d->phase, d->microbatch, d->step),
                       " (as of its ", d->reason, " dump)");
    }
    const std::string ps = died_or_stopped(r, v);
    if (!v.state.empty()) continue;
    if (d == nullptr) {
      v.detail =
          damaged_ranks.count(r) ? "its dump is damaged" : "no dump at all";
      info[r].silence = v.detail;
    } else {
      info[r].silence = absl::StrCat("no dump since its ", d->reason, " dump");
      v.detail = absl::StrCat("no dump since ", d->reason, " at ",
                              FormatUnixMicros(d->dumped_unix_us));
      if (facts.now_unix_us > d->dumped_unix_us) {
        absl::StrAppend(
            &v.detail, " (",
            (facts.now_unix_us - d->dumped_unix_us + 500000) / 1000000,
            " s ago)");
      }
    }
    if (!ps.empty()) {
      absl::StrAppend(&v.detail, "; its process is in state ", ps);
      absl::StrAppend(&info[r].silence, ", its process in state ", ps);
    }
    if (ri.waited_for) {
      v.state = "not_answering";
      absl::StrAppend(&v.detail, "; stopped, frozen or its node unreachable");
    } else {
      v.state = "unknown";
    }
  }
  // Each mismatch's ranks by the call they made, lowest rank first.
  for (Mismatch& m : mismatches) {
    for (int o : m.ranks) {
      const FlightEntry* e = EntryAt(*info[o].dump, m.group, m.seq);
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
        RankVerdict& v = out.ranks[r];
        v.state = "mismatch";
        v.where = EntryWhere(*EntryAt(*info[r].dump, m.group, m.seq));
        v.detail = absl::StrCat(m.group, " #", m.seq, ": ", call.first, " of ",
                                call.second, " bytes here, ",
                                absl::StrJoin(others, ", "));
      }
    }
  }
  for (int r : mismatched) out.ranks[r].state = "mismatch";

  // Culprits: the ends of waiting, the ranks that disagree, and ranks that
  // died or stopped though nobody waits for them yet.
  std::set<int> culprits(ends.begin(), ends.end());
  culprits.insert(mismatched.begin(), mismatched.end());
  for (int r = 0; r < world; ++r) {
    const std::string& s = out.ranks[r].state;
    if (s == "died" || s == "stopped") culprits.insert(r);
  }
  out.culprits.assign(culprits.begin(), culprits.end());

  // The summary: a sentence per culprit. Culprits alike (state and cause)
  // share one, as do the ranks of one mismatch, so that a lost node is one
  // sentence, not one per rank.
  struct Told {
    std::vector<int> ranks;  // ascending
    std::string sentence;    // "": culprits alike, told by tell_alike
  };
  std::vector<Told> told;
  for (const Mismatch& m : mismatches) {
    std::vector<std::string> parts;
    for (const auto& [call, ranks] : m.variants) {
      const std::string who =
          ranks.size() == 1
              ? RankName(ranks[0], info[ranks[0]].host, info[ranks[0]].pid)
              : Ranks(ranks);
      parts.push_back(absl::StrCat(who, parts.empty() ? " called " : " ",
                                   call.first, " of ", call.second, " bytes"));
    }
    told.push_back({std::vector<int>(m.ranks.begin(), m.ranks.end()),
                    absl::StrCat("mismatch in ", m.group, " #", m.seq, ": ",
                                 absl::StrJoin(parts, ", "),
                                 "; the ranks called different collectives.")});
  }
  auto cause = [&](const RankVerdict& v, bool plural) -> std::string {
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
    return absl::StrCat(is, " not answering (", info[v.rank].silence,
                        ": stopped, frozen or its node unreachable)");
  };
  // "; rank 2 waits in tp all_reduce #5, rank 1 in ... for it; rank 0 waits
  // behind rank 2": the ranks waiting for `culprits`, by the call they wait
  // in, then the ranks waiting for those.
  auto waiters = [&](const std::vector<int>& culprits) -> std::string {
    std::set<int> direct_set;
    for (int c : culprits) {
      direct_set.insert(waiters_of[c].begin(), waiters_of[c].end());
    }
    for (int c : culprits) direct_set.erase(c);
    if (direct_set.empty()) return "";
    const std::vector<int> direct(direct_set.begin(), direct_set.end());
    std::vector<std::pair<std::string, std::vector<int>>> by_call;
    for (int w : direct) {
      const std::string call = CallPhrase(*info[w].pending);
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
      for (int x : waiters_of[w]) {
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
  };
  // Culprits alike: compute is told rank by rank (each has its own place).
  std::vector<std::pair<std::string, std::vector<int>>> alike;
  for (int c : out.culprits) {
    const RankVerdict& v = out.ranks[c];
    if (v.state == "mismatch") continue;
    const std::string key = v.state == "compute"
                                ? absl::StrCat("compute ", c)
                                : absl::StrCat(v.state, " ", cause(v, false));
    auto it = std::find_if(alike.begin(), alike.end(),
                           [&](const auto& x) { return x.first == key; });
    if (it == alike.end()) {
      alike.push_back({key, {c}});
    } else {
      it->second.push_back(c);
    }
  }
  // Told only for the sentences shown (each walks the waiting ranks).
  auto tell_alike = [&](const std::vector<int>& ranks) {
    const RankVerdict& v = out.ranks[ranks[0]];
    std::string s;
    if (ranks.size() == 1) {
      const int c = ranks[0];
      s = absl::StrCat(RankName(c, v.host, v.pid), " ", cause(v, false));
      const FlightDump* d = info[c].dump;
      if (const FlightEntry* last =
              d != nullptr ? LastCompleted(*d) : nullptr) {
        absl::StrAppend(&s,
                        info[c].usable ? ": it"
                                       : absl::StrCat(": as of its ", d->reason,
                                                      " dump it"),
                        " last completed ", EntryWhere(*last));
      }
      absl::StrAppend(&s, waiters(ranks));
      if (info[c].usable && info[c].pending == nullptr) {
        absl::StrAppend(&s, "; rank ", c, " ", Idle(*d));
      }
    } else {
      std::set<std::string> hosts;
      for (int c : ranks) {
        if (!info[c].host.empty()) hosts.insert(info[c].host);
      }
      s = Ranks(ranks);
      constexpr size_t kMaxHosts = 4;
      if (!hosts.empty() && hosts.size() <= kMaxHosts) {
        absl::StrAppend(&s, hosts.size() == 1 ? " (node " : " (nodes ",
                        absl::StrJoin(hosts, ", "), ")");
      }
      absl::StrAppend(&s, " ", cause(v, true), waiters(ranks));
    }
    return s + ".";
  };
  for (const auto& [key, ranks] : alike) told.push_back({ranks, ""});
  std::sort(told.begin(), told.end(),
            [](const Told& a, const Told& b) { return a.ranks < b.ranks; });
  std::vector<std::string> sentences;
  std::set<int> untold;
  for (const Told& t : told) {
    if (sentences.size() < kMaxCulpritSentences) {
      sentences.push_back(t.sentence.empty() ? tell_alike(t.ranks)
                                             : t.sentence);
    } else {
      untold.insert(t.ranks.begin(), t.ranks.end());
    }
  }
  if (!untold.empty()) {
    std::map<std::string, int> states;
    for (int c : untold) ++states[out.ranks[c].state];
    std::vector<std::string> parts;
    for (const auto& [state, n] : states) {
      parts.push_back(absl::StrCat(n, " ", state));
    }
    sentences.push_back(absl::StrCat(
        "and ", Ranks(std::vector<int>(untold.begin(), untold.end())), " (",
        absl::StrJoin(parts, ", "), ")."));
  }

  // Waiting ranks that reach neither a culprit nor a mismatch wait in a
  // cycle (or behind one): ranks that wait for each other.
  std::vector<bool> explained(world, false);
  {
    std::deque<int> q;
    for (int c : out.culprits) {
      explained[c] = true;
      q.push_back(c);
    }
    while (!q.empty()) {
      const int r = q.front();
      q.pop_front();
      for (int w : waiters_of[r]) {
        if (!explained[w]) {
          explained[w] = true;
          q.push_back(w);
        }
      }
    }
  }
  // Tarjan's strongly connected components among the unexplained waiting
  // ranks (iterative: a world may be deep), each of two or more a cycle.
  std::vector<std::vector<int>> adj(world);
  for (int r = 0; r < world; ++r) {
    if (explained[r] || !waiting(r)) continue;
    for (int m : info[r].waits_for) {
      if (!explained[m] && waiting(m)) adj[r].push_back(m);
    }
  }
  std::vector<int> index(world, -1), low(world, 0), stack;
  std::vector<bool> on_stack(world, false);
  std::vector<std::pair<int, size_t>> calls_down;
  int next_index = 0;
  auto visit = [&](int v) {
    index[v] = low[v] = next_index++;
    stack.push_back(v);
    on_stack[v] = true;
    calls_down.push_back({v, 0});
  };
  for (int root = 0; root < world; ++root) {
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
      std::vector<std::string> calls;
      for (int x : cycle) {
        calls.push_back(
            absl::StrCat("rank ", x, " in ", CallPhrase(*info[x].pending)));
      }
      sentences.push_back(absl::StrCat(Ranks(cycle), " wait for each other (",
                                       absl::StrJoin(calls, ", "), ")."));
    }
  }

  // No one behind: ranks in calls every member has issued (in progress,
  // or stuck below what the recorder sees), and those waiting on them.
  if (sentences.empty()) {
    std::vector<std::pair<std::string, std::vector<int>>> by_call;
    for (int r = 0; r < world; ++r) {
      if (info[r].pending == nullptr || !info[r].waits_for.empty() ||
          !info[r].group_unknown.empty()) {
        continue;
      }
      const std::string call = CallPhrase(*info[r].pending);
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
  if (sentences.empty()) {
    std::map<std::string, std::vector<int>> by_state;
    for (const RankVerdict& v : out.ranks) by_state[v.state].push_back(v.rank);
    std::vector<std::string> parts;
    for (const auto& [state, ranks] : by_state) {
      parts.push_back(absl::StrCat(Ranks(ranks), " ",
                                   ranks.size() == 1 ? "is " : "are ", state));
    }
    if (world == 0) parts.push_back("no rank is known");
    sentences.push_back(absl::StrCat(
        "no rank is behind another: ", absl::StrJoin(parts, ", "), "."));
  }
  sentences[0] = absl::StrCat("attempt ", facts.attempt, ": ", sentences[0]);
  out.summary = absl::StrJoin(sentences, "\n");
  return out;
}

std::string Diagnosis::Text() const {
  std::string out;
  for (absl::string_view line : absl::StrSplit(summary, '\n')) {
    absl::StrAppend(&out, Wrap(line, kTextWidth), "\n");
  }
  // Over kMaxTableRows ranks: the culprits first, then the ranks waiting on
  // someone, then the rest of the waiting, the others counted.
  std::vector<const RankVerdict*> rows;
  if (ranks.size() <= static_cast<size_t>(kMaxTableRows)) {
    for (const RankVerdict& v : ranks) rows.push_back(&v);
  } else {
    std::set<int> picked;
    const std::set<int> culprit_set(culprits.begin(), culprits.end());
    auto pick = [&](auto&& wanted) {
      for (const RankVerdict& v : ranks) {
        if (picked.size() >= static_cast<size_t>(kMaxTableRows)) return;
        if (!picked.count(v.rank) && wanted(v)) picked.insert(v.rank);
      }
    };
    pick([&](const RankVerdict& v) { return culprit_set.count(v.rank) > 0; });
    pick([](const RankVerdict& v) {
      return v.state != "waiting" && v.state != "running";
    });
    pick([](const RankVerdict& v) { return !v.waits_for.empty(); });
    pick([](const RankVerdict& v) { return v.state == "waiting"; });
    for (int r : picked) rows.push_back(&ranks[r]);
  }
  std::vector<std::vector<std::string>> cells = {
      {"RANK", "NODE", "PID", "STATE", "WHERE"}};
  for (const RankVerdict* v : rows) {
    cells.push_back({absl::StrCat(v->rank), v->host.empty() ? "?" : v->host,
                     v->pid > 0 ? absl::StrCat(v->pid) : "?", v->state,
                     v->where.empty() ? v->detail : v->where});
  }
  std::vector<size_t> width(4, 0);
  for (const auto& row : cells) {
    for (size_t i = 0; i < 4; ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : cells) {
    std::string line;
    for (size_t i = 0; i < 4; ++i) {
      absl::StrAppend(&line, row[i],
                      std::string(width[i] + 2 - row[i].size(), ' '));
    }
    absl::StrAppend(&out, line, row[4], "\n");
  }
  if (rows.size() < ranks.size()) {
    std::map<std::string, int> rest;
    std::set<const RankVerdict*> shown(rows.begin(), rows.end());
    for (const RankVerdict& v : ranks) {
      if (!shown.count(&v)) ++rest[v.state];
    }
    std::vector<std::string> parts;
    for (const auto& [state, n] : rest) {
      parts.push_back(absl::StrCat(n, " ", state));
    }
    absl::StrAppend(&out, "... ", ranks.size() - rows.size(),
                    " more ranks: ", absl::StrJoin(parts, ", "), "\n");
  }
  for (const std::string& d : damaged) {
    absl::StrAppend(&out, "damaged: ", d, "\n");
  }
  return out;
}

json Diagnosis::Json() const {
  json rows = json::array();
  for (const RankVerdict& v : ranks) {
    rows.push_back({{"rank", v.rank},
                    {"host", v.host},
                    {"pid", v.pid},
                    {"state", v.state},
                    {"where", v.where},
                    {"detail", v.detail},
                    {"waits_for", v.waits_for}});
  }
  return {{"attempt", attempt},
          {"culprits", culprits},
          {"summary", summary},
          {"damaged", damaged},
          {"ranks", rows}};
}

namespace {

// mpirun's word on ranks that ended: "mpirun noticed that process rank 5
// with PID 4242 on node b exited on signal 9 (Killed)." Only the end of a
// large log is read: mpirun says so last.
void ReadMpirunExits(const fs::path& path, AttemptFacts& facts) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > static_cast<uintmax_t>(kMaxDumpBytes)) {
    in.seekg(static_cast<std::streamoff>(size - kMaxDumpBytes));
  }
  static constexpr absl::string_view kNoticed =
      "mpirun noticed that process rank ";
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = absl::string_view(line).find(kNoticed);
    if (at == std::string::npos) continue;
    absl::string_view rest =
        absl::string_view(line).substr(at + kNoticed.size());
    const size_t rank_end = rest.find(' ');
    int rank = -1, pid = 0;
    if (rank_end == absl::string_view::npos ||
        !absl::SimpleAtoi(rest.substr(0, rank_end), &rank) || rank < 0 ||
        rank >= kMaxWorldSize) {
      continue;
    }
    rest.remove_prefix(rank_end);
    std::string host;
    if (absl::ConsumePrefix(&rest, " with PID ")) {
      const size_t pid_end = rest.find(' ');
      if (pid_end == absl::string_view::npos ||
          !absl::SimpleAtoi(rest.substr(0, pid_end), &pid)) {
        continue;
      }
      rest.remove_prefix(pid_end);
    }
    if (absl::ConsumePrefix(&rest, " on node ")) {
      const size_t host_end = rest.find(' ');
      if (host_end == absl::string_view::npos) continue;
      host = std::string(rest.substr(0, host_end));
      rest.remove_prefix(host_end);
    }
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, ".");
    if (rest.empty() || facts.exits.count(rank)) continue;
    facts.exits[rank] = std::string(rest);
    if (!host.empty() || pid > 0) facts.exited_processes[rank] = {host, pid};
  }
}

}  // namespace

absl::StatusOr<Diagnosis> DiagnoseAttemptDir(const std::string& attempt_dir,
                                             AttemptFacts facts) {
  const fs::path flight = fs::path(attempt_dir) / "flight";
  std::error_code ec;
  std::vector<std::pair<int, fs::path>> files;
  for (fs::directory_iterator it(flight, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    absl::string_view digits = name;
    int rank = -1;
    // Only the dumps' own names: the writer's temporary files differ.
    if (absl::ConsumePrefix(&digits, "rank-") &&
        absl::ConsumeSuffix(&digits, ".jsonl") && digits.size() >= 5 &&
        std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) &&
        absl::SimpleAtoi(digits, &rank)) {
      files.push_back({rank, it->path()});
    }
  }
  if (files.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no flight recorder dump in ", flight.string(),
                     ec ? absl::StrCat(" (", ec.message(), ")") : ""));
  }
  std::sort(files.begin(), files.end());

  std::map<int, FlightDump> dumps;
  std::vector<std::string> damaged;
  for (const auto& [rank, path] : files) {
    const std::string name = path.filename().string();
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      damaged.push_back(absl::StrCat(name, ": unreadable"));
      continue;
    }
    // Read in pieces up to one byte past the cap, whatever the size the
    // folder listed (the file may be replaced while read).
    std::string text;
    char buffer[1 << 16];
    while (in && static_cast<int64_t>(text.size()) <= kMaxDumpBytes) {
      in.read(buffer, sizeof(buffer));
      text.append(buffer, static_cast<size_t>(in.gcount()));
    }
    if (in.bad()) {
      damaged.push_back(absl::StrCat(name, ": unreadable"));
      continue;
    }
    if (static_cast<int64_t>(text.size()) > kMaxDumpBytes) {
      damaged.push_back(absl::StrCat(name, ": too large (over ",
                                     kMaxDumpBytes >> 20, " MiB)"));
      continue;
    }
    absl::StatusOr<FlightDump> dump = ParseFlightDump(text);
    if (!dump.ok()) {
      damaged.push_back(absl::StrCat(name, ": ", dump.status().message()));
      continue;
    }
    if (dump->rank != rank) {
      damaged.push_back(
          absl::StrCat(name, ": its header says rank ", dump->rank));
      continue;
    }
    dumps[rank] = *std::move(dump);
  }
  if (facts.exits.empty()) {
    ReadMpirunExits(fs::path(attempt_dir) / "stderr.log", facts);
  }
  return Diagnose(facts, dumps, std::move(damaged));
}

}  // namespace ptrain
