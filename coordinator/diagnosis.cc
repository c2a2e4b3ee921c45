// Hangs explained (docs/diagnose.md): the ranks of an attempt asked for
// their flight recorder dumps — by ptctl diagnose, and by the supervision
// tick before it ends an attempt as hung — and the dumps analysed
// (flight_analysis.h). The dumps are the ranks' files: they are read off
// the coordinator's lock, each read bounded (bounded_file.h).
#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/job_state.h"
#include "common/net.h"
#include "common/private_file.h"
#include "common/process.h"
#include "common/spec.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "coordinator/flight_analysis.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace fs = std::filesystem;

namespace {

int64_t UnixMicros(absl::Time t) { return absl::ToUnixMicros(t); }

// Dumps written at or after `since` (answers to a request).
int FreshDumps(const std::string& attempt_dir, absl::Time since) {
  int fresh = 0;
  for (const DumpHeader& h : ReadDumpHeaders(attempt_dir)) {
    if (h.dumped_unix_us >= UnixMicros(since)) ++fresh;
  }
  return fresh;
}

// Whether any rank of the attempt dumped for a reason other than its
// start (which only says who it is).
bool HasAnsweredDumps(const std::string& attempt_dir) {
  for (const DumpHeader& h : ReadDumpHeaders(attempt_dir)) {
    if (h.reason != "start") return true;
  }
  return false;
}

// The state letter of a process of this host (/proc/PID/stat), "gone"
// when there is none, "" for another host's.
std::string LocalProcessState(const std::string& host, int pid) {
  if (host != HostName() || pid <= 0) return "";
  return ProcessState(pid);
}

// Why attempt `a` has nothing to analyse.
std::string NoDumpsBecause(const v1::Attempt& a, bool running) {
  if (running) {
    return absl::StrCat("attempt ", a.number(),
                        " is running and its ranks did not answer the request "
                        "for dumps (SIGUSR2)");
  }
  if (a.end() == v1::ATTEMPT_END_SUCCEEDED || a.exit_code() == 0) {
    return absl::StrCat("attempt ", a.number(),
                        " finished cleanly: its ranks never dumped");
  }
  return absl::StrCat(
      "attempt ", a.number(), " ended (exit code ", a.exit_code(),
      ") without dumps: its ranks were not asked (no hang) or could not "
      "answer");
}

// An attempt's error is long (the end of stderr); its first line, cut, is
// enough to say how it ended.
constexpr size_t kMaxEndedErrorBytes = 160;

// How attempt `a` ended, in a few words: "failed, exit code 1: attempt 1
// exited with code 1".
std::string EndedAs(const v1::Attempt* a) {
  if (a == nullptr ||
      (a->finished_unix_ms() == 0 && a->end() == v1::ATTEMPT_END_UNSPECIFIED)) {
    return "its processes are gone; how it ended is not recorded yet";
  }
  std::string out = a->end() == v1::ATTEMPT_END_UNSPECIFIED
                        ? std::string("ended")
                        : EndName(a->end());
  if (a->exit_code() > 0) absl::StrAppend(&out, ", exit code ", a->exit_code());
  // Its first clause: what follows says more than a line holds (the end of
  // stderr, the hang's analysis).
  absl::string_view error = a->error();
  error = error.substr(0, std::min(error.find('\n'), error.find("; ")));
  if (error.size() > kMaxEndedErrorBytes) {
    size_t cut = kMaxEndedErrorBytes;
    // Not inside a UTF-8 character.
    while (cut > 0 && (static_cast<unsigned char>(error[cut]) & 0xC0) == 0x80) {
      --cut;
    }
    absl::StrAppend(&out, ": ", error.substr(0, cut), "\u2026");
  } else if (!error.empty()) {
    absl::StrAppend(&out, ": ", error);
  }
  return out;
}

// The analysis made while the attempt was alive (ExplainHang), which knew
// its processes: flight/analysis.{txt,json}. nullopt when there is none,
// or when it cannot be read (named in `skipped`: the ranks could have
// replaced it by anything).
struct StoredAnalysis {
  std::string text;
  nlohmann::json json;
};
std::optional<StoredAnalysis> ReadStoredAnalysis(
    const std::string& attempt_dir, std::vector<std::string>& skipped) {
  absl::StatusOr<FlightFolder> folder = FlightFolder::Open(attempt_dir);
  if (!folder.ok()) return std::nullopt;
  absl::StatusOr<std::string> text =
      folder->Read("analysis.txt", kMaxDumpBytes);
  absl::StatusOr<std::string> json =
      folder->Read("analysis.json", kMaxDumpBytes);
  constexpr absl::string_view kNotShown =
      ": the analysis made when it was found hung is not shown";
  for (const absl::StatusOr<std::string>* r : {&text, &json}) {
    if (!r->ok() && !absl::IsNotFound(r->status())) {
      skipped.push_back(absl::StrCat(r->status().message(), kNotShown));
    }
  }
  if (!text.ok() || !json.ok()) return std::nullopt;
  StoredAnalysis out{*std::move(text),
                     nlohmann::json::parse(*json, nullptr, false)};
  if (!out.json.is_object()) {
    skipped.push_back(
        absl::StrCat("analysis.json: not a JSON object", kNotShown));
    return std::nullopt;
  }
  return out;
}

// One line of JSON, whatever bytes a string holds (replaced when not
// UTF-8, rather than thrown about: the ranks' files say what they want).
std::string JsonText(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ReplacePrivateFile, in the attempt's flight folder opened without
// following a link there.
void StoreAnalysis(const std::string& attempt_dir, const Diagnosis& d,
                   const std::string& job_id) {
  absl::StatusOr<FlightFolder> folder = FlightFolder::Open(attempt_dir);
  if (!folder.ok()) {
    spdlog::warn("{}: hang analysis not kept: {}", job_id,
                 std::string(folder.status().message()));
    return;
  }
  for (const auto& [name, text] :
       {std::pair<const char*, std::string>{"analysis.txt", d.Text()},
        {"analysis.json", JsonText(d.Json())}}) {
    if (absl::Status s =
            ReplaceFileAt(folder->fd(), folder->path(), name, text, 0600);
        !s.ok()) {
      spdlog::warn("{}: {}", job_id, std::string(s.message()));
    }
  }
}

// The newest of attempts 1..`latest` of job `id` whose ranks answered a
// request for dumps; FailedPrecondition saying why each of `attempts` has
// none otherwise (`latest_runs`: the latest is running).
absl::StatusOr<int> LatestAnsweredAttempt(
    const std::string& state_dir, const std::string& id, int latest,
    bool latest_runs, const std::vector<v1::Attempt>& attempts) {
  for (int k = latest; k >= 1; --k) {
    if (HasAnsweredDumps(AttemptDir(state_dir, id, k))) return k;
  }
  std::vector<std::string> why;
  for (const v1::Attempt& a : attempts) {
    why.push_back(NoDumpsBecause(a, latest_runs && a.number() == latest));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      id,
      " has no flight recorder dumps to analyse: ", absl::StrJoin(why, "; ")));
}

// The answer for ended attempt `n` (folder `dir`) from the analysis kept
// when it was found hung; nullopt when none can be read. Sets how it ended
// in `facts` either way.
std::optional<v1::DiagnoseJobResponse> StoredDiagnosis(
    const std::string& dir, int n, const std::vector<v1::Attempt>& attempts,
    AttemptFacts& facts, std::vector<std::string>& skipped) {
  const v1::Attempt* record = nullptr;
  for (const v1::Attempt& a : attempts) {
    if (a.number() == n) record = &a;
  }
  facts.ended = EndedAs(record);
  std::optional<StoredAnalysis> stored = ReadStoredAnalysis(dir, skipped);
  if (!stored.has_value()) return std::nullopt;
  v1::DiagnoseJobResponse out;
  out.set_attempt(n);
  out.set_text(absl::StrCat("attempt ", n, " ended (", facts.ended,
                            "); when it was found hung:\n", stored->text));
  stored->json["ended"] = facts.ended;
  out.set_json(stored->json.dump());
  return out;
}

// The analysis of attempt `n`'s dumps in `dir`, made once the `world` ranks
// asked at `asked` answered or kDumpWait passed; `skipped` names what was
// not read before.
absl::StatusOr<v1::DiagnoseJobResponse> AnalyseDumps(
    const std::string& id, int n, const std::string& dir, int world,
    std::optional<absl::Time> asked, AttemptFacts facts,
    const std::vector<std::string>& skipped) {
  if (asked.has_value()) {
    // A stopped rank never answers, the others within moments.
    const absl::Time until = *asked + Coordinator::kDumpWait;
    while (FreshDumps(dir, *asked) < world && absl::Now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  facts.now_unix_us = UnixMicros(absl::Now());  // after the wait
  absl::StatusOr<Diagnosis> d = DiagnoseAttemptDir(dir, std::move(facts));
  if (!d.ok()) {
    if (!absl::IsNotFound(d.status())) return d.status();
    return absl::FailedPreconditionError(
        absl::StrCat(id, ": attempt ", n, " has no flight recorder dumps (",
                     d.status().message(), ")"));
  }
  d->damaged.insert(d->damaged.end(), skipped.begin(), skipped.end());
  v1::DiagnoseJobResponse out;
  out.set_attempt(n);
  out.set_text(d->Text());
  out.set_json(JsonText(d->Json()));
  return out;
}

}  // namespace

AttemptFacts Coordinator::FactsOf(const Entry& e, int attempt,
                                  std::optional<absl::Time> asked,
                                  const Running* run,
                                  ProcessStates seen) const {
  AttemptFacts facts;
  facts.attempt = attempt;
  facts.world_size = e.record.job.world_size();
  facts.requested_unix_us = asked.has_value() ? UnixMicros(*asked) : 0;
  facts.now_unix_us = UnixMicros(absl::Now());
  // Once an attempt ended, its pids say nothing (and may be others').
  if (run != nullptr) {
    // This host's processes from /proc; the others' as their node's
    // daemon saw them.
    facts.process_state = [seen = std::move(seen)](const std::string& host,
                                                   int pid) {
      const std::string local = LocalProcessState(host, pid);
      if (!local.empty()) return local;
      const auto it = seen.find({host, pid});
      return it != seen.end() ? it->second : std::string();
    };
    for (const auto& [rank, at] : run->heard) {
      facts.heard_unix_us[rank] = UnixMicros(at);
    }
    for (const auto& [rank, step_at] : run->reported_steps) {
      facts.reported[rank] = {step_at.first, UnixMicros(step_at.second)};
    }
    facts.heartbeat_every_us =
        AliveIntervalMs(e.record.job.spec().restart().hang_timeout_s()) * 1000;
  }
  return facts;
}

absl::StatusOr<v1::DiagnoseJobResponse> Coordinator::Diagnose(
    const std::string& id, int attempt) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  if (attempt < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attempt=", attempt, " < 0"));
  }
  int n = attempt, world = 0, latest = 0;
  bool live = false, latest_runs = false;
  std::optional<absl::Time> asked;
  AttemptFacts facts;
  std::vector<v1::Attempt> attempts;
  {
    absl::MutexLock lock(&mu_);
    Entry* e = Find(id);
    if (e == nullptr) return UnknownJob(id);
    latest = e->record.job.attempts();
    if (latest == 0) {
      return absl::NotFoundError(absl::StrCat(id, " has not started yet"));
    }
    if (attempt > latest) {
      return absl::NotFoundError(absl::StrCat(id, " has no attempt ", attempt,
                                              " (latest ", latest, ")"));
    }
    absl::StatusOr<std::vector<v1::Attempt>> all = store_->ListAttempts(id);
    if (!all.ok()) return all.status();
    attempts = *std::move(all);
    world = e->record.job.world_size();
    auto run = running_.find(id);
    latest_runs = run != running_.end() && run->second.handle &&
                  !run->second.end.has_value();
    if (n == 0 && latest_runs) n = latest;
    // The running attempt answers a request now; an ended one left what
    // it left.
    live = n == latest && latest_runs;
    ProcessStates seen;
    if (live) {
      asked = absl::Now();
      if (!backend_->AskToDump(*run->second.handle, e->record.job,
                               e->record.attempt_uid, &seen)) {
        asked.reset();
      }
    }
    facts =
        FactsOf(*e, n, asked, live ? &run->second : nullptr, std::move(seen));
  }
  // Off the lock from here: the attempts' folders are their ranks' files.
  if (n == 0) {
    absl::StatusOr<int> dumped = LatestAnsweredAttempt(
        options_.state_dir, id, latest, latest_runs, attempts);
    if (!dumped.ok()) return dumped.status();
    n = *dumped;
    facts.attempt = n;
  }
  const std::string dir = AttemptDir(options_.state_dir, id, n);
  std::vector<std::string> skipped;
  if (!live) {
    if (std::optional<v1::DiagnoseJobResponse> stored =
            StoredDiagnosis(dir, n, attempts, facts, skipped)) {
      return *std::move(stored);
    }
  }
  return AnalyseDumps(id, n, dir, world, asked, std::move(facts), skipped);
}

bool Coordinator::ExplainHang(Entry& e, Running& run, absl::Time now) {
  if (!run.dump_asked_at.has_value()) {
    run.dump_asked_at = now;
    run.analysed.reset();
    // Without a way to ask, the start dumps and the SIGTERM ones are all
    // there will be: analysed by the next tick.
    run.dump_ask_failed = run.handle == nullptr ||
                          !backend_->AskToDump(*run.handle, e.record.job,
                                               e.record.attempt_uid, &run.seen);
    return false;
  }
  if (!run.analysed.has_value() || run.analysed->asked != *run.dump_asked_at) {
    return false;
  }
  if (run.analysed->summary.ok()) {
    run.hang_summary = *run.analysed->summary;
    CommitEvent(
        e, absl::StrCat("hang analysis of attempt ", e.record.job.attempts(),
                        ": ", run.hang_summary));
  } else {
    spdlog::warn("{}: no hang analysis: {}", e.record.job.id(),
                 std::string(run.analysed->summary.status().message()));
  }
  return true;
}

void Coordinator::AnalyseHang(AttemptRead& r) {
  const absl::Time now = absl::Now();
  if (!r.ask_failed && now - *r.asked < kDumpWait &&
      FreshDumps(r.dir, *r.asked) < r.facts.world_size) {
    return;  // the ranks have a moment more
  }
  r.facts.now_unix_us = UnixMicros(now);
  absl::StatusOr<Diagnosis> d = DiagnoseAttemptDir(r.dir, r.facts);
  if (!d.ok()) {
    r.analysed = d.status();
    return;
  }
  // Kept for ptctl diagnose once the processes it saw are gone.
  StoreAnalysis(r.dir, *d, r.job_id);
  r.analysed = d->summary;
}

}  // namespace ptrain
