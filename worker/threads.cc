// A rank's share of its machine and its OpenMP threads; see threads.h.
#include "worker/threads.h"

#include <mpi.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ptrain {
namespace {

struct ThreadChoice {
  int threads = 1;
  std::string warning;  // "" unless the machine gets more threads than cores
};

// OpenMP threads per rank: `per_rank` (resources.threads_per_rank) when set,
// else OMP_NUM_THREADS when set, else the rank's share of the cores. More
// threads than cores make OpenMP's threads wait for each other in every
// parallel region: the run is then often 10 to 100 times slower, so such a
// count is named in a warning.
ThreadChoice ChooseThreads(int per_rank, const NodeShare& node) {
  const char* env = std::getenv("OMP_NUM_THREADS");
  const bool from_env = per_rank <= 0 && env != nullptr && *env != '\0';
  ThreadChoice c;
  const int fair = std::max(1, node.cores / node.ranks);
  c.threads = per_rank > 0 ? per_rank
              : from_env   ? omp_get_max_threads()
                           : std::min(node.rank_cores, fair);
  const std::string given = per_rank > 0
                                ? "resources.threads_per_rank"
                                : (from_env ? "OMP_NUM_THREADS" : "default");
  const int64_t total = int64_t{c.threads} * node.ranks;
  if (c.threads == 1 && node.ranks > node.cores) {
    // No thread count helps: there are more ranks than cores, and ranks
    // that busy-wait for messages starve the one they wait for.
    const char* yield = std::getenv("OMPI_MCA_mpi_yield_when_idle");
    if (yield == nullptr || std::string(yield) != "1") {
      c.warning = absl::StrCat(
          "threads: ", node.ranks, " ranks on this machine's ", node.cores,
          " cores: set OMPI_MCA_mpi_yield_when_idle=1, so that ranks waiting "
          "for a message yield their core");
    }
  } else if (total > node.cores) {
    c.warning = absl::StrCat(
        "threads: ", node.ranks, " rank(s) on this machine x ", c.threads,
        " threads each (", given, ") = ", total, " threads on ", node.cores,
        " cores: oversubscribed, often 10-100x slower; set OMP_NUM_THREADS=",
        fair, " (or resources.threads_per_rank: ", fair, ")");
  } else if (c.threads > node.rank_cores) {
    c.warning = absl::StrCat(
        "threads: ", c.threads, " threads (", given, ") on the ",
        node.rank_cores,
        " cores this rank is bound to: oversubscribed, often 10-100x slower; "
        "set OMP_NUM_THREADS=",
        node.rank_cores, " or bind the ranks to more cores");
  }
  return c;
}

}  // namespace

NodeShare ShareOfNode() {
  NodeShare share;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) {
    for (long c = 0; c < sysconf(_SC_NPROCESSORS_ONLN) && c < CPU_SETSIZE;
         ++c) {
      CPU_SET(c, &mine);
    }
  }
  share.rank_cores = share.cores = std::max(1, CPU_COUNT(&mine));
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return share;  // a tool that runs without MPI
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0,
                          MPI_INFO_NULL, &node) != MPI_SUCCESS) {
    return share;
  }
  MPI_Comm_size(node, &share.ranks);
  MPI_Comm_rank(node, &share.local_rank);
  // The union of the ranks' CPU sets: bound one core each, two ranks still
  // have two cores between them.
  cpu_set_t all;
  CPU_ZERO(&all);
  MPI_Allreduce(&mine, &all, sizeof(cpu_set_t), MPI_BYTE, MPI_BOR, node);
  share.cores = std::max(1, CPU_COUNT(&all));
  MPI_Comm_free(&node);
  return share;
}

// Applies ChooseThreads; the first rank of each machine warns for it.
void SetThreads(int per_rank, const NodeShare& node) {
  const ThreadChoice c = ChooseThreads(per_rank, node);
  omp_set_num_threads(c.threads);
  if (!c.warning.empty() && node.local_rank == 0) spdlog::warn("{}", c.warning);
}

}  // namespace ptrain
