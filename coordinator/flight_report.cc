// How a diagnosis is shown (Diagnosis::Text and Json), and what is read of
// an attempt's folder for one: its dump files (FlightFolder) and mpirun's
// stderr.log, each read bounded, links not followed (bounded_file.h).
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
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
#include "common/bounded_file.h"
#include "coordinator/flight_analysis.h"
#include "coordinator/flight_analysis_internal.h"
#include "nlohmann/json.hpp"

namespace ptrain {

namespace {

namespace fs = std::filesystem;
using flight_internal::kMaxWorldSize;
using nlohmann::json;

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
    absl::StrAppend(&out, "skipped: ", d, "\n");
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
  return {{"attempt", attempt}, {"ended", ended},     {"culprits", culprits},
          {"summary", summary}, {"damaged", damaged}, {"ranks", rows}};
}

namespace {

// Printable ASCII, at most as long as a dump's strings may be.
bool ShortAscii(absl::string_view s) {
  return s.size() <= 256 && std::all_of(s.begin(), s.end(), [](char c) {
           return c >= 0x20 && c < 0x7f;
         });
}

// mpirun's word on ranks that ended: "mpirun noticed that process rank 5
// with PID 4242 on node b exited on signal 9 (Killed)." Only the end of the
// log is read: mpirun says so last. A log that cannot be read is named in
// `skipped` (a missing one is not: a launcher may write none).
void ReadMpirunExits(const std::string& path, AttemptFacts& facts,
                     std::vector<std::string>& skipped) {
  absl::StatusOr<FileTail> tail =
      ReadFileTail("", path, 0, kMaxStderrTailBytes, Symlinks::kRefuse);
  if (!tail.ok()) {
    if (!absl::IsNotFound(tail.status())) {
      absl::string_view why = tail.status().message();
      absl::ConsumePrefix(&why, path);
      skipped.push_back(absl::StrCat("stderr.log", why,
                                     " (mpirun's word on exits not read)"));
    }
    return;
  }
  absl::string_view text = tail->bytes;
  // A window that starts mid-line: that line is cut.
  if (tail->start > 0) {
    const size_t nl = text.find('\n');
    text.remove_prefix(nl == absl::string_view::npos ? text.size() : nl + 1);
  }
  static constexpr absl::string_view kNoticed =
      "mpirun noticed that process rank ";
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t at = line.find(kNoticed);
    if (at == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(at + kNoticed.size());
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
    // mpirun writes short ASCII; anything else in the log is a rank's.
    if (rest.empty() || facts.exits.count(rank) || !ShortAscii(rest) ||
        !ShortAscii(host)) {
      continue;
    }
    facts.exits[rank] = std::string(rest);
    if (!host.empty() || pid > 0) facts.exited_processes[rank] = {host, pid};
  }
}

}  // namespace

absl::StatusOr<FlightFolder> FlightFolder::Open(
    const std::string& attempt_dir) {
  const std::string path = (fs::path(attempt_dir) / "flight").string();
  // Not followed when a link: the folder is the ranks' to write.
  UniqueFd fd(
      ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    return absl::NotFoundError(absl::StrCat(
        "no flight recorder dump in ", path, " (",
        err == ELOOP || err == ENOTDIR ? "not a folder: a symbolic link?"
                                       : std::strerror(err),
        ")"));
  }
  // The listing reads its own descriptor: closedir closes it.
  DIR* d = ::fdopendir(::dup(fd.get()));
  if (d == nullptr) {
    return absl::NotFoundError(absl::StrCat("no flight recorder dump in ", path,
                                            " (", std::strerror(errno), ")"));
  }
  FlightFolder out(path, std::move(fd));
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    absl::string_view digits = name;
    int rank = -1;
    // Only the dumps' own names: the writer's temporary files differ.
    if (absl::ConsumePrefix(&digits, "rank-") &&
        absl::ConsumeSuffix(&digits, ".jsonl") && digits.size() >= 5 &&
        std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) &&
        absl::SimpleAtoi(digits, &rank)) {
      out.dumps_.push_back({rank, name});
    }
  }
  ::closedir(d);
  std::sort(out.dumps_.begin(), out.dumps_.end());
  return out;
}

absl::StatusOr<std::string> FlightFolder::Read(const std::string& name,
                                               size_t max_bytes) const {
  absl::StatusOr<BoundedFile> f =
      BoundedFile::Open("", name, Symlinks::kRefuse, fd_.get());
  if (!f.ok()) return f.status();
  if (f->size() > static_cast<int64_t>(max_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": too large (over ", max_bytes >> 20, " MiB)"));
  }
  return f->ReadAll(max_bytes);
}

absl::StatusOr<std::string> FlightFolder::FirstLine(
    const std::string& name) const {
  return ReadFirstLine("", name, kMaxDumpLineBytes, Symlinks::kRefuse,
                       fd_.get());
}

std::vector<DumpHeader> ReadDumpHeaders(const std::string& attempt_dir) {
  std::vector<DumpHeader> out;
  absl::StatusOr<FlightFolder> folder = FlightFolder::Open(attempt_dir);
  if (!folder.ok()) return out;
  for (const auto& [rank, name] : folder->dumps()) {
    absl::StatusOr<std::string> line = folder->FirstLine(name);
    if (!line.ok()) continue;
    const json h = json::parse(*line, nullptr, /*allow_exceptions=*/false);
    if (!h.is_object()) continue;
    DumpHeader d;
    d.rank = rank;
    if (auto it = h.find("reason"); it != h.end() && it->is_string()) {
      d.reason = it->get<std::string>();
    }
    if (auto it = h.find("dumped_unix_us");
        it != h.end() && it->is_number_integer()) {
      d.dumped_unix_us = it->get<int64_t>();
    }
    out.push_back(std::move(d));
  }
  return out;
}

absl::StatusOr<Diagnosis> DiagnoseAttemptDir(const std::string& attempt_dir,
                                             AttemptFacts facts) {
  absl::StatusOr<FlightFolder> folder = FlightFolder::Open(attempt_dir);
  if (!folder.ok()) return folder.status();
  if (folder->dumps().empty()) {
    return absl::NotFoundError(
        absl::StrCat("no flight recorder dump in ", folder->path()));
  }
  std::map<int, FlightDump> dumps;
  std::vector<std::string> damaged;
  for (const auto& [rank, name] : folder->dumps()) {
    absl::StatusOr<std::string> text = folder->Read(name, kMaxDumpBytes);
    if (!text.ok()) {
      damaged.push_back(std::string(text.status().message()));
      continue;
    }
    absl::StatusOr<FlightDump> dump = ParseFlightDump(*text);
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
    ReadMpirunExits((fs::path(attempt_dir) / "stderr.log").string(), facts,
                    damaged);
  }
  return Diagnose(facts, dumps, std::move(damaged));
}

}  // namespace ptrain
