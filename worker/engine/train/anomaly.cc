// See anomaly.h.
#include "worker/engine/train/anomaly.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ptrain {

namespace {

// A spike is measured against a median of at least this many losses: the
// first steps of a run fall fast and would look like nothing.
constexpr size_t kMinWindow = 10;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

AnomalyGuard::Verdict AnomalyGuard::Check(int64_t step, double loss,
                                          double grad_norm) {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    const bool bad_loss = !std::isfinite(loss);
    return {"nan",
            absl::StrCat(bad_loss ? "loss " : "gradient norm ",
                         bad_loss ? loss : grad_norm, " at step ", step)};
  }
  const size_t window = static_cast<size_t>(spec_.window());
  if (spec_.spike_factor() > 0 &&
      window_.size() >= std::min(window, kMinWindow)) {
    const double median = Median({window_.begin(), window_.end()});
    if (loss > spec_.spike_factor() * median) {
      return {"spike",
              absl::StrFormat("loss %.6g at step %d is above "
                              "train.anomaly.spike_factor=%g x %.6g, the "
                              "median of the last %d steps",
                              loss, step, spec_.spike_factor(), median,
                              window_.size())};
    }
  }
  window_.push_back(loss);
  while (window_.size() > window) window_.pop_front();
  return {};
}

void CheckpointLineage::Add(int64_t step, const std::string& dir) {
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const auto& e) { return e.second == dir; }),
                 entries_.end());
  const auto at =
      std::upper_bound(entries_.begin(), entries_.end(), step,
                       [](int64_t s, const auto& e) { return s < e.first; });
  entries_.insert(at, {step, dir});
}

std::vector<std::string> CheckpointLineage::At(int64_t step) const {
  std::vector<std::string> out;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->first <= step) out.push_back(it->second);
  }
  return out;
}

void CheckpointLineage::DropAfter(int64_t step) {
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const auto& e) { return e.first > step; }),
                 entries_.end());
}

}  // namespace ptrain
