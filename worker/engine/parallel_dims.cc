#include "worker/engine/parallel_dims.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/comm_mpi.h"

namespace ptrain {

absl::StatusOr<std::unique_ptr<ParallelDims>> ParallelDims::Create(
    const v1::ParallelSpec& spec, MPI_Comm world) {
  int size = 1, rank = 0;
  MPI_Comm_size(world, &size);
  MPI_Comm_rank(world, &rank);
  const int64_t product =
      static_cast<int64_t>(spec.dp()) * spec.tp() * spec.pp();
  if (product != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world size ", size,
        " does not equal parallel.dp × parallel.tp × "
        "parallel.pp = ",
        spec.dp(), " × ", spec.tp(), " × ", spec.pp(), " = ", product));
  }
  std::unique_ptr<ParallelDims> d(new ParallelDims());
  d->dp_ = spec.dp();
  d->tp_ = spec.tp();
  d->pp_ = spec.pp();
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
  // rank = pp_rank·(dp·tp) + dp_rank·tp + tp_rank
  d->tp_rank_ = rank % d->tp_;
  d->dp_rank_ = (rank / d->tp_) % d->dp_;
  d->pp_rank_ = rank / (d->tp_ * d->dp_);
  // Each group gathers the ranks that agree on the other two coordinates;
  // the key orders members by their coordinate within the group.
  MPI_Comm_split(world, d->pp_rank_ * d->tp_ + d->tp_rank_, d->dp_rank_,
                 &d->dp_comm_);
  MPI_Comm_split(world, d->pp_rank_ * d->dp_ + d->dp_rank_, d->tp_rank_,
                 &d->tp_comm_);
  MPI_Comm_split(world, d->dp_rank_ * d->tp_ + d->tp_rank_, d->pp_rank_,
                 &d->pp_comm_);
  // The embedding group: stage 0 and the last stage of one pipeline (the
  // tied embedding and head); only those ranks, and only when pp > 1.
  const bool tied_end =
      d->pp_ > 1 && (d->pp_rank_ == 0 || d->pp_rank_ == d->pp_ - 1);
  MPI_Comm_split(world,
                 tied_end ? d->dp_rank_ * d->tp_ + d->tp_rank_ : MPI_UNDEFINED,
                 d->pp_rank_, &d->emb_comm_);
  d->stats_ = std::make_shared<CommStats>();
  d->world_group_ = MakeMpiCommunicator(world, "world", d->stats_);
  d->dp_group_ = MakeMpiCommunicator(d->dp_comm_, "dp", d->stats_);
  d->tp_group_ = MakeMpiCommunicator(d->tp_comm_, "tp", d->stats_);
  d->pp_group_ = MakeMpiCommunicator(d->pp_comm_, "pp", d->stats_);
  if (d->emb_comm_ != MPI_COMM_NULL) {
    d->embedding_group_ =
        MakeMpiCommunicator(d->emb_comm_, "embedding", d->stats_);
  }
  return d;
}

ParallelDims::~ParallelDims() {
  world_group_.reset();
  dp_group_.reset();
  tp_group_.reset();
  pp_group_.reset();
  embedding_group_.reset();
  for (MPI_Comm* c : {&dp_comm_, &tp_comm_, &pp_comm_, &emb_comm_}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

std::string ParallelDims::ToString() const {
  return absl::StrCat("dp=", dp_, " tp=", tp_, " pp=", pp_, " zero=", zero_,
                      " (rank ", world_rank_, " of ", world_size_, ": dp_rank ",
                      dp_rank_, ", tp_rank ", tp_rank_, ", pp_rank ", pp_rank_,
                      ")");
}

}  // namespace ptrain
