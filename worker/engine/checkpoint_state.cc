// See checkpoint_state.h.
#include "worker/engine/checkpoint_state.h"

namespace ptrain {

std::vector<ShardRun> CheckpointRuns(ZeroStore& store, AdamW& adam,
                                     bool write_tp_replicated) {
  std::vector<ShardRun> runs, m_runs, v_runs;
  const float* params = store.update_params();
  store.ForEachShardStretch(
      [&](const ParamInfo& p, int64_t lo, int64_t hi, int64_t at) {
        if (p.tp_replicated() && !write_tp_replicated) return;
        if (p.tied_copy) return;  // stage 0 writes wte
        ForEachLocalBox(p, lo, hi, [&](const Box& box, int64_t local) {
          const int64_t i = at + (local - lo);
          runs.push_back({p.name, box, params + i});
          m_runs.push_back({ExpAvgName(p.name), box, adam.m() + i});
          v_runs.push_back({ExpAvgSqName(p.name), box, adam.v() + i});
        });
      });
  runs.insert(runs.end(), m_runs.begin(), m_runs.end());
  runs.insert(runs.end(), v_runs.begin(), v_runs.end());
  return runs;
}

absl::Status LoadState(ZeroStore& store, AdamW& adam, TensorSource& source,
                       bool with_optimizer) {
  float* params = store.update_params();
  absl::Status status = absl::OkStatus();
  // Each kind in turn, the order checkpoints store them in, so that reads
  // move forward through the files.
  for (int kind = 0; kind < (with_optimizer ? 3 : 1); ++kind) {
    store.ForEachUpdateStretch(
        [&](const ParamInfo& p, int64_t lo, int64_t hi, int64_t at) {
          ForEachLocalBox(p, lo, hi, [&](const Box& box, int64_t local) {
            if (!status.ok()) return;
            const int64_t i = at + (local - lo);
            if (kind == 0) {
              status = source.Read(p.name, box, params + i);
            } else if (kind == 1) {
              status = source.Read(ExpAvgName(p.name), box, adam.m() + i);
            } else {
              status = source.Read(ExpAvgSqName(p.name), box, adam.v() + i);
            }
          });
        });
    if (!status.ok()) return status;
  }
  return status;
}

}  // namespace ptrain
