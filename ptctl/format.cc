// See format.h.
#include "ptctl/format.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_state.h"
#include "common/spec.h"

namespace ptrain::ptctl {

std::string EndWords(const v1::Attempt& a) {
  if (a.finished_unix_ms() == 0) return "running";
  if (a.end() == v1::ATTEMPT_END_UNSPECIFIED) {
    // Ended under a ptcoord that did not record why.
    return a.error().empty() ? "" : "failed";
  }
  std::string words = EndName(a.end());
  std::replace(words.begin(), words.end(), '_', ' ');
  return words;
}

std::string Figure(bool measured, double value, int decimals) {
  return measured ? absl::StrFormat("%.*f", decimals, value) : "—";
}

bool HasSteps(const v1::Progress& p) { return p.step() > 0; }

std::string PadLeft(const std::string& text, size_t width) {
  size_t columns = 0;
  for (unsigned char c : text) columns += (c & 0xC0) != 0x80;
  return std::string(width > columns ? width - columns : 0, ' ') + text;
}

std::string Ending(const v1::Job& job) {
  if (job.cancel_requested() && !IsFinal(job.state())) return "cancelling";
  if (job.pause_requested()) return "pausing";
  return "";
}

std::string FiguresNote(const v1::Job& job) {
  const v1::Progress& p = job.progress();
  std::string note;
  if (job.state() == v1::JOB_STATE_SUCCEEDED && p.step() < p.total_steps()) {
    note = absl::StrCat("incomplete: the newest saved are of step ", p.step(),
                        "; the reports after it were lost");
  }
  if (p.unsaved_reports() > 0) {
    absl::StrAppend(&note, note.empty() ? "" : "; ", p.unsaved_reports(),
                    " progress report", p.unsaved_reports() == 1 ? "" : "s",
                    " could not be saved (the state disk was full): the loss "
                    "history lacks ",
                    p.unsaved_reports() == 1 ? "its point" : "their points");
  }
  return note;
}

std::string Ago(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const int64_t s = std::max<int64_t>(0, (now - unix_ms) / 1000);
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  return absl::StrCat(s / 3600, "h");
}

std::string Duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600)
    return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

void PrintJobsTable(const std::vector<v1::Job>& jobs) {
  std::printf("%-10s %-24s %-12s %-11s %8s %13s %9s %8s\n", "ID", "NAME",
              "OWNER", "STATE", "ATTEMPTS", "STEP", "LOSS", "AGE");
  for (const v1::Job& j : jobs) {
    const auto& p = j.progress();
    std::printf("%-10s %-24s %-12s %-11s %8d %13s %s %8s\n", j.id().c_str(),
                j.name().c_str(), j.owner().empty() ? "-" : j.owner().c_str(),
                StateName(j.state()).c_str(), j.attempts(),
                absl::StrCat(p.step(), "/", p.total_steps()).c_str(),
                PadLeft(Figure(HasSteps(p), p.loss()), 9).c_str(),
                Ago(j.created_unix_ms()).c_str());
  }
}

void PrintQueueTable(const std::vector<v1::Job>& jobs) {
  std::printf("%3s %-10s %-12s %-13s %5s %8s  %s\n", "#", "ID", "OWNER",
              "PRIORITY", "SLOTS", "WAITING", "WHY");
  for (const v1::Job& j : jobs) {
    std::printf("%3d %-10s %-12s %-13s %5d %8s  %s\n", j.queue_position(),
                j.id().c_str(), j.owner().empty() ? "-" : j.owner().c_str(),
                PriorityWords(j.priority()).c_str(), j.world_size(),
                Ago(j.created_unix_ms()).c_str(),
                j.waiting().empty() ? "starting" : j.waiting().c_str());
  }
}

const char* NodeStateName(v1::NodeState s) {
  switch (s) {
    case v1::NODE_STATE_UP:
      return "UP";
    case v1::NODE_STATE_DOWN:
      return "DOWN";
    default:
      return "?";
  }
}

}  // namespace ptrain::ptctl
