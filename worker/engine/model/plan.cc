// The parallel plan; see plan.h. The steps that read the model's parts
// (its tensors, their tensor-parallel plan, its FLOPs) are in
// plan_parts.cc.
#include "worker/engine/model/plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "worker/engine/model/rng.h"

namespace ptrain {
namespace {

using Init = ParamInfo::Init;

}  // namespace

int64_t ShapeNumel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

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
    case TpSplit::kStacked2:
      return "stacked2";
    case TpSplit::kKvHeads:
      return "kv_heads";
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
  const int64_t inner = ShapeNumel(p.shape) / p.shape[0];
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
  const ParamInfo* tied = nullptr;
  for (ParamInfo& p : *tensors) {
    if (p.layer >= 0) {
      PT_CHECK(p.layer < static_cast<int>(stage_of.size()),
               "the stages hold fewer layers than the model has");
      p.stage = stage_of[p.layer];
      n_layer = std::max(n_layer, p.layer + 1);
    } else {
      p.stage = p.layer == kAfterBlocks ? pp - 1 : 0;
    }
    if (p.layer == kAfterBlocks) final_unit = p.unit;
    if (p.tied) tied = &p;
  }
  PT_CHECK(n_layer == static_cast<int>(stage_of.size()),
           "the stages hold more layers than the model has");
  if (pp > 1 && tied != nullptr) {
    PT_CHECK(final_unit >= 0, "no final unit for the tied head's copy");
    ParamInfo copy = *tied;
    copy.stage = pp - 1;
    copy.unit = final_unit;
    copy.tied_copy = true;
    tensors->push_back(std::move(copy));
  }
}

void KeepExperts(std::vector<ParamInfo>* tensors, const GptConfig& config,
                 int tp, int tp_rank, int ep_rank) {
  if (!config.has_moe()) return;
  const int n = config.moe.LocalExperts(tp);
  if (n == config.moe.experts) return;
  const int first = config.moe.FirstExpert(tp, tp_rank, ep_rank);
  std::erase_if(*tensors, [&](const ParamInfo& p) {
    return p.expert >= 0 && (p.expert < first || p.expert >= first + n);
  });
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
      // A unit's tensors lie together (a part lists its own so).
      PT_CHECK(t.unit > global_unit, "a unit's tensors are not contiguous");
      if (unit >= 0) close_unit();
      global_unit = t.unit;
      ++unit;
    } else {
      PT_CHECK((t.expert >= 0) == (out.back().expert >= 0),
               "a unit mixes routed experts' tensors with others");
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
    u.expert = p.expert >= 0;
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
  KeepExperts(&tensors, config, o.tp, o.tp_rank, o.ep_rank);
  return LayoutUnits(tensors, RankStages(o), o.pad);
}

const char* RouterName(kernels::math::RouterScore router) {
  return router == kernels::math::RouterScore::kSigmoid ? "sigmoid" : "softmax";
}

std::optional<kernels::math::RouterScore> RouterNamed(std::string_view name) {
  for (auto r : {kernels::math::RouterScore::kSoftmax,
                 kernels::math::RouterScore::kSigmoid}) {
    if (name == RouterName(r)) return r;
  }
  return std::nullopt;
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
  for (const ParamInfo& p : GptTensors(config)) n += ShapeNumel(p.global_shape);
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

}  // namespace ptrain
