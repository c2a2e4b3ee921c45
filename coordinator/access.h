// Who may do what: one rule for every JobService RPC and every route of the
// web UI, in one table (access.cc), and the check of a caller against a
// rule. The gRPC edge (service.cc) and the UI (ui_server.cc) look their
// requests up here; tests/integration/multi_user_test.cc walks every RPC of
// the proto against it with every role. Users and roles are users.h's.
#ifndef PTRAIN_COORDINATOR_ACCESS_H_
#define PTRAIN_COORDINATOR_ACCESS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "coordinator/users.h"

namespace ptrain {

enum class Access {
  kRead,    // any role: viewer, member, admin
  kSubmit,  // member or admin
  kOwnJob,  // an admin, or the member who owns the job
  kAdmin,   // admin only
};

struct AccessRule {
  // A JobService method ("CancelJob") or a UI route ("GET /api/v1/jobs").
  absl::string_view name;
  Access access;
  // Changes state: written to the audit log, refusals included.
  bool audited;
};

// Every rule, JobService's methods first, then the UI's routes.
absl::Span<const AccessRule> AccessRules();

// The rule named `name`; null when the table has none (a request without a
// rule is refused: PermissionDenied).
const AccessRule* FindAccessRule(absl::string_view name);

// Whether `caller` may do what `rule` covers; for kOwnJob, on job `job_id`
// owned by `owner` ("" for a job submitted before owners were recorded: an
// admin's alone). PermissionDenied naming the rule, the role it needs, and
// for another user's job its owner.
absl::Status Authorize(const Caller& caller, const AccessRule& rule,
                       absl::string_view job_id = "",
                       absl::string_view owner = "");

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_ACCESS_H_
