// ptworker's exit codes; see exit_status.h.
#include "worker/exit_status.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/exit_codes.h"

namespace ptrain {

bool IsInputError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kFailedPrecondition:  // checkpoint does not fit
    case absl::StatusCode::kDataLoss:            // checkpoint is damaged
    case absl::StatusCode::kResourceExhausted:   // does not fit in memory
      return true;
    default:
      return false;
  }
}

int WorldRank() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {  // a tool that runs without MPI (prepare)
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
      if (const char* rank = std::getenv(name)) return std::atoi(rank);
    }
    return 0;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int AgreeOnSetup(const absl::Status& status) {
  const int mine = status.ok() ? 1 << 30 : WorldRank();
  int first_failed = 0;
  MPI_Allreduce(&mine, &first_failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first_failed == 1 << 30) return 0;
  if (first_failed == WorldRank()) {
    std::fprintf(stderr, "ptworker: error: %s\n",
                 std::string(status.message()).c_str());
  }
  return status.ok() || IsInputError(status) ? kExitBadInput : 1;
}

}  // namespace ptrain
