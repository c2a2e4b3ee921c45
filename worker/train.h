// A set-up training rank's run: its metrics endpoint advertised to
// ptcoord, the trainer's loop, and how it ends.
#ifndef PTRAIN_WORKER_TRAIN_H_
#define PTRAIN_WORKER_TRAIN_H_

#include "worker/setup.h"

namespace ptrain {

// Trains `rank` (built by SetUpRank, agreed by every rank) to the end of
// the run or to a stop asked for by a signal. Returns ptworker's exit
// code: 0 done, kExitStopped stopped after a step's checkpoint. A failure
// takes the whole job down (MPI_Abort with 2 or 1), since other ranks may
// be inside a collective.
int TrainRank(const RankFlags& flags, Rank* rank);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_TRAIN_H_
