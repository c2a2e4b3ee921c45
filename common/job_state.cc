// See job_state.h.
#include "common/job_state.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace ptrain {

namespace {

std::string WithoutPrefix(std::string name, absl::string_view prefix) {
  return absl::StartsWith(name, prefix) ? name.substr(prefix.size()) : name;
}

}  // namespace

bool IsFinal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED ||
         s == v1::JOB_STATE_CANCELLED;
}

std::string StateName(v1::JobState s) {
  return WithoutPrefix(v1::JobState_Name(s), "JOB_STATE_");
}

std::string LowerStateName(v1::JobState s) {
  return absl::AsciiStrToLower(StateName(s));
}

std::vector<std::string> LowerStateNames() {
  std::vector<std::string> out;
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (v1::JobState_IsValid(s) && s != v1::JOB_STATE_UNSPECIFIED) {
      out.push_back(LowerStateName(static_cast<v1::JobState>(s)));
    }
  }
  return out;
}

std::optional<v1::JobState> StateOfLowerName(const std::string& name) {
  v1::JobState s = v1::JOB_STATE_UNSPECIFIED;
  if (name != absl::AsciiStrToLower(name) ||
      !v1::JobState_Parse("JOB_STATE_" + absl::AsciiStrToUpper(name), &s) ||
      s == v1::JOB_STATE_UNSPECIFIED) {
    return std::nullopt;
  }
  return s;
}

std::string EndName(v1::AttemptEnd end) {
  return absl::AsciiStrToLower(
      WithoutPrefix(v1::AttemptEnd_Name(end), "ATTEMPT_END_"));
}

}  // namespace ptrain
