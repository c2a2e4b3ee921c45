#include "worker/engine/data/blend.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"
#include "worker/engine/model/rng.h"

namespace ptrain {

uint64_t ShuffledIndex(uint64_t x, uint64_t n, uint64_t key) {
  PT_CHECK(x < n && n < (uint64_t{1} << 62), "ShuffledIndex out of range");
  // A balanced Feistel network over [0, 4^h) ⊇ [0, n), a permutation for
  // any round function; values past n walk on until they land inside
  // (fewer than four steps on average: 4^h < 4n).
  int h = 1;
  while ((uint64_t{1} << (2 * h)) < n) ++h;
  const uint64_t mask = (uint64_t{1} << h) - 1;
  do {
    uint64_t left = x >> h, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = CounterRandom64(key, round, right) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << h) | right;
  } while (x >= n);
  return x;
}

BlendSampler::BlendSampler(const TokenData* data, int T, int global_batch,
                           uint64_t seed)
    : data_(data), T_(T), global_batch_(global_batch), seed_(seed) {
  PT_CHECK(!data->blend.empty(), "BlendSampler without data.blend");
  for (const BlendPart& part : data->blend) {
    keys_.push_back(StableHash("blend/" + part.name));
    std::vector<int64_t> starts = {0};
    for (size_t k = part.train_begin; k < part.train_end; ++k) {
      const auto n = static_cast<int64_t>(data->train[k].size());
      starts.push_back(starts.back() + (n > T ? (n - 1) / T : 0));
    }
    PT_CHECK(starts.back() > 0, "a blend source holds no window (validated)");
    window_starts_.push_back(std::move(starts));
  }
  taken_.assign(data->blend.size(), 0);
}

int BlendSampler::Choose(int64_t s, const std::vector<int64_t>& taken) const {
  int best = 0;
  double most = -std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < taken.size(); ++k) {
    // One rounding (fma), so the choice is the same on every machine.
    const double below =
        std::fma(data_->blend[k].weight, static_cast<double>(s + 1),
                 -static_cast<double>(taken[k]));
    if (below > most) {
      most = below;
      best = static_cast<int>(k);
    }
  }
  return best;
}

void BlendSampler::CountTo(int64_t n) const {
  if (n < counted_) {
    counted_ = 0;
    std::fill(taken_.begin(), taken_.end(), 0);
  }
  for (; counted_ < n; ++counted_) ++taken_[Choose(counted_, taken_)];
}

BlendSampler::Draw BlendSampler::At(int64_t s) const {
  std::lock_guard<std::mutex> lock(mu_);
  CountTo(s);
  Draw d;
  d.source = Choose(s, taken_);
  const int64_t j = taken_[d.source];
  const int64_t w = windows(d.source);
  d.epoch = j / w;
  d.window = static_cast<int64_t>(ShuffledIndex(
      static_cast<uint64_t>(j % w), static_cast<uint64_t>(w),
      CounterRandom64(seed_, keys_[d.source], static_cast<uint64_t>(d.epoch))));
  return d;
}

std::vector<int64_t> BlendSampler::EpochsBegun(int64_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  CountTo(n);
  std::vector<int64_t> begun(taken_.size());
  for (size_t k = 0; k < taken_.size(); ++k) {
    const int64_t w = windows(static_cast<int>(k));
    begun[k] = taken_[k] == 0 ? 0 : (taken_[k] - 1) / w + 1;
  }
  return begun;
}

void BlendSampler::Fill(int64_t b, int first, int count, int32_t* inputs,
                        int32_t* targets) const {
  for (int i = 0; i < count; ++i) {
    const Draw d = At(b * global_batch_ + first + i);
    const std::vector<int64_t>& starts = window_starts_[d.source];
    // The shard k of the source with starts[k] <= window < starts[k + 1].
    const size_t k = std::upper_bound(starts.begin(), starts.end(), d.window) -
                     starts.begin() - 1;
    const TokenStream& shard =
        data_->train[data_->blend[d.source].train_begin + k];
    shard.CopyWindow(static_cast<size_t>(d.window - starts[k]) * T_, T_,
                     inputs + static_cast<int64_t>(i) * T_,
                     targets + static_cast<int64_t>(i) * T_);
  }
}

}  // namespace ptrain
