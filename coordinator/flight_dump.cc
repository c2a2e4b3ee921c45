// Parsing of one flight recorder dump (ParseFlightDump in flight_analysis.h):
// the header and entry lines with the rules of docs/diagnose.md.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "coordinator/flight_analysis.h"
#include "coordinator/flight_analysis_internal.h"
#include "nlohmann/json.hpp"

namespace ptrain {

namespace {

using flight_internal::IsP2pOp;
using flight_internal::kMaxWorldSize;
using nlohmann::json;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
// Strings of a dump end up in one-screen text: short and printable.
constexpr size_t kMaxStringBytes = 256;

bool IsCollectiveOp(absl::string_view op) {
  return op == "all_reduce" || op == "reduce_scatter" || op == "all_gather" ||
         op == "broadcast" || op == "barrier";
}
bool IsState(absl::string_view s) {
  return s == "queued" || s == "started" || s == "completed";
}

// A key of the dump's as an error message shows it: one short line of
// ASCII, whatever the key holds (a line break, half a UTF-8 character once
// cut, a megabyte).
std::string ShownKey(const std::string& key) {
  constexpr size_t kShown = 64;
  const bool plain = key.size() <= kShown &&
                     std::all_of(key.begin(), key.end(),
                                 [](char c) { return c >= 0x20 && c < 0x7f; });
  if (plain) return key;
  return absl::StrCat(absl::CHexEscape(key.substr(0, kShown)),
                      key.size() > kShown ? "..." : "");
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
          f.Fail(absl::StrCat("coords.", ShownKey(name),
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
        const std::string shown = ShownKey(name);
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
            f.Fail(absl::StrCat(
                "groups.", shown, " holds ",
                m.is_number() ? m.dump() : absl::StrCat("a ", m.type_name()),
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

}  // namespace ptrain
