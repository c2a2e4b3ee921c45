// The queue's policy; see queue_policy.h.
#include "coordinator/queue_policy.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduler.h"

namespace ptrain {

std::optional<double> EtaSeconds(const v1::Job& job) {
  const v1::Progress& p = job.progress();
  const double tokens_per_step =
      static_cast<double>(job.spec().train().global_batch()) *
      job.spec().model().block_size();
  const int64_t left = job.spec().train().steps() - p.step();
  if (job.state() != v1::JOB_STATE_RUNNING || p.tok_per_s() <= 0 ||
      tokens_per_step <= 0 || left < 0) {
    return std::nullopt;
  }
  return static_cast<double>(left) * tokens_per_step / p.tok_per_s();
}

namespace {

// 2^(-t / half_life).
double Halving(absl::Duration t, absl::Duration half_life) {
  return std::exp2(-absl::FDivDuration(t, half_life));
}

}  // namespace

void FairShare::Charge(const std::string& user, double slots, absl::Time from,
                       absl::Time to) {
  if (to <= from || slots <= 0) return;
  Decayed& d = usage_[user];
  if (d.at == absl::Time()) d.at = to;
  // Everything as of the later of `to` and what is recorded: the span's
  // slot-seconds, each decayed from when it was used (the integral of
  // slots · 2^(-(at - t)/h) over [from, to]).
  const absl::Time at = std::max(d.at, to);
  const double h_s = absl::ToDoubleSeconds(half_life_);
  const double span =
      slots * h_s / std::log(2.0) *
      (Halving(at - to, half_life_) - Halving(at - from, half_life_));
  d.value = d.value * Halving(at - d.at, half_life_) + span;
  d.at = at;
}

double FairShare::Usage(const std::string& user, absl::Time now) const {
  auto it = usage_.find(user);
  if (it == usage_.end()) return 0;
  const absl::Duration age =
      std::max(absl::ZeroDuration(), now - it->second.at);
  return it->second.value * Halving(age, half_life_);
}

Holding HoldingOf(const v1::Job& job) {
  return Holding{job.world_size(), OnGpus(job.spec()) ? job.world_size() : 0,
                 1};
}

bool StartsBefore(const QueueKey& a, const QueueKey& b) {
  return std::make_tuple(-a.priority, a.usage, a.seq) <
         std::make_tuple(-b.priority, b.usage, b.seq);
}

std::string QuotaReason(const std::string& user, const Quota& q,
                        const Holding& held, const Holding& need) {
  const auto over = [&](int limit, int used, int wants, const char* what) {
    if (limit <= 0 || used + wants <= limit) return std::string();
    return absl::StrCat("user ", user, " at quota: ", used, "/", limit, " ",
                        what);
  };
  for (const std::string& why :
       {over(q.running_jobs, held.jobs, 1, "running jobs"),
        over(q.slots, held.slots, need.slots, "slots"),
        over(q.gpus, held.gpus, need.gpus, "GPUs")}) {
    if (!why.empty()) return why;
  }
  return "";
}

std::string NeverFitsQuota(const std::string& user, const Quota& q,
                           const Holding& need) {
  if (q.slots > 0 && need.slots > q.slots) {
    return absl::StrCat("the job needs ", need.slots, " slots and user ", user,
                        "'s quota is ", q.slots,
                        ": it could never run (users file, quota.slots)");
  }
  if (q.gpus > 0 && need.gpus > q.gpus) {
    return absl::StrCat("the job needs ", need.gpus, " GPUs and user ", user,
                        "'s quota is ", q.gpus,
                        ": it could never run (users file, quota.gpus)");
  }
  return "";
}

bool BackfillKeepsHeadStart(
    const std::vector<RunningJob>& running,
    const std::function<bool(const std::set<std::string>& gone,
                             bool with_candidate)>& head_fits) {
  std::vector<const RunningJob*> known;
  for (const RunningJob& r : running) {
    if (r.eta_s.has_value()) known.push_back(&r);
  }
  std::stable_sort(known.begin(), known.end(),
                   [](const RunningJob* a, const RunningJob* b) {
                     return *a->eta_s < *b->eta_s;
                   });
  std::set<std::string> gone;
  for (size_t i = 0; i < known.size(); ++i) {
    gone.insert(known[i]->id);
    // Jobs ending at the same moment end together.
    if (i + 1 < known.size() && *known[i + 1]->eta_s == *known[i]->eta_s) {
      continue;
    }
    if (head_fits(gone, false)) return head_fits(gone, true);
  }
  return false;
}

std::vector<std::string> PickVictims(
    const std::vector<RunningJob>& running, int priority,
    const std::function<bool(const std::set<std::string>& victims)>& fits,
    int max_tries) {
  std::vector<const RunningJob*> c;
  for (const RunningJob& r : running) {
    if (r.preemptible && r.priority < priority) c.push_back(&r);
  }
  std::stable_sort(c.begin(), c.end(),
                   [](const RunningJob* a, const RunningJob* b) {
                     return a->priority < b->priority;
                   });
  const int n = static_cast<int>(c.size());
  int tries = 0;
  for (int k = 1; k <= n; ++k) {
    // Every set of k, in the order of their sorted indices; the best is
    // the one of the lowest highest priority, then the lowest sum.
    std::vector<int> idx(k);
    for (int i = 0; i < k; ++i) idx[i] = i;
    std::optional<std::tuple<int, int64_t>> best_key;
    std::set<std::string> best;
    for (;;) {
      std::set<std::string> ids;
      int top = 0;
      int64_t sum = 0;
      for (int i : idx) {
        ids.insert(c[i]->id);
        top = std::max(top, c[i]->priority);
        sum += c[i]->priority;
      }
      const std::tuple<int, int64_t> key{top, sum};
      if ((!best_key.has_value() || key < *best_key) && ++tries <= max_tries &&
          fits(ids)) {
        best_key = key;
        best = ids;
      }
      if (tries > max_tries) break;
      // The next combination.
      int i = k - 1;
      while (i >= 0 && idx[i] == n - k + i) --i;
      if (i < 0) break;
      ++idx[i];
      for (int j = i + 1; j < k; ++j) idx[j] = idx[j - 1] + 1;
    }
    if (best_key.has_value()) return {best.begin(), best.end()};
    if (tries > max_tries) break;
  }
  return {};
}

}  // namespace ptrain
