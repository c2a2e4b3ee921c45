#include "worker/engine/model/pass_recorder.h"

#include <string>

#include "spdlog/spdlog.h"

namespace ptrain {

PassRecorder::Graph* PassRecorder::Find(const Key& key) {
  Graph* g = nullptr;
  for (Graph& p : graphs_) {
    if (p.key == key) g = &p;
  }
  if (g != nullptr) return g;
  if (graphs_.size() < kMaxGraphs) {
    g = &graphs_.emplace_back();
  } else {
    // Full: a key run once and never recorded makes room (a forward of
    // every length sampling runs through an earlier stage, one each).
    for (Graph& p : graphs_) {
      if (p.graph == nullptr && !p.failed && p.runs <= 1) g = &p;
    }
    if (g != nullptr) *g = Graph{};
  }
  if (g != nullptr) g->key = key;
  return g;
}

void PassRecorder::Run(const Key& key, kernels::Ops& ops,
                       const std::function<void()>& pass) {
  Graph* g = Find(key);
  if (g != nullptr && g->graph != nullptr) {
    if (g->graph->Replay()) {
      ++counts_.replayed;
      return;
    }
    // The backend moved a buffer the recording uses: run op by op once
    // more (which makes the buffers what the shape needs), then record.
    g->graph.reset();
    g->runs = 0;
  }
  // The first run of a shape goes op by op: it sizes the backend's buffers
  // (a recording must not allocate) and warms its kernels.
  if (g != nullptr && !g->failed && g->runs >= 1) {
    std::string error;
    g->graph = ops.Capture(pass, &error);
    if (g->graph != nullptr && g->graph->Replay()) {
      ++counts_.captured;
      ++counts_.replayed;
      return;
    }
    g->graph.reset();
    g->failed = true;
    ++counts_.failed;
    spdlog::warn(
        "train.cuda_graphs: the {} of a microbatch of B={} T={} could not be "
        "recorded ({}); it runs op by op",
        key.backward ? "backward" : "forward", key.B, key.T, error);
  }
  if (g != nullptr) ++g->runs;
  pass();
}

}  // namespace ptrain
