// ptworker --dry-run: what a run of a spec would be, with nothing started
// and nothing written.
#ifndef PTRAIN_WORKER_DRY_RUN_H_
#define PTRAIN_WORKER_DRY_RUN_H_

#include "worker/setup.h"

namespace ptrain {

// Prints, on rank 0 (the others return 0 at once), the effective spec (--config
// with --set applied and the defaults filled in, as YAML), the layout, the
// memory each rank needs (the rank that needs the most) and whether this
// machine's free memory holds the ranks of a run on it alone; reads the data
// (for its vocabulary) and nothing else. Exit code: 0, or 2 for bad input (one
// `ptworker: error:` line).
int DryRun(const RankFlags& flags);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_DRY_RUN_H_
