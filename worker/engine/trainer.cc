#include "worker/engine/trainer.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <new>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/check.h"
#include "common/gpu_inventory.h"
#include "common/spec.h"
#include "common/tokenizer.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/ops_cuda.h"
#include "spdlog/spdlog.h"
#include "worker/engine/checkpoint_state.h"
#include "worker/engine/flops.h"
#include "worker/engine/memory_estimate.h"
#include "worker/engine/rng.h"

namespace ptrain {

namespace {
using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
// The GPU of every rank, in rank order, when ptcoord chose them
// (PTRAIN_RANK_GPUS, "2,3,0,1": indices as the node's driver numbers its
// GPUs); empty otherwise, when a node's ranks take its GPUs in turn.
constexpr char kRankGpusEnv[] = "PTRAIN_RANK_GPUS";
absl::StatusOr<std::vector<int>> RankGpus(int world, int gpus) {
  const char* v = std::getenv(kRankGpusEnv);
  std::vector<int> out;
  if (v == nullptr || *v == '\0') return out;
  for (absl::string_view part : absl::StrSplit(v, ',')) {
    int g = -1;
    if (!absl::SimpleAtoi(part, &g) || g < 0 || g >= gpus) {
      return absl::InvalidArgumentError(
          absl::StrCat(kRankGpusEnv, "=", v, ": '", part,
                       "' is not a GPU of this node (0..", gpus - 1, ")"));
    }
    out.push_back(g);
  }
  if (static_cast<int>(out.size()) != world) {
    return absl::InvalidArgumentError(
        absl::StrCat(kRankGpusEnv, "=", v, ": ", out.size(),
                     " GPUs for a world of ", world, " ranks"));
  }
  return out;
}

// The GPU of this rank where resources.device is cuda, else -1;
// InvalidArgument when the device is neither or the node's GPUs do not do.
absl::StatusOr<int> RankGpu(const v1::JobSpec& spec, const ParallelDims& dims) {
  if (spec.resources().device() != "cpu" &&
      spec.resources().device() != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.device=", spec.resources().device(),
                     ": must be cpu or cuda"));
  }
  if (SpecDevice(spec) != Device::kCuda) return -1;
  if (const std::string why = kernels::CudaUnavailableReason(); !why.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.device=cuda: ", why));
  }
  const int gpus = kernels::CudaDeviceCount();
  auto rank_gpus = RankGpus(dims.world_size(), gpus);
  if (!rank_gpus.ok()) return rank_gpus.status();
  const int local = dims.local_size();
  if (local > gpus && !RanksShareGpus()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resources.device=cuda: ", local, " ranks on this node but ", gpus,
        " GPU(s): one rank per GPU (lower resources.ranks_per_node, or set "
        "PTRAIN_CUDA_SHARE_GPUS=1 to let ranks share GPUs)"));
  }
  // The GPU ptcoord chose for this rank, else the node's ranks take its
  // GPUs in turn.
  return !rank_gpus->empty() ? (*rank_gpus)[dims.world_rank()]
                             : dims.local_rank() % gpus;
}

// InvalidArgument where the job's precision cannot run here: bf16 on a CPU
// without AVX512_BF16, or on a GPU (`gpu`; -1 on the cpu) without bf16
// tensor cores.
absl::Status CheckPrecision(const v1::JobSpec& spec, int gpu) {
  if (SpecPrecision(spec) != Precision::kBf16) return absl::OkStatus();
  if (SpecDevice(spec) == Device::kCpu && !kernels::CpuHasBf16()) {
    return absl::InvalidArgumentError(
        "train.precision=bf16 with resources.device=cpu needs a CPU with "
        "AVX512_BF16 (this one has none, or ONEDNN_MAX_CPU_ISA forbids it): "
        "use fp32 or auto");
  }
  if (SpecDevice(spec) == Device::kCuda) {
    const std::string why =
        kernels::Bf16Unsupported(kernels::CudaComputeCapability(gpu));
    if (!why.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train.precision=", spec.train().precision(),
          spec.train().precision() == "auto" ? " (bf16 on cuda)" : "",
          " with resources.device=cuda: ", why, ": use fp32"));
    }
  }
  return absl::OkStatus();
}

// The memory of the rank's own GPU (`gpu`; -1 on the cpu) its estimate is
// checked against: 0 (no check) on the cpu and where ranks share a GPU.
int64_t RankGpuBytes(const TrainerOptions& options, const ParallelDims& dims,
                     int gpu) {
  if (gpu < 0) return 0;
  if (options.gpu_memory_bytes.has_value()) return *options.gpu_memory_bytes;
  return dims.local_size() > kernels::CudaDeviceCount()
             ? 0
             : kernels::CudaTotalMemory(gpu);
}

// The token drawn from `logits` (V of them): softmax at
// train.sample_temperature over the train.sample_top_k largest (all when 0),
// at the point `random` (64 random bits) of its cumulative sum; at
// temperature 0 the likeliest (the first of equals). `order` and `probs` (V
// each) are scratch.
int PickToken(const float* logits, int V, const v1::TrainSpec& train,
              uint64_t random, std::vector<int>* order,
              std::vector<float>* probs) {
  const double temp = train.sample_temperature();
  if (temp == 0)
    return static_cast<int>(std::max_element(logits, logits + V) - logits);
  std::iota(order->begin(), order->end(), 0);
  int keep = V;
  if (train.sample_top_k() > 0 && train.sample_top_k() < V) {
    keep = train.sample_top_k();
    std::partial_sort(order->begin(), order->begin() + keep, order->end(),
                      [&](int a, int b) { return logits[a] > logits[b]; });
  }
  const std::vector<int>& o = *order;
  float maxv = logits[o[0]];
  for (int j = 0; j < keep; ++j) maxv = std::max(maxv, logits[o[j]]);
  double total = 0.0;
  for (int j = 0; j < keep; ++j) {
    (*probs)[j] = static_cast<float>(std::exp((logits[o[j]] - maxv) / temp));
    total += (*probs)[j];
  }
  const double u = static_cast<double>(random >> 11) * 0x1.0p-53 * total;
  double acc = 0.0;
  for (int j = 0; j < keep; ++j) {
    acc += (*probs)[j];
    if (u < acc) return o[j];
  }
  return o[keep - 1];
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const v1::JobSpec& spec, const TrainerOptions& options,
    ParallelDims* dims) {
  const auto& par = spec.parallel();
  // Without MPI the rank is a mesh of its own.
  std::unique_ptr<ParallelDims> single;
  if (dims == nullptr) {
    auto made = ParallelDims::Single(par);
    if (!made.ok()) return made.status();
    single = std::move(*made);
    dims = single.get();
  }
  if (!dims->has_mpi() && par.zero() != 0) {
    return absl::InvalidArgumentError(
        "parallel.zero > 0 needs MPI (run ptworker, under mpirun or alone)");
  }
  auto gpu = RankGpu(spec, *dims);  // -1 on the cpu
  if (!gpu.ok()) return gpu.status();
  if (absl::Status s = CheckPrecision(spec, *gpu); !s.ok()) return s;
  if (CudaGraphsOf(spec) == CudaGraphs::kOn) {
    // The job can be recorded (the spec says); can the backend record?
    if (const std::string why = kernels::CudaCaptureUnsupported();
        !why.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.cuda_graphs=on: ", why));
    }
  }

  // More threads than any machine has cores is a mistake, and each one
  // costs a stack.
  constexpr int kMaxThreadsPerRank = 1024;
  if (spec.resources().threads_per_rank() > kMaxThreadsPerRank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resources.threads_per_rank=", spec.resources().threads_per_rank(),
        " is more than ", kMaxThreadsPerRank, " threads per rank"));
  }

  absl::StatusOr<TokenData> data = absl::UnknownError("data not loaded");
  try {
    data = LoadTokenData(spec.data(), spec.model().vocab_size(),
                         spec.model().block_size(), options.fs);
  } catch (const std::bad_alloc&) {
    data = absl::ResourceExhaustedError(
        "data: out of memory while reading the data files");
  }
  // Before anything large is allocated: does the model fit? And would its
  // checkpoints stay inside the data roots?
  absl::Status ready = data.status();
  if (ready.ok() && !spec.checkpoint().dir().empty()) {
    ready = options.fs.Check(spec.checkpoint().dir(), "checkpoint.dir");
  }
  if (ready.ok()) {
    ready =
        CheckMemoryFits(spec, data->vocab_size, options.ranks_on_node,
                        options.memory_bytes.value_or(AvailableMemoryBytes()),
                        RankGpuBytes(options, *dims, *gpu));
  }
  // Ranks agree before the collectives of loading state: one rank that
  // cannot read the data must not leave the others waiting.
  Communicator* world_group = dims->world_comm();
  if (absl::Status agreed = AgreeOnStatus(
          world_group, ready,
          "another rank could not load the data, reach checkpoint.dir or fit "
          "the model in memory (see its error)");
      !agreed.ok()) {
    return ready.ok() ? absl::InvalidArgumentError(agreed.message()) : ready;
  }
  std::unique_ptr<Trainer> trainer;
  absl::Status built = absl::OkStatus();
  try {
    trainer.reset(new Trainer(spec, options, std::move(*data), dims, *gpu));
  } catch (const std::bad_alloc&) {
    built = absl::ResourceExhaustedError(
        "memory: out of memory while building the model, its gradients and "
        "optimizer state (see the model.*, train.global_batch and "
        "parallel.* settings)");
  } catch (const std::exception& e) {
    built = absl::InternalError(
        absl::StrCat("building the model failed: ", e.what()));
  }
  if (AnyRankFailed(world_group, !built.ok())) {
    return built.ok() ? absl::ResourceExhaustedError(
                            "memory: another rank could not build the model "
                            "(see its error)")
                      : built;
  }
  trainer->own_dims_ = std::move(single);
  if (auto s = trainer->LoadInitialState(); !s.ok()) return s;
  return trainer;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::CreateWithData(
    const v1::JobSpec& spec, const TrainerOptions& options, TokenData data) {
  if (JobWorldSize(spec) != 1 || spec.resources().device() != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("Trainer::CreateWithData: one rank on the cpu only, not ",
                     JobWorldSize(spec), " on ", spec.resources().device()));
  }
  auto single = ParallelDims::Single(spec.parallel());
  if (!single.ok()) return single.status();
  std::unique_ptr<Trainer> trainer(
      new Trainer(spec, options, std::move(data), single->get(), /*gpu=*/-1));
  trainer->own_dims_ = std::move(*single);
  if (auto s = trainer->LoadInitialState(); !s.ok()) return s;
  return trainer;
}

absl::Status Trainer::LoadInitialState() {
  const std::string& init = spec_.model().init_from();
  if (!init.empty()) {
    // init_from is validated as "llmc:PATH".
    auto src = LlmcSource::Open(init.substr(5), model().config(), options_.fs,
                                "model.init_from");
    absl::Status s = src.ok() ? LoadState(*store_, optimizer_->adam(), **src,
                                          /*with_optimizer=*/false)
                              : src.status();
    if (auto agreed = AgreeOnStatus(world(), s,
                                    "model.init_from: another rank failed to "
                                    "load (see its error)");
        !agreed.ok()) {
      return agreed;
    }
    store_->GatherUpdatedParams();
  }
  // Under ptcoord the job's uid names its checkpoints; a standalone run
  // goes on as the run it resumes (so it prunes that run's older steps),
  // else it is a run of its own.
  run_uid_ = options_.job_uid;
  if (absl::Status s = Resume(); !s.ok()) return s;
  if (run_uid_.empty()) run_uid_ = NewRunUid(world());
  // Two runs cannot save one step in one folder: the save of such a step
  // fails. Said now rather than when the step comes; an error here would
  // make every trainer built from a spec depend on what its folder holds.
  const auto& ckpt = spec_.checkpoint();
  if (ckpt.dir().empty() || !is_log_rank()) return absl::OkStatus();
  const int64_t steps = spec_.train().steps();
  auto others = OtherRunsCheckpointsAt(
      ckpt.dir(), run_uid_,
      [&](int64_t step) {
        return step > start_step_ && step <= steps &&
               (step == steps ||
                (ckpt.every() > 0 && step % ckpt.every() == 0));
      },
      options_.fs);
  if (others.ok() && !others->empty()) {
    const std::string what = absl::StrCat(
        "checkpoint.dir '", ckpt.dir(), "' holds ",
        absl::StrJoin(*others, ", "), " of another run, at steps this run ('",
        run_uid_,
        "') saves, and a run never overwrites another's checkpoint. Give this "
        "run a folder of its own (--set checkpoint.dir=...), or go on from "
        "that run with --resume-from latest if it is of this model and data");
    if (options_.refuse_other_runs_steps) {
      return absl::FailedPreconditionError(what);
    }
    spdlog::warn("{}: those saves will fail", what);
  }
  return absl::OkStatus();
}

absl::Status Trainer::LoadCandidate(const std::string& dir, bool latest,
                                    const std::string& field,
                                    ResumeCandidate* c) {
  const bool standalone = options_.job_uid.empty();
  auto reader = CheckpointReader::Open(dir, options_.fs, field);
  if (!reader.ok()) {
    // Damaged or not a checkpoint (of this format): fall back. Refused
    // by confinement, or unreadable: stop.
    const absl::StatusCode code = reader.status().code();
    c->fatal = code != absl::StatusCode::kDataLoss &&
               code != absl::StatusCode::kFailedPrecondition;
    return reader.status();
  }
  const CheckpointMeta& meta = (*reader)->meta();
  if (latest && !standalone && meta.job_uid != options_.job_uid) {
    c->fatal = true;
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", dir, "' belongs to job '", meta.job_uid,
        "', not to this job '", options_.job_uid,
        "' (PTRAIN_JOB_UID); refusing to resume another job's checkpoint "
        "(give checkpoint.dir a folder of this job's own)"));
  }
  // Not this run's model or data: skipped by `latest`, refused when
  // named.
  auto mismatch = [&](absl::Status why) {
    c->other = latest;
    c->fatal = !latest;
    return why;
  };
  if (absl::Status compatible =
          (*reader)->CheckCompatible(model().config(), store_->layout());
      !compatible.ok()) {
    return mismatch(compatible);
  }
  if (data_.has_tokenizer && meta.vocab != data_.tokenizer.vocab()) {
    return mismatch(absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", dir,
                     "' was trained on another vocabulary than "
                     "data.path '",
                     spec_.data().path(), "'")));
  }
  // Named, a checkpoint may go on with other data of its vocabulary.
  if (latest && meta.data_digest.has_value() &&
      *meta.data_digest != data_.digest) {
    const v1::DataSpec& d = spec_.data();
    return mismatch(absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", dir, "' was trained on other data than ",
        d.path().empty() ? "data.train_bin '" + d.train_bin()
                         : "data.path '" + d.path(),
        "' (data_digest ", absl::Hex(*meta.data_digest, absl::kZeroPad16),
        ", this data's ", absl::Hex(data_.digest, absl::kZeroPad16), ")")));
  }
  if (meta.step > spec_.train().steps()) {
    c->fatal = true;
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", dir, "' is at step ", meta.step,
                     ", past train.steps=", spec_.train().steps()));
  }
  c->step = meta.step;
  c->opt_step = meta.optimizer_step;
  c->skipped_steps = meta.skipped_steps;
  c->owner = meta.job_uid;
  absl::Status loaded = LoadState(*store_, optimizer_->adam(), **reader,
                                  /*with_optimizer=*/true);
  resume_bytes_read_ = (*reader)->bytes_read();
  return loaded;
}

absl::Status Trainer::Resume() {
  const std::string& from = options_.resume_from;
  if (from.empty()) return absl::OkStatus();
  const bool latest = from == "latest";
  const std::string& root = spec_.checkpoint().dir();
  if (latest && root.empty()) {
    spdlog::info("resume: no checkpoint.dir, starting fresh");
    return absl::OkStatus();
  }
  auto listed = latest ? ListCheckpoints(root, options_.fs)
                       : absl::StatusOr<std::vector<std::string>>(
                             std::vector<std::string>{from});
  if (auto agreed = AgreeOnStatus(
          world(), listed.status(),
          absl::StrCat("resume: another rank could not list '", root, "'"));
      !agreed.ok()) {
    return agreed;
  }
  const std::string& fork = options_.fork_from;
  if (latest && listed->empty()) {
    if (!fork.empty()) return LoadNewestOf({fork}, /*latest=*/false);
    spdlog::info("resume: no checkpoint under '{}', starting fresh", root);
    return absl::OkStatus();
  }
  absl::Status loaded = LoadNewestOf(*listed, latest);
  // None of this run's loaded (another model's, data's): the fork's.
  if (loaded.ok() && latest && resumed_from_.empty() && !fork.empty()) {
    return LoadNewestOf({fork}, /*latest=*/false);
  }
  return loaded;
}

absl::Status Trainer::LoadNewestOf(const std::vector<std::string>& candidates,
                                   bool latest) {
  const bool standalone = options_.job_uid.empty();
  const std::string& root = spec_.checkpoint().dir();
  const std::string field = latest ? "checkpoint.dir" : "--resume-from";
  std::string skipped;
  bool damaged = false;
  for (const std::string& dir : candidates) {
    // `latest` skips a checkpoint of another model or data (standalone runs
    // of several models may share a folder) and falls back past a damaged
    // one. Another job's, or one past train.steps, is an error: an older
    // one would not do either. A named folder must load.
    ResumeCandidate c;
    absl::Status s = LoadCandidate(dir, latest, field, &c);
    const bool failed = AnyRankFailed(world(), !s.ok());
    const bool any_fatal = AnyRankFailed(world(), c.fatal);
    const bool any_other = AnyRankFailed(world(), c.other);
    if (!failed) {
      store_->GatherUpdatedParams();
      start_step_ = c.step;
      resumed_from_ = dir;
      lineage_.Add(c.step, dir);
      if (standalone) run_uid_ = c.owner;
      optimizer_->adam().set_steps_taken(c.opt_step);
      data_skip_ = c.skipped_steps;
      spdlog::info("resumed from '{}' at step {}{}", dir, c.step, skipped);
      return absl::OkStatus();
    }
    if (s.ok()) s = absl::DataLossError("another rank failed to read " + dir);
    if (!latest || any_fatal) return s;
    if (any_other) {
      spdlog::warn("resume: skipping {}", std::string(s.message()));
      absl::StrAppend(&skipped, " (skipped ", dir,
                      ", of another model or data)");
      continue;
    }
    spdlog::warn("resume: skipping damaged checkpoint '{}': {}", dir,
                 std::string(s.message()));
    absl::StrAppend(&skipped, " (skipped damaged ", dir, ")");
    damaged = true;
  }
  if (!damaged) {
    spdlog::info(
        "resume: no checkpoint of this model and data under '{}'{}, starting "
        "fresh",
        root, skipped);
    return absl::OkStatus();
  }
  return absl::DataLossError(
      absl::StrCat("resume: no intact checkpoint under '", root, "'", skipped));
}

CheckpointMeta Trainer::CheckpointMetaAt(int64_t step) const {
  CheckpointMeta meta;
  meta.step = step;
  meta.tokens_seen =
      step * static_cast<int64_t>(build_.global_batch) * build_.T;
  meta.optimizer_step = optimizer_->adam().steps_taken();
  meta.seed = spec_.train().seed();
  meta.skipped_steps = data_skip_;
  meta.model = chunks_.front()->config();
  if (data_.has_tokenizer) meta.vocab = data_.tokenizer.vocab();
  meta.data_digest = data_.digest;
  meta.spec_yaml = JobSpecToYaml(spec_);
  const auto& par = spec_.parallel();
  meta.dp = par.dp();
  meta.tp = par.tp();
  meta.pp = par.pp();
  meta.cp = par.cp();
  meta.zero = par.zero();
  meta.world = dims_->world_size();
  meta.job_uid = run_uid_;
  return meta;
}

SaveOptions Trainer::CheckpointSaveOptions() const {
  SaveOptions save = options_.save;
  save.keep_last = spec_.checkpoint().keep_last();
  save.fs = options_.fs;
  return save;
}

std::vector<ShardRun> Trainer::CheckpointRunsNow() {
  const bool tp_rank0 = dims_->tp_rank() == 0;
  return CheckpointRuns(*store_, optimizer_->adam(), tp_rank0,
                        &checkpoint_host_);
}

absl::Status Trainer::CommitPendingSave() {
  if (!background_save_.pending()) return absl::OkStatus();
  return background_save_.Finish(world()).status();
}

absl::StatusOr<std::string> Trainer::SaveCheckpointAt(int64_t step) {
  if (auto s = CommitPendingSave(); !s.ok()) return s;
  return SaveCheckpoint(spec_.checkpoint().dir(), CheckpointMetaAt(step),
                        CheckpointRunsNow(), world(), CheckpointSaveOptions());
}

absl::StatusOr<bool> Trainer::StartCheckpointAt(int64_t step) {
  if (auto s = CommitPendingSave(); !s.ok()) return s;
  return background_save_.Start(spec_.checkpoint().dir(),
                                CheckpointMetaAt(step), CheckpointRunsNow(),
                                world(), CheckpointSaveOptions());
}

Trainer::Trainer(const v1::JobSpec& spec, const TrainerOptions& options,
                 TokenData data, ParallelDims* dims, int gpu)
    : spec_(spec),
      options_(options),
      data_(std::move(data)),
      dims_(dims),
      build_(RankBuild::Of(spec_, data_.vocab_size, dims->tp_rank(),
                           dims->pp_rank())),
      anomaly_guard_(spec_.train().anomaly()) {
  if (spec_.resources().threads_per_rank() > 0) {
    omp_set_num_threads(spec_.resources().threads_per_rank());
  }
  const RankBuild& b = build_;
  // The plan of this rank: split into stages, tensor-parallel, ZeRO units.
  const std::vector<ParamInfo> layout = BuildPlan(b.model, b.plan);
  if (b.device == Device::kCuda) {
    kernels::CudaOptions cuda;
    cuda.bf16_compute = b.precision == Precision::kBf16;
    cuda.device = gpu;  // chosen and checked by Create
    std::string error;
    device_ops_ = kernels::MakeCudaOps(cuda, &error);
    PT_CHECK(device_ops_ != nullptr, error.c_str());  // Create checked
    spdlog::info("training on {}", device_ops_->name());
    dims_->AttachDevice(device_ops_.get());
  }
  const ComputeGroups groups = dims_->compute_groups();
  // The backend that computes (the bf16 CPU one under bf16): the store's
  // bf16 copy of the weights is made for its matmuls.
  store_ = std::make_unique<ZeroStore>(layout, b.replicas(), b.zero, groups.dp,
                                       compute_ops());
  order_ = b.pp > 1 ? PipelineOrder(b.schedule, b.pp, dims_->pp_rank(),
                                    b.microbatches, b.virtual_stages)
                    : PipelineRuntime::SequentialOrder(b.microbatches);
  if (CudaGraphsOf(spec_) != CudaGraphs::kOff) {
    graphs_unavailable_ = CudaGraphsUnsupported(spec_);
    if (graphs_unavailable_.empty() && compute_ops() != nullptr) {
      graphs_unavailable_ = compute_ops()->CaptureUnsupported();
    }
  }
  const bool graphs =
      CudaGraphsOf(spec_) != CudaGraphs::kOff && graphs_unavailable_.empty();
  std::vector<GptStage*> chunks;
  for (int c = 0; c < b.chunks(); ++c) {
    int first_unit = 0;
    std::vector<ParamInfo> chunk_layout =
        StageSlice(layout, b.stages[c], &first_unit);
    slices_.push_back(
        std::make_unique<UnitStoreSlice>(store_.get(), first_unit));
    StageOptions stage = b.Stage(c);
    stage.tp = TpGroup{groups.tp, b.sequence_parallel};
    stage.cp = CpGroup{groups.cp};
    stage.store = slices_.back().get();
    stage.ops = compute_ops();
    stage.graphs = graphs;
    chunks_.push_back(
        std::make_unique<GptStage>(b.model, std::move(chunk_layout), stage));
    chunks.push_back(chunks_.back().get());
  }
  optimizer_ = std::make_unique<DistributedOptimizer>(
      store_.get(), spec_.train(), groups, b.offload_optimizer);
  store_->InitParams(spec_.train().seed());
  train_sampler_ = std::make_unique<BatchSampler>(
      &data_.train, b.T, b.global_batch, spec_.train().seed(), "train");
  val_sampler_ = std::make_unique<BatchSampler>(&data_.val, b.T, b.global_batch,
                                                spec_.train().seed(), "val");
  inputs_.resize(static_cast<size_t>(b.micro_B) * b.T_local() * b.microbatches);
  targets_.resize(inputs_.size());
  if (b.cp > 1) {
    whole_inputs_.resize(static_cast<size_t>(b.micro_B) * b.T);
    whole_targets_.resize(whole_inputs_.size());
  }
  PipelineRuntime::Options run;
  run.pp = groups.pp;
  run.pp_rank = dims_->pp_rank();
  run.chunks = std::move(chunks);
  run.store = store_.get();
  run.microbatches = b.microbatches;
  run.seq_split =
      b.sequence_parallel && groups.tp != nullptr ? groups.tp->size() : 1;
  run.max_B = b.micro_B;
  run.max_T = b.T_local();
  run.recorder = recorder();
  runtime_ = std::make_unique<PipelineRuntime>(std::move(run));
}

Trainer::~Trainer() {
  // What communicates over the mesh's device groups goes first, then the
  // groups, before the backend they use (device_ops_).
  runtime_.reset();
  optimizer_.reset();
  chunks_.clear();
  slices_.clear();
  store_.reset();
  dims_->DetachDevice();
}

GptStage::GraphCounts Trainer::graph_counts() const {
  GptStage::GraphCounts all;
  for (const auto& chunk : chunks_) {
    const GptStage::GraphCounts c = chunk->graph_counts();
    all.captured += c.captured;
    all.replayed += c.replayed;
    all.failed += c.failed;
  }
  return all;
}

MemoryBytes Trainer::memory() const {
  MemoryBytes m = store_->memory();
  m.optimizer = optimizer_->bytes();
  for (const auto& chunk : chunks_) {
    m.activations += chunk->memory().activations;
  }
  return m;
}

double Trainer::SumOverReplicas(double x) {
  if (build_.replicas() > 1) dims_->dp_comm()->AllReduce(&x, 1);
  return x;
}

void Trainer::FillMicrobatch(BatchSampler& sampler, int64_t batch, int first,
                             int32_t* inputs, int32_t* targets) {
  const RankBuild& b = build_;
  if (b.cp == 1) {
    sampler.Fill(batch, first, b.micro_B, inputs, targets);
    return;
  }
  sampler.Fill(batch, first, b.micro_B, whole_inputs_.data(),
               whole_targets_.data());
  const CpGroup cp{dims_->cp_comm()};
  cp.TakeLocal(whole_inputs_.data(), b.micro_B, b.T, inputs);
  cp.TakeLocal(whole_targets_.data(), b.micro_B, b.T, targets);
}

double Trainer::flops_per_step() const {
  return GptFlopsPerToken(chunks_.front()->config(), build_.T) *
         static_cast<double>(build_.global_batch) * build_.T;
}

StepResult Trainer::TrainStep(int64_t step) {
  const auto t0 = Clock::now();
  const double exposed0 = dims_->comm_stats()->ExposedSeconds();
  const RankBuild& b = build_;
  // Each position's loss enters the mean over the whole global batch.
  const float dloss = 1.0f / (static_cast<float>(b.global_batch) * b.T);
  StepResult r;
  if (recorder() != nullptr) recorder()->SetStep(step + 1);
  store_->BeginStep();
  auto t = Clock::now();
  const int64_t tokens = int64_t{b.micro_B} * b.T_local();
  for (int mb = 0; mb < b.microbatches; ++mb) {
    FillMicrobatch(*train_sampler_, step + data_skip_, FirstSequence(mb),
                   inputs_.data() + mb * tokens, targets_.data() + mb * tokens);
  }
  r.phases.data += SecondsSince(t);
  double loss_sum =
      runtime_->TrainStep(order_, inputs_.data(), targets_.data(), b.micro_B,
                          b.T_local(), dloss, &r.phases);
  t = Clock::now();
  if (recorder() != nullptr) recorder()->Enter(FlightPhase::kOptimizer);
  // The last stage computed the losses: every stage learns them. Each cp
  // rank's are means over as many positions: their mean is the sequence's.
  if (Communicator* pp = dims_->pp_comm()) pp->AllReduce(&loss_sum, 1);
  r.loss = static_cast<float>(SumOverReplicas(loss_sum) /
                              (b.microbatches * b.replicas()));
  r.lr = LearningRate(spec_.train(), step);
  r.grad_norm = optimizer_->Step(static_cast<float>(r.lr)).grad_norm;
  r.phases.optimizer = SecondsSince(t);
  r.seconds = SecondsSince(t0);
  r.comm_exposed = dims_->comm_stats()->ExposedSeconds() - exposed0;
  return r;
}

float Trainer::Evaluate() {
  const RankBuild& b = build_;
  double sum = 0.0;
  int64_t count = 0;
  const int local = b.global_batch / b.dp;
  const int dp_rank = dims_->dp_rank();
  for (int batch = 0; batch < spec_.train().eval_batches(); ++batch) {
    for (int first = dp_rank * local; first < (dp_rank + 1) * local;
         first += b.micro_B) {
      FillMicrobatch(*val_sampler_, batch, first, inputs_.data(),
                     targets_.data());
      sum += runtime_->Forward(inputs_.data(), targets_.data(), b.micro_B,
                               b.T_local());
      ++count;
    }
  }
  if (Communicator* pp = dims_->pp_comm()) pp->AllReduce(&sum, 1);
  return static_cast<float>(SumOverReplicas(sum) /
                            SumOverReplicas(static_cast<double>(count)));
}

std::string Trainer::Sample(uint64_t salt, SampleMode mode) {
  const auto& train = spec_.train();
  const int V = data_.vocab_size;
  std::vector<int32_t> ids;
  const Tokenizer* text = data_.text_tokenizer();
  if (text != nullptr && text->can_encode()) {
    ids = text->Encode(train.sample_prompt());
  }
  // Without a prompt the sample starts after an end of text (a document's
  // start), or else after token 0.
  const bool starts_document = ids.empty() && text != nullptr &&
                               text->end_of_text() >= 0 &&
                               text->end_of_text() < V;
  if (ids.empty()) ids.push_back(starts_document ? text->end_of_text() : 0);
  const size_t prompt_len = ids.size();
  const uint64_t stream = StableHash("sample");
  std::vector<float> probs(V);
  std::vector<int> order(V);
  // Under sequence parallelism a forward's length is a multiple of tp: the
  // context is padded at its end, which causal attention keeps from the
  // positions that matter. (Decode steps are not split along the sequence.)
  Communicator* tp = dims_->tp_comm();
  const int multiple =
      tp != nullptr && build_.sequence_parallel ? tp->size() : 1;
  const int T_max = build_.T;
  const int Vl = model().vocab_local();
  std::vector<float> gathered(tp != nullptr ? int64_t{Vl} * tp->size() : 0);
  std::vector<int32_t> context;
  std::vector<float> last_logits;
  // The context is ids[start, end); `cached` of its positions are in every
  // stage's cache.
  size_t start = 0;
  int cached = 0;
  for (int i = 0; i < train.sample_tokens(); ++i) {
    if (ids.size() - start > static_cast<size_t>(T_max)) {
      start = mode == SampleMode::kSlidingWindow
                  ? ids.size() - T_max
                  : ids.size() - std::max(1, T_max / 2);
      cached = 0;
    }
    const int T = static_cast<int>(ids.size() - start);
    int last_row = T - 1;  // the row of logits(0) at the context's end
    // Under context parallelism a forward takes a rank's zigzag positions:
    // every mode runs through the cache on each cp rank alike, the
    // recomputing ones from the context's start again for every token.
    if (mode == SampleMode::kKvCache || build_.cp > 1) {
      if (mode != SampleMode::kKvCache) cached = 0;
      while (cached < T) {
        const int n = std::min(T - cached, model().decode_max());
        runtime_->Forward(ids.data() + start + cached, nullptr, 1, n, cached);
        cached += n;
        last_row = n - 1;
      }
    } else {
      const int padded = (T + multiple - 1) / multiple * multiple;
      context.assign(ids.begin() + start, ids.end());
      context.resize(padded, 0);
      runtime_->Forward(context.data(), nullptr, 1, padded);
    }
    // The last stage picks the token; the others learn it from there.
    if (!last_stage()) {
      float pick = 0.0f;
      dims_->pp_comm()->Broadcast(&pick, 1, build_.pp - 1);
      ids.push_back(static_cast<int32_t>(pick));
      continue;
    }
    // This rank's vocabulary columns at the last position; the whole
    // vocabulary is gathered only here, for sampling.
    const float* logits =
        chunks_.back()->logits(0) + static_cast<int64_t>(last_row) * Vl;
    if (device_ops_ != nullptr) {  // only the last position leaves the GPU
      last_logits.resize(Vl);
      device_ops_->ToHost(last_logits.data(), logits, Vl);
      logits = last_logits.data();
    }
    if (tp != nullptr) {
      tp->AllGather(logits, gathered.data(), Vl);
      logits = gathered.data();
    }
    const int pick = PickToken(logits, V, train,
                               CounterRandom64(train.seed() + salt, stream, i),
                               &order, &probs);
    if (Communicator* pp = dims_->pp_comm()) {
      float f = static_cast<float>(pick);  // token ids are exact in a float
      pp->Broadcast(&f, 1, build_.pp - 1);
    }
    ids.push_back(pick);
  }
  if (text != nullptr) {
    if (starts_document) ids.erase(ids.begin());
    return ToValidUtf8(text->Decode(ids));
  }
  std::string out;
  for (size_t i = prompt_len; i < ids.size(); ++i) {
    absl::StrAppend(&out, i == prompt_len ? "" : " ", ids[i]);
  }
  return out;
}

}  // namespace ptrain
