// ParallelDims: the mesh, the one place that knows the parallel layout.
// Validates that the world size (ParallelWorldSize: dp·tp·pp·cp) is the
// number of ranks, computes this rank's coordinates (tp fastest, then cp,
// then dp, then pp — Megatron's order) and creates the dp, tp, pp and cp
// process groups
// over host memory, and on a GPU their twins over its memory (NCCL, or
// staged through the host). No other code splits communicators, computes
// rank coordinates or chooses a group's transport. Always present: a rank
// without MPI is a mesh of one (Single).
//
// Adding a dimension: one degree and coordinate here, one split and group
// in Create, one factor in ParallelWorldSize (common/spec.cc).
#ifndef PTRAIN_WORKER_ENGINE_PARALLEL_PARALLEL_DIMS_H_
#define PTRAIN_WORKER_ENGINE_PARALLEL_PARALLEL_DIMS_H_

#include <mpi.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
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
      const v1::ParallelSpec& spec, MPI_Comm world);
  // One rank without MPI: every degree 1 (InvalidArgument, as Create's,
  // when the spec's world size is not 1), groups of this rank alone.
  static absl::StatusOr<std::unique_ptr<ParallelDims>> Single(
      const v1::ParallelSpec& spec);
  ~ParallelDims();
  ParallelDims(const ParallelDims&) = delete;
  ParallelDims& operator=(const ParallelDims&) = delete;

  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int cp() const { return cp_; }
  int zero() const { return zero_; }
  bool sequence_parallel() const { return sp_; }
  int microbatches() const { return microbatches_; }
  bool dp_enabled() const { return dp_ > 1; }
  bool tp_enabled() const { return tp_ > 1; }
  bool pp_enabled() const { return pp_ > 1; }

  int world_size() const { return world_size_; }
  int world_rank() const { return world_rank_; }
  int dp_rank() const { return dp_rank_; }
  int tp_rank() const { return tp_rank_; }
  int pp_rank() const { return pp_rank_; }
  int cp_rank() const { return cp_rank_; }
  // This rank among the ranks of its node (which share its GPUs).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // The groups this rank belongs to; they share one CommStats. The dp
  // group is every rank holding the same weights: dp × cp ranks (the
  // gradients are summed and ZeRO shards over it, as Megatron's), the dp
  // ranks alone when cp = 1; its metrics are group="dp". The cp group
  // (group="cp") splits every sequence: ring attention's.
  Communicator& world_group() { return *world_group_; }
  Communicator& dp_group() { return *dp_group_; }
  Communicator& cp_group() { return *cp_group_; }
  Communicator& tp_group() { return *tp_group_; }
  Communicator& pp_group() { return *pp_group_; }
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
  Communicator* embedding_comm() const;
  ComputeGroups compute_groups() const;

  // "dp=2 tp=1 pp=1 zero=1 (rank 3: dp_rank 1, tp_rank 0, pp_rank 0)"
  std::string ToString() const;

 private:
  ParallelDims() = default;

  int dp_ = 1, tp_ = 1, pp_ = 1, cp_ = 1, zero_ = 0, microbatches_ = 1;
  bool sp_ = false;
  int world_size_ = 1, world_rank_ = 0;
  int local_size_ = 1, local_rank_ = 0;
  int dp_rank_ = 0, tp_rank_ = 0, pp_rank_ = 0, cp_rank_ = 0;
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm dp_comm_ = MPI_COMM_NULL, tp_comm_ = MPI_COMM_NULL,
           pp_comm_ = MPI_COMM_NULL, cp_comm_ = MPI_COMM_NULL,
           emb_comm_ = MPI_COMM_NULL;
  std::shared_ptr<CommStats> stats_;
  std::shared_ptr<FlightRecorder> recorder_;
  void MakeRecorder();  // recorder_, its identity from the coordinates
  std::unique_ptr<Communicator> world_group_, dp_group_, tp_group_, pp_group_,
      cp_group_, embedding_group_;
  // AttachDevice's twins, by host group.
  std::map<const Communicator*, std::unique_ptr<Communicator>> device_groups_;
  Communicator* OnDevice(Communicator* group) const;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_PARALLEL_PARALLEL_DIMS_H_
