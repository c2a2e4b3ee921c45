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

std::string EndName(v1::AttemptEnd end) {
  return absl::AsciiStrToLower(
      WithoutPrefix(v1::AttemptEnd_Name(end), "ATTEMPT_END_"));
}

}  // namespace ptrain
