// What the files of the Coordinator class (coordinator.h) share among
// themselves; not an interface of ptcoord's.
#ifndef PTRAIN_COORDINATOR_COORDINATOR_INTERNAL_H_
#define PTRAIN_COORDINATOR_COORDINATOR_INTERNAL_H_

#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/echo.h"
#include "coordinator/launcher.h"
#include "coordinator/store.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

// What every lookup of a job id answers when there is no such job.
inline absl::Status UnknownJob(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("no job ", EchoQuoted(id)));
}

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

// How the processes of the job's running attempt are found.
inline AttemptKey KeyOf(const JobRecord& r) {
  return AttemptKey{r.attempt_uid, r.token_sha256};
}

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_COORDINATOR_INTERNAL_H_
