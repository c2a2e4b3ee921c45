// ParallelDims: the mesh, the one place that knows the parallel layout.
// Validates that the world size (ParallelWorldSize, the product of every
// dimension's degree) is the number of ranks, computes this rank's
// coordinate in each dimension of the table (common/mesh.h: tp fastest,
// then cp, dp, pp — Megatron's order) and creates each dimension's process
// group over host memory, and on a GPU their twins over its memory (NCCL,
// or staged through the host). No other code splits communicators, computes
// rank coordinates or chooses a group's transport. Always present: a rank
// without MPI is a mesh of one (Single).
//
// Adding a dimension: its row in MeshDimensions (common/mesh.cc); its
// group, coordinate and names follow. Named accessors are for the code that
// does a dimension's math.
#ifndef PTRAIN_WORKER_ENGINE_PARALLEL_PARALLEL_DIMS_H_
#define PTRAIN_WORKER_ENGINE_PARALLEL_PARALLEL_DIMS_H_

#include <mpi.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mesh.h"
#include "kernels/ops.h"
#include "ptrain/v1/job.pb.h"
#include "worker/engine/comm/comm.h"
#include "worker/engine/comm/flight_recorder.h"

namespace ptrain {

class ParallelDims {
 public:
  // Splits `world` (not owned). InvalidArgument, printing every factor, when
  // the spec's world size differs from `world`'s. Collective over `world`.
  static absl::StatusOr<std::unique_ptr<ParallelDims>> Create(
      const ParallelLayout& layout, MPI_Comm world);
  static absl::StatusOr<std::unique_ptr<ParallelDims>> Create(
      const v1::ParallelSpec& spec, MPI_Comm world) {
    return Create(LayoutOf(spec), world);
  }
  // One rank without MPI: every degree 1 (InvalidArgument, as Create's,
  // when the spec's world size is not 1), groups of this rank alone.
  static absl::StatusOr<std::unique_ptr<ParallelDims>> Single(
      const ParallelLayout& layout);
  static absl::StatusOr<std::unique_ptr<ParallelDims>> Single(
      const v1::ParallelSpec& spec) {
    return Single(LayoutOf(spec));
  }
  ~ParallelDims();
  ParallelDims(const ParallelDims&) = delete;
  ParallelDims& operator=(const ParallelDims&) = delete;

  const ParallelLayout& layout() const { return layout_; }
  // Dimension `name`'s degree and this rank's coordinate in it.
  int degree(std::string_view name) const { return axis(name).degree; }
  int coordinate(std::string_view name) const { return axis(name).coord; }
  // This rank's coordinate in each dimension named at one or above it,
  // in the table's order: [("dp", 1), ("tp", 0), ("pp", 0)].
  std::vector<std::pair<std::string, int>> NamedCoordinates() const;

  int dp() const { return degree("dp"); }
  int tp() const { return degree("tp"); }
  int pp() const { return degree("pp"); }
  int cp() const { return degree("cp"); }
  int ep() const { return degree("ep"); }
  int zero() const { return layout_.zero; }
  bool sequence_parallel() const { return layout_.sequence_parallel; }
  int microbatches() const { return layout_.microbatches; }
  bool dp_enabled() const { return dp() > 1; }
  bool tp_enabled() const { return tp() > 1; }
  bool pp_enabled() const { return pp() > 1; }

  int world_size() const { return world_size_; }
  int world_rank() const { return world_rank_; }
  int dp_rank() const { return coordinate("dp"); }
  int tp_rank() const { return coordinate("tp"); }
  int pp_rank() const { return coordinate("pp"); }
  int cp_rank() const { return coordinate("cp"); }
  // This rank among the ranks of its node (which share its GPUs).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // The groups this rank belongs to; they share one CommStats. The dp
  // group is every rank holding the same weights: dp × cp ranks (the
  // gradients are summed and ZeRO shards over it, as Megatron's), the dp
  // ranks alone when cp = 1; its metrics are group="dp". The cp group
  // (group="cp") splits every sequence: ring attention's.
  Communicator& world_group() { return *world_group_; }
  Communicator& group(std::string_view name) { return *axis(name).group; }
  Communicator& dp_group() { return group("dp"); }
  Communicator& cp_group() { return group("cp"); }
  Communicator& tp_group() { return group("tp"); }
  Communicator& pp_group() { return group("pp"); }
  // Stage 0 and the last stage of this rank's pipeline (pp > 1), which sum
  // the gradients of the tied embedding and head; null elsewhere.
  Communicator* embedding_group() { return embedding_group_.get(); }
  std::shared_ptr<CommStats> comm_stats() const { return stats_; }
  // Records every call of the host groups (and, through them, of their
  // device twins) and the phases the trainer marks: the rank's flight
  // recorder, dumped when a job hangs.
  FlightRecorder* flight_recorder() const { return recorder_.get(); }
  std::shared_ptr<FlightRecorder> shared_flight_recorder() const {
    return recorder_;
  }
  // Created by Create (over MPI); false for Single.
  bool has_mpi() const { return world_ != MPI_COMM_NULL; }

  // With a GPU backend (not owned; outlives the groups): makes each
  // group's twin over the GPU's memory — NCCL where every rank has its own
  // GPU, else staged through the host. Collective (every rank decides
  // alike). Nothing to do for a mesh of one.
  void AttachDevice(kernels::Ops* device_ops);
  // Destroys the twins (before their backend goes, and before another
  // AttachDevice).
  void DetachDevice() { device_groups_.clear(); }

  // The groups the model and optimizer communicate over: each group's
  // device twin after AttachDevice, else the group itself; null where
  // there is nothing to communicate (their users skip the work). dp is
  // present at dp = 1 too when there is MPI (ZeRO's collectives are then
  // local); the world group is the host's (ranks agreeing, checkpoints).
  Communicator* world_comm() const;
  Communicator* dp_comm() const;
  Communicator* tp_comm() const;
  Communicator* pp_comm() const;
  Communicator* cp_comm() const;
  // ep > 1: the ranks among which an MoE layer's experts are split (its
  // tokens' all-to-all), and the ranks holding the same experts (their
  // gradients are summed, and ZeRO shards them, over it).
  Communicator* ep_comm() const;
  Communicator* edp_comm() const;
  Communicator* embedding_comm() const;
  ComputeGroups compute_groups() const;

  // "dp=2 tp=1 pp=1 zero=1 (rank 3: dp_rank 1, tp_rank 0, pp_rank 0)"
  std::string ToString() const;

 private:
  ParallelDims() = default;

  // One dimension of the mesh: its row of the table, degree, this rank's
  // coordinate and group.
  struct Axis {
    const MeshDimension* dim = nullptr;
    int degree = 1, coord = 0;
    MPI_Comm comm = MPI_COMM_NULL;
    std::unique_ptr<Communicator> group;
    // A carved dimension's complement group (MeshDimension::complement).
    MPI_Comm rest_comm = MPI_COMM_NULL;
    std::unique_ptr<Communicator> rest;
  };
  const Axis& axis(std::string_view name) const {
    return axes_[MeshDimensionIndex(name)];
  }
  // The mixed-radix number of this rank's coordinates in the dimensions
  // `in` selects, taken in rank order.
  template <typename In>
  int RankOrderIndex(In in) const;

  ParallelLayout layout_;
  std::vector<Axis> axes_;  // MeshDimensions()' order
  int world_size_ = 1, world_rank_ = 0;
  int local_size_ = 1, local_rank_ = 0;
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm emb_comm_ = MPI_COMM_NULL;
  std::shared_ptr<CommStats> stats_;
  std::shared_ptr<FlightRecorder> recorder_;
  void MakeRecorder();  // recorder_, its identity from the coordinates
  void SetLayout(const ParallelLayout& layout, int world_rank);
  std::unique_ptr<Communicator> world_group_, embedding_group_;
  // AttachDevice's twins, by host group.
  std::map<const Communicator*, std::unique_ptr<Communicator>> device_groups_;
  Communicator* OnDevice(Communicator* group) const;
  // Dimension `name`'s group (its device twin) where its degree is above 1.
  Communicator* Working(std::string_view name) const;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_PARALLEL_PARALLEL_DIMS_H_
