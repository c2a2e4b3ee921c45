// The authorization table and its check; see access.h.
#include "coordinator/access.h"

#include "absl/strings/str_cat.h"

namespace ptrain {

namespace {

constexpr AccessRule kRules[] = {
    // JobService (coordinator.proto), in its order.
    {"SubmitJob", Access::kSubmit, true},
    {"GetJob", Access::kRead, false},
    {"ListJobs", Access::kRead, false},
    {"CancelJob", Access::kOwnJob, true},
    {"PauseJob", Access::kOwnJob, true},
    {"ResumeJob", Access::kOwnJob, true},
    {"ExtendJob", Access::kOwnJob, true},
    {"WatchJob", Access::kRead, false},
    {"StreamLogs", Access::kRead, false},
    {"ListCheckpoints", Access::kRead, false},
    // Asks a running job's ranks for dumps: an action on the job.
    {"DiagnoseJob", Access::kOwnJob, true},
    {"ListNodes", Access::kRead, false},
    {"DrainNode", Access::kAdmin, true},
    {"ForgetNode", Access::kAdmin, true},
    {"ApproveNode", Access::kAdmin, true},
    {"DeleteJob", Access::kOwnJob, true},
    {"ListEvents", Access::kRead, false},
    {"WhoAmI", Access::kRead, false},
    {"SetJobPriority", Access::kOwnJob, true},
    {"ListQueue", Access::kRead, false},
    // The web UI (ui_server.cc): read-only pages and their JSON.
    {"GET /", Access::kRead, false},
    {"GET /nodes", Access::kRead, false},
    {"GET /jobs/ID", Access::kRead, false},
    {"GET /static/*", Access::kRead, false},
    {"GET /api/v1/jobs", Access::kRead, false},
    {"GET /api/v1/jobs/ID", Access::kRead, false},
    {"GET /api/v1/jobs/ID/metrics", Access::kRead, false},
    {"GET /api/v1/jobs/ID/log", Access::kRead, false},
    {"GET /api/v1/nodes", Access::kRead, false},
};

Role Needed(Access a) {
  switch (a) {
    case Access::kRead:
      return Role::kViewer;
    case Access::kSubmit:
    case Access::kOwnJob:
      return Role::kMember;
    case Access::kAdmin:
      return Role::kAdmin;
  }
  return Role::kAdmin;
}

}  // namespace

absl::Span<const AccessRule> AccessRules() { return kRules; }

const AccessRule* FindAccessRule(absl::string_view name) {
  for (const AccessRule& r : kRules) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

absl::Status Authorize(const Caller& caller, const AccessRule& rule,
                       absl::string_view job_id, absl::string_view owner) {
  const Role needed = Needed(rule.access);
  if (caller.role < needed) {
    return absl::PermissionDeniedError(
        absl::StrCat(rule.name, " needs role ", RoleName(needed), " or above; ",
                     caller.user, " is a ", RoleName(caller.role)));
  }
  if (rule.access == Access::kOwnJob && caller.role != Role::kAdmin &&
      owner != caller.user) {
    return absl::PermissionDeniedError(absl::StrCat(
        rule.name, " on job ", job_id, ", which ",
        owner.empty() ? "has no recorded owner"
                      : absl::StrCat("belongs to ", owner),
        ", needs role admin; ", caller.user, " is a ", RoleName(caller.role)));
  }
  return absl::OkStatus();
}

}  // namespace ptrain
