#include "worker/engine/parallel/memory_estimate.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/mesh.h"
#include "common/spec.h"
#include "kernels/footprint.h"
#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/parallel/zero_store.h"

namespace ptrain {

namespace {

constexpr int64_t kMax = INT64_MAX;
constexpr int64_t kFloat = 4;

std::string Human(int64_t bytes) {
  if (bytes == kMax) return "more than 9.2 EB";
  const double b = static_cast<double>(bytes);
  if (b >= 1e12) return absl::StrFormat("%.1f TB", b / 1e12);
  if (b >= 1e9) return absl::StrFormat("%.1f GB", b / 1e9);
  return absl::StrFormat("%.1f MB", b / 1e6);
}

std::string Bytes(int64_t bytes) {
  return bytes == kMax ? std::string("more than 2^63")
                       : absl::StrCat(bytes, " bytes");
}

}  // namespace

int64_t MemoryEstimate::total() const {
  return SatAdd(SatAdd(SatAdd(params, grads), SatAdd(optimizer, activations)),
                checkpoint);
}

int64_t MemoryEstimate::host() const {
  if (!gpu) return total();
  return SatAdd(checkpoint, offload ? optimizer : 0);
}

int64_t MemoryEstimate::device() const {
  if (!gpu) return 0;
  return SatAdd(SatAdd(params, grads),
                SatAdd(activations, offload ? 0 : optimizer));
}

MemoryEstimate EstimateRankMemory(const RankBuild& b, bool async_copy) {
  return EstimateRankMemory(
      b, async_copy,
      ZeroStore::Measure(BuildPlan(b.model, b.plan), b.replicas(), b.zero,
                         b.expert_replicas()));
}

MemoryEstimate EstimateRankMemory(const RankBuild& b, bool async_copy,
                                  const ZeroStore::Footprint& f) {
  // What attention and the MLP keep: the CPU backend of the job's precision
  // says; on a GPU (not loaded here) the most any backend keeps.
  const kernels::ActivationFootprint* ops =
      b.device != Device::kCpu
          ? nullptr
          : &kernels::CpuFootprint(b.precision == Precision::kBf16);
  MemoryEstimate e;
  e.gpu = b.device == Device::kCuda;
  e.offload = b.offload_optimizer;
  e.params = SatMul(f.params, kFloat);
  e.grads = SatMul(f.grads, kFloat);
  // Adam's two moments; offloaded, also the host's master weights and
  // gradients of what the rank updates.
  e.optimizer = SatMul(SatMul(b.offload_optimizer ? 4 : 2, f.update), kFloat);
  if (async_copy) e.checkpoint = SatMul(SatMul(3, f.update), kFloat);
  for (int c = 0; c < b.chunks(); ++c) {
    e.activations =
        SatAdd(e.activations,
               SatMul(ActivationFloats(
                          ModelPartsOf(b.model),
                          StageActivationDims::Of(
                              b.model, b.micro_B, b.T_local(), b.slots[c], b.tp,
                              b.sequence_parallel, b.recompute,
                              b.plan.stage_layers[b.stages[c]], b.last_stage(c),
                              ops, b.Stage(c).split_backward, b.cp)),
                      kFloat));
  }
  return e;
}

bool AsyncCheckpointCopy(const v1::JobSpec& spec) {
  return spec.checkpoint().async_save() && !spec.checkpoint().dir().empty();
}

std::array<int, 3> FullestStageCandidates(int pp) {
  return {0, std::min(1, pp - 1), pp - 1};
}

MemoryEstimate EstimateStageMemory(const v1::JobSpec& spec, int vocab_size,
                                   int stage) {
  return EstimateRankMemory(
      RankBuild::Of(spec, vocab_size, /*tp_rank=*/0, stage),
      AsyncCheckpointCopy(spec));
}

MemoryEstimate EstimateRankMemory(const v1::JobSpec& spec, int vocab_size) {
  MemoryEstimate most;
  for (int rank : FullestStageCandidates(JobLayout(spec).degree("pp"))) {
    const MemoryEstimate e = EstimateStageMemory(spec, vocab_size, rank);
    if (rank == 0 || e.total() > most.total()) most = e;
  }
  return most;
}

int64_t AvailableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key, unit;
    int64_t kb = 0;
    if (fields >> key >> kb >> unit && key == "MemAvailable:" && kb > 0) {
      return SatMul(kb, 1024);
    }
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? SatMul(pages, page) : 0;
}

namespace {

// The spec fields that size an estimate, for refusals.
std::string SizingFields(const v1::JobSpec& spec, int vocab_size) {
  const auto& m = spec.model();
  const ParallelLayout p = JobLayout(spec);
  const int cp = p.degree("cp");
  return absl::StrCat(
      "model.n_layer=", m.n_layer(), ", model.n_head=", m.n_head(),
      ", model.n_embd=", m.n_embd(), ", model.block_size=", m.block_size(),
      ", vocabulary ", vocab_size,
      ", train.global_batch=", spec.train().global_batch(),
      " over parallel.dp=", p.degree("dp"),
      " x parallel.microbatches=", p.microbatches, ", parallel.zero=", p.zero,
      ", parallel.tp=", p.degree("tp"),
      ", parallel.sequence_parallel=", p.sequence_parallel ? "true" : "false",
      cp > 1 ? absl::StrCat(", parallel.cp=", cp) : "",
      ", train.recompute=", spec.train().recompute());
}

// The parts of e in one memory, the rank's GPU's (device) or the host's,
// with their sizes: where each lives as MemoryEstimate::host()/device()
// count it; the checkpoint copy only when there is one.
std::string Parts(const MemoryEstimate& e, bool device) {
  struct Part {
    const char* name;
    int64_t bytes;
    bool on_device;
    bool when_any = false;  // named only when it has bytes
  };
  const Part parts[] = {
      {"params", e.params, e.gpu},
      {"grads", e.grads, e.gpu},
      {e.offload ? "offloaded optimizer" : "optimizer", e.optimizer,
       e.gpu && !e.offload},
      {"activations", e.activations, e.gpu},
      {"checkpoint.async_save copy", e.checkpoint, false, true}};
  std::string s;
  for (const Part& p : parts) {
    if (p.on_device != device || (p.when_any && p.bytes == 0)) continue;
    absl::StrAppend(&s, s.empty() ? "" : ", ", p.name, " ", Human(p.bytes));
  }
  return s;
}

}  // namespace

std::string DescribeMemory(const MemoryEstimate& e) {
  std::string s = absl::StrCat("host: ", Parts(e, /*device=*/false), " = ",
                               Human(e.host()));
  if (e.gpu) {
    absl::StrAppend(&s, "; GPU: ", Parts(e, /*device=*/true), " = ",
                    Human(e.device()));
  }
  return s;
}

namespace {

// The part of `spec`'s estimate that `device` (or the host) holds, per rank.
int64_t Need(const v1::JobSpec& spec, int vocab_size, bool device) {
  const MemoryEstimate e = EstimateRankMemory(spec, vocab_size);
  return device ? e.device() : e.host();
}

// "; with X each rank would need N, which fits" for the first change of
// spec (full recomputation, the optimizer offloaded) that fits `available`
// `ranks` times over; else "".
std::string FitHint(const v1::JobSpec& spec, int vocab_size, bool device,
                    int64_t ranks, int64_t available) {
  std::vector<std::pair<std::string, v1::JobSpec>> changes;
  if (RecomputeOf(spec.train().recompute()) != Recompute::kFull) {
    v1::JobSpec recomputed = spec;
    recomputed.mutable_train()->set_recompute("full");
    changes.emplace_back("train.recompute=full", recomputed);
  }
  if (device && !JobLayout(spec).offload_optimizer) {
    v1::JobSpec offloaded = spec;
    if (ApplyOverride(&offloaded, "parallel.offload=optimizer").ok()) {
      changes.emplace_back("parallel.offload=optimizer", offloaded);
    }
  }
  for (const auto& [change, changed] : changes) {
    const int64_t need = Need(changed, vocab_size, device);
    if (SatMul(need, ranks) <= available) {
      return absl::StrCat("; with ", change, " each rank would need ",
                          Human(need), device ? " of its GPU" : "",
                          ", which fits");
    }
  }
  return "";
}

}  // namespace

absl::Status CheckMemoryFits(const v1::JobSpec& spec, int vocab_size,
                             int ranks_on_node, int64_t available_bytes,
                             int64_t gpu_bytes) {
  const MemoryEstimate e = EstimateRankMemory(spec, vocab_size);
  if (e.gpu && gpu_bytes > 0 && e.device() > gpu_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "GPU memory: each rank needs ", Bytes(e.device()), " (",
        Human(e.device()), ": ", Parts(e, /*device=*/true), ") on its GPU for ",
        SizingFields(spec, vocab_size),
        e.offload ? ", parallel.offload=optimizer" : "", "; its GPU has ",
        gpu_bytes, " bytes (", Human(gpu_bytes), ")",
        FitHint(spec, vocab_size, /*device=*/true, 1, gpu_bytes)));
  }
  if (available_bytes <= 0) return absl::OkStatus();
  const int64_t ranks = std::max(ranks_on_node, 1);
  const int64_t need = SatMul(e.host(), ranks);
  if (need <= available_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "memory: each rank needs ", Bytes(e.host()), " (", Human(e.host()), ": ",
      e.gpu ? "in host memory, " : "", Parts(e, /*device=*/false), ") for ",
      SizingFields(spec, vocab_size),
      e.offload ? ", parallel.offload=optimizer" : "", "; ", ranks,
      ranks == 1 ? " rank" : " ranks", " on this machine need ", Bytes(need),
      " but it has ", available_bytes, " bytes (", Human(available_bytes),
      ") available",
      e.gpu ? ""
            : FitHint(spec, vocab_size, /*device=*/false, ranks,
                      available_bytes)));
}

}  // namespace ptrain
