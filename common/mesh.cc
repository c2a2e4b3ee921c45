#include "common/mesh.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace ptrain {

const std::vector<MeshDimension>& MeshDimensions() {
  static const std::vector<MeshDimension> kDimensions = {
      {"dp", [](const v1::ParallelSpec& p) { return p.dp(); },
       [](v1::ParallelSpec* p, int32_t d) { p->set_dp(d); },
       /*rank_place=*/2, /*node_local=*/false, /*named_at_one=*/true,
       /*point_to_point=*/false, /*also_spans=*/"cp"},
      {"tp", [](const v1::ParallelSpec& p) { return p.tp(); },
       [](v1::ParallelSpec* p, int32_t d) { p->set_tp(d); },
       /*rank_place=*/0, /*node_local=*/true, /*named_at_one=*/true,
       /*point_to_point=*/false, ""},
      {"pp", [](const v1::ParallelSpec& p) { return p.pp(); },
       [](v1::ParallelSpec* p, int32_t d) { p->set_pp(d); },
       /*rank_place=*/3, /*node_local=*/false, /*named_at_one=*/true,
       /*point_to_point=*/true, ""},
      {"cp", [](const v1::ParallelSpec& p) { return p.cp(); },
       [](v1::ParallelSpec* p, int32_t d) { p->set_cp(d); },
       /*rank_place=*/1, /*node_local=*/true, /*named_at_one=*/false,
       /*point_to_point=*/true, ""},
      {"ep", [](const v1::ParallelSpec& p) { return p.ep(); },
       [](v1::ParallelSpec* p, int32_t d) { p->set_ep(d); },
       /*rank_place=*/-1, /*node_local=*/false, /*named_at_one=*/false,
       /*point_to_point=*/false, "", /*within=*/"dp", /*complement=*/"edp"},
  };
  return kDimensions;
}

int MeshDimensionIndex(std::string_view name) {
  const auto& dims = MeshDimensions();
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].name == name) return static_cast<int>(i);
  }
  PT_CHECK(false, "no such mesh dimension");
  return -1;
}

int ParallelLayout::degree(std::string_view name) const {
  return degrees[MeshDimensionIndex(name)];
}

int64_t ParallelLayout::world_size() const {
  int64_t product = 1;
  for (int i : RankOrder()) product *= degrees[i];
  return product;
}

int64_t ParallelLayout::group_size(std::string_view name) const {
  const MeshDimension& d = MeshDimensions()[MeshDimensionIndex(name)];
  int64_t size = degree(name);
  if (!d.also_spans.empty()) size *= degree(d.also_spans);
  return size;
}

int64_t ParallelLayout::node_local_ranks() const {
  int64_t product = 1;
  const auto& dims = MeshDimensions();
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].node_local) product *= degrees[i];
  }
  return product;
}

std::string ParallelLayout::Factors() const {
  return FactorsSpelt("parallel.", "parallel.", false);
}

std::string ParallelLayout::FactorsSpelt(std::string_view first,
                                         std::string_view each,
                                         bool all) const {
  const auto& dims = MeshDimensions();
  std::vector<std::string> names, values;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (!dims[i].within.empty()) continue;  // no factor of the world
    if (!all && !dims[i].named_at_one && degrees[i] <= 1) continue;
    names.push_back(absl::StrCat(std::string(names.empty() ? first : each),
                                 std::string(dims[i].name)));
    values.push_back(absl::StrCat(degrees[i]));
  }
  std::string carved;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].within.empty() || degrees[i] <= 1) continue;
    carved += absl::StrCat(" (", std::string(each), std::string(dims[i].name),
                           "=", degrees[i], " within ", std::string(each),
                           std::string(dims[i].within), ")");
  }
  return absl::StrCat(absl::StrJoin(names, " × "), " = ",
                      absl::StrJoin(values, " × "), carved);
}

const std::vector<int>& RankOrder() {
  static const std::vector<int>* order = [] {
    const auto& dims = MeshDimensions();
    auto* o = new std::vector<int>();
    for (size_t i = 0; i < dims.size(); ++i) {
      if (dims[i].within.empty()) o->push_back(static_cast<int>(i));
    }
    std::stable_sort(o->begin(), o->end(), [&](int a, int b) {
      return dims[a].rank_place < dims[b].rank_place;
    });
    return o;
  }();
  return *order;
}

std::vector<int> ParallelLayout::Coordinates(int world_rank) const {
  std::vector<int> coords(degrees.size(), 0);
  int64_t stride = 1;
  for (int i : RankOrder()) {
    coords[i] = static_cast<int>((world_rank / stride) % degrees[i]);
    stride *= degrees[i];
  }
  // A carved dimension: the rank's index in the group it is carved from
  // (the group's own dimension varying slowest, as its members are
  // ordered), modulo its degree.
  const auto& dims = MeshDimensions();
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].within.empty()) continue;
    coords[i] =
        static_cast<int>(GroupIndex(dims[i].within, coords) % degrees[i]);
  }
  return coords;
}

int64_t ParallelLayout::GroupIndex(std::string_view name,
                                   const std::vector<int>& coords) const {
  const int g = MeshDimensionIndex(name);
  const MeshDimension& d = MeshDimensions()[g];
  int64_t index = coords[g];
  if (!d.also_spans.empty()) {
    const int a = MeshDimensionIndex(d.also_spans);
    index = index * degrees[a] + coords[a];
  }
  return index;
}

ParallelLayout LayoutOf(const v1::ParallelSpec& p) {
  ParallelLayout l;
  for (const MeshDimension& d : MeshDimensions()) {
    l.degrees.push_back(d.degree(p));
  }
  l.zero = p.zero();
  l.sequence_parallel = p.sequence_parallel();
  l.microbatches = p.microbatches();
  l.virtual_stages = p.virtual_stages();
  l.schedule = p.schedule();
  l.bucket_bytes = p.bucket_bytes();
  l.offload_optimizer = p.offload() == "optimizer";
  l.expert_tp = p.expert_tp();
  return l;
}

ParallelLayout JobLayout(const v1::JobSpec& spec) {
  return LayoutOf(spec.parallel());
}

v1::JobSpec WithDataParallel(const v1::JobSpec& spec, int dp,
                             int microbatches) {
  v1::JobSpec out = spec;
  MeshDimensions()[MeshDimensionIndex("dp")].set_degree(out.mutable_parallel(),
                                                        dp);
  out.mutable_parallel()->set_microbatches(microbatches);
  return out;
}

void ResetParallel(v1::JobSpec* spec) {
  *spec->mutable_parallel() = DefaultJobSpec().parallel();
}

absl::StatusOr<std::vector<int>> JobStageLayers(const v1::JobSpec& spec) {
  return PipelineStageLayers(spec.parallel(), spec.model().n_layer());
}

}  // namespace ptrain
