#include "worker/engine/parallel/parallel_dims.h"

#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "kernels/backends.h"
#include "spdlog/spdlog.h"
#include "worker/engine/comm/comm_mpi.h"
#include "worker/engine/comm/comm_nccl.h"
#include "worker/engine/comm/comm_staged.h"

namespace ptrain {

namespace {

// InvalidArgument, printing every factor, unless the spec's world size is
// `size`.
absl::Status CheckWorldSize(const v1::ParallelSpec& spec, int size) {
  const int64_t product = ParallelWorldSize(spec);
  if (product == size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("world size ", size, " does not equal ",
                   ParallelWorldFactors(spec), " = ", product));
}

// The world ranks of `comm`'s members in its order.
std::vector<int> WorldRanks(MPI_Comm comm, MPI_Comm world) {
  MPI_Group group, world_group;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(world, &world_group);
  int n = 0;
  MPI_Group_size(group, &n);
  std::vector<int> mine(n), theirs(n);
  for (int i = 0; i < n; ++i) mine[i] = i;
  MPI_Group_translate_ranks(group, n, mine.data(), world_group, theirs.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  return theirs;
}

}  // namespace

void ParallelDims::MakeRecorder() {
  recorder_ = std::make_shared<FlightRecorder>();
  recorder_->SetIdentity({world_rank_,
                          world_size_,
                          {{"dp", dp_rank_},
                           {"tp", tp_rank_},
                           {"pp", pp_rank_},
                           {"cp", cp_rank_}}});
}

absl::StatusOr<std::unique_ptr<ParallelDims>> ParallelDims::Single(
    const v1::ParallelSpec& spec) {
  if (absl::Status s = CheckWorldSize(spec, 1); !s.ok()) return s;
  std::unique_ptr<ParallelDims> d(new ParallelDims());
  d->zero_ = spec.zero();
  d->sp_ = spec.sequence_parallel();
  d->microbatches_ = spec.microbatches();
  d->stats_ = std::make_shared<CommStats>();
  d->MakeRecorder();
  d->world_group_ = MakeSelfCommunicator("world", d->stats_);
  d->dp_group_ = MakeSelfCommunicator("dp", d->stats_);
  d->tp_group_ = MakeSelfCommunicator("tp", d->stats_);
  d->pp_group_ = MakeSelfCommunicator("pp", d->stats_);
  d->cp_group_ = MakeSelfCommunicator("cp", d->stats_);
  return d;
}

absl::StatusOr<std::unique_ptr<ParallelDims>> ParallelDims::Create(
    const v1::ParallelSpec& spec, MPI_Comm world) {
  int size = 1, rank = 0;
  MPI_Comm_size(world, &size);
  MPI_Comm_rank(world, &rank);
  if (absl::Status s = CheckWorldSize(spec, size); !s.ok()) return s;
  std::unique_ptr<ParallelDims> d(new ParallelDims());
  d->dp_ = spec.dp();
  d->tp_ = spec.tp();
  d->pp_ = spec.pp();
  d->cp_ = spec.cp();
  d->zero_ = spec.zero();
  d->sp_ = spec.sequence_parallel();
  d->microbatches_ = spec.microbatches();
  d->world_size_ = size;
  d->world_rank_ = rank;
  d->world_ = world;
  // The ranks on this node (they share its GPUs).
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &d->local_size_);
  MPI_Comm_rank(node, &d->local_rank_);
  MPI_Comm_free(&node);
  // rank = ((pp_rank·dp + dp_rank)·cp + cp_rank)·tp + tp_rank
  const int tp = d->tp_, cp = d->cp_, dp = d->dp_;
  d->tp_rank_ = rank % tp;
  d->cp_rank_ = (rank / tp) % cp;
  d->dp_rank_ = (rank / (tp * cp)) % dp;
  d->pp_rank_ = rank / (tp * cp * dp);
  const int tp_rank = d->tp_rank_, cp_rank = d->cp_rank_, dp_rank = d->dp_rank_,
            pp_rank = d->pp_rank_;
  // Each group gathers the ranks that agree on the other coordinates; the
  // key orders members by their coordinates within the group. The dp group
  // spans dp × cp (the ranks holding the same weights).
  MPI_Comm_split(world, pp_rank * tp + tp_rank, dp_rank * cp + cp_rank,
                 &d->dp_comm_);
  MPI_Comm_split(world, (pp_rank * dp + dp_rank) * cp + cp_rank, tp_rank,
                 &d->tp_comm_);
  MPI_Comm_split(world, (pp_rank * dp + dp_rank) * tp + tp_rank, cp_rank,
                 &d->cp_comm_);
  const int pipeline = (dp_rank * cp + cp_rank) * tp + tp_rank;
  MPI_Comm_split(world, pipeline, pp_rank, &d->pp_comm_);
  // The embedding group: stage 0 and the last stage of one pipeline (the
  // tied embedding and head); only those ranks, and only when pp > 1.
  const bool tied_end = d->pp_ > 1 && (pp_rank == 0 || pp_rank == d->pp_ - 1);
  MPI_Comm_split(world, tied_end ? pipeline : MPI_UNDEFINED, pp_rank,
                 &d->emb_comm_);
  d->stats_ = std::make_shared<CommStats>();
  d->MakeRecorder();
  auto group = [&](MPI_Comm comm, const char* name) {
    d->recorder_->SetGroup(name, WorldRanks(comm, world));
    return MakeMpiCommunicator(comm, name, d->stats_, d->recorder_);
  };
  d->world_group_ = group(world, "world");
  d->dp_group_ = group(d->dp_comm_, "dp");
  d->tp_group_ = group(d->tp_comm_, "tp");
  d->pp_group_ = group(d->pp_comm_, "pp");
  d->cp_group_ = group(d->cp_comm_, "cp");
  if (d->emb_comm_ != MPI_COMM_NULL) {
    d->embedding_group_ = group(d->emb_comm_, "embedding");
  }
  return d;
}

ParallelDims::~ParallelDims() {
  device_groups_.clear();
  world_group_.reset();
  dp_group_.reset();
  tp_group_.reset();
  pp_group_.reset();
  cp_group_.reset();
  embedding_group_.reset();
  for (MPI_Comm* c : {&dp_comm_, &tp_comm_, &pp_comm_, &cp_comm_, &emb_comm_}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

void ParallelDims::AttachDevice(kernels::Ops* device_ops) {
  DetachDevice();
  if (!has_mpi()) return;
  // NCCL where every rank has its own GPU (NCCL refuses a GPU shared by two
  // ranks of a group), decided alike on every rank; PTRAIN_CUDA_COMM=staged
  // keeps to MPI, =nccl takes NCCL for groups of one rank too (tests).
  const char* env = std::getenv("PTRAIN_CUDA_COMM");
  const std::string choice = env != nullptr && *env != '\0' ? env : "auto";
  const bool own_gpu = local_size_ <= kernels::CudaDeviceCount();
  const bool nccl =
      !AnyRankFailed(world_group_.get(), !own_gpu || choice == "staged");
  // The pipeline and cp groups only send and receive (staged: see
  // comm_nccl.h) and sum host numbers.
  for (Communicator* g :
       {dp_group_.get(), tp_group_.get(), embedding_group_.get()}) {
    if (g == nullptr) continue;
    if (nccl && (g->size() > 1 || choice == "nccl")) {
      auto c = MakeNcclCommunicator(g, device_ops, recorder_.get());
      if (c.ok()) {
        device_groups_[g] = std::move(*c);
        continue;
      }
      spdlog::warn("{}: group {} communicates through host memory",
                   std::string(c.status().message()), g->group());
    }
    device_groups_[g] = MakeStagedCommunicator(g, device_ops);
  }
  for (Communicator* g : {pp_group_.get(), cp_group_.get()}) {
    device_groups_[g] = MakeStagedCommunicator(g, device_ops);
  }
}

Communicator* ParallelDims::OnDevice(Communicator* group) const {
  const auto it = device_groups_.find(group);
  return it != device_groups_.end() ? it->second.get() : group;
}

Communicator* ParallelDims::world_comm() const {
  return world_size_ > 1 ? world_group_.get() : nullptr;
}

Communicator* ParallelDims::dp_comm() const {
  // ZeRO needs its group even at dp = 1 (its collectives are then local).
  return has_mpi() ? OnDevice(dp_group_.get()) : nullptr;
}

Communicator* ParallelDims::tp_comm() const {
  return tp_ > 1 ? OnDevice(tp_group_.get()) : nullptr;
}

Communicator* ParallelDims::pp_comm() const {
  return pp_ > 1 ? OnDevice(pp_group_.get()) : nullptr;
}

Communicator* ParallelDims::cp_comm() const {
  return cp_ > 1 ? OnDevice(cp_group_.get()) : nullptr;
}

Communicator* ParallelDims::embedding_comm() const {
  return embedding_group_ != nullptr ? OnDevice(embedding_group_.get())
                                     : nullptr;
}

ComputeGroups ParallelDims::compute_groups() const {
  return ComputeGroups{dp_comm(), tp_comm(),        pp_comm(),
                       cp_comm(), embedding_comm(), sp_};
}

std::string ParallelDims::ToString() const {
  const bool cp = cp_ > 1;
  return absl::StrCat("dp=", dp_, " tp=", tp_, " pp=", pp_,
                      cp ? absl::StrCat(" cp=", cp_) : "", " zero=", zero_,
                      " (rank ", world_rank_, " of ", world_size_, ": dp_rank ",
                      dp_rank_, ", tp_rank ", tp_rank_, ", pp_rank ", pp_rank_,
                      cp ? absl::StrCat(", cp_rank ", cp_rank_) : "", ")");
}

}  // namespace ptrain
