// The job spec's defaults and the typed views of a validated spec that the
// engine reads (world size, schedule, recomputation, device, precision). The
// rest of common/spec.h: YAML in and out in spec_yaml.cc (field by field in
// spec_fields.cc), the rules in spec_validate.cc, the warnings in
// spec_warnings.cc.
#include "common/spec.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/mesh.h"

namespace ptrain {

int64_t AliveIntervalMs(int64_t hang_timeout_s) {
  return std::clamp<int64_t>(hang_timeout_s * 1000 / 4, 250, 10000);
}

bool IsRankTimesGroupName(std::string_view name) {
  return !name.empty() && name.size() <= kMaxRankTimesGroupBytes &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                  c == '_';
         });
}

int64_t ParallelWorldSize(const v1::ParallelSpec& p) {
  return LayoutOf(p).world_size();
}

int64_t JobWorldSize(const v1::JobSpec& spec) {
  return ParallelWorldSize(spec.parallel());
}

std::string ParallelWorldFactors(const v1::ParallelSpec& p) {
  return LayoutOf(p).Factors();
}

ScheduleKind ScheduleKindOf(std::string_view name) {
  if (name == "gpipe") return ScheduleKind::kGpipe;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  if (name == "zb1p") return ScheduleKind::kZeroBubble;
  return ScheduleKind::k1F1B;
}

const char* ScheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGpipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZeroBubble:
      return "zb1p";
  }
  return "?";
}

Recompute RecomputeOf(std::string_view name) {
  if (name == "full") return Recompute::kFull;
  return name == "selective" ? Recompute::kSelective : Recompute::kNone;
}

Device SpecDevice(const v1::JobSpec& spec) {
  return spec.resources().device() == "cuda" ? Device::kCuda : Device::kCpu;
}

Precision SpecPrecision(const v1::JobSpec& spec) {
  const std::string& p = spec.train().precision();
  if (p == "auto") {
    return SpecDevice(spec) == Device::kCuda ? Precision::kBf16
                                             : Precision::kFp32;
  }
  return p == "bf16" ? Precision::kBf16 : Precision::kFp32;
}

bool TiesEmbeddings(const v1::ModelSpec& model) {
  return !model.has_tie_embeddings() || model.tie_embeddings();
}

int KvHeads(const v1::ModelSpec& model) {
  return model.arch() == "llama" && model.n_kv_head() > 0 ? model.n_kv_head()
                                                          : model.n_head();
}

int HeadDim(const v1::ModelSpec& model) {
  return model.head_dim() > 0 ? model.head_dim()
                              : model.n_embd() / std::max(1, model.n_head());
}

std::string TrainFilesPrefix(std::string_view train_bin) {
  const size_t slash = train_bin.rfind('/');
  const size_t name_at = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t train = train_bin.rfind("_train");
  if (train == std::string_view::npos || train < name_at) return "";
  return std::string(train_bin.substr(0, train));
}

std::string BlendSourceName(const v1::BlendSource& source) {
  if (!source.name().empty()) return source.name();
  const std::string prefix = TrainFilesPrefix(source.train_bin());
  return prefix.substr(prefix.rfind('/') + 1);  // npos + 1: all of it
}

bool IsBlendSourceName(std::string_view name) {
  return !name.empty() && name.size() <= kMaxBlendNameBytes &&
         std::none_of(name.begin(), name.end(), [](char c) {
           return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
         });
}

v1::DataSpec BlendSourceData(const v1::DataSpec& data, int i) {
  v1::DataSpec one;
  one.set_tokenizer(data.tokenizer());
  one.set_val_fraction(data.val_fraction());
  one.set_train_bin(data.blend(i).train_bin());
  one.set_val_bin(data.blend(i).val_bin());
  return one;
}

v1::MoeSpec MoeOf(const v1::ModelSpec& model) {
  v1::MoeSpec moe = model.moe();
  if (moe.experts() == 0) return v1::MoeSpec();
  if (moe.top_k() == 0) moe.set_top_k(2);
  if (moe.every() == 0) moe.set_every(1);
  if (moe.expert_hidden() == 0) moe.set_expert_hidden(FfnHidden(model));
  if (moe.router().empty()) moe.set_router("softmax");
  if (!moe.has_aux_loss_coef()) moe.set_aux_loss_coef(0.01);
  if (moe.balance().empty()) moe.set_balance("aux");
  if (moe.balance() == "bias" && !moe.has_bias_update_rate()) {
    moe.set_bias_update_rate(0.001);
  }
  return moe;
}

int FfnHidden(const v1::ModelSpec& model) {
  const int64_t C = model.n_embd();
  if (model.arch() != "llama") return static_cast<int>(4 * C);
  if (model.ffn_hidden() > 0) return model.ffn_hidden();
  int64_t hidden = 2 * (4 * C) / 3;
  if (model.ffn_dim_multiplier() > 0) {
    hidden = static_cast<int64_t>(model.ffn_dim_multiplier() *
                                  static_cast<double>(hidden));
  }
  const int64_t m = model.multiple_of() > 0 ? model.multiple_of() : 256;
  return static_cast<int>((hidden + m - 1) / m * m);
}

double NormEps(const v1::ModelSpec& model) {
  return model.norm_eps() > 0 ? model.norm_eps() : 1e-5;
}

double RopeTheta(const v1::ModelSpec& model) {
  return model.rope_theta() > 0 ? model.rope_theta() : 10000;
}

v1::RopeScalingSpec RopeScaling(const v1::ModelSpec& model) {
  v1::RopeScalingSpec r = model.rope_scaling();
  if (r.low_freq_factor() <= 0) r.set_low_freq_factor(1);
  if (r.high_freq_factor() <= 0) r.set_high_freq_factor(4);
  if (r.original_context() <= 0) r.set_original_context(8192);
  return r;
}

CudaGraphs CudaGraphsOf(const v1::JobSpec& spec) {
  const std::string& g = spec.train().cuda_graphs();
  if (g == "auto") return CudaGraphs::kAuto;
  return g == "on" ? CudaGraphs::kOn : CudaGraphs::kOff;
}

std::string CudaGraphsUnsupported(const v1::JobSpec& spec) {
  const v1::ParallelSpec& p = spec.parallel();
  if (SpecDevice(spec) != Device::kCuda) {
    return absl::StrCat("resources.device=", spec.resources().device(),
                        ": CUDA graphs record a GPU's kernels");
  }
  if (p.dp() * int64_t{p.tp()} * p.cp() > 1) {
    return absl::StrCat("parallel.dp × parallel.tp × parallel.cp = ", p.dp(),
                        " × ", p.tp(), " × ", p.cp(),
                        ": these groups communicate inside a pass, from the "
                        "host");
  }
  if (p.pp() > 1 && p.schedule() == "zb1p") {
    return "parallel.schedule=zb1p: each backward runs as two passes with "
           "other microbatches' passes between them";
  }
  if (p.zero() != 0) {
    return absl::StrCat("parallel.zero=", p.zero(),
                        ": the store reduces or gathers inside the passes");
  }
  if (p.offload() != "none") {
    return absl::StrCat("parallel.offload=", p.offload(),
                        ": the step copies between host and GPU");
  }
  return "";
}

v1::JobSpec DefaultJobSpec() {
  v1::JobSpec spec;

  v1::ModelSpec* model = spec.mutable_model();
  model->set_arch("gpt");
  model->set_n_layer(4);
  model->set_n_head(4);
  model->set_n_embd(128);
  model->set_block_size(64);
  model->set_vocab_size(0);
  model->set_init_from("");
  model->set_tie_embeddings(true);
  model->mutable_rope_scaling();  // present, as every section (all 0)
  model->mutable_moe();

  v1::DataSpec* data = spec.mutable_data();
  data->set_path("");
  data->set_tokenizer("auto");
  data->set_val_fraction(0.1);
  data->set_train_bin("");
  data->set_val_bin("");

  v1::ParallelSpec* parallel = spec.mutable_parallel();
  for (const MeshDimension& d : MeshDimensions()) d.set_degree(parallel, 1);
  parallel->set_zero(0);
  parallel->set_sequence_parallel(false);
  parallel->set_microbatches(1);
  parallel->set_schedule("1f1b");
  parallel->set_bucket_bytes(int64_t{25} << 20);
  parallel->set_virtual_stages(1);
  parallel->set_offload("none");

  v1::TrainSpec* train = spec.mutable_train();
  train->set_steps(1000);
  train->set_global_batch(32);
  train->set_lr(1e-3);
  train->set_min_lr(1e-4);
  train->set_warmup_steps(100);
  train->set_weight_decay(0.1);
  train->set_grad_clip(1.0);
  train->set_seed(1337);
  train->set_eval_every(100);
  train->set_eval_batches(20);
  train->set_sample_every(0);
  train->set_beta1(0.9);
  train->set_beta2(0.95);
  train->set_eps(1e-8);
  train->set_sample_prompt("\n");
  train->set_sample_tokens(200);
  train->set_sample_temperature(1.0);
  train->set_sample_top_k(0);
  train->set_log_every(10);
  train->set_precision("auto");
  train->set_recompute("none");
  train->set_cuda_graphs("off");
  train->set_lr_schedule("cosine");
  train->set_decay_fraction(0.2);
  v1::AnomalySpec* anomaly = train->mutable_anomaly();
  anomaly->set_nan("stop");
  anomaly->set_spike_factor(0.0);
  anomaly->set_window(100);
  anomaly->set_max_rollbacks(3);

  v1::CheckpointSpec* checkpoint = spec.mutable_checkpoint();
  checkpoint->set_every(0);
  checkpoint->set_keep_last(3);
  checkpoint->set_dir("");

  v1::ResourcesSpec* resources = spec.mutable_resources();
  resources->set_device("cpu");
  resources->set_ranks_per_node(0);
  resources->set_threads_per_rank(0);

  v1::RestartSpec* restart = spec.mutable_restart();
  restart->set_max_restarts(3);
  restart->set_hang_timeout_s(300);
  restart->set_allow_shrink(false);
  restart->set_allow_grow(false);
  restart->set_preemptible(true);
  spec.set_priority("normal");
  return spec;
}

}  // namespace ptrain
