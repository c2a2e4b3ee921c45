// The training sequences of a blend (data.blend): which source each one
// comes from and which of that source's windows, a pure function of
// (train.seed, the sequence's index in the run), so the same on every
// layout and after any resume.
//
// Source: sequence s (the i-th of batch b: s = b·global_batch + i) comes
// from the source furthest below its share, the largest
// weight·(s+1) − sequences taken before s (the first on a tie): after any n
// sequences each source has taken its share of them to within one.
//
// Window: a source's W windows are the T+1 tokens at every T-th position
// of each of its shards (a shard of n tokens holds ⌊(n−1)/T⌋; a window
// never spans two shards). Its j-th sequence is window π(j mod W) of epoch
// e = ⌊j/W⌋, π a permutation of the W windows drawn from (seed, the
// source's name, e): each epoch sees every window once, in an order the
// files' order does not show through; a source that runs out begins its
// next epoch in a new order. No index is built: π is computed (a Feistel
// network over the windows), so the corpus is never read ahead.
#ifndef PTRAIN_WORKER_ENGINE_DATA_BLEND_H_
#define PTRAIN_WORKER_ENGINE_DATA_BLEND_H_

#include <cstdint>
#include <mutex>
#include <vector>

#include "worker/engine/data/data.h"

namespace ptrain {

// A permutation of [0, n) drawn from `key`: x's place. n < 2^62.
uint64_t ShuffledIndex(uint64_t x, uint64_t n, uint64_t key);

class BlendSampler {
 public:
  // `data` (with data->blend set) is not owned and outlives the sampler.
  BlendSampler(const TokenData* data, int T, int global_batch, uint64_t seed);

  // Where sequence s of the run comes from.
  struct Draw {
    int source = 0;
    int64_t epoch = 0;   // from 0
    int64_t window = 0;  // of the source's windows, in shard order
  };
  Draw At(int64_t s) const;

  // inputs and targets are (count,T): sequences [first, first+count) of
  // batch b; targets are inputs shifted by one token.
  void Fill(int64_t b, int first, int count, int32_t* inputs,
            int32_t* targets) const;

  // The epochs each source has begun within the first n sequences of the
  // run (0 before its first sequence; 2 once it has run out once).
  std::vector<int64_t> EpochsBegun(int64_t n) const;
  // A source's windows (W above).
  int64_t windows(int source) const { return window_starts_[source].back(); }

 private:
  // The source of sequence s given what each took of the s before it.
  int Choose(int64_t s, const std::vector<int64_t>& taken) const;
  // taken_ brought to the first n sequences (from 0 when n is behind it).
  void CountTo(int64_t n) const;

  const TokenData* data_;
  const int T_, global_batch_;
  const uint64_t seed_;
  std::vector<uint64_t> keys_;  // per source: StableHash of its name
  // Per source: the windows in its shards before shard k (k from 0, one
  // more entry than shards).
  std::vector<std::vector<int64_t>> window_starts_;
  // What the sources took of the first counted_ sequences: the choices
  // replayed once as the run goes forward (from 0 after a step back).
  mutable std::mutex mu_;
  mutable int64_t counted_ = 0;
  mutable std::vector<int64_t> taken_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_DATA_BLEND_H_
