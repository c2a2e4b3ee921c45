// A rank's share of its machine (the ranks on it and the cores they may
// run on) and the OpenMP thread count it takes from it.
#ifndef PTRAIN_WORKER_THREADS_H_
#define PTRAIN_WORKER_THREADS_H_

namespace ptrain {

// This rank's machine as its ranks share it.
struct NodeShare {
  int ranks = 1;       // ranks of MPI_COMM_WORLD on it: they share its memory
  int local_rank = 0;  // this rank's index among them
  int cores = 1;       // CPUs any of them may run on
  int rank_cores = 1;  // CPUs this rank may run on (mpirun may bind it)
};

// Collective over MPI_COMM_WORLD: every rank calls it, before anything can
// fail.
NodeShare ShareOfNode();

// Sets the OpenMP threads of this rank: `per_rank`
// (resources.threads_per_rank) when set, else OMP_NUM_THREADS when set,
// else the rank's share of the cores. A count that puts more threads on
// the machine than it has cores is warned about, by the first rank of each
// machine.
void SetThreads(int per_rank, const NodeShare& node);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_THREADS_H_
