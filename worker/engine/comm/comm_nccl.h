// A Communicator for ranks that each have their own GPU: collectives on GPU
// memory go through NCCL, on a communication stream beside the backend's
// (kernels/backends.h: DeviceCollectives), each after the kernels
// issued before it; a blocking one makes the backend's later kernels wait
// for it, an async one runs beside them until its handle is waited for
// (the backend's stream then waits; the host never does), so the data-
// parallel reductions overlap the backward as on the CPU. Point-to-point
// transfers of GPU memory are staged through the host
// and MPI (comm_staged.h): on one stream, a receive posted early would hold
// back the kernels of the pass before it. Host buffers (norms, losses,
// flags) go to MPI directly. Each NCCL operation's GPU time is recorded
// into the group's CommStats once it has finished (the stats lag the GPU
// by the operations still in flight).
#ifndef PTRAIN_WORKER_ENGINE_COMM_COMM_NCCL_H_
#define PTRAIN_WORKER_ENGINE_COMM_COMM_NCCL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/engine/comm/comm.h"
#include "worker/engine/comm/flight_recorder.h"

namespace ptrain {

// Collective over `inner` (every rank calls it; rank 0's NCCL id reaches
// the others through it). `inner` and `ops` (a CUDA backend) are not owned
// and must outlive the result, as `recorder` (may be null), which records
// each NCCL operation (queued until it is seen finished). An error on every
// rank where NCCL cannot start on any.
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(
    Communicator* inner, kernels::Ops* ops, FlightRecorder* recorder);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_COMM_COMM_NCCL_H_
