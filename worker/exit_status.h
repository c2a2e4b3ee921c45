// How ptworker's failures become its exit codes: 2 (kExitBadInput) for
// what the user can fix (spec, data, flags, layout, a damaged or foreign
// checkpoint, a model that does not fit in memory), 1 for the rest, with
// one error line on stderr from the lowest failing rank.
#ifndef PTRAIN_WORKER_EXIT_STATUS_H_
#define PTRAIN_WORKER_EXIT_STATUS_H_

#include "absl/status/status.h"

namespace ptrain {

// Whether the failure `s` is bad input (exit 2) rather than a runtime
// failure (exit 1).
bool IsInputError(const absl::Status& s);

// This process's rank in MPI_COMM_WORLD (MPI is initialised).
int WorldRank();

// Every rank learns whether any rank failed setup, so that all leave
// together; the lowest failing rank prints its error. Returns the exit code
// (0: every rank is set up). Collective over MPI_COMM_WORLD.
int AgreeOnSetup(const absl::Status& status);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_EXIT_STATUS_H_
