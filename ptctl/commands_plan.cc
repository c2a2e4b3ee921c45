#include "ptctl/commands_plan.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/exit_codes.h"
#include "common/mesh.h"
#include "common/spec.h"
#include "nlohmann/json.hpp"
#include "planner/search.h"

namespace ptrain::ptctl {

namespace {

using Json = nlohmann::ordered_json;
using planner::Prediction;
using planner::RankedLayout;

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
}

std::string Tokens(double per_s) {
  if (per_s >= 1e6) return absl::StrFormat("%.2fM", per_s / 1e6);
  if (per_s >= 1e3) return absl::StrFormat("%.1fk", per_s / 1e3);
  return absl::StrFormat("%.0f", per_s);
}

std::string Comm(const Prediction& p) {
  std::string s;
  for (const planner::GroupTime& g : p.comm) {
    if (g.seconds <= 0) continue;
    absl::StrAppend(&s, s.empty() ? "" : " ",
                    absl::StrFormat("%s %.3gs%s", g.group, g.seconds,
                                    g.crosses_nodes ? "*" : ""));
  }
  return s.empty() ? "-" : s;
}

Json LayoutJson(const RankedLayout& l) {
  const ParallelLayout layout = JobLayout(l.spec);
  const Prediction& p = l.prediction;
  Json j;
  j["layout"] = planner::LayoutWords(l.spec);
  Json degrees;
  for (const MeshDimension& d : MeshDimensions()) {
    degrees[std::string(d.name)] = layout.degree(d.name);
  }
  j["degrees"] = degrees;
  j["zero"] = layout.zero;
  j["schedule"] = layout.schedule;
  j["virtual_stages"] = layout.virtual_stages;
  j["microbatches"] = layout.microbatches;
  j["micro_batch_size"] = l.spec.train().global_batch() /
                          (layout.degree("dp") * layout.microbatches);
  j["recompute"] = l.spec.train().recompute();
  j["sequence_parallel"] = layout.sequence_parallel;
  j["memory_bytes"] = p.memory_need;
  j["memory_limit_bytes"] = p.memory_limit;
  j["step_s"] = p.step_s;
  j["tokens_per_s"] = p.tokens_per_s;
  j["mfu"] = p.mfu;
  j["bubble"] = p.bubble;
  j["compute_s"] = p.compute_s;
  j["matmul_s"] = p.matmul_s;
  j["attention_s"] = p.attention_s;
  j["elementwise_s"] = p.elementwise_s;
  j["pipeline_s"] = p.pipeline_s;
  j["optimizer_s"] = p.optimizer_s;
  Json comm = Json::object();
  for (const planner::GroupTime& g : p.comm) {
    comm[g.group] = {{"exposed_s", g.seconds},
                     {"crosses_nodes", g.crosses_nodes}};
  }
  j["comm"] = comm;
  if (!l.why.empty()) j["why"] = l.why;
  return j;
}

void PrintTable(const planner::PlanResult& r) {
  size_t width = 6;
  for (const auto* list : {&r.best, &r.rejected}) {
    for (const RankedLayout& l : *list) {
      width = std::max(width, planner::LayoutWords(l.spec).size());
    }
  }
  std::printf("%3s  %-*s %10s %9s %9s %6s %6s  %s\n", "#",
              static_cast<int>(width), "LAYOUT", "MEM/RANK", "STEP", "TOKENS/S",
              "MFU", "BUBBLE", "EXPOSED COMM");
  for (size_t i = 0; i < r.best.size(); ++i) {
    const RankedLayout& l = r.best[i];
    const Prediction& p = l.prediction;
    std::printf("%3zu  %-*s %10s %8.3fs %9s %5.1f%% %5.1f%%  %s%s%s\n", i + 1,
                static_cast<int>(width), planner::LayoutWords(l.spec).c_str(),
                GiB(p.memory_need).c_str(), p.step_s,
                Tokens(p.tokens_per_s).c_str(), 100 * p.mfu, 100 * p.bubble,
                Comm(p).c_str(), l.why.empty() ? "" : "   ", l.why.c_str());
  }
  if (!r.rejected.empty()) {
    std::printf("\nrejected, though predicted faster than the last above:\n");
    for (const RankedLayout& l : r.rejected) {
      std::printf("     %-*s %8.3fs  %s\n", static_cast<int>(width),
                  planner::LayoutWords(l.spec).c_str(), l.prediction.step_s,
                  l.why.c_str());
    }
  }
}

}  // namespace

int Plan(const PlanArgs& a) {
  const auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "ptctl: error: %s\n",
                 std::string(s.message()).c_str());
    return kExitBadInput;
  };
  if (a.nodes < 1) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--nodes must be >= 1 (is ", a.nodes, ")")));
  }
  if (a.gpus_per_node < 1) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--gpus-per-node must be >= 1 (is ", a.gpus_per_node, ")")));
  }
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(a.file, a.sets);
  if (!spec.ok()) return fail(spec.status());
  absl::StatusOr<planner::HardwareProfile> profile =
      planner::LoadProfile(a.profile);
  if (!profile.ok()) return fail(profile.status());
  planner::Cluster cluster;
  cluster.nodes = a.nodes;
  cluster.ranks_per_node = a.gpus_per_node;
  cluster.threads_per_rank = spec->resources().threads_per_rank();
  planner::SearchOptions options;
  options.fixed = a.fixed;
  if (IsAutoLayout(*spec)) {
    // As ptcoord would search it, with as many layouts shown as asked.
    if (a.fixed) {
      return fail(absl::InvalidArgumentError(
          "--fixed: the spec says parallel: auto and has no layout of its "
          "own to cost; drop --fixed to see what the planner chooses"));
    }
    options.accept = planner::AutoLayoutOptions(*spec).accept;
  }
  const planner::PlanInput input = planner::PlanInputOf(*spec, *profile);
  absl::StatusOr<planner::PlanResult> result =
      planner::PlanLayouts(input, cluster, *profile, options);
  if (!result.ok()) return fail(result.status());
  const double params = static_cast<double>(result->parameters);
  if (a.json) {
    Json j;
    j["model"] = {{"name", spec->name()},
                  {"arch", spec->model().arch()},
                  {"parameters", result->parameters},
                  {"block_size", spec->model().block_size()},
                  {"global_batch", spec->train().global_batch()}};
    j["cluster"] = {{"nodes", a.nodes}, {"ranks_per_node", a.gpus_per_node}};
    j["profile"] = {{"name", profile->name}, {"source", profile->source}};
    j["notes"] = result->notes;
    Json best = Json::array(), rejected = Json::array();
    for (const RankedLayout& l : result->best) best.push_back(LayoutJson(l));
    for (const RankedLayout& l : result->rejected) {
      rejected.push_back(LayoutJson(l));
    }
    j["best"] = best;
    j["rejected"] = rejected;
    j["search"] = {{"layouts", result->layouts},
                   {"simulated", result->simulated},
                   {"sized", result->sized},
                   {"seconds", result->seconds}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf(
        "%s: %s, %.3gB parameters, %d positions, batch %d, on %d node%s × "
        "%d %s (%s)\n",
        a.fixed ? "the spec's layout" : "best layouts", spec->name().c_str(),
        params / 1e9, spec->model().block_size(), spec->train().global_batch(),
        a.nodes, a.nodes == 1 ? "" : "s", a.gpus_per_node,
        profile->device == "cuda" ? "GPUs" : "ranks", profile->name.c_str());
    for (const std::string& n : result->notes) {
      std::printf("note: %s\n", n.c_str());
    }
    PrintTable(*result);
    const std::vector<RankedLayout>& costed =
        result->best.empty() ? result->rejected : result->best;
    if (a.fixed && !costed.empty()) {
      // Where the layout's step goes.
      const Prediction& p = costed.front().prediction;
      std::printf(
          "\nthe step: %.4g s of compute (matmuls %.4g, attention %.4g, "
          "elementwise %.4g) on the busiest rank, the pipeline %.4g s "
          "(bubble %.1f%%), optimizer %.4g s, exposed communication %s\n",
          p.compute_s, p.matmul_s, p.attention_s, p.elementwise_s, p.pipeline_s,
          100 * p.bubble, p.optimizer_s, Comm(p).c_str());
    }
    std::printf(
        "\n%lld layouts valid, %lld simulated, %lld sized, in %.2f s; "
        "* crosses nodes\n",
        static_cast<long long>(result->layouts),
        static_cast<long long>(result->simulated),
        static_cast<long long>(result->sized), result->seconds);
  }
  // --fixed on a layout that does not fit: the plan printed, and a failure.
  return result->best.empty() ? kExitFailed : 0;
}

}  // namespace ptrain::ptctl
