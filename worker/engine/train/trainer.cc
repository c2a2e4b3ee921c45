#include "worker/engine/train/trainer.h"

#include <omp.h>

#include <chrono>
#include <new>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/mesh.h"
#include "common/seconds.h"
#include "common/spec.h"
#include "kernels/backends.h"
#include "spdlog/spdlog.h"
#include "worker/engine/model/flops.h"
#include "worker/engine/parallel/memory_estimate.h"
#include "worker/engine/train/expert_report.h"
#include "worker/engine/train/rank_device.h"

namespace ptrain {

using Clock = std::chrono::steady_clock;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const v1::JobSpec& spec, const TrainerOptions& options,
    ParallelDims* dims) {
  // Without MPI the rank is a mesh of its own.
  std::unique_ptr<ParallelDims> single;
  if (dims == nullptr) {
    auto made = ParallelDims::Single(JobLayout(spec));
    if (!made.ok()) return made.status();
    single = std::move(*made);
    dims = single.get();
  }
  if (!dims->has_mpi() && dims->zero() != 0) {
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

  // More threads than cores is a mistake, and each costs a stack.
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
  if (auto s = trainer->checkpointer_->LoadInitialState(); !s.ok()) return s;
  return trainer;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::CreateWithData(
    const v1::JobSpec& spec, const TrainerOptions& options, TokenData data) {
  if (JobWorldSize(spec) != 1 || spec.resources().device() != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("Trainer::CreateWithData: one rank on the cpu only, not ",
                     JobWorldSize(spec), " on ", spec.resources().device()));
  }
  auto single = ParallelDims::Single(JobLayout(spec));
  if (!single.ok()) return single.status();
  std::unique_ptr<Trainer> trainer(
      new Trainer(spec, options, std::move(data), single->get(), /*gpu=*/-1));
  trainer->own_dims_ = std::move(*single);
  if (auto s = trainer->checkpointer_->LoadInitialState(); !s.ok()) return s;
  return trainer;
}

Trainer::Trainer(const v1::JobSpec& spec, const TrainerOptions& options,
                 TokenData data, ParallelDims* dims, int gpu)
    : spec_(spec),
      options_(options),
      data_(std::move(data)),
      dims_(dims),
      build_(RankBuild::Of(spec_, data_.vocab_size, dims->tp_rank(),
                           dims->pp_rank(), dims->coordinate("ep"))) {
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
  // The store's bf16 weight copy is made for compute_ops()' matmuls.
  store_ = std::make_unique<ZeroStore>(
      layout, b.replicas(), b.zero, groups.dp,
      compute_ops() != nullptr ? compute_ops() : &kernels::CpuOps(),
      groups.expert_dp);
  order_ = b.pp > 1 ? PipelineOrder(b.schedule, b.pp, dims_->pp_rank(),
                                    b.microbatches, b.virtual_stages)
                    : PipelineRuntime::SequentialOrder(b.microbatches);
  if (CudaGraphsOf(spec_) != CudaGraphs::kOff) {
    graphs_unavailable_ = CudaGraphsUnsupported(spec_);
    if (graphs_unavailable_.empty() && compute_ops() != nullptr) {
      graphs_unavailable_ = compute_ops()->CaptureUnsupported();
    }
  }
  BuildChunks(layout);
  optimizer_ = std::make_unique<DistributedOptimizer>(
      store_.get(), spec_.train(), groups, b.offload_optimizer);
  store_->InitParams(spec_.train().seed());
  BuildRunParts();
}

void Trainer::BuildChunks(const std::vector<ParamInfo>& layout) {
  const RankBuild& b = build_;
  const ComputeGroups groups = dims_->compute_groups();
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
    stage.ep = groups.ep;
    stage.store = slices_.back().get();
    stage.ops = compute_ops();
    stage.graphs = graphs;
    chunks_.push_back(
        std::make_unique<GptStage>(b.model, std::move(chunk_layout), stage));
    chunks.push_back(chunks_.back().get());
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
  run.recorder = dims_->flight_recorder();
  runtime_ = std::make_unique<PipelineRuntime>(std::move(run));
}

void Trainer::BuildRunParts() {
  const RankBuild& b = build_;
  StepFeed::Shape shape;
  shape.T = b.T;
  shape.global_batch = b.global_batch;
  shape.micro_B = b.micro_B;
  shape.microbatches = b.microbatches;
  shape.dp = b.dp;
  shape.dp_rank = dims_->dp_rank();
  shape.seed = spec_.train().seed();
  feed_ = std::make_unique<StepFeed>(&data_, shape, CpGroup{dims_->cp_comm()});
  report_ = std::make_unique<RunReport>(spec_, options_, dims_, build_);
  Checkpointer::State state;
  state.store = store_.get();
  state.optimizer = optimizer_.get();
  state.model = &chunks_.front()->config();
  state.feed = feed_.get();
  state.report = report_.get();
  checkpointer_ = std::make_unique<Checkpointer>(spec_, options_, dims_, build_,
                                                 data_, state);
  TextSampler::Model model;
  model.runtime = runtime_.get();
  model.first_chunk = chunks_.front().get();
  model.last_chunk = chunks_.back().get();
  model.device_ops = device_ops_.get();
  sampler_ =
      std::make_unique<TextSampler>(spec_.train(), data_, dims_, build_, model);
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
  FlightRecorder* recorder = dims_->flight_recorder();
  if (recorder != nullptr) recorder->SetStep(step + 1);
  store_->BeginStep();
  ClearExpertLoad(chunks_);
  auto t = Clock::now();
  r.epochs_begun = feed_->FillStep(step);
  r.phases.data += SecondsSince(t);
  double loss_sum =
      runtime_->TrainStep(order_, feed_->inputs(), feed_->targets(), b.micro_B,
                          b.T_local(), dloss, &r.phases);
  t = Clock::now();
  if (recorder != nullptr) recorder->Enter(FlightPhase::kOptimizer);
  // Every stage learns the last one's losses (cp ranks': the mean).
  if (Communicator* pp = dims_->pp_comm()) pp->AllReduce(&loss_sum, 1);
  r.loss = static_cast<float>(SumOverReplicas(loss_sum) /
                              (b.microbatches * b.replicas()));
  r.experts = CollectExpertLoad(chunks_, *dims_, b);
  MoveExpertBias(*store_, r.experts, b.model);
  r.lr = LearningRate(spec_.train(), step);
  r.grad_norm = optimizer_->Step(static_cast<float>(r.lr)).grad_norm;
  r.phases.optimizer = SecondsSince(t);
  r.seconds = SecondsSince(t0);
  r.comm_exposed = dims_->comm_stats()->ExposedSeconds() - exposed0;
  return r;
}

EvalResult Trainer::EvaluateSources() {
  const RankBuild& b = build_;
  const int local = b.global_batch / b.dp;
  const int dp_rank = dims_->dp_rank();
  std::vector<double> losses;
  for (int source = 0; source < feed_->eval_sources(); ++source) {
    double sum = 0.0;
    int64_t count = 0;
    for (int batch = 0; batch < spec_.train().eval_batches(); ++batch) {
      for (int first = dp_rank * local; first < (dp_rank + 1) * local;
           first += b.micro_B) {
        feed_->FillEval(source, batch, first);
        sum += runtime_->Forward(feed_->inputs(), feed_->targets(), b.micro_B,
                                 b.T_local());
        ++count;
      }
    }
    if (Communicator* pp = dims_->pp_comm()) pp->AllReduce(&sum, 1);
    losses.push_back(SumOverReplicas(sum) /
                     SumOverReplicas(static_cast<double>(count)));
  }
  EvalResult r;
  r.loss = static_cast<float>(feed_->ValLoss(losses));
  if (!data_.blend.empty()) {
    r.sources.assign(losses.begin(), losses.end());
  }
  return r;
}

}  // namespace ptrain
