// The plan's steps that read the model's parts (model_parts.h): its
// tensors (GptTensors, GptBlockTensorNames), their tensor-parallel plan
// (ApplyTensorParallel) and its FLOPs (GptFlopsPerToken); see plan.h. The
// rest of the plan reads none.
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/plan.h"

namespace ptrain {
namespace {

using Init = ParamInfo::Init;

// The tensor-parallel plan, keyed by the tensor's name (its block suffix
// for block tensors): every part's entries.
struct TpRule {
  TpSplit split;
  bool sequence_partial;  // gradient summed over tp under sp
  bool tp_partial;        // gradient summed over tp always
};
std::map<std::string, TpRule> TpPlan(const GptConfig& cfg) {
  std::map<std::string, TpRule> plan;
  const ModelParts& parts = ModelPartsOf(cfg);
  for (const auto* list : {&parts.before, &parts.block, &parts.after}) {
    for (const auto& part : *list) {
      for (const PartTensor& t : part->Tensors(cfg)) {
        plan[t.name] = TpRule{t.split, t.sequence_partial, t.tp_partial};
      }
    }
  }
  return plan;
}

// "h.3.attn.c_attn.weight" -> "attn.c_attn.weight"; other names unchanged.
std::string PlanKey(const ParamInfo& p) {
  if (p.layer < 0) return p.name;
  return p.name.substr(p.name.find('.', 2) + 1);
}

// The global unit of a tensor before LayoutUnits numbers them per stage:
// 0 embeddings, 1 + kBlockUnits·l + k block l's k-th, after the blocks
// ln_f's (a block's units need not all be used).
constexpr int kBlockUnits = 8;
int GlobalUnit(int layer, int unit_in_block, bool final_norm, int L) {
  if (final_norm) return kBlockUnits * L + 1;
  return layer < 0 ? 0 : 1 + kBlockUnits * layer + unit_in_block;
}

}  // namespace

const std::vector<std::string>& GptBlockTensorNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& part : Gpt2Parts().block) {
      for (const PartTensor& t : part->Tensors(GptConfig{})) {
        out.push_back(t.name);
      }
    }
    return out;
  }();
  return names;
}

std::vector<ParamInfo> GptTensors(const GptConfig& cfg) {
  const int L = cfg.n_layer;
  const double std = 0.02;
  // GPT-2 scales the residual projections by 1/sqrt(2L): two per block.
  const double proj_std = 0.02 / std::sqrt(2.0 * L);
  std::vector<ParamInfo> out;
  auto add = [&](const PartTensor& t, std::string name, int layer, int unit) {
    ParamInfo p;
    p.name = std::move(name);
    p.global_shape = t.shape;
    p.shape = t.shape;
    p.layer = layer;
    p.decay = p.global_shape.size() == 2;
    p.init = t.init;
    p.init_std = t.init == Init::kNormal
                     ? (t.residual_projection ? proj_std : std)
                     : 0.0;
    p.unit = unit;
    p.expert = t.expert;
    p.boxes = {WholeBox(p.global_shape)};
    p.numel = ShapeNumel(p.shape);
    out.push_back(std::move(p));
  };
  const ModelParts& parts = ModelPartsOf(cfg);
  for (const auto& part : parts.before) {
    for (const PartTensor& t : part->Tensors(cfg)) {
      add(t, t.name, kBeforeBlocks, GlobalUnit(-1, t.unit, false, L));
    }
  }
  // A tied head reads the token embedding's table.
  if (parts.head->tied()) {
    for (ParamInfo& p : out) p.tied = p.name == "wte";
  }
  for (int l = 0; l < L; ++l) {
    for (const auto& part : parts.block) {
      for (const PartTensor& t : part->TensorsAt(cfg, l)) {
        add(t, absl::StrCat("h.", l, ".", t.name), l,
            GlobalUnit(l, t.unit, false, L));
      }
    }
  }
  for (const auto& part : parts.after) {
    for (const PartTensor& t : part->Tensors(cfg)) {
      add(t, t.name, kAfterBlocks, GlobalUnit(-1, t.unit, true, L));
    }
  }
  return out;
}

void ApplyTensorParallel(std::vector<ParamInfo>* tensors, const GptConfig& cfg,
                         int tp, int r) {
  PT_CHECK(tp >= 1 && cfg.n_head % tp == 0 && cfg.padded_vocab % tp == 0 &&
               cfg.padded_vocab >= cfg.vocab_size,
           "tp must divide n_head and the padded vocabulary");
  const int64_t C = cfg.n_embd, Cl = C / tp;
  const std::map<std::string, TpRule> plan = TpPlan(cfg);
  for (ParamInfo& p : *tensors) {
    auto rule = plan.find(PlanKey(p));
    p.split = rule == plan.end() ? TpSplit::kReplicated : rule->second.split;
    p.sequence_partial = rule != plan.end() && rule->second.sequence_partial;
    p.tp_partial = rule != plan.end() && rule->second.tp_partial;
    if (p.split == TpSplit::kKvHeads) {
      if (cfg.kv_heads() % tp == 0) {
        p.split = TpSplit::kColumn;
      } else {
        p.split = TpSplit::kReplicated;
        p.tp_partial = true;
      }
    }
    // A routed expert is split over its slice's expert_tp ranks (Moe::
    // ExpertTp), the rank's place in it tp_rank % expert_tp.
    const int n = p.expert >= 0 ? cfg.moe.ExpertTp(tp) : tp;
    const int at = r % n;
    const std::vector<int64_t>& g = p.global_shape;
    Box box = WholeBox(g);
    switch (p.split) {
      case TpSplit::kReplicated:
        p.shape = g;
        p.boxes = {box};
        break;
      case TpSplit::kColumn: {
        const int64_t rows = g[0] / n;
        p.shape = g;
        p.shape[0] = rows;
        box.lo[0] = at * rows;
        box.hi[0] = (at + 1) * rows;
        p.boxes = {box};
        break;
      }
      case TpSplit::kRow: {
        const int64_t cols = g[1] / n;
        p.shape = {g[0], cols};
        box.lo[1] = at * cols;
        box.hi[1] = (at + 1) * cols;
        p.boxes = {box};
        break;
      }
      case TpSplit::kQkv:
      case TpSplit::kStacked2: {
        // Equal parts of dim 0 (q, k and v: C rows each); this rank's
        // rows of each: [at·each, (at+1)·each) of the part.
        const int parts = p.split == TpSplit::kQkv ? 3 : 2;
        const int64_t rows = p.split == TpSplit::kQkv ? C : g[0] / 2;
        const int64_t each = p.split == TpSplit::kQkv ? Cl : rows / n;
        p.shape = g;
        p.shape[0] = parts * each;
        p.boxes.clear();
        for (int part = 0; part < parts; ++part) {
          Box b = box;
          b.lo[0] = part * rows + at * each;
          b.hi[0] = part * rows + (at + 1) * each;
          p.boxes.push_back(b);
        }
        break;
      }
      case TpSplit::kKvHeads:  // resolved above
        PT_CHECK(false, "kv_heads split unresolved");
        break;
      case TpSplit::kVocab: {
        const int64_t Vl = cfg.padded_vocab / tp;
        p.shape = {Vl, g[1]};
        box.lo[0] = std::min<int64_t>(r * Vl, g[0]);
        box.hi[0] = std::min<int64_t>((r + 1) * Vl, g[0]);
        p.boxes = {box};
        break;
      }
    }
    p.numel = ShapeNumel(p.shape);
  }
}

double GptFlopsPerToken(const GptConfig& cfg, int T) {
  const ModelParts& parts = ModelPartsOf(cfg);
  double flops = 0;
  for (const auto& part : parts.before) flops += part->FlopsPerToken(cfg, T);
  for (const auto& part : parts.block) {
    flops += cfg.n_layer * part->FlopsPerToken(cfg, T);
  }
  for (const auto& part : parts.after) flops += part->FlopsPerToken(cfg, T);
  return flops;
}

}  // namespace ptrain
