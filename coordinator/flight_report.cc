// How a diagnosis is shown (Diagnosis::Text and Json), and DiagnoseAttemptDir:
// an attempt's dump files and mpirun's stderr.log read into one.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "coordinator/flight_analysis.h"
#include "coordinator/flight_analysis_internal.h"
#include "nlohmann/json.hpp"

namespace ptrain {

namespace {

namespace fs = std::filesystem;
using flight_internal::kMaxWorldSize;
using nlohmann::json;

// Bigger dump files are refused unread: a ring of 2048 entries is well under
// 1 MiB, so 64 MiB is damage, not a big job.
constexpr int64_t kMaxDumpBytes = int64_t{64} << 20;
constexpr int kMaxTableRows = 32;
constexpr int kTextWidth = 80;

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
