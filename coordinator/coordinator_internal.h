// What the files of the Coordinator class (coordinator.h) share among
// themselves; not an interface of ptcoord's.
#ifndef PTRAIN_COORDINATOR_COORDINATOR_INTERNAL_H_
#define PTRAIN_COORDINATOR_COORDINATOR_INTERNAL_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/echo.h"
#include "coordinator/coordinator.h"
#include "coordinator/flight_analysis.h"
#include "coordinator/launcher.h"
#include "coordinator/reports.h"
#include "coordinator/store.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

// What every lookup of a job id answers when there is no such job.
inline absl::Status UnknownJob(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("no job ", EchoQuoted(id)));
}

// " by USER" for a job event of an action a user asked for; "" for none.
inline std::string By(const std::string& user) {
  return user.empty() ? "" : absl::StrCat(" by ", user);
}

// The users of JobService as `o` names them (CoordinatorOptions.users_file,
// token_file, user_tokens): what Users::Create and each reload read.
std::function<absl::StatusOr<UserTable>()> UsersLoader(
    const CoordinatorOptions& o);

// Waiting to be scheduled.
inline bool IsWaiting(v1::JobState s) {
  return s == v1::JOB_STATE_QUEUED || s == v1::JOB_STATE_RESTARTING;
}

// STATE/jobs/ID/attempt-N.
inline std::string AttemptDir(const std::string& state_dir,
                              const std::string& id, int n) {
  return (std::filesystem::path(state_dir) / "jobs" / id /
          absl::StrCat("attempt-", n))
      .string();
}

// One attempt's files a supervision tick reads off the lock
// (Coordinator::AttemptReadsDue, ReadAttempt, TakeAttemptReads): what it
// needs, gathered under the lock, and what it found.
struct Coordinator::AttemptRead {
  std::string job_id;
  int attempt = 0;
  std::string dir;

  // A hang being explained: the request for dumps, and what the analysis
  // knows beside them. Analysed once every rank answered, kDumpWait passed
  // or there was no way to ask; else `analysed` stays empty.
  std::optional<absl::Time> asked;
  bool ask_failed = false;
  AttemptFacts facts;
  std::optional<absl::StatusOr<std::string>> analysed;

  // An ended attempt: its run log read with this context, and stderr.log.
  bool ended = false;
  ReportContext context;
  int64_t known_step = -1;
  std::optional<Running::Left> left;
};

// How the processes of the job's running attempt are found.
inline AttemptKey KeyOf(const JobRecord& r) {
  return AttemptKey{r.attempt_uid, r.token_sha256};
}

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_COORDINATOR_INTERNAL_H_
