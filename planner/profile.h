// A hardware profile: what the layout planner's cost model knows of the
// machines a job would run on: matmul throughput over a grid of shapes,
// the attention's time by sequence length, elementwise bandwidth, the
// optimizer's rate, the memory of one rank and, per link class (within a
// node, between nodes), each collective's latency and bus bandwidth.
// `ptworker profile` measures one (worker/profile.cc); the profiles of
// GPUs we may not have (H100 SXM, H200, A100 80GB) ship with the project,
// built from published figures and stated efficiencies
// (planner/profiles/, scripts/gpu_profiles.py). docs/planner.md documents
// the file.
#ifndef PTRAIN_PLANNER_PROFILE_H_
#define PTRAIN_PLANNER_PROFILE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ptrain::planner {

// The collectives the engine uses, as the profile names them.
enum class Collective {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kSendRecv,
  kAllToAll
};
inline constexpr Collective kCollectives[] = {
    Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
    Collective::kSendRecv, Collective::kAllToAll};
inline constexpr int kCollectiveCount = 5;
// "allreduce", "allgather", "reduce_scatter", "sendrecv", "alltoall".
const char* CollectiveName(Collective c);

// One collective over one link class: time = alpha + f(p)·bytes/bus
// bandwidth, where bytes is the whole buffer and f the NCCL-tests factor
// (2(p−1)/p for all-reduce, (p−1)/p for all-gather, reduce-scatter and
// all-to-all, 1 for a send/receive pair).
struct LinkCost {
  double alpha_s = 0;
  double bus_bytes_per_s = 0;
};
// f(p) above.
double BusFactor(Collective c, int p);

// The link classes: a group whose ranks share a node, or one that spans
// nodes.
enum class LinkClass { kIntraNode, kInterNode };
const char* LinkClassName(LinkClass c);  // "intra_node", "inter_node"

struct HardwareProfile {
  std::string name, source;
  std::string device;        // "cpu" | "cuda"
  int64_t memory_bytes = 0;  // one GPU's; a CPU node's host memory
  int cores = 0;             // the CPU's cores (cpu profiles)

  struct Matmul {
    std::string precision;  // "fp32" | "bf16"
    bool backward = false;  // pass "backward": dinp and dweight (4·m·n·k)
    int64_t m = 0, n = 0, k = 0;
    int threads = 0;  // cpu: the OpenMP threads it ran on; 0: n/a
    double flops_per_s = 0;
  };
  std::vector<Matmul> matmul;

  struct Attention {
    std::string precision;
    int64_t B = 0, T = 0, C = 0, heads = 0;
    int threads = 0;
    double forward_s = 0, backward_s = 0;  // one call each, causal
  };
  std::vector<Attention> attention;

  double elementwise_bytes_per_s = 0;
  double optimizer_params_per_s = 0;  // AdamW parameters updated a second
  // Optional: the published dense peak per precision, MFU's denominator;
  // absent, the fastest matmul of the grid.
  std::vector<std::pair<std::string, double>> peak_flops_per_s;

  // links.intra_node / inter_node; unset: not in the file.
  std::optional<std::array<LinkCost, kCollectiveCount>> links[2];

  // --- what the cost model asks ---
  // FLOP/s of a matmul of m×k by k×n in `precision` on `threads` threads
  // (cpu; 0 on a GPU), the forward or the backward: interpolated over the
  // grid (inverse-distance over log m, log n, log k of the nearest
  // points), linearly in threads between the measured thread counts and
  // scaled down below the fewest (a rank that gets part of a core).
  double MatmulFlopsPerS(std::string_view precision, bool backward, double m,
                         double n, double k, double threads) const;
  // Seconds of one causal attention forward (or backward) of B sequences
  // of T positions over C channels in heads of `head` channels, scaled as
  // B·T²·C from the entry nearest in head size, then in T.
  double AttentionSeconds(std::string_view precision, bool backward, double B,
                          double T, double C, double head,
                          double threads) const;
  // Seconds of a collective of `bytes` over `p` ranks on a link class;
  // 0 for p ≤ 1. The class must be in the profile (HasLink).
  double CollectiveSeconds(LinkClass link, Collective c, int p,
                           double bytes) const;
  bool HasLink(LinkClass link) const {
    return links[static_cast<int>(link)].has_value();
  }
  // The dense peak of `precision`: peak_flops_per_s, else the fastest
  // forward matmul of the grid at the most threads.
  double PeakFlopsPerS(std::string_view precision) const;
  // The most threads a matmul of the grid ran on (cpu), else 0.
  int MaxThreads() const;
};

// The profile in `json` (from `origin`, for messages): every error names
// the field and the rule ("profile h100.json: matmul[3].flops_per_s must
// be > 0").
absl::StatusOr<HardwareProfile> ParseProfile(std::string_view json,
                                             std::string_view origin);
// A profile shipped with the project by name ("a100", "h100", "h200"), or
// a file's path.
absl::StatusOr<HardwareProfile> LoadProfile(std::string_view name_or_path);
// The names of the shipped profiles.
std::vector<std::string> BuiltinProfileNames();

}  // namespace ptrain::planner

#endif  // PTRAIN_PLANNER_PROFILE_H_
