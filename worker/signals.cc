// ptworker's stop signals; see signals.h.
#include "worker/signals.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "common/thread_entry.h"
#include "spdlog/spdlog.h"

namespace ptrain {
namespace {

std::atomic<bool> g_stop_requested{false};
std::atomic<bool> g_training{false};
std::atomic<int> g_world_rank{0};
// The thread of WaitForStopSignals, once started.
pthread_t g_waiter;
std::mutex g_dump_mu;
std::function<void(const char*)> g_dump;  // guarded by g_dump_mu

void Dump(const char* reason) {
  std::lock_guard<std::mutex> lock(g_dump_mu);
  if (g_dump) g_dump(reason);
}

// SIGUSR1, SIGUSR2, SIGINT and SIGTERM are blocked in every thread ptrain
// starts (set before any is created, so all inherit it; a thread a library
// started earlier passes them on: ForwardToWaiter) and taken by this one
// alone with sigwait: no thread of MPI, OpenMP or the allocator is
// interrupted by them for long, and this one can write files whatever the
// others are stuck in. Ctrl-C then saves the step being trained, like SIGUSR1;
// a second Ctrl-C (or ptcoord's cancel reaching a rank both directly and
// through mpirun) does not wait for that save.
void WaitForStopSignals(sigset_t signals) {
  bool interrupted = false;
  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGUSR1) {
      g_stop_requested.store(true);
      continue;
    }
    if (sig == SIGUSR2) {
      Dump("SIGUSR2");
      continue;
    }
    // A launcher tearing the job down after another rank died sends this:
    // the rank's view of the end is kept before anything else.
    if (sig == SIGTERM && !interrupted) Dump("SIGTERM");
    if (interrupted || !g_training.load()) std::_Exit(128 + sig);
    interrupted = true;
    g_stop_requested.store(true);
    if (g_world_rank.load() == 0) {
      const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
      spdlog::warn(
          "{}: stopping after this step and its checkpoint (exit 3); {} "
          "again exits at once",
          name, name);
    }
  }
}

// A stop signal that reached a thread started before HandleStopSignals
// (one a library starts as it loads, sized by the CPUs the process may
// use: none when a rank is bound to one core, one or more when it has
// several) would otherwise take its default action and end the rank. It
// goes on to the waiting thread, which blocks it, so it stays pending
// there for sigwait. (pthread_kill is one tgkill call: safe here.)
void ForwardToWaiter(int sig) {
  const int saved = errno;
  pthread_kill(g_waiter, sig);
  errno = saved;
}

}  // namespace

void HandleStopSignals() {
  // SIGUSR1 asks for a checkpoint and a stop (the trainer looks at the flag
  // after every step); from the start, as it would end the rank otherwise.
  // SIGINT and SIGTERM too, while training (WaitForStopSignals).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGUSR1);
  sigaddset(&stop_signals, SIGUSR2);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::thread waiter(ThreadEntry(
      "stop-signals", [stop_signals] { WaitForStopSignals(stop_signals); }));
  g_waiter = waiter.native_handle();
  waiter.detach();
  struct sigaction forward = {};
  forward.sa_handler = ForwardToWaiter;
  forward.sa_flags = SA_RESTART;
  sigfillset(&forward.sa_mask);
  for (int sig : {SIGUSR1, SIGUSR2, SIGINT, SIGTERM}) {
    sigaction(sig, &forward, nullptr);
  }
}

const std::atomic<bool>* StopRequested() { return &g_stop_requested; }

void RequestStop() { g_stop_requested.store(true); }

void SetTraining(bool training) { g_training.store(training); }

void SetSignalRank(int world_rank) { g_world_rank.store(world_rank); }

void DumpFlightRecorder(const char* reason) { Dump(reason); }

void SetFlightDump(std::function<void(const char* reason)> dump) {
  std::lock_guard<std::mutex> lock(g_dump_mu);
  g_dump = std::move(dump);
}

}  // namespace ptrain
