#include "worker/engine/parallel/parallel_dims.h"

#include <algorithm>
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
absl::Status CheckWorldSize(const ParallelLayout& layout, int size) {
  const int64_t product = layout.world_size();
  if (product == size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("world size ", size, " does not equal ", layout.Factors(),
                   " = ", product));
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

void ParallelDims::SetLayout(const ParallelLayout& layout, int world_rank) {
  layout_ = layout;
  const std::vector<int> coords = layout.Coordinates(world_rank);
  const auto& dims = MeshDimensions();
  axes_.resize(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    axes_[i].dim = &dims[i];
    axes_[i].degree = layout.degrees[i];
    axes_[i].coord = coords[i];
  }
}

template <typename In>
int ParallelDims::RankOrderIndex(In in) const {
  int index = 0;
  const std::vector<int>& order = RankOrder();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Axis& a = axes_[*it];
    if (in(a)) index = index * a.degree + a.coord;
  }
  return index;
}

void ParallelDims::MakeRecorder() {
  recorder_ = std::make_shared<FlightRecorder>();
  FlightRecorder::Identity identity{world_rank_, world_size_, {}};
  for (const Axis& a : axes_) {
    identity.coords[std::string(a.dim->name)] = a.coord;
  }
  recorder_->SetIdentity(std::move(identity));
}

std::vector<std::pair<std::string, int>> ParallelDims::NamedCoordinates()
    const {
  std::vector<std::pair<std::string, int>> named;
  for (const Axis& a : axes_) {
    if (a.dim->named_at_one || a.degree > 1) {
      named.emplace_back(std::string(a.dim->name), a.coord);
    }
  }
  return named;
}

absl::StatusOr<std::unique_ptr<ParallelDims>> ParallelDims::Single(
    const ParallelLayout& layout) {
  if (absl::Status s = CheckWorldSize(layout, 1); !s.ok()) return s;
  std::unique_ptr<ParallelDims> d(new ParallelDims());
  d->SetLayout(layout, 0);
  d->stats_ = std::make_shared<CommStats>();
  d->MakeRecorder();
  d->world_group_ = MakeSelfCommunicator("world", d->stats_);
  for (Axis& a : d->axes_) {
    a.group = MakeSelfCommunicator(std::string(a.dim->name), d->stats_);
    if (!a.dim->complement.empty()) {
      a.rest = MakeSelfCommunicator(std::string(a.dim->complement), d->stats_);
    }
  }
  return d;
}

absl::StatusOr<std::unique_ptr<ParallelDims>> ParallelDims::Create(
    const ParallelLayout& layout, MPI_Comm world) {
  int size = 1, rank = 0;
  MPI_Comm_size(world, &size);
  MPI_Comm_rank(world, &rank);
  if (absl::Status s = CheckWorldSize(layout, size); !s.ok()) return s;
  std::unique_ptr<ParallelDims> d(new ParallelDims());
  d->SetLayout(layout, rank);
  d->world_size_ = size;
  d->world_rank_ = rank;
  d->world_ = world;
  // The ranks on this node (they share its GPUs).
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &d->local_size_);
  MPI_Comm_rank(node, &d->local_rank_);
  MPI_Comm_free(&node);
  // Each dimension's group gathers the ranks that agree on the other
  // coordinates (and, for dp, on all but cp's: the ranks holding the same
  // weights); the key orders members by their coordinates within it.
  for (Axis& a : d->axes_) {
    if (!a.dim->within.empty()) continue;
    auto spanned = [&a](const Axis& b) {
      return &b == &a ||
             (!a.dim->also_spans.empty() && b.dim->name == a.dim->also_spans);
    };
    const int color =
        d->RankOrderIndex([&](const Axis& b) { return !spanned(b); });
    MPI_Comm_split(world, color, d->RankOrderIndex(spanned), &a.comm);
  }
  // A carved dimension's groups: ep consecutive members of the group it is
  // carved from, and its complement, the members with its coordinate.
  for (Axis& a : d->axes_) {
    if (a.dim->within.empty()) continue;
    const Axis& g = d->axis(a.dim->within);
    auto in_group = [&](const Axis& b) {
      return &b == &g || b.dim->name == g.dim->also_spans;
    };
    const int others =
        d->RankOrderIndex([&](const Axis& b) { return !in_group(b); });
    const int index = static_cast<int>(
        d->layout_.GroupIndex(g.dim->name, d->layout_.Coordinates(rank)));
    const int n = a.degree;
    const int size = static_cast<int>(d->layout_.group_size(g.dim->name));
    MPI_Comm_split(world, others * size + index / n, index % n, &a.comm);
    MPI_Comm_split(world, others * size + index % n, index / n, &a.rest_comm);
  }
  // The embedding group: stage 0 and the last stage of one pipeline (the
  // tied embedding and head); only those ranks, and only when pp > 1.
  const int pp = d->pp(), pp_rank = d->pp_rank();
  const int pipeline =
      d->RankOrderIndex([](const Axis& b) { return b.dim->name != "pp"; });
  const bool tied_end = pp > 1 && (pp_rank == 0 || pp_rank == pp - 1);
  MPI_Comm_split(world, tied_end ? pipeline : MPI_UNDEFINED, pp_rank,
                 &d->emb_comm_);
  d->stats_ = std::make_shared<CommStats>();
  d->MakeRecorder();
  auto group = [&](MPI_Comm comm, const std::string& name) {
    d->recorder_->SetGroup(name, WorldRanks(comm, world));
    return MakeMpiCommunicator(comm, name, d->stats_, d->recorder_);
  };
  d->world_group_ = group(world, "world");
  for (Axis& a : d->axes_) {
    a.group = group(a.comm, std::string(a.dim->name));
    if (a.rest_comm != MPI_COMM_NULL) {
      a.rest = group(a.rest_comm, std::string(a.dim->complement));
    }
  }
  if (d->emb_comm_ != MPI_COMM_NULL) {
    d->embedding_group_ = group(d->emb_comm_, "embedding");
  }
  return d;
}

ParallelDims::~ParallelDims() {
  device_groups_.clear();
  world_group_.reset();
  embedding_group_.reset();
  for (Axis& a : axes_) {
    a.group.reset();
    a.rest.reset();
    if (a.comm != MPI_COMM_NULL) MPI_Comm_free(&a.comm);
    if (a.rest_comm != MPI_COMM_NULL) MPI_Comm_free(&a.rest_comm);
  }
  if (emb_comm_ != MPI_COMM_NULL) MPI_Comm_free(&emb_comm_);
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
  // The groups that only send and receive (staged: see comm_nccl.h) and
  // sum host numbers never take NCCL.
  std::vector<Communicator*> collective = {embedding_group_.get()};
  for (Axis& a : axes_) {
    if (a.dim->point_to_point) {
      device_groups_[a.group.get()] =
          MakeStagedCommunicator(a.group.get(), device_ops);
    } else {
      collective.insert(collective.end() - 1, a.group.get());
    }
    if (a.rest != nullptr)
      collective.insert(collective.end() - 1, a.rest.get());
  }
  for (Communicator* g : collective) {
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
  return has_mpi() ? OnDevice(axis("dp").group.get()) : nullptr;
}

Communicator* ParallelDims::Working(std::string_view name) const {
  const Axis& a = axis(name);
  return a.degree > 1 ? OnDevice(a.group.get()) : nullptr;
}

Communicator* ParallelDims::tp_comm() const { return Working("tp"); }
Communicator* ParallelDims::ep_comm() const { return Working("ep"); }

Communicator* ParallelDims::edp_comm() const {
  const Axis& a = axis("ep");
  return a.degree > 1 ? OnDevice(a.rest.get()) : nullptr;
}
Communicator* ParallelDims::pp_comm() const { return Working("pp"); }
Communicator* ParallelDims::cp_comm() const { return Working("cp"); }

Communicator* ParallelDims::embedding_comm() const {
  return embedding_group_ != nullptr ? OnDevice(embedding_group_.get())
                                     : nullptr;
}

ComputeGroups ParallelDims::compute_groups() const {
  return ComputeGroups{dp_comm(), tp_comm(),        pp_comm(),
                       cp_comm(), embedding_comm(), sequence_parallel(),
                       ep_comm(), edp_comm()};
}

std::string ParallelDims::ToString() const {
  std::string degrees, coords;
  for (const auto& [name, coord] : NamedCoordinates()) {
    absl::StrAppend(&degrees, name, "=", degree(name), " ");
    absl::StrAppend(&coords, ", ", name, "_rank ", coord);
  }
  return absl::StrCat(degrees, "zero=", zero(), " (rank ", world_rank_, " of ",
                      world_size_, ":", coords.substr(1), ")");
}

}  // namespace ptrain
