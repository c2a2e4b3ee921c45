#include "worker/engine/train/run_report.h"

#include <omp.h>

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mesh.h"
#include "common/spec.h"
#include "kernels/backends.h"
#include "spdlog/spdlog.h"
#include "worker/engine/model/flops.h"

namespace ptrain {

Busy::Busy(const TrainerOptions& options, FlightRecorder* recorder,
           FlightPhase phase, const char* what)
    : options_(options) {
  if (recorder != nullptr) recorder->Enter(phase);
  if (options_.on_activity) options_.on_activity(what);
}

Busy::~Busy() {
  if (options_.on_activity) options_.on_activity("");
}

RunReport::RunReport(const v1::JobSpec& spec, const TrainerOptions& options,
                     ParallelDims* dims, const RankBuild& build)
    : spec_(spec), options_(options), dims_(dims), build_(build) {}

absl::Status RunReport::Open() {
  run_log_ = std::make_unique<RunLog>();
  if (!options_.log_json_path.empty() && log_rank()) {
    auto opened = RunLog::Open(options_.log_json_path);
    if (!opened.ok()) return opened.status();
    run_log_ = std::move(*opened);
  }
  return absl::OkStatus();
}

void RunReport::Emit(const nlohmann::json& record) {
  run_log_->Write(record);
  if (options_.on_record && log_rank()) options_.on_record(record);
}

void RunReport::MeasurePeak(kernels::Ops* compute) {
  // MFU's denominator: the measured matmul peak of what trains, the CPU's
  // sgemm or the GPU's matmul in the job's precision.
  if (options_.peak_flops > 0) {
    peak_flops_ = options_.peak_flops;
    return;
  }
  Busy busy = Scope(FlightPhase::kSetup, "measuring the matmul peak");
  const double measured = compute != nullptr ? MeasureMatmulPeakFlops(*compute)
                                             : MeasureSgemmPeakFlops();
  peak_flops_ = BestPeakFlops(
      measured,
      PeakCacheKey(compute != nullptr ? compute->name() : "cpu sgemm",
                   omp_get_max_threads()),
      PeakCachePath());
}

void RunReport::Start(const MemoryBytes& mem, const GptConfig& model,
                      int vocab_size, kernels::Ops* compute,
                      const std::string& graphs_unavailable,
                      const std::string& resumed_from, int64_t start_step) {
  spdlog::info(
      "model: {} parameters (L={} NH={} C={} T={} V={}), {} threads, {} "
      "matmul peak {:.1f} GFLOP/s",
      GptNumParams(model), spec_.model().n_layer(), spec_.model().n_head(),
      spec_.model().n_embd(), build_.T, vocab_size, omp_get_max_threads(),
      compute != nullptr ? compute->name() : "cpu sgemm", peak_flops_ / 1e9);
  spdlog::info(
      "memory per rank: params {:.1f} MB, grads {:.1f} MB, optimizer {:.1f} "
      "MB, activations {:.1f} MB",
      mem.params / 1e6, mem.grads / 1e6, mem.optimizer / 1e6,
      mem.activations / 1e6);
  if (options_.metrics != nullptr) options_.metrics->SetMemory(mem);
  if (CudaGraphsOf(spec_) != CudaGraphs::kOff) {
    if (graphs_unavailable.empty()) {
      spdlog::info(
          "cuda graphs: each microbatch's forward and backward recorded at "
          "its second run, then replayed");
    } else {
      spdlog::info("train.cuda_graphs=auto: launching op by op ({})",
                   graphs_unavailable);
    }
  }
  const ParallelLayout& par = dims_->layout();
  nlohmann::json layout = {{"type", "layout"},
                           {"world", dims_->world_size()},
                           {"zero", par.zero},
                           {"sequence_parallel", par.sequence_parallel},
                           {"microbatches", par.microbatches},
                           {"schedule", build_.pp > 1 ? par.schedule : "none"},
                           {"virtual_stages", par.virtual_stages},
                           {"stage_layers", build_.plan.stage_layers}};
  for (const MeshDimension& d : MeshDimensions()) {
    layout[std::string(d.name)] = dims_->degree(d.name);
  }
  Emit(layout);
  if (!resumed_from.empty()) {
    // The checkpoint this attempt starts from, read off the directory: it may
    // be newer than the previous attempt's last "checkpoint" record, when that
    // attempt died between committing a checkpoint and logging it.
    Emit({{"type", "resume"}, {"step", start_step}, {"dir", resumed_from}});
  }
  Emit({{"type", "memory"},
        {"params_bytes", mem.params},
        {"grads_bytes", mem.grads},
        {"optimizer_bytes", mem.optimizer},
        {"activations_bytes", mem.activations}});
  if (options_.metrics != nullptr && !spec_.checkpoint().dir().empty() &&
      spec_.checkpoint().every() > 0) {
    options_.metrics->OnCheckpointPolicy(spec_.checkpoint().every());
  }
}

absl::Status RunReport::Step(int64_t step, const StepResult& r,
                             double flops_per_step, bool gpu) {
  const auto& train = spec_.train();
  const double tokens_per_step =
      static_cast<double>(train.global_batch()) * build_.T;
  const double tok_per_s = tokens_per_step / r.seconds;
  // Model FLOPs of the global batch over the peak of every rank.
  const double mfu =
      flops_per_step / r.seconds / (peak_flops_ * dims_->world_size());
  if (!mfu_warned_ && log_rank()) {
    const std::string w =
        MfuAbovePeakWarning(mfu, peak_flops_, options_.peak_flops <= 0);
    mfu_warned_ = !w.empty();
    if (mfu_warned_) spdlog::warn("step {:>6} | {}", step, w);
  }
  if (options_.metrics != nullptr) {
    options_.metrics->OnStep(step, r.loss, r.seconds, tok_per_s, mfu, r.phases);
    options_.metrics->UpdateComm(*dims_->comm_stats());
    if (gpu) {
      const kernels::CudaMemory memory = kernels::CudaMemoryInfo();
      options_.metrics->SetGpuMemory(memory.used, memory.total);
    }
  }
  if (options_.on_rank_step) {
    RankStep rank_step;
    rank_step.step = step;
    rank_step.seconds = r.seconds;
    rank_step.comm_exposed = r.comm_exposed;
    for (const auto& [key, stat] : dims_->comm_stats()->Snapshot()) {
      rank_step.comm_seconds[key.first] += stat.seconds;  // key: (group, op)
    }
    options_.on_rank_step(rank_step);
  }
  if (!std::isfinite(r.loss)) {
    return absl::InternalError(
        absl::StrCat("loss is ", r.loss, " at step ", step));
  }
  Emit({{"type", "step"},
        {"step", step},
        {"loss", r.loss},
        {"lr", r.lr},
        {"ms", r.seconds * 1e3},
        {"tok_per_s", tok_per_s},
        {"mfu", mfu},
        {"grad_norm", r.grad_norm},
        {"comm_exposed_ms", r.comm_exposed * 1e3}});
  const bool logged =
      step == 1 || step % train.log_every() == 0 || step == train.steps();
  if (!options_.quiet && logged) {
    spdlog::info(
        "step {:>6}/{} | loss {:.6f} | lr {:.2e} | norm {:.3f} | {:.1f} ms | "
        "{:.0f} tok/s | MFU {:.1f}%",
        step, train.steps(), r.loss, r.lr, r.grad_norm, r.seconds * 1e3,
        tok_per_s, 100.0 * mfu);
  }
  if (!r.experts.layers.empty()) Experts(step, r.experts, logged);
  for (const StepFeed::EpochBegun& e : r.epochs_begun) {
    const std::string name = BlendSourceName(spec_.data().blend(e.source));
    if (log_rank()) {
      spdlog::info(
          "step {:>6} | data.blend source {} begins epoch {}: it ran out, "
          "its windows come again in another order",
          step, name, e.epoch);
    }
    Emit({{"type", "epoch"},
          {"step", step},
          {"source", name},
          {"epoch", e.epoch}});
  }
  return absl::OkStatus();
}

void RunReport::Experts(int64_t step, const ExpertLoad& load, bool logged) {
  if (!log_rank()) return;  // every rank has the same figures
  if (options_.metrics != nullptr) options_.metrics->OnExperts(load);
  if (!logged) return;
  nlohmann::json layers = nlohmann::json::array();
  double dropped = 0, choices = 0, worst = 0;
  int worst_layer = 0;
  for (const ExpertLoad::Layer& l : load.layers) {
    layers.push_back({{"layer", l.layer},
                      {"tokens", l.tokens},
                      {"dropped", l.dropped},
                      {"imbalance", l.imbalance()}});
    dropped += l.dropped;
    for (double n : l.tokens) choices += n;
    if (l.imbalance() > worst) worst = l.imbalance(), worst_layer = l.layer;
  }
  choices += dropped;
  Emit({{"type", "experts"},
        {"step", step},
        {"aux_loss", load.aux_loss},
        {"layers", std::move(layers)}});
  if (options_.quiet) return;
  spdlog::info(
      "step {:>6} | experts: imbalance {:.2f} (layer {}) | dropped {:.0f} "
      "({:.2f}%) | balance loss {:.5f}",
      step, worst, worst_layer, dropped,
      choices > 0 ? 100.0 * dropped / choices : 0.0, load.aux_loss);
}

void RunReport::Eval(int64_t step, const EvalResult& val,
                     const std::vector<BlendPart>& blend) {
  std::vector<std::pair<std::string, double>> sources;
  nlohmann::json by_source = nlohmann::json::object();
  std::string line;
  for (size_t k = 0; k < val.sources.size(); ++k) {
    sources.emplace_back(blend[k].name, val.sources[k]);
    by_source[blend[k].name] = val.sources[k];
    absl::StrAppend(&line, " | ", blend[k].name, " ",
                    absl::StrFormat("%.6f", val.sources[k]));
  }
  if (options_.metrics != nullptr) options_.metrics->OnEval(val.loss, sources);
  spdlog::info("step {:>6} | val loss {:.6f}{}", step, val.loss, line);
  nlohmann::json record = {
      {"type", "eval"}, {"step", step}, {"val_loss", val.loss}};
  if (!sources.empty()) record["val_loss_by_source"] = std::move(by_source);
  Emit(record);
}

void RunReport::Sample(int64_t step, const std::string& text) {
  spdlog::info("sample at step {}:\n{}", step, text);
  Emit({{"type", "sample"}, {"step", step}, {"text", text}});
}

void RunReport::Checkpoint(int64_t step, const std::string& dir, double blocked,
                           std::optional<double> written) {
  if (options_.metrics != nullptr) options_.metrics->OnCheckpoint(blocked);
  nlohmann::json record = {{"type", "checkpoint"},
                           {"step", step},
                           {"dir", dir},
                           {"seconds", blocked}};
  if (written.has_value()) {
    spdlog::info(
        "step {:>6} | checkpoint {} ({:.2f} s blocked; written in the "
        "background in {:.2f} s)",
        step, dir, blocked, *written);
    record["write_seconds"] = *written;
  } else {
    spdlog::info("step {:>6} | checkpoint {} ({:.2f} s)", step, dir, blocked);
  }
  Emit(record);
}

}  // namespace ptrain
