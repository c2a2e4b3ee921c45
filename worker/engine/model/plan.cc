// The parallel plan; see plan.h. The model's tensors and their
// tensor-parallel plan come from its parts (parts.h); here are the steps
// that apply them.
#include "worker/engine/model/plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "worker/engine/model/parts.h"
#include "worker/engine/model/rng.h"

namespace ptrain {
namespace {

using Init = ParamInfo::Init;

// The tensor-parallel plan, keyed by the tensor's name (its block suffix
// for block tensors): every part's entries.
struct TpRule {
  TpSplit split;
  bool sequence_partial;  // gradient summed over tp under sp
};
std::map<std::string, TpRule> TpPlan(const GptConfig& cfg) {
  std::map<std::string, TpRule> plan;
  const ModelParts& parts = ModelPartsOf(cfg);
  for (const auto* list : {&parts.before, &parts.block, &parts.after}) {
    for (const auto& part : *list) {
      for (const PartTensor& t : part->Tensors(cfg)) {
        plan[t.name] = TpRule{t.split, t.sequence_partial};
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

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The global unit of a tensor before LayoutUnits numbers them per stage:
// 0 embeddings, 1 + 4l + k block l's k-th, 4L + 1 ln_f.
int GlobalUnit(int layer, int unit_in_block, bool final_norm, int L) {
  if (final_norm) return 4 * L + 1;
  return layer < 0 ? 0 : 1 + 4 * layer + unit_in_block;
}

}  // namespace

int PaddedVocab(int V, int tp) {
  const int multiple = 128 * tp;
  return (V + multiple - 1) / multiple * multiple;
}

const char* TpSplitName(TpSplit split) {
  switch (split) {
    case TpSplit::kReplicated:
      return "replicated";
    case TpSplit::kColumn:
      return "column";
    case TpSplit::kRow:
      return "row";
    case TpSplit::kVocab:
      return "vocab";
    case TpSplit::kQkv:
      return "qkv";
  }
  return "?";
}

int64_t Box::numel() const {
  int64_t n = 1;
  for (size_t d = 0; d < lo.size(); ++d)
    n *= std::max<int64_t>(0, hi[d] - lo[d]);
  return n;
}

Box Intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.lo.size(); ++d) {
    out.lo.push_back(std::max(a.lo[d], b.lo[d]));
    out.hi.push_back(std::max(out.lo.back(), std::min(a.hi[d], b.hi[d])));
  }
  return out;
}

Box WholeBox(const std::vector<int64_t>& shape) {
  return Box{std::vector<int64_t>(shape.size(), 0), shape};
}

int64_t BoxIndex(const Box& frame, const std::vector<int64_t>& coord) {
  int64_t index = 0;
  for (size_t d = 0; d < coord.size(); ++d) {
    index = index * (frame.hi[d] - frame.lo[d]) + (coord[d] - frame.lo[d]);
  }
  return index;
}

std::string CheckTiling(const std::vector<int64_t>& shape,
                        const std::vector<Box>& boxes) {
  auto show = [](const Box& b) {
    std::string out = "[";
    for (size_t d = 0; d < b.lo.size(); ++d) {
      absl::StrAppend(&out, d ? ", " : "", b.lo[d], ":", b.hi[d]);
    }
    return out + "]";
  };
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  int64_t covered = 0;
  for (const Box& b : boxes) {
    if (b.lo.size() != shape.size() || b.hi.size() != shape.size()) {
      return "a box has the wrong number of dimensions";
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      if (b.lo[d] < 0 || b.lo[d] >= b.hi[d] || b.hi[d] > shape[d]) {
        return absl::StrCat("box ", show(b), " is empty or outside the tensor");
      }
    }
    covered += b.numel();  // each at most numel: no overflow below 2^63
    if (covered > numel) break;
  }
  // Sorted by first row; a box can only overlap those still open (started
  // before it, not yet ended) along dimension 0.
  std::vector<const Box*> order;
  for (const Box& b : boxes) order.push_back(&b);
  std::sort(order.begin(), order.end(),
            [](const Box* a, const Box* b) { return a->lo < b->lo; });
  std::vector<const Box*> open;
  for (const Box* b : order) {
    open.erase(
        std::remove_if(open.begin(), open.end(),
                       [&](const Box* o) { return o->hi[0] <= b->lo[0]; }),
        open.end());
    for (const Box* o : open) {
      if (!Intersect(*o, *b).empty()) {
        return absl::StrCat("boxes ", show(*o), " and ", show(*b), " overlap");
      }
    }
    open.push_back(b);
  }
  if (covered != numel) {
    return absl::StrCat("the boxes cover ", covered, " of the tensor's ", numel,
                        " elements");
  }
  return "";
}

std::optional<int64_t> GlobalIndex(const ParamInfo& p, int64_t local) {
  const int64_t inner = Product(p.shape) / p.shape[0];
  int64_t row = local / inner, rest = local % inner;
  for (const Box& box : p.boxes) {
    const int64_t rows = box.hi[0] - box.lo[0];
    if (row >= rows) {
      row -= rows;
      continue;
    }
    // Row-major: the trailing dimensions of the box are those of the local
    // tensor, so `rest` decomposes over them.
    int64_t index = 0, stride = 1;
    std::vector<int64_t> coord(p.global_shape.size());
    for (size_t d = p.global_shape.size(); d-- > 1;) {
      const int64_t extent = box.hi[d] - box.lo[d];
      coord[d] = box.lo[d] + rest % extent;
      rest /= extent;
    }
    coord[0] = box.lo[0] + row;
    for (size_t d = p.global_shape.size(); d-- > 0;) {
      index += coord[d] * stride;
      stride *= p.global_shape[d];
    }
    return index;
  }
  return std::nullopt;  // padding rows past the real vocabulary
}

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
    p.boxes = {WholeBox(p.global_shape)};
    p.numel = Product(p.shape);
    out.push_back(std::move(p));
  };
  const ModelParts& parts = ModelPartsOf(cfg);
  for (const auto& part : parts.before) {
    for (const PartTensor& t : part->Tensors(cfg)) {
      add(t, t.name, -1, GlobalUnit(-1, t.unit, false, L));
    }
  }
  for (int l = 0; l < L; ++l) {
    for (const auto& part : parts.block) {
      for (const PartTensor& t : part->Tensors(cfg)) {
        add(t, absl::StrCat("h.", l, ".", t.name), l,
            GlobalUnit(l, t.unit, false, L));
      }
    }
  }
  for (const auto& part : parts.after) {
    for (const PartTensor& t : part->Tensors(cfg)) {
      add(t, t.name, -1, GlobalUnit(-1, t.unit, true, L));
    }
  }
  return out;
}

std::vector<int> EvenStageLayers(int n_layer, int pp) {
  PT_CHECK(pp >= 1 && n_layer % pp == 0, "pp must divide n_layer");
  return std::vector<int>(pp, n_layer / pp);
}

void SplitStages(std::vector<ParamInfo>* tensors,
                 const std::vector<int>& stage_layers) {
  const int pp = static_cast<int>(stage_layers.size());
  PT_CHECK(pp >= 1, "no pipeline stages");
  // stage_of[l]: the stage that holds layer l.
  std::vector<int> stage_of;
  for (int s = 0; s < pp; ++s) {
    PT_CHECK(stage_layers[s] >= 1, "a pipeline stage without layers");
    stage_of.insert(stage_of.end(), stage_layers[s], s);
  }
  int final_unit = -1, n_layer = 0;
  const ParamInfo* wte = nullptr;
  for (ParamInfo& p : *tensors) {
    if (p.layer >= 0) {
      PT_CHECK(p.layer < static_cast<int>(stage_of.size()),
               "the stages hold fewer layers than the model has");
      p.stage = stage_of[p.layer];
      n_layer = std::max(n_layer, p.layer + 1);
    } else {
      p.stage = absl::StartsWith(p.name, "ln_f.") ? pp - 1 : 0;
    }
    if (absl::StartsWith(p.name, "ln_f.")) final_unit = p.unit;
    if (p.name == "wte") wte = &p;
  }
  PT_CHECK(n_layer == static_cast<int>(stage_of.size()),
           "the stages hold more layers than the model has");
  if (pp > 1) {
    PT_CHECK(wte != nullptr && final_unit >= 0, "no wte or ln_f to tie");
    ParamInfo copy = *wte;
    copy.stage = pp - 1;
    copy.unit = final_unit;
    copy.tied_copy = true;
    tensors->push_back(std::move(copy));
  }
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
    const std::vector<int64_t>& g = p.global_shape;
    Box box = WholeBox(g);
    switch (p.split) {
      case TpSplit::kReplicated:
        p.shape = g;
        p.boxes = {box};
        break;
      case TpSplit::kColumn: {
        const int64_t n = g[0] / tp;
        p.shape = g;
        p.shape[0] = n;
        box.lo[0] = r * n;
        box.hi[0] = (r + 1) * n;
        p.boxes = {box};
        break;
      }
      case TpSplit::kRow: {
        const int64_t n = g[1] / tp;
        p.shape = {g[0], n};
        box.lo[1] = r * n;
        box.hi[1] = (r + 1) * n;
        p.boxes = {box};
        break;
      }
      case TpSplit::kQkv: {
        // q, k and v are C rows each; this rank's heads are rows
        // [r·Cl, (r+1)·Cl) of each.
        p.shape = g;
        p.shape[0] = 3 * Cl;
        p.boxes.clear();
        for (int part = 0; part < 3; ++part) {
          Box b = box;
          b.lo[0] = part * C + r * Cl;
          b.hi[0] = part * C + (r + 1) * Cl;
          p.boxes.push_back(b);
        }
        break;
      }
      case TpSplit::kVocab: {
        const int64_t Vl = cfg.padded_vocab / tp;
        p.shape = {Vl, g[1]};
        box.lo[0] = std::min<int64_t>(r * Vl, g[0]);
        box.hi[0] = std::min<int64_t>((r + 1) * Vl, g[0]);
        p.boxes = {box};
        break;
      }
    }
    p.numel = Product(p.shape);
  }
}

std::vector<ParamInfo> LayoutUnits(const std::vector<ParamInfo>& tensors,
                                   int stage, int pad) {
  return LayoutUnits(tensors, std::vector<int>{stage}, pad);
}

std::vector<ParamInfo> LayoutUnits(const std::vector<ParamInfo>& tensors,
                                   const std::vector<int>& stages, int pad) {
  std::vector<ParamInfo> out;
  int64_t offset = 0, unit_begin = 0;
  int unit = -1, global_unit = -1;
  auto close_unit = [&] {
    const int64_t size = offset - unit_begin;
    offset = unit_begin + (size + pad - 1) / pad * pad;
    unit_begin = offset;
  };
  // The table lists tensors by stage (the tied copy, last, is on the last
  // stage), so the stages' units follow one another in their order.
  for (const ParamInfo& t : tensors) {
    if (std::find(stages.begin(), stages.end(), t.stage) == stages.end()) {
      continue;
    }
    if (t.unit != global_unit) {
      if (unit >= 0) close_unit();
      global_unit = t.unit;
      ++unit;
    }
    ParamInfo p = t;
    p.unit = unit;
    p.offset = offset;
    p.unit_offset = offset - unit_begin;
    offset += p.numel;
    out.push_back(std::move(p));
  }
  if (unit >= 0) close_unit();
  return out;
}

std::vector<UnitRange> Units(const std::vector<ParamInfo>& layout, int pad) {
  std::vector<UnitRange> units(layout.empty() ? 0 : layout.back().unit + 1);
  for (const ParamInfo& p : layout) {
    UnitRange& u = units[p.unit];
    if (p.unit_offset == 0) u.begin = p.offset;
    u.size = std::max(u.size, p.unit_offset + p.numel);
  }
  for (UnitRange& u : units) u.size = (u.size + pad - 1) / pad * pad;
  return units;
}

std::vector<ParamInfo> StageSlice(const std::vector<ParamInfo>& layout,
                                  int stage, int* first_unit) {
  std::vector<ParamInfo> out;
  int64_t base = 0;
  for (const ParamInfo& p : layout) {
    if (p.stage != stage) continue;
    if (out.empty()) {
      *first_unit = p.unit;
      base = p.offset - p.unit_offset;
    }
    out.push_back(p);
    out.back().unit -= *first_unit;
    out.back().offset -= base;
  }
  PT_CHECK(!out.empty(), "a stage the layout does not hold");
  return out;
}

std::vector<int> RankStages(const PlanOptions& o) {
  std::vector<int> stages;
  for (int c = 0; c < o.virtual_stages; ++c) {
    stages.push_back(c * o.pp + o.pp_rank);
  }
  return stages;
}

std::vector<ParamInfo> BuildPlan(const GptConfig& config,
                                 const PlanOptions& o) {
  std::vector<ParamInfo> tensors = GptTensors(config);
  const std::vector<int> stage_layers =
      o.stage_layers.empty()
          ? EvenStageLayers(config.n_layer, o.pp * o.virtual_stages)
          : o.stage_layers;
  PT_CHECK(static_cast<int>(stage_layers.size()) == o.pp * o.virtual_stages,
           "one layer count per pipeline stage");
  SplitStages(&tensors, stage_layers);
  ApplyTensorParallel(&tensors, config, o.tp, o.tp_rank);
  return LayoutUnits(tensors, RankStages(o), o.pad);
}

int64_t SatAdd(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

int64_t SatMul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

int64_t GptNumParams(const GptConfig& config) {
  int64_t n = 0;
  for (const ParamInfo& p : GptTensors(config)) n += Product(p.global_shape);
  return n;
}

float InitialValue(const ParamInfo& info, uint64_t seed, int64_t index) {
  switch (info.init) {
    case Init::kZeros:
      return 0.0f;
    case Init::kOnes:
      return 1.0f;
    case Init::kNormal:
      break;
  }
  return static_cast<float>(
      info.init_std *
      CounterNormal(seed, StableHash(info.name), static_cast<uint64_t>(index)));
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
