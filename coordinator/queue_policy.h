// The queue's policy, as plain logic over what the scheduler knows (no
// clock of its own, no I/O; whether a job fits is asked of a callback that
// places it): the order waiting jobs start in (priority, then fair share,
// then submission), per-user quotas, EASY backfill that never delays the
// job at the head of the queue, and the running jobs a blocked job of higher
// priority preempts. Coordinator::Schedule (scheduling.cc) applies it;
// docs/users.md describes it to users.
#ifndef PTRAIN_COORDINATOR_QUEUE_POLICY_H_
#define PTRAIN_COORDINATOR_QUEUE_POLICY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/users.h"
#include "ptrain/v1/coordinator.pb.h"

namespace ptrain {

// Seconds until a running job trains its last step, at the speed it last
// reported (steps left × tokens a step ÷ tok/s); nullopt before it reported
// a speed, or when it is not running.
std::optional<double> EtaSeconds(const v1::Job& job);

// Each user's usage (slot-seconds) decayed by half every `half_life`, as
// Slurm's fair-share factor: among waiting jobs of one priority, the user
// of the smallest usage goes first. Not thread-safe.
class FairShare {
 public:
  explicit FairShare(absl::Duration half_life) : half_life_(half_life) {}
  // `user` held `slots` from `from` to `to` (an attempt, or a tick of one).
  void Charge(const std::string& user, double slots, absl::Time from,
              absl::Time to);
  // `user`'s usage decayed to `now`; 0 for a user never charged.
  double Usage(const std::string& user, absl::Time now) const;
  absl::Duration half_life() const { return half_life_; }

 private:
  struct Decayed {
    double value = 0;  // as of `at`
    absl::Time at;
  };
  const absl::Duration half_life_;
  std::map<std::string, Decayed> usage_;
};

// Where a waiting job stands: the queue starts the highest priority first,
// then, within a priority, the user of the smallest decayed usage, then the
// earliest submitted.
struct QueueKey {
  int priority = 0;
  double usage = 0;
  int64_t seq = 0;
};
bool StartsBefore(const QueueKey& a, const QueueKey& b);

// What a user's running jobs hold, or what a job needs.
struct Holding {
  int slots = 0;
  int gpus = 0;
  int jobs = 0;
  Holding& operator+=(const Holding& o) {
    slots += o.slots;
    gpus += o.gpus;
    jobs += o.jobs;
    return *this;
  }
};

// What one running `job` holds: its ranks' slots, as many GPUs for a GPU
// job, and one job.
Holding HoldingOf(const v1::Job& job);

// Why a job needing `need` waits for its owner `user`'s quota `q` while the
// user's running jobs hold `held` ("user alice at quota: 8/8 slots"); ""
// when it is within the quota.
std::string QuotaReason(const std::string& user, const Quota& q,
                        const Holding& held, const Holding& need);

// Why a job needing `need` can never run under quota `q` (more slots or
// GPUs than the quota allows at once); "" when it can.
std::string NeverFitsQuota(const std::string& user, const Quota& q,
                           const Holding& need);

// A running job, as backfill and preemption see it.
struct RunningJob {
  std::string id;
  int priority = 0;
  // Seconds until it ends: EtaSeconds, 0 for one being stopped; nullopt
  // when unknown (it is then taken to run on forever).
  std::optional<double> eta_s;
  bool preemptible = true;
};

// EASY backfill: whether a job may start now in front of the blocked head
// of the queue. `head_fits(gone, with_candidate)` says whether the head
// fits once the running jobs `gone` have ended, with the candidate running
// too or not. The head's planned start is when enough running jobs of known
// end (soonest first) have ended for it to fit; the candidate may start when
// the head still fits then beside it, however long the candidate runs. No
// planned start (the jobs it waits for have no known end): no backfill.
bool BackfillKeepsHeadStart(
    const std::vector<RunningJob>& running,
    const std::function<bool(const std::set<std::string>& gone,
                             bool with_candidate)>& head_fits);

// The running jobs a blocked job of priority `priority` preempts: the
// fewest preemptible ones of lower priority whose ending lets it fit
// (`fits(victims)`), and among as few, those of the lowest priorities. At
// most `max_tries` sets are tried. Empty when none does.
std::vector<std::string> PickVictims(
    const std::vector<RunningJob>& running, int priority,
    const std::function<bool(const std::set<std::string>& victims)>& fits,
    int max_tries = 4096);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_QUEUE_POLICY_H_
