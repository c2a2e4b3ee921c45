// `ptworker profile`: measures on this machine what a layout planner's cost
// model reads, and writes it as one small JSON file (the hardware profile).
// Not a benchmark that passes or fails: the figures are what they are.
//
// It times the engine's own kernels (kernels/ops.h, the backend a training
// rank would get): matmul_forward and matmul_backward by shape (rows m = B·T,
// n output and k input channels) at one thread and at every core of this
// rank (CPU), attention_forward and attention_backward by sequence length, a
// bandwidth-bound op (Add) and the optimizer (adamw_update). Under mpirun it
// also times the engine's collectives (worker/engine/comm/comm.h) over
// groups of 2, 4, ... consecutive ranks and fits, for each collective and
// kind of link, the nccl-tests model time = alpha + f(p)·n / busbw. Rank 0
// measures the kernels (the other ranks sleep meanwhile) and writes the file.
//
// The file (format "ptrain-profile/1"; every number positive):
//   {"format", "name", "source", "device": "cpu"|"cuda", "memory_bytes",
//    "cores" (cpu),
//    "matmul": [{"precision", "pass": "forward"|"backward", "m", "n", "k",
//                "threads" (cpu), "flops_per_s"}],   2·m·n·k FLOPs forward,
//                                                    4·m·n·k backward
//    "attention": [{"precision", "B", "T", "C", "heads", "threads" (cpu),
//                   "forward_s", "backward_s"}],    seconds per call
//    "elementwise_bytes_per_s", "optimizer_params_per_s",
//    "links": {"intra_node"|"inter_node": {"allreduce"|"allgather"|
//              "reduce_scatter"|"sendrecv"|"alltoall":
//              {"alpha_s", "bus_bytes_per_s"}}}}     world > 1 only
#ifndef PTRAIN_WORKER_PROFILE_H_
#define PTRAIN_WORKER_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "planner/profile.h"
#include "worker/threads.h"

namespace ptrain {

inline constexpr char kProfileFormat[] = "ptrain-profile/1";

// The flags of `ptworker profile`.
struct ProfileFlags {
  std::string device = "cpu";  // cpu | cuda
  std::string out;             // the profile's path; its folder must exist
  bool quick = false;          // smaller grids and fewer repetitions (CI)
};

// `ptworker profile`: measures, rank 0 writes flags.out (atomically) and
// prints one summary line per family on stdout. Returns ptworker's exit
// code: 0, 2 for bad input (one error line naming the flag, nothing
// written), 1 otherwise. Collective over MPI_COMM_WORLD.
int RunProfile(const ProfileFlags& flags, const NodeShare& node);

// The collectives a profile fits and their nccl-tests bus factors are the
// planner's (planner/profile.h), whose reader takes the file.
using planner::BusFactor;
using planner::Collective;
using planner::CollectiveName;
using planner::kCollectives;

// One timed call: `bytes` the whole buffer (per-rank count × p for
// all-gather and reduce-scatter, each rank's send buffer for all-to-all, the
// message for send/recv) over a group of `ranks`.
struct LinkPoint {
  double bytes = 0.0;
  int ranks = 2;
  double seconds = 0.0;
};
struct LinkFit {
  double alpha_s = 0.0;          // ≥ 0
  double bus_bytes_per_s = 0.0;  // > 0
};
// The least-squares fit of seconds = alpha + BusFactor(c, ranks)·bytes /
// busbw over `points` (at least one, every value positive), in relative
// error (each point weighted by 1/seconds²: the small messages that set
// alpha count as much as the large ones that set the bandwidth). alpha is
// clamped at 0 (then busbw is refitted through the origin) and busbw kept
// positive and finite (time that does not grow with size: 1e15 bytes/s).
LinkFit FitLink(Collective c, const std::vector<LinkPoint>& points);

// The measurements (profile_measure.cc).

struct MatmulRate {
  std::string precision, pass;  // "fp32"|"bf16", "forward"|"backward"
  int64_t m = 0, n = 0, k = 0;
  int threads = 0;  // 0 on a GPU
  double flops_per_s = 0.0;
};
struct AttentionTime {
  std::string precision;
  int B = 0, T = 0, C = 0, heads = 0;
  int threads = 0;  // 0 on a GPU
  double forward_s = 0.0, backward_s = 0.0;
};
struct ComputeProfile {
  std::vector<MatmulRate> matmul;
  std::vector<AttentionTime> attention;
  double elementwise_bytes_per_s = 0.0;
  double optimizer_params_per_s = 0.0;
};
// Times the kernels of `ops`, its matmuls in `precision` (its activation
// type), at each count of `threads` (OpenMP threads, the CPU; {0} on a GPU,
// whose entries carry none); the elementwise op and the optimizer at the
// last count. Leaves the OpenMP threads as it found them.
ComputeProfile MeasureCompute(kernels::Ops* ops,
                              const std::vector<int>& threads, bool quick);

// One fitted point's origin: the kind of link its group spans
// ("intra_node" when every rank of it runs on one host, else "inter_node").
struct LinkSample {
  std::string link;
  Collective op = Collective::kAllReduce;
  LinkPoint point;
};
// Times each collective over groups of p = 2, 4, ... consecutive ranks of
// MPI_COMM_WORLD (p ≤ the world size; the last world % p ranks sit out), all
// groups of a size at once, over `ops`' memory (a GPU backend's groups
// through ParallelDims::AttachDevice). Send/recv is a ping-pong between
// ranks 0 and p/2 of each group (the pair of a group of 2 is the group),
// its link the pair's. Each point is the best over repetitions of the
// slowest rank of the group. Collective over MPI_COMM_WORLD; rank 0 gets
// every group's points, the other ranks none.
std::vector<LinkSample> MeasureLinks(kernels::Ops* ops, bool quick);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_PROFILE_H_
