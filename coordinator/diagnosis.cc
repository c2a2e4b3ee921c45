// Hangs explained (docs/diagnose.md): the ranks of an attempt asked for
// their flight recorder dumps — by ptctl diagnose, and by the supervision
// tick before it ends an attempt as hung — and the dumps analysed
// (flight_analysis.h).
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// The first line of each rank's dump in `attempt_dir`, parsed; a file
// whose first line is not a JSON object is left out.
std::vector<nlohmann::json> DumpHeaders(const std::string& attempt_dir) {
  std::vector<nlohmann::json> out;
  std::error_code ec;
  for (const auto& f :
       fs::directory_iterator(fs::path(attempt_dir) / "flight", ec)) {
    if (f.path().extension() != ".jsonl") continue;
    std::ifstream in(f.path());
    std::string line;
    if (!std::getline(in, line)) continue;
    nlohmann::json h = nlohmann::json::parse(line, nullptr, false);
    if (h.is_object()) out.push_back(std::move(h));
  }
  return out;
}

// Dumps written at or after `since` (answers to a request).
int FreshDumps(const std::string& attempt_dir, absl::Time since) {
  int fresh = 0;
  for (const nlohmann::json& h : DumpHeaders(attempt_dir)) {
    const auto at = h.find("dumped_unix_us");
    if (at != h.end() && at->is_number_integer() &&
        at->get<int64_t>() >= UnixMicros(since)) {
      ++fresh;
    }
  }
  return fresh;
}

// Whether any rank of the attempt dumped for a reason other than its
// start (which only says who it is).
bool HasAnsweredDumps(const std::string& attempt_dir) {
  for (const nlohmann::json& h : DumpHeaders(attempt_dir)) {
    if (h.value("reason", std::string()) != "start") return true;
  }
  return false;
}

// The state letter of a process of this host (/proc/PID/stat), "gone"
// when there is none, "" for another host's.
std::string LocalProcessState(const std::string& host, int pid) {
  if (host != LocalHostName() || pid <= 0) return "";
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

// The analysis made while the attempt was alive (ExplainHang), which
// knew its processes: flight/analysis.{txt,json}.
fs::path StoredAnalysis(const std::string& attempt_dir, const char* ext) {
  return fs::path(attempt_dir) / "flight" / absl::StrCat("analysis.", ext);
}

std::optional<v1::DiagnoseJobResponse> ReadStoredAnalysis(
    const std::string& attempt_dir, int attempt) {
  std::ifstream text(StoredAnalysis(attempt_dir, "txt"));
  std::ifstream json(StoredAnalysis(attempt_dir, "json"));
  if (!text || !json) return std::nullopt;
  std::stringstream t, j;
  t << text.rdbuf();
  j << json.rdbuf();
  v1::DiagnoseJobResponse out;
  out.set_attempt(attempt);
  out.set_text(t.str());
  out.set_json(j.str());
  return out;
}

}  // namespace

AttemptFacts Coordinator::FactsOf(const Entry& e, int attempt,
                                  std::optional<absl::Time> asked,
                                  const std::map<int, absl::Time>* heard,
                                  ProcessStates seen) const {
  AttemptFacts facts;
  facts.attempt = attempt;
  facts.world_size = e.record.job.world_size();
  facts.requested_unix_us = asked.has_value() ? UnixMicros(*asked) : 0;
  facts.now_unix_us = UnixMicros(absl::Now());
  // Once an attempt ended, its pids say nothing (and may be others').
  if (heard != nullptr) {
    // This host's processes from /proc; the others' as their node's
    // daemon saw them.
    facts.process_state = [seen = std::move(seen)](const std::string& host,
                                                   int pid) {
      const std::string local = LocalProcessState(host, pid);
      if (!local.empty()) return local;
      const auto it = seen.find({host, pid});
      return it != seen.end() ? it->second : std::string();
    };
    for (const auto& [rank, at] : *heard) {
      facts.heard_unix_us[rank] = UnixMicros(at);
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
  int n = attempt, world = 0;
  bool live = false;
  std::string dir;
  std::optional<absl::Time> asked;
  AttemptFacts facts;
  {
    absl::MutexLock lock(&mu_);
    Entry* e = Find(id);
    if (e == nullptr) return UnknownJob(id);
    const int latest = e->record.job.attempts();
    if (latest == 0) {
      return absl::NotFoundError(absl::StrCat(id, " has not started yet"));
    }
    if (attempt > latest) {
      return absl::NotFoundError(absl::StrCat(id, " has no attempt ", attempt,
                                              " (latest ", latest, ")"));
    }
    world = e->record.job.world_size();
    auto run = running_.find(id);
    const bool latest_runs = run != running_.end() && run->second.handle;
    if (n == 0) {
      n = latest_runs ? latest : 0;
      for (int k = latest; n == 0 && k >= 1; --k) {
        if (HasAnsweredDumps(AttemptDir(options_.state_dir, id, k))) n = k;
      }
      if (n == 0) {
        absl::StatusOr<std::vector<v1::Attempt>> all = store_->ListAttempts(id);
        if (!all.ok()) return all.status();
        std::vector<std::string> why;
        for (const v1::Attempt& a : *all) {
          why.push_back(NoDumpsBecause(a, latest_runs && a.number() == latest));
        }
        return absl::FailedPreconditionError(
            absl::StrCat(id, " has no flight recorder dumps to analyse: ",
                         absl::StrJoin(why, "; ")));
      }
    }
    dir = AttemptDir(options_.state_dir, id, n);
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
    facts = FactsOf(*e, n, asked, live ? &run->second.heard : nullptr,
                    std::move(seen));
  }
  if (!live) {
    if (auto stored = ReadStoredAnalysis(dir, n)) return *stored;
  }
  if (asked.has_value()) {
    // Off the lock: a stopped rank never answers, the others within
    // moments.
    const absl::Time until = *asked + kDumpWait;
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
  v1::DiagnoseJobResponse out;
  out.set_attempt(n);
  out.set_text(d->Text());
  out.set_json(d->Json().dump());
  return out;
}

bool Coordinator::ExplainHang(Entry& e, Running& run, absl::Time now) {
  if (!run.dump_asked_at.has_value()) {
    run.dump_asked_at = now;
    // Without a way to ask, the start dumps and the SIGTERM ones are all
    // there will be.
    if (run.handle != nullptr &&
        backend_->AskToDump(*run.handle, e.record.job, e.record.attempt_uid,
                            &run.seen)) {
      return false;
    }
  }
  if (now - *run.dump_asked_at < kDumpWait &&
      FreshDumps(run.attempt_dir, *run.dump_asked_at) <
          e.record.job.world_size()) {
    return false;
  }
  // Read under the lock, once per hung attempt: a few files per rank.
  absl::StatusOr<Diagnosis> d = DiagnoseAttemptDir(
      run.attempt_dir, FactsOf(e, e.record.job.attempts(), run.dump_asked_at,
                               &run.heard, run.seen));
  if (d.ok()) {
    run.hang_summary = d->summary;
    // Kept for ptctl diagnose once the processes it saw are gone.
    for (const auto& [ext, text] :
         {std::pair<const char*, std::string>{"txt", d->Text()},
          {"json", d->Json().dump()}}) {
      if (absl::Status s =
              ReplacePrivateFile(StoredAnalysis(run.attempt_dir, ext), text);
          !s.ok()) {
        spdlog::warn("{}: {}", e.record.job.id(), std::string(s.message()));
      }
    }
    CommitEvent(e, absl::StrCat("hang analysis of attempt ",
                                e.record.job.attempts(), ": ", d->summary));
  } else {
    spdlog::warn("{}: no hang analysis: {}", e.record.job.id(),
                 std::string(d.status().message()));
  }
  return true;
}

}  // namespace ptrain
