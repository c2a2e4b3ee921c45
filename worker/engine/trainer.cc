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
#include "common/spec.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/ops_cuda.h"
#include "spdlog/spdlog.h"
#include "worker/engine/checkpoint_state.h"
#include "worker/engine/comm_nccl.h"
#include "worker/engine/comm_staged.h"
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

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const v1::JobSpec& spec, const TrainerOptions& options,
    ParallelDims* dims) {
  const auto& par = spec.parallel();
  const int64_t world = static_cast<int64_t>(par.dp()) * par.tp() * par.pp();
  if (dims == nullptr && world != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world size 1 does not equal parallel.dp × parallel.tp × parallel.pp "
        "= ",
        par.dp(), " × ", par.tp(), " × ", par.pp(), " = ", world));
  }
  if (dims == nullptr && par.zero() != 0) {
    return absl::InvalidArgumentError(
        "parallel.zero > 0 needs MPI (run ptworker, under mpirun or alone)");
  }
  int gpu = -1;  // the rank's GPU, on cuda
  if (spec.resources().device() == "cuda") {
    if (const std::string why = kernels::CudaUnavailableReason();
        !why.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("resources.device=cuda: ", why));
    }
    const int gpus = kernels::CudaDeviceCount();
    auto rank_gpus = RankGpus(dims != nullptr ? dims->world_size() : 1, gpus);
    if (!rank_gpus.ok()) return rank_gpus.status();
    const int local = dims != nullptr ? dims->local_size() : 1;
    if (local > gpus && !kernels::CudaRanksShareGpus()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resources.device=cuda: ", local, " ranks on this node but ", gpus,
          " GPU(s): one rank per GPU (lower resources.ranks_per_node, or set "
          "PTRAIN_CUDA_SHARE_GPUS=1 to let ranks share GPUs)"));
    }
    // The GPU ptcoord chose for this rank, else the node's ranks take its
    // GPUs in turn.
    gpu = !rank_gpus->empty()
              ? (*rank_gpus)[dims != nullptr ? dims->world_rank() : 0]
              : (dims != nullptr ? dims->local_rank() : 0) % gpus;
  } else if (spec.resources().device() != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.device=", spec.resources().device(),
                     ": must be cpu or cuda"));
  }
  if (spec.train().precision() == "bf16" &&
      spec.resources().device() == "cpu" && !kernels::CpuHasBf16()) {
    return absl::InvalidArgumentError(
        "train.precision=bf16 with resources.device=cpu needs a CPU with "
        "AVX512_BF16 (this one has none, or ONEDNN_MAX_CPU_ISA forbids it): "
        "use fp32 or auto");
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
                        options.memory_bytes.value_or(AvailableMemoryBytes()));
  }
  // Ranks agree before the collectives of loading state: one rank that
  // cannot read the data must not leave the others waiting.
  Communicator* world_group = dims != nullptr && dims->world_size() > 1
                                  ? &dims->world_group()
                                  : nullptr;
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
    trainer.reset(new Trainer(spec, options, std::move(*data), dims, gpu));
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
  std::unique_ptr<Trainer> trainer(new Trainer(spec, options, std::move(data),
                                               /*dims=*/nullptr, /*gpu=*/-1));
  if (auto s = trainer->LoadInitialState(); !s.ok()) return s;
  return trainer;
}

Communicator* Trainer::world() const {
  return dims_ != nullptr && dims_->world_size() > 1 ? &dims_->world_group()
                                                     : nullptr;
}

void Trainer::MakeDeviceGroups() {
  // NCCL where every rank has its own GPU (NCCL refuses a GPU shared by two
  // ranks of a group), decided alike on every rank; PTRAIN_CUDA_COMM=staged
  // keeps to MPI, =nccl takes NCCL for groups of one rank too (tests).
  const char* env = std::getenv("PTRAIN_CUDA_COMM");
  const std::string choice = env != nullptr && *env != '\0' ? env : "auto";
  const bool own_gpu = dims_->local_size() <= kernels::CudaDeviceCount();
  const bool nccl =
      !AnyRankFailed(&dims_->world_group(), !own_gpu || choice == "staged");
  // The pipeline group only sends and receives (staged: see comm_nccl.h)
  // and sums host numbers.
  for (Communicator* g :
       {&dims_->dp_group(), &dims_->tp_group(), dims_->embedding_group()}) {
    if (g == nullptr) continue;
    if (nccl && (g->size() > 1 || choice == "nccl")) {
      auto c = MakeNcclCommunicator(g, device_ops_.get());
      if (c.ok()) {
        device_groups_[g] = std::move(*c);
        continue;
      }
      spdlog::warn("{}: group {} communicates through host memory",
                   std::string(c.status().message()), g->group());
    }
    device_groups_[g] = MakeStagedCommunicator(g, device_ops_.get());
  }
  device_groups_[&dims_->pp_group()] =
      MakeStagedCommunicator(&dims_->pp_group(), device_ops_.get());
}

Communicator* Trainer::OnDevice(Communicator* group) const {
  const auto it = device_groups_.find(group);
  return it != device_groups_.end() ? it->second.get() : group;
}

Communicator* Trainer::dp_group() const {
  // ZeRO needs its group even at dp = 1 (its collectives are then local).
  return dims_ != nullptr ? OnDevice(&dims_->dp_group()) : nullptr;
}

Communicator* Trainer::tp_group() const {
  return dims_ != nullptr && dims_->tp() > 1 ? OnDevice(&dims_->tp_group())
                                             : nullptr;
}

Communicator* Trainer::pp_group() const {
  return dims_ != nullptr && dims_->pp() > 1 ? OnDevice(&dims_->pp_group())
                                             : nullptr;
}

int64_t Trainer::StageFloats(int B, int T) const {
  const bool sp = spec_.parallel().sequence_parallel() && tp_group() != nullptr;
  return int64_t{B} * (sp ? T / tp_group()->size() : T) *
         spec_.model().n_embd();
}

void Trainer::SendCopy(const float* data, int64_t n, int peer, int tag) {
  Outgoing* out = nullptr;
  for (Outgoing& o : outgoing_) {
    if (o.send != nullptr && o.send->Test()) o.send.reset();
    if (out == nullptr && o.send == nullptr) out = &o;
  }
  if (out == nullptr) out = &outgoing_.emplace_back();
  kernels::Ops& ops = store_->ops();
  if (out->data.size() < n) out->data = kernels::Buffer(&ops, n);
  ops.Copy(out->data.data(), data, n);
  out->send = pp_group()->SendAsync(out->data.data(), n, peer, tag);
}

void Trainer::WaitSends() {
  for (Outgoing& o : outgoing_) {
    if (o.send != nullptr) o.send->Wait();
    o.send.reset();
  }
}

float Trainer::PipelineForward(const int32_t* tokens, const int32_t* targets,
                               int B, int T, int decode_pos) {
  auto forward = [&](GptStage& chunk, const float* hidden, bool last) {
    if (decode_pos < 0) {
      return chunk.Forward(0, tokens, hidden, last ? targets : nullptr, B, T);
    }
    chunk.Decode(tokens, hidden, T, decode_pos);
    return 0.0f;
  };
  Communicator* pp = pp_group();
  if (pp == nullptr) return forward(model(), nullptr, true);
  // Through the virtual stages in order: this rank's chunk c is stage
  // c·pp + rank, fed by the rank before it (the last rank for c > 0 on
  // rank 0). A generation step passes every position (no sequence split).
  const int64_t n =
      decode_pos < 0 ? StageFloats(B, T) : int64_t{T} * model().config().n_embd;
  const int prev = (pp_rank_ + pp_ - 1) % pp_, next = (pp_rank_ + 1) % pp_;
  float loss = 0.0f;
  for (int c = 0; c < chunks(); ++c) {
    const int vs = VirtualStage(c);
    const bool last = vs == last_virtual_stage();
    const float* hidden = nullptr;
    if (vs > 0) {
      pp->Recv(received_[0].data(), n, prev, Tag(0, c, true));
      hidden = received_[0].data();
    }
    loss = forward(*chunks_[c], hidden, last);
    if (!last) {
      pp->Send(chunks_[c]->output(0), n, next, Tag(0, (vs + 1) / pp_, true));
    }
  }
  return loss;
}

void Trainer::PipelineStep(int64_t step, float dloss, StepResult* r,
                           double* loss_sum) {
  Communicator& pp = *pp_group();
  const int64_t tokens = int64_t{micro_B_} * T_;
  const int64_t n = StageFloats(micro_B_, T_);
  const int prev = (pp_rank_ + pp_ - 1) % pp_, next = (pp_rank_ + 1) % pp_;
  auto t = Clock::now();
  for (int mb = 0; mb < microbatches_; ++mb) {
    train_sampler_->Fill(step, FirstSequence(mb), micro_B_,
                         mb_inputs_.data() + mb * tokens,
                         mb_targets_.data() + mb * tokens);
  }
  r->phases.data += SecondsSince(t);
  // The receive each pass needs, posted one receiving pass ahead into the
  // buffer the current pass does not use, so that it arrives while this
  // rank computes: a forward's input from the previous virtual stage (none
  // for the first), a backward's gradient from the next (none for the last).
  const int n_actions = static_cast<int>(order_.size());
  auto receives = [&](int i) {
    const PipeAction& a = order_[i];
    const int vs = VirtualStage(a.chunk);
    return a.kind == PipeAction::kForward ? vs > 0 : vs != last_virtual_stage();
  };
  std::unique_ptr<CommHandle> posted;
  int posted_for = n_actions, posted_buffer = 0;
  auto post_after = [&](int i, int buffer) {
    posted_for = i + 1;
    while (posted_for < n_actions && !receives(posted_for)) ++posted_for;
    if (posted_for == n_actions) return;
    const PipeAction& a = order_[posted_for];
    const bool forward = a.kind == PipeAction::kForward;
    posted_buffer = buffer;
    posted = pp.RecvAsync(received_[buffer].data(), n, forward ? prev : next,
                          Tag(a.microbatch, a.chunk, forward));
  };
  post_after(-1, 0);
  // Backwards run so far per chunk: a chunk's last one issues the
  // reductions of its units.
  std::vector<int> backwards(chunks(), 0);
  for (int i = 0; i < n_actions; ++i) {
    const PipeAction& a = order_[i];
    const int mb = a.microbatch, c = a.chunk;
    GptStage& chunk = *chunks_[c];
    // A chunk's microbatches in flight are consecutive (ChunkSlots).
    const int slot = mb % chunk.slots();
    const int vs = VirtualStage(c);
    const bool last = vs == last_virtual_stage();
    const int32_t* in = mb_inputs_.data() + mb * tokens;
    const int32_t* tg = mb_targets_.data() + mb * tokens;
    const float* received = nullptr;
    if (posted_for == i) {
      t = Clock::now();
      posted->Wait();
      r->phases.bubble += SecondsSince(t);
      received = received_[posted_buffer].data();
      post_after(i, 1 - posted_buffer);
    }
    if (a.kind == PipeAction::kForward) {
      const float* hidden = received;
      t = Clock::now();
      const float loss =
          chunk.Forward(slot, in, hidden, last ? tg : nullptr, micro_B_, T_);
      r->phases.forward += SecondsSince(t);
      if (last) {
        *loss_sum += loss;
      } else {
        SendCopy(chunk.output(slot), n, next, Tag(mb, (vs + 1) / pp_, true));
      }
    } else {
      const float* dout = received;
      t = Clock::now();
      store_->BeginMicrobatch(++backwards[c] == microbatches_);
      chunk.Backward(slot, in, tg, dloss, dout);
      r->phases.backward += SecondsSince(t);
      if (vs > 0) {
        SendCopy(chunk.dinput(), n, prev, Tag(mb, (vs - 1) / pp_, false));
      }
    }
  }
  t = Clock::now();
  WaitSends();
  store_->FinishGradients();
  r->phases.backward += SecondsSince(t);
  // Stages finish at different times: waiting for the last one is the
  // bubble's tail, not optimizer time.
  t = Clock::now();
  pp.Barrier();
  r->phases.bubble += SecondsSince(t);
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

absl::Status Trainer::Resume() {
  const std::string& from = options_.resume_from;
  if (from.empty()) return absl::OkStatus();
  const bool latest = from == "latest";
  const bool standalone = options_.job_uid.empty();
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
  const std::vector<std::string>& candidates = *listed;
  if (latest && candidates.empty()) {
    spdlog::info("resume: no checkpoint under '{}', starting fresh", root);
    return absl::OkStatus();
  }
  const std::string field = latest ? "checkpoint.dir" : "--resume-from";
  std::string skipped;
  bool damaged = false;
  for (const std::string& dir : candidates) {
    // `latest` skips a checkpoint of another model or data (standalone runs
    // of several models may share a folder) and falls back past a damaged
    // one. Another job's, or one past train.steps, is an error: an older
    // one would not do either. A named folder must load.
    bool fatal = false, other = false;
    int64_t step = 0, opt_step = 0;
    std::string owner;
    absl::Status s = [&]() -> absl::Status {
      auto reader = CheckpointReader::Open(dir, options_.fs, field);
      if (!reader.ok()) {
        // Damaged or not a checkpoint (of this format): fall back. Refused
        // by confinement, or unreadable: stop.
        const absl::StatusCode code = reader.status().code();
        fatal = code != absl::StatusCode::kDataLoss &&
                code != absl::StatusCode::kFailedPrecondition;
        return reader.status();
      }
      const CheckpointMeta& meta = (*reader)->meta();
      if (latest && !standalone && meta.job_uid != options_.job_uid) {
        fatal = true;
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint '", dir, "' belongs to job '", meta.job_uid,
            "', not to this job '", options_.job_uid,
            "' (PTRAIN_JOB_UID); refusing to resume another job's checkpoint "
            "(give checkpoint.dir a folder of this job's own)"));
      }
      // Not this run's model or data: skipped by `latest`, refused when
      // named.
      auto mismatch = [&](absl::Status why) {
        other = latest;
        fatal = !latest;
        return why;
      };
      if (auto c =
              (*reader)->CheckCompatible(model().config(), store_->layout());
          !c.ok()) {
        return mismatch(c);
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
        fatal = true;
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint '", dir, "' is at step ", meta.step,
                         ", past train.steps=", spec_.train().steps()));
      }
      step = meta.step;
      opt_step = meta.optimizer_step;
      owner = meta.job_uid;
      absl::Status loaded = LoadState(*store_, optimizer_->adam(), **reader,
                                      /*with_optimizer=*/true);
      resume_bytes_read_ = (*reader)->bytes_read();
      return loaded;
    }();
    const bool failed = AnyRankFailed(world(), !s.ok());
    const bool any_fatal = AnyRankFailed(world(), fatal);
    const bool any_other = AnyRankFailed(world(), other);
    if (!failed) {
      store_->GatherUpdatedParams();
      start_step_ = step;
      resumed_from_ = dir;
      if (standalone) run_uid_ = owner;
      optimizer_->adam().set_steps_taken(opt_step);
      spdlog::info("resumed from '{}' at step {}{}", dir, step, skipped);
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
      step * static_cast<int64_t>(spec_.train().global_batch()) * T_;
  meta.optimizer_step = optimizer_->adam().steps_taken();
  meta.seed = spec_.train().seed();
  meta.model = chunks_.front()->config();
  if (data_.has_tokenizer) meta.vocab = data_.tokenizer.vocab();
  meta.data_digest = data_.digest;
  meta.spec_yaml = JobSpecToYaml(spec_);
  const auto& par = spec_.parallel();
  meta.dp = par.dp();
  meta.tp = par.tp();
  meta.pp = par.pp();
  meta.zero = par.zero();
  meta.world = dims_ != nullptr ? dims_->world_size() : 1;
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
  const bool tp_rank0 = dims_ == nullptr || dims_->tp_rank() == 0;
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
    : spec_(spec), options_(options), data_(std::move(data)), dims_(dims) {
  if (spec_.resources().threads_per_rank() > 0) {
    omp_set_num_threads(spec_.resources().threads_per_rank());
  }
  const auto& par = spec_.parallel();
  const GptConfig cfg = ModelConfig(spec_, data_.vocab_size);
  T_ = spec_.model().block_size();
  microbatches_ = par.microbatches();
  dp_ = par.dp();
  dp_rank_ = dims_ != nullptr ? dims_->dp_rank() : 0;
  micro_B_ = spec_.train().global_batch() / (dp_ * microbatches_);
  pp_ = par.pp();
  pp_rank_ = dims_ != nullptr ? dims_->pp_rank() : 0;
  schedule_ = ScheduleKindOf(par.schedule());
  const int v = par.virtual_stages();
  // The plan of this rank: split into stages, tensor-parallel, ZeRO units.
  const PlanOptions plan =
      SpecPlan(spec_, dims_ != nullptr ? dims_->tp_rank() : 0, pp_rank_);
  const std::vector<ParamInfo> layout = BuildPlan(cfg, plan);
  if (spec_.resources().device() == "cuda") {
    kernels::CudaOptions cuda;
    cuda.bf16_compute = spec_.train().precision() != "fp32";
    cuda.device = gpu;  // chosen and checked by Create
    std::string error;
    device_ops_ = kernels::MakeCudaOps(cuda, &error);
    PT_CHECK(device_ops_ != nullptr, error.c_str());  // Create checked
    spdlog::info("training on {}", device_ops_->name());
    if (dims_ != nullptr) MakeDeviceGroups();
  }
  store_ = std::make_unique<ZeroStore>(
      layout, dp_,
      ZeroOptions{par.zero(), microbatches_, par.bucket_bytes(),
                  /*reduce_once_per_step=*/pp_ > 1},
      dp_group(), device_ops_.get());
  // Activations of the microbatches in flight at once on each chunk.
  const std::vector<int> slots =
      ChunkSlots(schedule_, pp_, pp_rank_, microbatches_, v);
  if (pp_ > 1) {
    order_ = PipelineOrder(schedule_, pp_, pp_rank_, microbatches_, v);
  }
  const std::vector<int> stages = RankStages(plan);
  for (int c = 0; c < v; ++c) {
    int first_unit = 0;
    std::vector<ParamInfo> chunk_layout =
        StageSlice(layout, stages[c], &first_unit);
    slices_.push_back(
        std::make_unique<UnitStoreSlice>(store_.get(), first_unit));
    StageOptions stage;
    stage.max_B = micro_B_;
    stage.max_T = T_;
    stage.tp = TpGroup{tp_group(), par.sequence_parallel()};
    stage.store = slices_.back().get();
    stage.ops = compute_ops();
    stage.pad = dp_;
    stage.stage = stages[c];
    stage.n_stages = pp_ * v;
    stage.slots = slots[c];
    stage.recompute = RecomputeOf(spec_.train().recompute());
    chunks_.push_back(
        std::make_unique<GptStage>(cfg, std::move(chunk_layout), stage));
  }
  optimizer_ = std::make_unique<DistributedOptimizer>(
      store_.get(), spec_.train(),
      DistributedOptimizer::Groups{
          dp_group(), tp_group(), pp_group(),
          dims_ != nullptr ? OnDevice(dims_->embedding_group()) : nullptr,
          par.sequence_parallel()});
  store_->InitParams(spec_.train().seed());
  train_sampler_ = std::make_unique<BatchSampler>(
      &data_.train, T_, spec_.train().global_batch(), spec_.train().seed(),
      "train");
  val_sampler_ = std::make_unique<BatchSampler>(&data_.val, T_,
                                                spec_.train().global_batch(),
                                                spec_.train().seed(), "val");
  inputs_.resize(static_cast<size_t>(micro_B_) * T_);
  targets_.resize(inputs_.size());
  if (pp_ > 1) {
    mb_inputs_.resize(inputs_.size() * microbatches_);
    mb_targets_.resize(mb_inputs_.size());
    for (auto& buffer : received_) {
      buffer = kernels::Buffer(&store_->ops(), StageFloats(micro_B_, T_));
    }
  }
}

MemoryBytes Trainer::memory() const {
  MemoryBytes m = store_->memory();
  m.optimizer = optimizer_->adam().bytes();
  for (const auto& chunk : chunks_) {
    m.activations += chunk->memory().activations;
  }
  return m;
}

double Trainer::SumOverDp(double x) {
  if (dims_ != nullptr && dp_ > 1) dp_group()->AllReduce(&x, 1);
  return x;
}

double Trainer::flops_per_step() const {
  return GptFlopsPerToken(chunks_.front()->config(), T_) *
         static_cast<double>(spec_.train().global_batch()) * T_;
}

StepResult Trainer::TrainStep(int64_t step) {
  const auto t0 = Clock::now();
  const int global_batch = spec_.train().global_batch();
  // Each position's loss enters the mean over the whole global batch.
  const float dloss = 1.0f / (static_cast<float>(global_batch) * T_);
  StepResult r;
  store_->BeginStep();
  double loss_sum = 0.0;
  if (pp_ > 1) {
    PipelineStep(step, dloss, &r, &loss_sum);
  } else {
    for (int mb = 0; mb < microbatches_; ++mb) {
      auto t = Clock::now();
      train_sampler_->Fill(step, FirstSequence(mb), micro_B_, inputs_.data(),
                           targets_.data());
      r.phases.data += SecondsSince(t);
      t = Clock::now();
      store_->BeginMicrobatch(mb == microbatches_ - 1);
      loss_sum += model().Forward(0, inputs_.data(), nullptr, targets_.data(),
                                  micro_B_, T_);
      r.phases.forward += SecondsSince(t);
      t = Clock::now();
      model().Backward(0, inputs_.data(), targets_.data(), dloss, nullptr);
      if (mb == microbatches_ - 1) store_->FinishGradients();
      r.phases.backward += SecondsSince(t);
    }
  }
  const auto t = Clock::now();
  // The last stage computed the losses: every stage learns them.
  if (Communicator* pp = pp_group()) pp->AllReduce(&loss_sum, 1);
  r.loss = static_cast<float>(SumOverDp(loss_sum) / (microbatches_ * dp_));
  r.lr = LearningRate(spec_.train(), step);
  r.grad_norm = optimizer_->Step(static_cast<float>(r.lr)).grad_norm;
  r.phases.optimizer = SecondsSince(t);
  r.seconds = SecondsSince(t0);
  return r;
}

float Trainer::Evaluate() {
  const int global_batch = spec_.train().global_batch();
  double sum = 0.0;
  int64_t count = 0;
  const int local = global_batch / dp_;
  for (int b = 0; b < spec_.train().eval_batches(); ++b) {
    for (int first = dp_rank_ * local; first < (dp_rank_ + 1) * local;
         first += micro_B_) {
      val_sampler_->Fill(b, first, micro_B_, inputs_.data(), targets_.data());
      sum += PipelineForward(inputs_.data(), targets_.data(), micro_B_, T_);
      ++count;
    }
  }
  if (Communicator* pp = pp_group()) pp->AllReduce(&sum, 1);
  return static_cast<float>(SumOverDp(sum) /
                            SumOverDp(static_cast<double>(count)));
}

std::string Trainer::Sample(uint64_t salt, SampleMode mode) {
  const auto& train = spec_.train();
  const int V = data_.vocab_size;
  std::vector<int32_t> ids;
  if (data_.has_tokenizer) ids = data_.tokenizer.Encode(train.sample_prompt());
  if (ids.empty()) ids.push_back(0);
  const size_t prompt_len = ids.size();
  const uint64_t stream = StableHash("sample");
  std::vector<float> probs(V);
  std::vector<int> order(V);
  // Under sequence parallelism a forward's length is a multiple of tp: the
  // context is padded at its end, which causal attention keeps from the
  // positions that matter. (Decode steps are not split along the sequence.)
  Communicator* tp = tp_group();
  const int multiple =
      tp != nullptr && spec_.parallel().sequence_parallel() ? tp->size() : 1;
  const int Vl = model().vocab_local();
  std::vector<float> gathered(tp != nullptr ? int64_t{Vl} * tp->size() : 0);
  std::vector<int32_t> context;
  std::vector<float> last_logits;
  // The context is ids[start, end); `cached` of its positions are in every
  // stage's cache.
  size_t start = 0;
  int cached = 0;
  for (int i = 0; i < train.sample_tokens(); ++i) {
    if (ids.size() - start > static_cast<size_t>(T_)) {
      start = mode == SampleMode::kSlidingWindow
                  ? ids.size() - T_
                  : ids.size() - std::max(1, T_ / 2);
      cached = 0;
    }
    const int T = static_cast<int>(ids.size() - start);
    int last_row = T - 1;  // the row of logits(0) at the context's end
    if (mode == SampleMode::kKvCache) {
      while (cached < T) {
        const int n = std::min(T - cached, model().decode_max());
        PipelineForward(ids.data() + start + cached, nullptr, 1, n, cached);
        cached += n;
        last_row = n - 1;
      }
    } else {
      const int padded = (T + multiple - 1) / multiple * multiple;
      context.assign(ids.begin() + start, ids.end());
      context.resize(padded, 0);
      PipelineForward(context.data(), nullptr, 1, padded);
    }
    // The last stage picks the token; the others learn it from there.
    if (!last_stage()) {
      float pick = 0.0f;
      pp_group()->Broadcast(&pick, 1, pp_ - 1);
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
    // Softmax at the temperature, restricted to the top k logits if asked.
    const double temp = train.sample_temperature();
    std::iota(order.begin(), order.end(), 0);
    int keep = V;
    if (train.sample_top_k() > 0 && train.sample_top_k() < V) {
      keep = train.sample_top_k();
      std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                        [&](int a, int b) { return logits[a] > logits[b]; });
    }
    float maxv = logits[order[0]];
    for (int j = 0; j < keep; ++j) maxv = std::max(maxv, logits[order[j]]);
    double total = 0.0;
    for (int j = 0; j < keep; ++j) {
      probs[j] = static_cast<float>(std::exp((logits[order[j]] - maxv) / temp));
      total += probs[j];
    }
    const double u =
        static_cast<double>(CounterRandom64(train.seed() + salt, stream, i) >>
                            11) *
        0x1.0p-53 * total;
    double acc = 0.0;
    int pick = order[keep - 1];
    for (int j = 0; j < keep; ++j) {
      acc += probs[j];
      if (u < acc) {
        pick = order[j];
        break;
      }
    }
    if (Communicator* pp = pp_group()) {
      float f = static_cast<float>(pick);  // token ids are exact in a float
      pp->Broadcast(&f, 1, pp_ - 1);
    }
    ids.push_back(pick);
  }
  if (data_.has_tokenizer) return data_.tokenizer.Decode(ids);
  std::string out;
  for (size_t i = prompt_len; i < ids.size(); ++i) {
    absl::StrAppend(&out, i == prompt_len ? "" : " ", ids[i]);
  }
  return out;
}

namespace {

// Tells options.on_activity what the rank is busy with while it lives
// (scopes of it do not nest).
class Busy {
 public:
  Busy(const TrainerOptions& options, const char* what) : options_(options) {
    if (options_.on_activity) options_.on_activity(what);
  }
  ~Busy() {
    if (options_.on_activity) options_.on_activity("");
  }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  const TrainerOptions& options_;
};

}  // namespace

absl::Status Trainer::Run() {
  std::unique_ptr<RunLog> log = std::make_unique<RunLog>();
  if (!options_.log_json_path.empty() && is_log_rank()) {
    auto opened = RunLog::Open(options_.log_json_path);
    if (!opened.ok()) return opened.status();
    log = std::move(*opened);
  }
  auto emit = [&](const nlohmann::json& record) {
    log->Write(record);
    if (options_.on_record && is_log_rank()) options_.on_record(record);
  };
  const auto& train = spec_.train();
  // MFU's denominator: the measured matmul peak of what trains, the CPU's
  // sgemm or the GPU's matmul in the job's precision.
  const double peak = [&] {
    if (options_.peak_flops > 0) return options_.peak_flops;
    Busy busy(options_, "measuring the matmul peak");
    const double measured = compute_ops() != nullptr
                                ? MeasureMatmulPeakFlops(*compute_ops())
                                : MeasureSgemmPeakFlops();
    return BestPeakFlops(
        measured,
        PeakCacheKey(
            compute_ops() != nullptr ? compute_ops()->name() : "cpu sgemm",
            omp_get_max_threads()),
        PeakCachePath());
  }();
  bool mfu_warned = false;
  const MemoryBytes mem = memory();
  spdlog::info(
      "model: {} parameters (L={} NH={} C={} T={} V={}), {} threads, {} "
      "matmul peak {:.1f} GFLOP/s",
      GptNumParams(model().config()), spec_.model().n_layer(),
      spec_.model().n_head(), spec_.model().n_embd(), T_, data_.vocab_size,
      omp_get_max_threads(),
      compute_ops() != nullptr ? compute_ops()->name() : "cpu sgemm",
      peak / 1e9);
  spdlog::info(
      "memory per rank: params {:.1f} MB, grads {:.1f} MB, optimizer {:.1f} "
      "MB, activations {:.1f} MB",
      mem.params / 1e6, mem.grads / 1e6, mem.optimizer / 1e6,
      mem.activations / 1e6);
  if (options_.metrics != nullptr) options_.metrics->SetMemory(mem);
  const auto& par = spec_.parallel();
  emit({{"type", "layout"},
        {"world", dims_ != nullptr ? dims_->world_size() : 1},
        {"dp", par.dp()},
        {"tp", par.tp()},
        {"pp", par.pp()},
        {"zero", par.zero()},
        {"sequence_parallel", par.sequence_parallel()},
        {"microbatches", par.microbatches()},
        {"schedule", pp_ > 1 ? par.schedule() : "none"},
        {"virtual_stages", par.virtual_stages()},
        {"stage_layers", SpecPlan(spec_, 0, 0).stage_layers}});
  if (!resumed_from_.empty()) {
    // The checkpoint this attempt starts from, read off the directory: it may
    // be newer than the previous attempt's last "checkpoint" record, when that
    // attempt died between committing a checkpoint and logging it.
    emit({{"type", "resume"}, {"step", start_step_}, {"dir", resumed_from_}});
  }
  emit({{"type", "memory"},
        {"params_bytes", mem.params},
        {"grads_bytes", mem.grads},
        {"optimizer_bytes", mem.optimizer},
        {"activations_bytes", mem.activations}});

  const double tokens_per_step = static_cast<double>(train.global_batch()) * T_;
  auto eval = [&](int64_t step) {
    const float val = [&] {
      Busy busy(options_, "evaluating");
      return Evaluate();
    }();
    if (options_.metrics != nullptr) options_.metrics->OnEval(val);
    spdlog::info("step {:>6} | val loss {:.6f}", step, val);
    emit({{"type", "eval"}, {"step", step}, {"val_loss", val}});
  };
  auto sample = [&](int64_t step) {
    const std::string text = [&] {
      Busy busy(options_, "sampling");
      return Sample(static_cast<uint64_t>(step));
    }();
    spdlog::info("sample at step {}:\n{}", step, text);
    emit({{"type", "sample"}, {"step", step}, {"text", text}});
  };
  const bool checkpoints = !spec_.checkpoint().dir().empty();
  // `blocked`: seconds the loop waited for this save; `written`: for a
  // background save, seconds its thread took to write this rank's shard.
  auto report_checkpoint = [&](int64_t step, const std::string& dir,
                               double blocked, std::optional<double> written) {
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
    emit(record);
  };
  auto finish_background = [&]() -> absl::Status {
    const auto t0 = Clock::now();
    const int64_t saved_step = background_save_.step();
    auto dir = [&] {
      Busy busy(options_, "committing a checkpoint");
      return background_save_.Finish(world());
    }();
    if (!dir.ok()) return dir.status();
    report_checkpoint(saved_step, *dir, background_blocked_ + SecondsSince(t0),
                      background_save_.write_seconds());
    return absl::OkStatus();
  };
  if (options_.metrics != nullptr && checkpoints &&
      spec_.checkpoint().every() > 0) {
    options_.metrics->OnCheckpointPolicy(spec_.checkpoint().every());
  }
  for (int64_t s = start_step_; s < train.steps(); ++s) {
    if (options_.hang_at_step.has_value() && *options_.hang_at_step == s + 1) {
      spdlog::warn("test hook: hanging at step {}", s + 1);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const StepResult r = TrainStep(s);
    const int64_t step = s + 1;  // steps completed
    const double tok_per_s = tokens_per_step / r.seconds;
    // Model FLOPs of the global batch over the peak of every rank.
    const double mfu = flops_per_step() / r.seconds /
                       (peak * (dims_ != nullptr ? dims_->world_size() : 1));
    if (!mfu_warned && is_log_rank()) {
      const std::string w =
          MfuAbovePeakWarning(mfu, peak, options_.peak_flops <= 0);
      mfu_warned = !w.empty();
      if (mfu_warned) spdlog::warn("step {:>6} | {}", step, w);
    }
    if (options_.metrics != nullptr) {
      options_.metrics->OnStep(step, r.loss, r.seconds, tok_per_s, mfu,
                               r.phases);
      if (dims_ != nullptr) options_.metrics->UpdateComm(*dims_->comm_stats());
      if (device_ops_ != nullptr) {
        const kernels::CudaMemory gpu = kernels::CudaMemoryInfo();
        options_.metrics->SetGpuMemory(gpu.used, gpu.total);
      }
    }
    if (!std::isfinite(r.loss)) {
      return absl::InternalError(
          absl::StrCat("loss is ", r.loss, " at step ", step));
    }
    emit({{"type", "step"},
          {"step", step},
          {"loss", r.loss},
          {"lr", r.lr},
          {"ms", r.seconds * 1e3},
          {"tok_per_s", tok_per_s},
          {"mfu", mfu},
          {"grad_norm", r.grad_norm}});
    if (!options_.quiet &&
        (step == 1 || step % train.log_every() == 0 || step == train.steps())) {
      spdlog::info(
          "step {:>6}/{} | loss {:.6f} | lr {:.2e} | norm {:.3f} | {:.1f} ms | "
          "{:.0f} tok/s | MFU {:.1f}%",
          step, train.steps(), r.loss, r.lr, r.grad_norm, r.seconds * 1e3,
          tok_per_s, 100.0 * mfu);
    }
    if ((train.eval_every() > 0 && step % train.eval_every() == 0) ||
        step == train.steps()) {
      eval(step);
    }
    if (train.sample_every() > 0 && step % train.sample_every() == 0 &&
        step != train.steps()) {
      sample(step);
    }
    // A background save commits at the first step end after every rank
    // has written its shard (one small all-reduce a step while it writes).
    if (background_save_.pending() && background_save_.AllWritten(world())) {
      if (auto st = finish_background(); !st.ok()) return st;
    }
    // Asked to stop (SIGUSR1 on any rank): this step is saved, here or
    // below, and the run ends after it.
    const bool stop = options_.stop_requested != nullptr &&
                      step != train.steps() &&
                      AnyRankFailed(world(), options_.stop_requested->load());
    if (checkpoints && (stop ||
                        (spec_.checkpoint().every() > 0 &&
                         step % spec_.checkpoint().every() == 0) ||
                        step == train.steps())) {
      // The previous background save first: its wait counts as its own.
      if (background_save_.pending()) {
        if (auto st = finish_background(); !st.ok()) return st;
      }
      const auto t0 = Clock::now();
      Busy busy(options_, "writing a checkpoint");
      if (spec_.checkpoint().async_save() && step != train.steps() && !stop) {
        auto committed = StartCheckpointAt(step);
        if (!committed.ok()) return committed.status();
        background_blocked_ = SecondsSince(t0);
        if (!*committed) continue;  // reported once it commits
        report_checkpoint(step,
                          CheckpointFolder(spec_.checkpoint().dir(), step),
                          background_blocked_, std::nullopt);
      } else {
        auto dir = SaveCheckpointAt(step);
        if (!dir.ok()) return dir.status();
        report_checkpoint(step, *dir, SecondsSince(t0), std::nullopt);
      }
    }
    if (stop) {
      spdlog::warn("step {:>6} | stopping as asked (a stop signal){}", step,
                   checkpoints ? ", after this step's checkpoint"
                               : "; no checkpoint.dir, so nothing is saved");
      emit({{"type", "stop"}, {"step", step}});
      stopped_ = true;
      return absl::OkStatus();
    }
  }
  if (background_save_.pending()) {
    if (auto st = finish_background(); !st.ok()) return st;
  }
  sample(train.steps());
  // The last record of a run that trained every step: how a coordinator
  // that could not learn the exit code knows the job finished.
  emit({{"type", "end"}, {"step", train.steps()}});
  return absl::OkStatus();
}

}  // namespace ptrain
