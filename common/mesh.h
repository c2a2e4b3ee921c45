// The mesh's dimensions as one table, and a job's parallel layout read off
// its spec. Besides the spec parser (spec*.cc) this is the one reader of
// the spec's parallel section: the engine (ParallelDims, RankBuild, the
// memory estimate, checkpoints, metrics, the run log) and ptcoord (placing
// a job's ranks, shrinking it) take the layout from here and iterate the
// table wherever they handle every dimension alike.
//
// Adding a dimension: its field in job.proto (ParallelSpec) and one row in
// MeshDimensions (mesh.cc). Its default (1), its range (1..kMaxDegree), its
// factor in the world size (or, carved out of another's group, its place
// in that group), its group, coordinate, checkpoint layout key, metrics
// label, run-log key and flight-recorder group follow from the row; rules
// tying it to other fields go in spec_validate.cc.
#ifndef PTRAIN_COMMON_MESH_H_
#define PTRAIN_COMMON_MESH_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

// One dimension of the mesh.
struct MeshDimension {
  // Its spec field (parallel.<name>), its group ("dp"), its coordinate's
  // label and record key ("dp_rank"), its key in a checkpoint's layout.
  std::string_view name;
  int32_t (*degree)(const v1::ParallelSpec& spec);
  void (*set_degree)(v1::ParallelSpec* spec, int32_t degree);
  // Its place in the world rank: 0 varies fastest (tp, then cp, dp, pp:
  // Megatron's order, tensor-parallel neighbours adjacent).
  int rank_place = 0;
  // Its groups must stay within a node (they communicate every layer).
  bool node_local = false;
  // Named at degree 1 too: in summaries and labels, and required in a
  // checkpoint's layout. A newer dimension is named only where it is
  // above 1, and a checkpoint written before it reads degree 1.
  bool named_at_one = true;
  // Its group only sends and receives (and sums host numbers): on a GPU
  // it is staged through the host rather than given to NCCL.
  bool point_to_point = false;
  // Another dimension whose ranks this one's group also gathers: dp's
  // group spans dp × cp, the ranks holding the same weights. "" if none.
  std::string_view also_spans;
  // Carved out of another dimension's group rather than adding ranks: ep
  // splits each dp group (dp × cp ranks) into groups of ep consecutive
  // members. It is no factor of the world size and has no rank place; its
  // degree divides that group's size, and the members of the carved group
  // holding the same coordinate in it form its complement (`complement`:
  // "edp", the ranks holding the same experts). "" if none.
  std::string_view within;
  std::string_view complement;
};

// Every dimension, in the order specs, messages and checkpoints list them:
// dp, tp, pp, cp, ep.
const std::vector<MeshDimension>& MeshDimensions();
// The index in MeshDimensions() of `name`; PT_CHECKs that it is one.
int MeshDimensionIndex(std::string_view name);
// The indices of MeshDimensions() that are factors of the world size
// (not carved out of another's group) in rank order, the fastest varying
// first (by rank_place).
const std::vector<int>& RankOrder();

// A job's parallel layout: each dimension's degree and the options of the
// parallel section that are not dimensions.
struct ParallelLayout {
  std::vector<int> degrees;  // by MeshDimensions() index
  int zero = 0;
  bool sequence_parallel = false;
  int microbatches = 1;
  int virtual_stages = 1;
  std::string schedule;  // parallel.schedule as written
  int64_t bucket_bytes = 0;
  bool offload_optimizer = false;  // parallel.offload=optimizer
  int expert_tp = 0;               // parallel.expert_tp as written (0: tp)

  // The degree of dimension `name` (PT_CHECKs that it is one).
  int degree(std::string_view name) const;
  // The product of the degrees of the world's factors (every dimension
  // not carved out of another's group), in 64 bits (each is an int32).
  int64_t world_size() const;
  // The size of dimension `name`'s group: its degree, times that of the
  // dimension it also spans (dp's: dp·cp).
  int64_t group_size(std::string_view name) const;
  // The ranks of one node-local group of every node-local dimension
  // together (tp × cp): the ranks a job's placement keeps on one node.
  int64_t node_local_ranks() const;
  // "parallel.dp × parallel.tp × parallel.pp = 2 × 1 × 1": the world's
  // factors, each named at one or above 1, then a carved dimension above 1
  // as " (parallel.ep=2 within parallel.dp)".
  std::string Factors() const;
  // The same product spelt `first` + name, then `each` + name for the
  // others, naming every dimension if `all`: Factors() is
  // FactorsSpelt("parallel.", "parallel.", false).
  std::string FactorsSpelt(std::string_view first, std::string_view each,
                           bool all) const;
  // This rank's coordinate in each dimension (by index) from its world
  // rank: a carved dimension's is its place in the carved group (ep:
  // the rank's index among the dp·cp ranks of its dp group, modulo ep).
  std::vector<int> Coordinates(int world_rank) const;
  // A rank's index among the members of its group of dimension `name`,
  // from its coordinates: its coordinate there, and where the group also
  // spans another dimension, that one's varying fastest (dp's: dp_rank·cp
  // + cp_rank), the order the group's members are ranked in.
  int64_t GroupIndex(std::string_view name,
                     const std::vector<int>& coords) const;
};

ParallelLayout LayoutOf(const v1::ParallelSpec& spec);
ParallelLayout JobLayout(const v1::JobSpec& spec);

// The spec with `dp` data-parallel replicas and `microbatches` a step
// (ptcoord's shrink and grow; not validated here).
v1::JobSpec WithDataParallel(const v1::JobSpec& spec, int dp, int microbatches);
// The spec with its parallel section at the defaults: one rank.
void ResetParallel(v1::JobSpec* spec);
// PipelineStageLayers of the spec's parallel section and model.n_layer.
absl::StatusOr<std::vector<int>> JobStageLayers(const v1::JobSpec& spec);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_MESH_H_
