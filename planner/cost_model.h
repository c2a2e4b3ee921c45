// The cost of one layout: a job spec (its parallel section and
// train.recompute as the layout sets them) on a cluster of nodes described
// by a hardware profile. It predicts the optimizer step the engine would
// run — compute from the model parts' matmul shapes and the profile's
// rates; tp/sp, the cp ring, the pipeline's sends and the dp/ZeRO
// collectives by their sizes and groups, hidden behind compute as the
// engine overlaps them; the pipeline bubble from the schedule simulator
// over the real stage costs; recompute's extra forward — and sizes each
// rank with the memory estimate the job's own check runs
// (EstimateRankMemory of its RankBuild). docs/planner.md states the model
// and its assumptions.
#ifndef PTRAIN_PLANNER_COST_MODEL_H_
#define PTRAIN_PLANNER_COST_MODEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/profile.h"
#include "ptrain/v1/job.pb.h"
#include "worker/engine/parallel/memory_estimate.h"
#include "worker/engine/parallel/zero_store.h"

namespace ptrain::planner {

// Where the job would run: `nodes` of `ranks_per_node` ranks (a GPU each
// on cuda; CPU ranks sharing the node's cores, `threads_per_rank` each, 0:
// the cores divided among them).
struct Cluster {
  int nodes = 1;
  int ranks_per_node = 1;
  int threads_per_rank = 0;
  int world() const { return nodes * ranks_per_node; }
};

// Exposed (not hidden behind compute) communication of one group a step.
struct GroupTime {
  std::string group;  // "tp", "cp", "pp", "dp", "ep"
  double seconds = 0;
  bool crosses_nodes = false;
};

struct Prediction {
  double step_s = 0;
  // The slowest pipeline rank's compute a step (its passes without
  // communication), the pipeline's makespan and its idle share.
  double compute_s = 0, pipeline_s = 0, bubble = 0;
  // compute_s's parts: matmuls, attention, elementwise passes.
  double matmul_s = 0, attention_s = 0, elementwise_s = 0;
  double optimizer_s = 0;  // the update and the gradient norm
  std::vector<GroupTime> comm;
  double tokens_per_s = 0;
  double model_flops = 0;  // a step's, without recomputation
  double mfu = 0;          // model_flops / (step · ranks · peak)
  // The rank that needs the most, and what bounds it: one GPU's memory
  // less the margin, or for CPU ranks the node's memory shared by them.
  MemoryEstimate memory;
  int64_t memory_need = 0, memory_limit = 0;
  bool fits() const { return memory_need <= memory_limit; }
  double comm_s() const;
};

// The share of a GPU's memory a plan leaves free (the CUDA context, the
// allocator's fragmentation, cuBLAS workspaces), and the host memory a
// CPU node keeps for everything but the ranks.
inline constexpr double kGpuMemoryMargin = 0.10;
inline constexpr double kHostMemoryMargin = 0.10;

struct LayerShapes;  // cost_model.cc: a block's matmuls on one tp rank

// Costs layouts of one model on one cluster and profile; caches what
// layouts share (a layer's matmul shapes by tp, each stage's parameter
// footprint, pipeline simulations). Not thread-safe.
class CostModel {
 public:
  // `base`: the job spec whose model, batch and precision are costed;
  // `vocab_size`: model.vocab_size, or the data's when that is 0.
  CostModel(const v1::JobSpec& base, int vocab_size, const Cluster& cluster,
            const HardwareProfile& profile);
  ~CostModel();

  // The step of `spec` (a validated spec of `base`'s model with another
  // layout) without its memory. Without `simulate`, a lower bound that
  // leaves out the pipeline's bubble (exact without a pipeline).
  Prediction Time(const v1::JobSpec& spec, bool simulate = true);
  // Adds the memory of `spec` to `p`.
  void Memory(const v1::JobSpec& spec, Prediction* p);
  // Both.
  Prediction Predict(const v1::JobSpec& spec);

  // A group of dimension `name` of `spec` in world ranks: its members'
  // stride (the degrees varying faster; ep's is carved from dp's group)
  // and its size (dp's spans dp·cp).
  struct GroupSpan {
    int64_t stride = 1, size = 1;
  };
  GroupSpan Span(const v1::JobSpec& spec, std::string_view name) const;
  // Whether a group of dimension `name` of `spec` (of that span) spans
  // nodes.
  bool CrossesNodes(const v1::JobSpec& spec, std::string_view name) const;
  bool CrossesNodes(const GroupSpan& g) const;

  const Cluster& cluster() const { return cluster_; }
  const HardwareProfile& profile() const { return profile_; }
  // The memory one rank may use.
  int64_t MemoryLimit() const;

 private:
  const LayerShapes& Shapes(int tp);
  double Threads() const;

  v1::JobSpec base_;
  int vocab_size_;
  Cluster cluster_;
  HardwareProfile profile_;
  std::map<int, std::unique_ptr<LayerShapes>> shapes_;
  std::map<std::tuple<int, int, int, int, int, int, int, int64_t>,
           ZeroStore::Footprint>
      footprints_;
};

}  // namespace ptrain::planner

#endif  // PTRAIN_PLANNER_COST_MODEL_H_
