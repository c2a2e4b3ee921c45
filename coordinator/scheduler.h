// FIFO gang scheduling over a pool of identical slots: a job starts only when
// all of its dp*tp*pp slots are free at once. Pure logic, no clock, no I/O.
#ifndef PTRAIN_COORDINATOR_SCHEDULER_H_
#define PTRAIN_COORDINATOR_SCHEDULER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ptrain {

struct QueuedJob {
  std::string id;
  int slots = 1;
};

class Scheduler {
 public:
  explicit Scheduler(int total_slots) : total_slots_(total_slots) {}

  int total_slots() const { return total_slots_; }

  // A job that can never fit is refused at submit rather than queued forever.
  absl::Status CheckFits(int slots) const;

  // The jobs to start now, in queue order, given `used_slots` already taken.
  // Strict FIFO: the first job that does not fit blocks every job behind it
  // (no backfill), so a big job cannot be starved by a stream of small ones.
  std::vector<std::string> Pick(const std::vector<QueuedJob>& queue,
                                int used_slots) const;

 private:
  const int total_slots_;
};

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_SCHEDULER_H_
