#include "planner/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mesh.h"
#include "common/spec.h"
#include "worker/engine/model/plan.h"
#include "worker/engine/parallel/rank_build.h"

namespace ptrain::planner {

namespace {

constexpr int kGpt2Vocab = 50257;
constexpr double kGiB = 1 << 30;

std::vector<int> Divisors(int64_t n) {
  std::vector<int> d;
  for (int64_t i = 1; i * i <= n; ++i) {
    if (n % i != 0) continue;
    d.push_back(static_cast<int>(i));
    if (i * i != n) d.push_back(static_cast<int>(n / i));
  }
  std::sort(d.begin(), d.end());
  return d;
}

void SetDegree(v1::ParallelSpec* p, std::string_view name, int degree) {
  MeshDimensions()[MeshDimensionIndex(name)].set_degree(p, degree);
}

// A layout to cost: its spec, and the placement rule it breaks ("" none).
struct Layout {
  v1::JobSpec spec;
  std::string rule;
};

// The base spec's parallel section cleared to the defaults but for what
// the planner does not choose (bucket size, offload).
v1::JobSpec Cleared(const v1::JobSpec& base) {
  v1::JobSpec s = base;
  const v1::ParallelSpec keep = base.parallel();
  ResetParallel(&s);
  s.mutable_parallel()->set_bucket_bytes(keep.bucket_bytes());
  s.mutable_parallel()->set_offload(keep.offload());
  return s;
}

// Calls fn(layout) for every valid layout of `base` on `cluster`; with
// `least_memory`, only each mesh's layout that needs the least memory
// (ZeRO-3, full recomputation, one sequence a microbatch). Returns the
// first layout the spec's validator refused and why ("" if none).
template <typename Fn>
std::string Enumerate(const v1::JobSpec& base, const Cluster& cluster,
                      bool least_memory,
                      const std::function<bool(const v1::JobSpec&)>& accept,
                      Fn fn) {
  std::string refused;
  const int world = cluster.world();
  const int G = cluster.ranks_per_node;
  const int L = base.model().n_layer();
  const bool moe = MoeOf(base.model()).experts() > 0;
  const int experts = MoeOf(base.model()).experts();
  const v1::JobSpec cleared = Cleared(base);
  const int64_t batch = base.train().global_batch();
  for (int tp : Divisors(world)) {
    for (int cp : Divisors(world / tp)) {
      // tp and cp communicate every layer: within a node. One step past
      // it is still costed, to say what crossing would cost.
      const bool crosses = tp * cp > G;
      if (crosses && (tp * cp > 2 * G || least_memory)) continue;
      for (int pp : Divisors(world / (tp * cp))) {
        if (pp > L) continue;
        const int dp = world / (tp * cp * pp);
        if (batch % dp != 0) continue;
        const int64_t local = batch / dp;
        std::vector<int> eps{1};
        if (moe) {
          eps.clear();
          for (int e : Divisors(int64_t{dp} * cp)) {
            if (experts % e == 0) eps.push_back(e);
          }
        }
        for (int ep : eps) {
          for (int m : Divisors(local)) {
            if (least_memory && m != local) continue;
            std::vector<std::pair<std::string, int>> schedules{{"1f1b", 1}};
            if (pp > 1 && !least_memory) {
              schedules.emplace_back("zb1p", 1);
              for (int v : {2, 3, 4}) {
                if (L % (pp * v) == 0 && m % pp == 0) {
                  schedules.emplace_back("interleaved", v);
                }
              }
            }
            for (const auto& [schedule, v] : schedules) {
              const int R = dp * cp;
              for (int zero = least_memory && R > 1 ? 3 : 0;
                   zero <= (R > 1 ? 3 : 0); ++zero) {
                for (const char* recompute : {"none", "selective", "full"}) {
                  if (least_memory && std::string_view(recompute) != "full") {
                    continue;
                  }
                  // Sequence parallelism with tp: the same bytes on the
                  // bus, a tp-th of the norms and of their activations.
                  for (bool sp : {true, false}) {
                    if (sp && tp == 1) continue;
                    Layout l{cleared, ""};
                    v1::ParallelSpec* p = l.spec.mutable_parallel();
                    SetDegree(p, "dp", dp);
                    SetDegree(p, "tp", tp);
                    SetDegree(p, "pp", pp);
                    SetDegree(p, "cp", cp);
                    if (moe) SetDegree(p, "ep", ep);
                    p->set_microbatches(m);
                    p->set_schedule(schedule);
                    if (v > 1) p->set_virtual_stages(v);
                    p->set_zero(zero);
                    p->set_sequence_parallel(sp);
                    l.spec.mutable_train()->set_recompute(recompute);
                    if (accept && !accept(l.spec)) continue;
                    if (absl::Status v = ValidateJobSpec(l.spec); !v.ok()) {
                      if (refused.empty()) {
                        refused = absl::StrCat(LayoutWords(l.spec), ": ",
                                               v.message());
                      }
                      continue;
                    }
                    if (crosses) {
                      l.rule = absl::StrCat(
                          tp > 1 ? "tp" : "cp",
                          " group crosses nodes (tp·cp = ", tp * cp, " > ", G,
                          " ranks a node)");
                    }
                    fn(std::move(l));
                    if (sp) break;  // sp valid: it dominates
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return refused;
}

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / kGiB);
}

// "OOM by 3.2 GiB (needs 75.2 GiB of 72.0 GiB)".
std::string OutOfMemory(const Prediction& p) {
  return absl::StrCat("OOM by ", Gib(p.memory_need - p.memory_limit),
                      " (needs ", Gib(p.memory_need), " of ",
                      Gib(p.memory_limit), ")");
}

std::string Unit(const HardwareProfile& profile) {
  return profile.device == "cuda" ? "GPUs" : "ranks";
}

// What `p` loses to `best` by: the part of the step that grew the most.
std::string WhyLost(const Prediction& p, const Prediction& best,
                    const v1::JobSpec& spec) {
  const double worse = p.step_s / best.step_s - 1;
  std::vector<std::pair<double, std::string>> parts;
  parts.emplace_back(p.pipeline_s * p.bubble - best.pipeline_s * best.bubble,
                     absl::StrFormat("bubble %.0f%%", 100 * p.bubble));
  const std::string recompute = spec.train().recompute();
  parts.emplace_back(p.compute_s - best.compute_s,
                     recompute != "none"
                         ? absl::StrFormat("compute %.3g s (recompute %s)",
                                           p.compute_s, recompute)
                         : absl::StrFormat("compute %.3g s", p.compute_s));
  parts.emplace_back(p.optimizer_s - best.optimizer_s,
                     absl::StrFormat("optimizer %.3g s", p.optimizer_s));
  for (const GroupTime& g : p.comm) {
    double before = 0;
    for (const GroupTime& b : best.comm) {
      if (b.group == g.group) before = b.seconds;
    }
    parts.emplace_back(
        g.seconds - before,
        absl::StrFormat("%s %.3g s exposed%s", g.group, g.seconds,
                        g.crosses_nodes ? " across nodes" : ""));
  }
  const auto most = std::max_element(parts.begin(), parts.end());
  return absl::StrFormat("+%.1f%%: %s", 100 * worse, most->second);
}

struct Item {
  double key = 0;
  bool exact = false;
  int64_t index = 0;  // into the layouts
  bool operator>(const Item& o) const {
    return key != o.key ? key > o.key : index > o.index;
  }
};

// The smallest cluster of `cluster`'s node size on which some layout fits,
// and that layout; nullopt past the largest world.
std::optional<std::pair<Cluster, RankedLayout>> SmallestFit(
    const PlanInput& input, const Cluster& cluster,
    const HardwareProfile& profile) {
  Cluster c = cluster;
  for (int step = 0; c.world() <= kMaxWorldSize / 2; ++step) {
    c.nodes = step < 64 ? c.nodes + 1 : c.nodes * 2;
    if (c.world() > kMaxWorldSize) break;
    CostModel model(input.spec, input.vocab_size, c, profile);
    std::optional<RankedLayout> found;
    Enumerate(input.spec, c, /*least_memory=*/true, nullptr, [&](Layout l) {
      if (found.has_value() || !l.rule.empty()) return;
      Prediction p;
      model.Memory(l.spec, &p);
      if (p.fits()) found = RankedLayout{l.spec, p, ""};
    });
    if (found.has_value()) return std::make_pair(c, *found);
  }
  return std::nullopt;
}

// --fixed: the spec's own layout, costed as the search costs one.
absl::Status CostFixed(const PlanInput& input, const Cluster& cluster,
                       CostModel& model, PlanResult* result) {
  if (const int64_t world = JobWorldSize(input.spec);
      world != cluster.world()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fixed: the spec's layout has ", world, " ranks (",
                     ParallelWorldFactors(input.spec.parallel()),
                     "); the cluster has ", cluster.world(), " (",
                     cluster.nodes, " × ", cluster.ranks_per_node, ")"));
  }
  RankedLayout l{input.spec, model.Predict(input.spec), ""};
  result->layouts = result->simulated = result->sized = 1;
  if (l.prediction.fits()) {
    result->best.push_back(l);
  } else {
    l.why = OutOfMemory(l.prediction);
    result->rejected.push_back(l);
  }
  return absl::OkStatus();
}

// No layout of `layouts` fits: the error, with the smallest cluster of
// these nodes that would hold one.
absl::Status NothingFits(const PlanInput& input, const Cluster& cluster,
                         const HardwareProfile& profile, const CostModel& model,
                         int64_t layouts) {
  std::string smallest;
  if (auto fit = SmallestFit(input, cluster, profile); fit.has_value()) {
    smallest = absl::StrCat(": needs at least ", fit->first.world(), " ",
                            Unit(profile), " (", fit->first.nodes,
                            " nodes): smallest fit is ",
                            LayoutWords(fit->second.spec), " at ",
                            Gib(fit->second.prediction.memory_need), " a rank");
  } else {
    smallest = ": no cluster of these nodes up to 2^20 ranks holds it";
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "no layout fits ", cluster.nodes, " nodes × ", cluster.ranks_per_node,
      " ", Unit(profile), " of ", Gib(model.MemoryLimit()), " usable (",
      layouts, " layouts tried)", smallest));
}

}  // namespace

SearchOptions AutoLayoutOptions(const v1::JobSpec& spec) {
  SearchOptions options;
  options.top = 1;
  options.rejected = 0;
  const std::string recompute = spec.train().recompute();
  if (recompute != DefaultJobSpec().train().recompute()) {
    options.accept = [recompute](const v1::JobSpec& s) {
      return s.train().recompute() == recompute;
    };
  }
  return options;
}

void AdoptLayout(const v1::JobSpec& planned, v1::JobSpec* spec) {
  *spec->mutable_parallel() = planned.parallel();
  spec->mutable_parallel()->clear_layout();
  spec->mutable_train()->set_recompute(planned.train().recompute());
}

std::string LayoutWords(const v1::JobSpec& spec) {
  const ParallelLayout l = JobLayout(spec);
  std::string s;
  for (const MeshDimension& d : MeshDimensions()) {
    const int degree = l.degree(d.name);
    if (!d.named_at_one && degree == 1) continue;
    absl::StrAppend(&s, s.empty() ? "" : " ", std::string(d.name), "=", degree);
  }
  absl::StrAppend(&s, " zero=", l.zero);
  if (l.degree("pp") > 1) {
    absl::StrAppend(&s, " ", l.schedule);
    if (l.virtual_stages > 1) absl::StrAppend(&s, " v=", l.virtual_stages);
  }
  const int micro_B =
      spec.train().global_batch() / (l.degree("dp") * l.microbatches);
  absl::StrAppend(
      &s, " m=", l.microbatches, "×", micro_B, " recompute=",
      spec.train().recompute().empty() ? "none" : spec.train().recompute());
  if (l.sequence_parallel) absl::StrAppend(&s, " sp");
  return s;
}

PlanInput PlanInputOf(const v1::JobSpec& spec, const HardwareProfile& profile) {
  PlanInput in;
  in.spec = spec;
  if (in.spec.resources().device() != profile.device) {
    in.notes.push_back(absl::StrCat(
        "resources.device=", profile.device, " (the profile's; the spec says ",
        in.spec.resources().device().empty() ? "cpu"
                                             : in.spec.resources().device(),
        ")"));
    in.spec.mutable_resources()->set_device(profile.device);
  }
  in.vocab_size = spec.model().vocab_size();
  if (in.vocab_size <= 0) {
    in.vocab_size = kGpt2Vocab;
    in.notes.push_back(absl::StrCat(
        "vocabulary of ", kGpt2Vocab,
        " assumed (model.vocab_size is 0: the data's, unknown here)"));
  }
  return in;
}

absl::StatusOr<PlanResult> PlanLayouts(const PlanInput& input,
                                       const Cluster& cluster,
                                       const HardwareProfile& profile,
                                       const SearchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  PlanResult result;
  result.notes = input.notes;
  result.parameters = GptNumParams(ModelConfig(input.spec, input.vocab_size));
  if (cluster.world() > kMaxWorldSize || cluster.nodes < 1 ||
      cluster.ranks_per_node < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the cluster must have 1 to ", kMaxWorldSize, " ranks (is ",
        cluster.nodes, " nodes × ", cluster.ranks_per_node, ")"));
  }
  if (!profile.HasLink(LinkClass::kIntraNode) && cluster.world() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile ", profile.name,
        ": links.intra_node is missing, and a plan of more than one rank "
        "communicates"));
  }
  if (!profile.HasLink(LinkClass::kInterNode) && cluster.nodes > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile ", profile.name,
                     ": links.inter_node is missing, and the "
                     "cluster has ",
                     cluster.nodes, " nodes"));
  }
  CostModel model(input.spec, input.vocab_size, cluster, profile);
  const auto done = [&] {
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  };
  if (options.fixed) {
    absl::Status s = CostFixed(input, cluster, model, &result);
    done();
    if (!s.ok()) return s;
    return result;
  }

  std::vector<Layout> layouts;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
  std::vector<Prediction> predictions;
  const std::string refused = Enumerate(
      input.spec, cluster, /*least_memory=*/false, options.accept,
      [&](Layout l) {
        const Prediction p = model.Time(l.spec, /*simulate=*/false);
        const bool exact = JobLayout(l.spec).degree("pp") == 1;
        queue.push(Item{p.step_s, exact, static_cast<int64_t>(layouts.size())});
        layouts.push_back(std::move(l));
        predictions.push_back(p);
      });
  result.layouts = static_cast<int64_t>(layouts.size());
  if (layouts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no layout of this job is valid on ", cluster.nodes, " nodes × ",
        cluster.ranks_per_node, " ", Unit(profile),
        refused.empty() ? std::string() : absl::StrCat(": ", refused)));
  }
  while (!queue.empty() && static_cast<int>(result.best.size()) < options.top) {
    Item item = queue.top();
    queue.pop();
    const Layout& l = layouts[item.index];
    Prediction& p = predictions[item.index];
    if (!item.exact) {
      p = model.Time(l.spec, /*simulate=*/true);
      ++result.simulated;
      queue.push(Item{p.step_s, true, item.index});
      continue;
    }
    if (!l.rule.empty()) {
      if (static_cast<int>(result.rejected.size()) < options.rejected) {
        result.rejected.push_back(RankedLayout{l.spec, p, l.rule});
      }
      continue;
    }
    model.Memory(l.spec, &p);
    ++result.sized;
    if (p.fits()) {
      result.best.push_back(RankedLayout{l.spec, p, ""});
    } else if (static_cast<int>(result.rejected.size()) < options.rejected) {
      result.rejected.push_back(RankedLayout{l.spec, p, OutOfMemory(p)});
    }
  }
  if (result.best.empty()) {
    return NothingFits(input, cluster, profile, model, result.layouts);
  }
  for (size_t i = 1; i < result.best.size(); ++i) {
    result.best[i].why =
        WhyLost(result.best[i].prediction, result.best[0].prediction,
                result.best[i].spec);
  }
  done();
  return result;
}

}  // namespace ptrain::planner
