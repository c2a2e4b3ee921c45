// A Communicator for a backend whose memory the host cannot read (a GPU),
// over one that communicates host memory (MPI): buffers in the backend's
// memory are copied to the host, communicated, and copied back; host
// buffers pass straight through. It is how ranks that share a GPU (where
// NCCL refuses to run) train every layout on it. Time is recorded by the
// inner communicator, so the metrics show the MPI part, not the copies.
//
// The copy to the host waits for every op the backend has issued (its
// stream), so a buffer is communicated only once it is final; the copy back
// happens when the operation completes (the blocking call, or Wait / a
// successful Test of its handle).
#ifndef PTRAIN_WORKER_ENGINE_COMM_COMM_STAGED_H_
#define PTRAIN_WORKER_ENGINE_COMM_COMM_STAGED_H_

#include <memory>

#include "kernels/ops.h"
#include "worker/engine/comm/comm.h"

namespace ptrain {

// `inner` and `ops` are not owned and must outlive the result.
std::unique_ptr<Communicator> MakeStagedCommunicator(Communicator* inner,
                                                     kernels::Ops* ops);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_COMM_COMM_STAGED_H_
