// The step's expert load of the whole model, from what each chunk's MoE
// layers counted (GptStage::part_stats).
#ifndef PTRAIN_WORKER_ENGINE_TRAIN_EXPERT_REPORT_H_
#define PTRAIN_WORKER_ENGINE_TRAIN_EXPERT_REPORT_H_

#include <memory>
#include <vector>

#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/parallel/rank_build.h"
#include "worker/engine/parallel/zero_store.h"
#include "worker/engine/report/expert_load.h"

namespace ptrain {

// Forgets what the chunks counted (before a step).
void ClearExpertLoad(const std::vector<std::unique_ptr<GptStage>>& chunks);
// The counts of the step since ClearExpertLoad, over every rank: each
// layer's held by its pipeline stage, counted alike by the ranks of its
// tensor-parallel group (one of them counts), summed over the data-parallel
// replicas. One all-reduce over the world, on every rank alike; nothing for
// a dense model.
ExpertLoad CollectExpertLoad(
    const std::vector<std::unique_ptr<GptStage>>& chunks,
    const ParallelDims& dims, const RankBuild& build);

// model.moe.balance: bias (DeepSeek-V3's auxiliary-loss-free balancing):
// moves each MoE layer's selection bias (mlp.router.expert_bias) by the
// model's bias_rate for each expert, up where the expert took fewer of the
// layer's tokens in `load` than their mean, down where it took more, in
// the weights the optimizer updates next (before its step, which leaves
// them: their gradient is zero). Every rank alike, from the global load;
// nothing for a model without the bias.
void MoveExpertBias(ZeroStore& store, const ExpertLoad& load,
                    const GptConfig& model);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_TRAIN_EXPERT_REPORT_H_
