// The MPI implementation of Communicator.
#ifndef PTRAIN_WORKER_ENGINE_COMM_COMM_MPI_H_
#define PTRAIN_WORKER_ENGINE_COMM_COMM_MPI_H_

#include <mpi.h>

#include <memory>
#include <string>

#include "worker/engine/comm/comm.h"
#include "worker/engine/comm/flight_recorder.h"

namespace ptrain {

// Wraps a duplicate of `comm` (collective: every rank of `comm` calls it),
// with MPI errors returned and reported as aborts naming the call. Records
// into `stats` under `group`, and each call into `recorder` (when given).
std::unique_ptr<Communicator> MakeMpiCommunicator(
    MPI_Comm comm, std::string group, std::shared_ptr<CommStats> stats,
    std::shared_ptr<FlightRecorder> recorder = nullptr);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_COMM_COMM_MPI_H_
