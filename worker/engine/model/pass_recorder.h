// Training's passes recorded once per shape and replayed as one unit each
// (Ops::Capture; on a GPU a CUDA graph, one launch for the hundreds of a
// pass): GptStage's StageOptions::graphs. A pass is known by its key (the
// slot, shape, direction, dloss and receive buffer its host code decided
// on); its first run goes op by op (sizing the backend's buffers, which a
// recording must not allocate), its second is recorded and replayed, later
// ones replay. Where a capture fails the pass runs op by op, with a warning.
#ifndef PTRAIN_WORKER_ENGINE_MODEL_PASS_RECORDER_H_
#define PTRAIN_WORKER_ENGINE_MODEL_PASS_RECORDER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/ops.h"

namespace ptrain {

class PassRecorder {
 public:
  // What a pass's host code decided: the slot, the shape, which pass, the
  // dloss it computes with and the one its forward folded into the logits,
  // and where its input from another stage is (the previous stage's
  // output, or the next one's gradient; null for none).
  struct Key {
    int slot = 0, B = 0, T = 0;
    bool backward = false;
    float dloss = 0.0f, forward_dloss = 0.0f;
    const float* received = nullptr;
    bool operator==(const Key& o) const {
      return slot == o.slot && B == o.B && T == o.T && backward == o.backward &&
             dloss == o.dloss && forward_dloss == o.forward_dloss &&
             received == o.received;
    }
  };
  // Passes recorded (captures), passes run as a replay (the recording one
  // included), and captures that failed (their passes then run op by op).
  struct Counts {
    int64_t captured = 0, replayed = 0, failed = 0;
  };

  // Runs `pass` (whose inputs are in place) on `ops` as the replay of its
  // recording, recording it at its second run.
  void Run(const Key& key, kernels::Ops& ops,
           const std::function<void()>& pass);
  Counts counts() const { return counts_; }

 private:
  struct Graph {
    Key key;
    int64_t runs = 0;  // op by op since it was last (re)made
    bool failed = false;
    std::unique_ptr<kernels::OpsGraph> graph;
  };
  // At most this many keys (past them a key run once and never recorded
  // makes room; else the pass runs op by op).
  static constexpr int kMaxGraphs = 64;
  // The key's graph, or room for it; null when there is none.
  Graph* Find(const Key& key);

  std::vector<Graph> graphs_;
  Counts counts_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_PASS_RECORDER_H_
