// See checkpoint_state.h.
#include "worker/engine/checkpoint/checkpoint_state.h"

namespace ptrain {

namespace {

// The weights and both moments this rank updates, copied out of a GPU
// into `host` (params, m, v back to back); or null where they are on the
// host already.
struct StatePointers {
  float* params;
  float* m;
  float* v;
};
StatePointers HostState(ZeroStore& store, AdamW& adam,
                        std::vector<float>* host) {
  if (store.ops().device() == kernels::Device::kCpu) {
    return {store.update_params(), adam.m(), adam.v()};
  }
  const int64_t n = store.update_size();
  host->resize(3 * n);
  StatePointers h{host->data(), host->data() + n, host->data() + 2 * n};
  store.ops().ToHost(h.params, store.update_params(), n);
  // The moments where Adam keeps them (the host's under offload).
  adam.ops().ToHost(h.m, adam.m(), n);
  adam.ops().ToHost(h.v, adam.v(), n);
  return h;
}

}  // namespace

std::vector<ShardRun> CheckpointRuns(ZeroStore& store, AdamW& adam,
                                     bool write_tp_replicated,
                                     std::vector<float>* host) {
  std::vector<ShardRun> runs, m_runs, v_runs;
  const StatePointers state = HostState(store, adam, host);
  const float* params = state.params;
  store.ForEachShardStretch(
      [&](const ParamInfo& p, int64_t lo, int64_t hi, int64_t at) {
        if (p.tp_replicated() && !write_tp_replicated) return;
        if (p.tied_copy) return;  // stage 0 writes wte
        ForEachLocalBox(p, lo, hi, [&](const Box& box, int64_t local) {
          const int64_t i = at + (local - lo);
          runs.push_back({p.name, box, params + i});
          m_runs.push_back({ExpAvgName(p.name), box, state.m + i});
          v_runs.push_back({ExpAvgSqName(p.name), box, state.v + i});
        });
      });
  runs.insert(runs.end(), m_runs.begin(), m_runs.end());
  runs.insert(runs.end(), v_runs.begin(), v_runs.end());
  return runs;
}

absl::Status LoadState(ZeroStore& store, AdamW& adam, TensorSource& source,
                       bool with_optimizer) {
  // On a GPU: read into a host copy of the current state, then copy back.
  std::vector<float> host;
  const StatePointers state = HostState(store, adam, &host);
  float* params = state.params;
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
              status = source.Read(ExpAvgName(p.name), box, state.m + i);
            } else {
              status = source.Read(ExpAvgSqName(p.name), box, state.v + i);
            }
          });
        });
    if (!status.ok()) return status;
  }
  if (!host.empty()) {
    const int64_t n = store.update_size();
    store.ops().FromHost(store.update_params(), state.params, n);
    adam.ops().FromHost(adam.m(), state.m, n);
    adam.ops().FromHost(adam.v(), state.v, n);
  }
  return status;
}

}  // namespace ptrain
