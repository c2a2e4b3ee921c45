#include "worker/engine/memory_estimate.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/spec.h"
#include "worker/engine/gpt_stage.h"
#include "worker/engine/zero_store.h"

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

MemoryEstimate EstimateRankMemory(const RankBuild& b, bool async_copy) {
  // What attention and the MLP keep: the CPU backend of the job's precision
  // says; on a GPU (not loaded here) the most any backend keeps.
  const kernels::Ops* ops = b.device != Device::kCpu ? nullptr
                            : b.precision == Precision::kBf16
                                ? &kernels::CpuBf16Ops()
                                : &kernels::CpuOps();
  const ZeroStore::Footprint f =
      ZeroStore::Measure(BuildPlan(b.model, b.plan), b.replicas(), b.zero);
  MemoryEstimate e;
  e.params = SatMul(f.params, kFloat);
  e.grads = SatMul(f.grads, kFloat);
  // Adam's two moments; offloaded, also the host's master weights and
  // gradients of what the rank updates.
  e.optimizer = SatMul(SatMul(b.offload_optimizer ? 4 : 2, f.update), kFloat);
  if (async_copy) e.checkpoint = SatMul(SatMul(3, f.update), kFloat);
  for (int c = 0; c < b.chunks(); ++c) {
    e.activations =
        SatAdd(e.activations,
               SatMul(GptStage::ActivationFloats(
                          b.model, b.micro_B, b.T_local(), b.slots[c], b.tp,
                          b.sequence_parallel, b.recompute,
                          b.plan.stage_layers[b.stages[c]], b.last_stage(c),
                          ops, b.Stage(c).split_backward, b.cp),
                      kFloat));
  }
  return e;
}

MemoryEstimate EstimateRankMemory(const v1::JobSpec& spec, int vocab_size) {
  const int pp = spec.parallel().pp();
  const bool async_copy =
      spec.checkpoint().async_save() && !spec.checkpoint().dir().empty();
  // The rank that needs the most: ranks differ in their tensors (the first
  // embeds, the last holds the head) and in microbatches in flight (fewer
  // further down a pipeline), so the candidates are the first, the second
  // (the fullest of the middle ones) and the last.
  MemoryEstimate most;
  for (int rank : {0, std::min(1, pp - 1), pp - 1}) {
    const MemoryEstimate e = EstimateRankMemory(
        RankBuild::Of(spec, vocab_size, /*tp_rank=*/0, rank), async_copy);
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

absl::Status CheckMemoryFits(const v1::JobSpec& spec, int vocab_size,
                             int ranks_on_node, int64_t available_bytes) {
  if (available_bytes <= 0) return absl::OkStatus();
  const MemoryEstimate e = EstimateRankMemory(spec, vocab_size);
  const int64_t ranks = std::max(ranks_on_node, 1);
  const int64_t need = SatMul(e.total(), ranks);
  if (need <= available_bytes) return absl::OkStatus();
  const auto& m = spec.model();
  const auto& p = spec.parallel();
  // What recomputing the blocks would need, when that would fit.
  std::string hint;
  if (RecomputeOf(spec.train().recompute()) != Recompute::kFull) {
    v1::JobSpec recomputed = spec;
    recomputed.mutable_train()->set_recompute("full");
    const int64_t full = EstimateRankMemory(recomputed, vocab_size).total();
    if (SatMul(full, ranks) <= available_bytes) {
      hint = absl::StrCat("; with train.recompute=full each rank would need ",
                          Human(full), ", which fits");
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "memory: each rank needs ", Bytes(e.total()), " (", Human(e.total()),
      ": params ", Human(e.params), ", grads ", Human(e.grads), ", optimizer ",
      Human(e.optimizer), ", activations ", Human(e.activations),
      e.checkpoint > 0
          ? absl::StrCat(", checkpoint.async_save copy ", Human(e.checkpoint))
          : "",
      ") for model.n_layer=", m.n_layer(), ", model.n_head=", m.n_head(),
      ", model.n_embd=", m.n_embd(), ", model.block_size=", m.block_size(),
      ", vocabulary ", vocab_size, ", train.global_batch=",
      spec.train().global_batch(), " over parallel.dp=", p.dp(),
      " x parallel.microbatches=", p.microbatches(),
      ", parallel.zero=", p.zero(), ", parallel.tp=", p.tp(),
      ", parallel.sequence_parallel=", p.sequence_parallel() ? "true" : "false",
      p.cp() > 1 ? absl::StrCat(", parallel.cp=", p.cp()) : "",
      ", train.recompute=", spec.train().recompute(), "; ", ranks,
      ranks == 1 ? " rank" : " ranks", " on this machine need ", Bytes(need),
      " but it has ", available_bytes, " bytes (", Human(available_bytes),
      ") available", hint));
}

}  // namespace ptrain
