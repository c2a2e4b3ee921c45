// Fuzzes the flight recorder dump parser (ParseFlightDump,
// coordinator/flight_analysis.h) and the analysis of what it accepts
// (Diagnose, its Text and Json): the dumps are files the ranks write, and
// ptcoord reads them. Not the reading of the folder, not the RPC. Input:
// dumps separated by NUL bytes, then the facts (taken from the end).
// Whatever the bytes, a dump is accepted obeying docs/diagnose.md's rules or
// refused naming its line; the analysis names every rank once, and its text
// and JSON are made without an exception (else abort).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/flight_analysis.h"

namespace {

using ptrain::AttemptFacts;
using ptrain::FlightDump;

void Require(bool property) {
  if (!property) std::abort();
}

// One line of printable text: what a verdict or a message may hold.
bool OneLine(const std::string& s) {
  return std::none_of(s.begin(), s.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
}

void CheckDump(const FlightDump& d) {
  Require(d.world_size >= 1 && d.rank >= 0 && d.rank < d.world_size);
  Require(d.capacity >= 1 && d.recorded >= 0);
  Require(d.entries.size() <= static_cast<size_t>(d.capacity));
  Require(OneLine(d.host) && !d.host.empty() && OneLine(d.phase));
  for (const auto& [name, members] : d.groups) {
    Require(!members.empty());
    for (int m : members) Require(m >= 0 && m < d.world_size);
  }
  uint64_t previous = 0;
  for (const ptrain::FlightEntry& e : d.entries) {
    Require(e.id > previous && e.id <= static_cast<uint64_t>(d.recorded));
    previous = e.id;
    if (e.mark) continue;
    Require(e.bytes >= 0 && e.seq >= 1);
    Require(e.state == "queued" || e.state == "started" ||
            e.state == "completed");
    Require((e.end_us != 0) <= (e.state == "completed"));
    const bool p2p = e.op == "send" || e.op == "recv";
    Require(p2p ? e.peer >= 0 && e.peer < d.world_size : e.peer == -1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  // Times near one moment, as a real attempt's are: that of the dumps of
  // the seed corpus (fuzz/corpus/flight_dump/, a tp2·pp2 job's).
  constexpr int64_t kNow = int64_t{1795931500} * 1000000;
  constexpr int64_t kHour = int64_t{3600} * 1000000;
  AttemptFacts facts;
  facts.attempt = in.ConsumeIntegralInRange<int>(1, 9);
  int world = in.ConsumeIntegralInRange<int>(0, 8);  // 0: the dumps say
  facts.requested_unix_us =
      in.ConsumeBool() ? 0
                       : kNow + in.ConsumeIntegralInRange<int64_t>(-kHour, 0);
  facts.now_unix_us = in.ConsumeBool()
                          ? 0
                          : kNow + in.ConsumeIntegralInRange<int64_t>(0, kHour);
  if (in.ConsumeBool()) facts.ended = "failed, exit code 1";
  facts.heartbeat_every_us = in.ConsumeIntegralInRange<int64_t>(0, kHour);
  for (int i = in.ConsumeIntegralInRange<int>(0, 3); i > 0; --i) {
    const int r = in.ConsumeIntegralInRange<int>(0, 9);
    const int64_t at = kNow + in.ConsumeIntegralInRange<int64_t>(-kHour, 0);
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
      case 0:
        facts.exits[r] = "exited on signal 9 (Killed)";
        facts.exited_processes[r] = {"node", 4242};
        break;
      case 1:
        facts.heard_unix_us[r] = at;
        break;
      default:
        facts.reported[r] = {in.ConsumeIntegralInRange<int64_t>(0, 1000), at};
        break;
    }
  }
  const uint8_t states = in.ConsumeIntegral<uint8_t>();
  facts.process_state = [states](const std::string&, int pid) {
    static const char* const kStates[] = {"R", "S", "D",    "T",
                                          "t", "Z", "gone", ""};
    return std::string(kStates[(states + pid) % 8]);
  };

  const std::string rest = in.ConsumeRemainingBytesAsString();
  std::map<int, FlightDump> dumps;
  std::vector<std::string> damaged;
  int k = 0;
  for (absl::string_view text : absl::StrSplit(rest, '\0')) {
    if (text.empty()) continue;
    if (++k > 8) break;
    absl::StatusOr<FlightDump> d = ptrain::ParseFlightDump(text);
    if (!d.ok()) {
      const std::string message(d.status().message());
      Require(d.status().code() == absl::StatusCode::kInvalidArgument);
      Require(absl::StartsWith(message, "line ") && OneLine(message));
      damaged.push_back(absl::StrCat("rank-0000", k, ".jsonl: ", message));
      continue;
    }
    CheckDump(*d);
    // The analysis holds a world's ranks in memory: a dump's world_size
    // alone (up to 2^20) would make each run slow, not find more.
    if (world == 0 && d->world_size > 64) world = 8;
    dumps[d->rank] = *std::move(d);
  }
  facts.world_size = world;

  const ptrain::Diagnosis diagnosis =
      ptrain::Diagnose(facts, dumps, std::move(damaged));
  const size_t n = diagnosis.ranks.size();
  for (size_t r = 0; r < n; ++r) {
    Require(diagnosis.ranks[r].rank == static_cast<int>(r));
    Require(!diagnosis.ranks[r].state.empty());
    Require(OneLine(diagnosis.ranks[r].where) &&
            OneLine(diagnosis.ranks[r].detail));
  }
  Require(std::is_sorted(diagnosis.culprits.begin(), diagnosis.culprits.end()));
  Require(std::set<int>(diagnosis.culprits.begin(), diagnosis.culprits.end())
              .size() == diagnosis.culprits.size());
  for (int c : diagnosis.culprits) {
    Require(c >= 0 && static_cast<size_t>(c) < n);
    const std::string& s = diagnosis.ranks[c].state;
    Require(s != "running" && s != "ended" && s != "waiting");
  }
  Require(absl::StartsWith(diagnosis.summary,
                           absl::StrCat("attempt ", facts.attempt)));
  Require(!diagnosis.Text().empty());
  // Throws (and so aborts) on a string that is not UTF-8.
  Require(!diagnosis.Json().dump().empty());
  return 0;
}
