// ptworker's signals. SIGUSR1 (which mpirun forwards to every rank), or a
// first SIGINT or SIGTERM while training, asks the trainer to stop at the
// end of the step, after that step's checkpoint (exit 3); a second SIGINT
// or SIGTERM, or the first outside training, exits at once with 128 + the
// signal. SIGUSR2 (forwarded by mpirun too), and a first SIGTERM before
// anything else, dump the flight recorder (docs/diagnose.md). Not a
// general signal facility: these four only.
#ifndef PTRAIN_WORKER_SIGNALS_H_
#define PTRAIN_WORKER_SIGNALS_H_

#include <atomic>
#include <functional>

namespace ptrain {

// Blocks SIGUSR1, SIGUSR2, SIGINT and SIGTERM in the calling thread and takes
// them on a thread of its own. Call first in main, before MPI, OpenMP or
// anything else starts a thread: threads inherit the blocked set, so none
// of theirs is ever interrupted by these signals.
void HandleStopSignals();

// Set by SIGUSR1, or a first SIGINT/SIGTERM while training: save at the
// end of this step and stop (TrainerOptions::stop_requested).
const std::atomic<bool>* StopRequested();

// Asks for that stop as SIGUSR1 does, from any thread (the rank has lost
// its coordinator: ProgressReporter::OnCoordinatorLost).
void RequestStop();

// Whether the training loop runs: only then can a stop save anything, so
// outside it (setup, export, sample) SIGINT and SIGTERM end at once.
void SetTraining(bool training);

// This process's rank in MPI_COMM_WORLD: only rank 0 says what it does
// about a signal (mpirun passes one to all).
void SetSignalRank(int world_rank);

// What SIGUSR2 and a first SIGTERM run, on the signal thread (while the
// others may be stuck anywhere); reason "SIGUSR2" or "SIGTERM". Empty: none.
// Thread-safe; a dump running when it is replaced finishes first.
void SetFlightDump(std::function<void(const char* reason)> dump);
// Runs it now, on this thread (nothing when none is set).
void DumpFlightRecorder(const char* reason);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_SIGNALS_H_
