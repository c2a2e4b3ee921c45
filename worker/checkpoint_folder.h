// A standalone run's checkpoint.dir, as ptworker starts: one run at a time
// saves there, and a run that starts fresh beside an earlier run's
// checkpoints says how to go on from them instead.
#ifndef PTRAIN_WORKER_CHECKPOINT_FOLDER_H_
#define PTRAIN_WORKER_CHECKPOINT_FOLDER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/confined_fs.h"

namespace ptrain {

// Takes an exclusive flock(2) on the folder `dir` itself (created when
// missing), held until the returned descriptor is closed (the process
// ends); nothing is written into it. FailedPrecondition when another live
// process holds it, naming that process (from /proc/locks) and the fix:
// two runs saving into one folder would have the second fail at its first
// save, its steps lost. Confined by `fs` (errors name checkpoint.dir).
absl::StatusOr<UniqueFd> HoldCheckpointFolder(const std::string& dir,
                                              const ConfinedFs& fs);

// When `dir` already holds committed checkpoints: "" if it holds none (or
// cannot be listed, which the trainer reports), else a sentence naming the
// newest and whose it is and saying that `--resume-from latest` goes on
// from it; for a run started without --resume-from, which starts fresh.
std::string EarlierCheckpointsNotice(const std::string& dir,
                                     const ConfinedFs& fs);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_CHECKPOINT_FOLDER_H_
