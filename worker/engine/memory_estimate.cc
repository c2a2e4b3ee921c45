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
#include "worker/engine/schedule.h"
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

GptConfig ModelConfig(const v1::JobSpec& spec, int vocab_size) {
  const auto& m = spec.model();
  GptConfig c{m.n_layer(), m.n_head(), m.n_embd(), m.block_size(), vocab_size};
  c.padded_vocab = PaddedVocab(vocab_size, spec.parallel().tp());
  return c;
}

PlanOptions SpecPlan(const v1::JobSpec& spec, int tp_rank, int pp_rank) {
  const auto& p = spec.parallel();
  PlanOptions plan;
  plan.tp = p.tp();
  plan.tp_rank = tp_rank;
  plan.pp = p.pp();
  plan.pp_rank = pp_rank;
  plan.pad = p.dp();
  plan.virtual_stages = p.virtual_stages();
  absl::StatusOr<std::vector<int>> layers =
      PipelineStageLayers(p, spec.model().n_layer());
  PT_CHECK(layers.ok(), std::string(layers.status().message()).c_str());
  plan.stage_layers = *std::move(layers);
  return plan;
}

int64_t MemoryEstimate::total() const {
  return SatAdd(SatAdd(SatAdd(params, grads), SatAdd(optimizer, activations)),
                checkpoint);
}

MemoryEstimate EstimateRankMemory(const v1::JobSpec& spec, int vocab_size) {
  const auto& p = spec.parallel();
  const GptConfig config = ModelConfig(spec, vocab_size);
  const int micro_B = spec.train().global_batch() / (p.dp() * p.microbatches());
  const ScheduleKind kind = ScheduleKindOf(p.schedule());
  const int v = p.virtual_stages();
  // What attention and the MLP keep: the CPU backend of the job's precision
  // says; on a GPU (not loaded here) the most any backend keeps.
  const kernels::Ops* ops = spec.resources().device() != "cpu" ? nullptr
                            : spec.train().precision() == "bf16"
                                ? &kernels::CpuBf16Ops()
                                : &kernels::CpuOps();
  // The rank that needs the most: ranks differ in their tensors (the first
  // embeds, the last holds the head) and in microbatches in flight (fewer
  // further down a pipeline), so the candidates are the first, the second
  // (the fullest of the middle ones) and the last.
  MemoryEstimate most;
  for (int rank : {0, std::min(1, p.pp() - 1), p.pp() - 1}) {
    const PlanOptions plan = SpecPlan(spec, 0, rank);
    const ZeroStore::Footprint f = ZeroStore::Measure(
        BuildPlan(config, plan), p.dp(),
        ZeroOptions{p.zero(), p.microbatches(), p.bucket_bytes(),
                    /*reduce_once_per_step=*/p.pp() > 1});
    // The trainer's slots per chunk.
    const std::vector<int> slots =
        ChunkSlots(kind, p.pp(), rank, p.microbatches(), v);
    MemoryEstimate e;
    e.params = SatMul(f.params, kFloat);
    e.grads = SatMul(f.grads, kFloat);
    e.optimizer = SatMul(SatMul(2, f.update), kFloat);
    if (spec.checkpoint().async_save() && !spec.checkpoint().dir().empty()) {
      e.checkpoint = SatMul(SatMul(3, f.update), kFloat);
    }
    const std::vector<int> stages = RankStages(plan);
    for (int c = 0; c < v; ++c) {
      e.activations = SatAdd(e.activations,
                             SatMul(GptStage::ActivationFloats(
                                        config, micro_B, config.block_size,
                                        slots[c], p.tp(), p.sequence_parallel(),
                                        RecomputeOf(spec.train().recompute()),
                                        plan.stage_layers[stages[c]],
                                        stages[c] == p.pp() * v - 1, ops),
                                    kFloat));
    }
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
  if (spec.train().recompute() != "full") {
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
      ", train.recompute=", spec.train().recompute(), "; ", ranks,
      ranks == 1 ? " rank" : " ranks", " on this machine need ", Bytes(need),
      " but it has ", available_bytes, " bytes (", Human(available_bytes),
      ") available", hint));
}

}  // namespace ptrain
