#include "worker/engine/train/expert_report.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"

namespace ptrain {

void ClearExpertLoad(const std::vector<std::unique_ptr<GptStage>>& chunks) {
  for (const auto& chunk : chunks) chunk->part_stats().Clear();
}

ExpertLoad CollectExpertLoad(
    const std::vector<std::unique_ptr<GptStage>>& chunks,
    const ParallelDims& dims, const RankBuild& build) {
  ExpertLoad out;
  const GptConfig& c = build.model;
  if (!c.has_moe()) return out;
  const int L = c.n_layer, E = c.moe.experts;
  // Per layer: E tokens, then dropped; then the losses.
  const int64_t width = E + 1;
  std::vector<double> all(L * width + 1, 0.0);
  // tp ranks route the same tokens; cp ranks each their own, and their
  // losses are parts of their sequences' (MoeMlpPart).
  if (dims.tp_rank() == 0) {
    for (const auto& chunk : chunks) {
      const PartStats& s = chunk->part_stats();
      for (const auto& [layer, tokens] : s.tokens) {
        std::copy(tokens.begin(), tokens.end(), all.begin() + layer * width);
      }
      for (const auto& [layer, dropped] : s.dropped) {
        all[layer * width + E] = dropped;
      }
      all[L * width] += s.losses;
    }
  }
  if (Communicator* world = dims.world_comm()) {
    world->AllReduce(all.data(), static_cast<int64_t>(all.size()));
  }
  for (int l = 0; l < L; ++l) {
    if (!c.moe.HasExperts(l)) continue;  // a dense MLP's block
    ExpertLoad::Layer layer;
    layer.layer = l;
    layer.tokens.assign(all.begin() + l * width, all.begin() + l * width + E);
    layer.dropped = all[l * width + E];
    out.layers.push_back(std::move(layer));
  }
  out.aux_loss = all[L * width] / (build.microbatches * build.dp);
  return out;
}

void MoveExpertBias(ZeroStore& store, const ExpertLoad& load,
                    const GptConfig& model) {
  if (!model.has_moe() || !model.moe.bias) return;
  const int E = model.moe.experts;
  std::map<int, std::vector<float>> step;  // by layer
  for (const ExpertLoad::Layer& l : load.layers) {
    double mean = 0;
    for (double t : l.tokens) mean += t;
    mean /= E;
    std::vector<float>& d = step[l.layer];
    d.resize(E);
    for (int e = 0; e < E; ++e) {
      const double t = l.tokens[e];
      d[e] = t < mean   ? model.moe.bias_rate
             : t > mean ? -model.moe.bias_rate
                        : 0.0f;
    }
  }
  float* params = store.update_params();
  kernels::Ops& ops = store.ops();
  std::vector<float> host;
  store.ForEachUpdateStretch(
      [&](const ParamInfo& p, int64_t lo, int64_t hi, int64_t at) {
        if (!absl::EndsWith(p.name, ".mlp.router.expert_bias")) return;
        const auto it = step.find(p.layer);
        if (it == step.end()) return;
        host.resize(hi - lo);
        ops.ToHost(host.data(), params + at, hi - lo);
        for (int64_t i = lo; i < hi; ++i) host[i - lo] += it->second[i];
        ops.FromHost(params + at, host.data(), hi - lo);
      });
}

}  // namespace ptrain
