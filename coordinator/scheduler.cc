// FIFO gang scheduler; see scheduler.h. Placement on nodes is not modelled
// yet: on one machine every slot is equivalent.
#include "coordinator/scheduler.h"

#include "absl/strings/str_cat.h"

namespace ptrain {

absl::Status Scheduler::CheckFits(int slots) const {
  if (slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job needs at least one slot, got ", slots));
  }
  if (slots > total_slots_) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.dp*tp*pp=", slots, " slots exceeds the pool of ",
                     total_slots_, " slots (--local-slots)"));
  }
  return absl::OkStatus();
}

std::vector<std::string> Scheduler::Pick(const std::vector<QueuedJob>& queue,
                                         int used_slots) const {
  std::vector<std::string> start;
  int free_slots = total_slots_ - used_slots;
  for (const QueuedJob& job : queue) {
    if (job.slots > free_slots) break;
    free_slots -= job.slots;
    start.push_back(job.id);
  }
  return start;
}

}  // namespace ptrain
