#include "worker/engine/parallel/rank_build.h"

#include <string>

#include "common/check.h"
#include "common/mesh.h"
#include "worker/engine/parallel/schedule.h"

namespace ptrain {

GptConfig ModelConfig(const v1::JobSpec& spec, int vocab_size) {
  const auto& m = spec.model();
  GptConfig c;
  c.n_layer = m.n_layer();
  c.n_head = m.n_head();
  c.n_embd = m.n_embd();
  c.block_size = m.block_size();
  c.vocab_size = vocab_size;
  c.arch = m.arch();
  c.tie_embeddings = TiesEmbeddings(m);
  if (m.arch() == "llama") {
    c.n_kv_head = KvHeads(m);
    c.head_dim = m.head_dim();
    c.qk_norm = m.qk_norm();
    c.ffn_hidden = FfnHidden(m);
    c.norm_eps = static_cast<float>(NormEps(m));
    c.rope.theta = static_cast<float>(RopeTheta(m));
    const v1::RopeScalingSpec r = RopeScaling(m);
    c.rope.factor = static_cast<float>(r.factor());
    c.rope.low_freq_factor = static_cast<float>(r.low_freq_factor());
    c.rope.high_freq_factor = static_cast<float>(r.high_freq_factor());
    c.rope.original_context = r.original_context();
  }
  if (const v1::MoeSpec moe = MoeOf(m); moe.experts() > 0) {
    c.moe.experts = moe.experts();
    c.moe.top_k = moe.top_k();
    c.moe.shared = moe.shared_experts();
    c.moe.hidden = moe.expert_hidden();
    c.moe.every = moe.every();
    c.moe.router = RouterNamed(moe.router()).value();  // validated
    c.moe.capacity_factor = static_cast<float>(moe.capacity_factor());
    c.moe.aux_coef = static_cast<float>(moe.aux_loss_coef());
    c.moe.z_coef = static_cast<float>(moe.z_loss_coef());
    c.moe.ep = JobLayout(spec).degree("ep");
    c.moe.expert_tp = JobLayout(spec).expert_tp;
    c.moe.bias = moe.balance() == "bias";
    c.moe.bias_rate = static_cast<float>(moe.bias_update_rate());
  }
  c.padded_vocab = PaddedVocab(vocab_size, JobLayout(spec).degree("tp"));
  return c;
}

PlanOptions SpecPlan(const v1::JobSpec& spec, int tp_rank, int pp_rank,
                     int ep_rank) {
  const ParallelLayout p = JobLayout(spec);
  PlanOptions plan;
  plan.tp = p.degree("tp");
  plan.tp_rank = tp_rank;
  plan.pp = p.degree("pp");
  plan.pp_rank = pp_rank;
  plan.pad = p.degree("dp") * p.degree("cp");
  plan.ep_rank = ep_rank;
  plan.virtual_stages = p.virtual_stages;
  absl::StatusOr<std::vector<int>> layers = JobStageLayers(spec);
  PT_CHECK(layers.ok(), std::string(layers.status().message()).c_str());
  plan.stage_layers = *std::move(layers);
  return plan;
}

RankBuild RankBuild::Of(const v1::JobSpec& spec, int vocab_size, int tp_rank,
                        int pp_rank, int ep_rank) {
  const ParallelLayout p = JobLayout(spec);
  RankBuild b;
  b.model = ModelConfig(spec, vocab_size);
  b.device = SpecDevice(spec);
  b.precision = SpecPrecision(spec);
  b.T = spec.model().block_size();
  b.global_batch = spec.train().global_batch();
  b.microbatches = p.microbatches;
  b.dp = p.degree("dp");
  b.tp = p.degree("tp");
  b.pp = p.degree("pp");
  b.cp = p.degree("cp");
  b.ep = p.degree("ep");
  b.micro_B = b.global_batch / (b.dp * b.microbatches);
  b.virtual_stages = p.virtual_stages;
  b.sequence_parallel = p.sequence_parallel;
  b.schedule = ScheduleKindOf(p.schedule);
  b.recompute = RecomputeOf(spec.train().recompute());
  b.zero = ZeroOptions{p.zero, b.microbatches, p.bucket_bytes,
                       /*reduce_once_per_step=*/b.pp > 1,
                       /*bf16_weights=*/b.precision == Precision::kBf16};
  b.offload_optimizer = p.offload_optimizer;
  b.plan = SpecPlan(spec, tp_rank, pp_rank, ep_rank);
  b.stages = RankStages(b.plan);
  b.slots =
      ChunkSlots(b.schedule, b.pp, pp_rank, b.microbatches, b.virtual_stages);
  return b;
}

StageOptions RankBuild::Stage(int chunk) const {
  StageOptions stage;
  stage.max_B = micro_B;
  stage.max_T = T_local();
  stage.pad = replicas();
  stage.stage = stages[chunk];
  stage.n_stages = n_stages();
  stage.slots = slots[chunk];
  stage.recompute = recompute;
  // A zero-bubble order runs each backward as B and W (pp > 1: whole
  // gradients through the step, as the split needs).
  stage.split_backward = pp > 1 && schedule == ScheduleKind::kZeroBubble;
  return stage;
}

}  // namespace ptrain
