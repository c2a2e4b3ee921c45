// The layout planner: hardware profiles (read, refused with the field
// named, interpolated), the cost model of a layout (each term moves the
// way the engine's work does; memory is the job's own estimate) and the
// search (ranked, valid, within the placement rules, the fastest rejected
// explained, a cluster too small refused).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/mesh.h"
#include "common/spec.h"
#include "planner/cost_model.h"
#include "planner/profile.h"
#include "planner/search.h"
#include "tests/testing/cpu_profile.h"
#include "worker/engine/parallel/memory_estimate.h"

namespace ptrain::planner {
namespace {

HardwareProfile Cpu() {
  absl::StatusOr<HardwareProfile> p =
      ParseProfile(testing::kCpuProfile, "test");
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

HardwareProfile Shipped(const std::string& name) {
  absl::StatusOr<HardwareProfile> p = LoadProfile(name);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

// config M of the benchmarks (6 layers, 6 heads, C 384, T 256).
v1::JobSpec ConfigM(std::vector<std::string> sets = {}) {
  std::vector<std::string> all = {
      "model.n_layer=6",      "model.n_head=6",      "model.n_embd=384",
      "model.block_size=256", "model.vocab_size=65", "train.global_batch=16"};
  all.insert(all.end(), sets.begin(), sets.end());
  absl::StatusOr<v1::JobSpec> s =
      LoadJobSpecFile("examples/shakespeare-char.yaml", all);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// A GPT of `layers` × C on GPUs, T 2048, GPT-2's vocabulary.
v1::JobSpec Gpt(int layers, int heads, int C, int batch,
                std::vector<std::string> sets = {}) {
  std::vector<std::string> all = {"model.n_layer=" + std::to_string(layers),
                                  "model.n_head=" + std::to_string(heads),
                                  "model.n_embd=" + std::to_string(C),
                                  "model.block_size=2048",
                                  "model.vocab_size=51200",
                                  "train.global_batch=" + std::to_string(batch),
                                  "resources.device=cuda"};
  all.insert(all.end(), sets.begin(), sets.end());
  absl::StatusOr<v1::JobSpec> s =
      LoadJobSpecFile("examples/shakespeare-char.yaml", all);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

v1::JobSpec With(v1::JobSpec spec, const std::vector<std::string>& sets) {
  for (const std::string& s : sets) {
    EXPECT_TRUE(ApplyOverride(&spec, s).ok()) << s;
  }
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  return spec;
}

// --- profiles -------------------------------------------------------------

TEST(Profile, ShippedProfilesLoadAndNameTheirSource) {
  for (const std::string& name : BuiltinProfileNames()) {
    const HardwareProfile p = Shipped(name);
    EXPECT_EQ(p.device, "cuda") << name;
    EXPECT_NE(p.source.find("datasheet"), std::string::npos) << name;
    EXPECT_TRUE(p.HasLink(LinkClass::kIntraNode)) << name;
    EXPECT_TRUE(p.HasLink(LinkClass::kInterNode)) << name;
    EXPECT_GT(p.PeakFlopsPerS("bf16"), 1e14) << name;
  }
  EXPECT_EQ(Shipped("a100").PeakFlopsPerS("bf16"), 312e12);
  EXPECT_GT(Shipped("h200").memory_bytes, Shipped("h100").memory_bytes);
}

TEST(Profile, EachMalformedFieldIsNamed) {
  struct Case {
    std::string from, to, message;
  };
  const std::vector<Case> cases = {
      {"\"elementwise_bytes_per_s\": 1e10", "\"elementwise_bytes_per_s\": -1",
       "elementwise_bytes_per_s must be > 0"},
      {"\"optimizer_params_per_s\": 5e8,", "",
       "optimizer_params_per_s is missing"},
      {"\"bus_bytes_per_s\": 4e9", "\"bus_bytes_per_s\": 0",
       "links.intra_node.sendrecv.bus_bytes_per_s must be > 0"},
      {"\"flops_per_s\": 4e10}", "\"flops_per_s\": \"fast\"}",
       "matmul[1].flops_per_s must be a number"},
      {"ptrain-profile/1", "ptrain-profile/9", "format must be"},
      {"\"device\": \"cpu\"", "\"device\": \"tpu\"",
       "device must be cpu or cuda"},
      {"\"intra_node\"", "\"intra\"", "links.intra is not a link class"},
      {"\"precision\": \"fp32\", \"B\"", "\"precision\": \"fp8\", \"B\"",
       "attention[0].precision must be fp32 or bf16"},
      {"\"cores\": 2,", "", "cores is missing"},
  };
  for (const Case& c : cases) {
    std::string text = testing::kCpuProfile;
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    text.replace(at, c.from.size(), c.to);
    absl::StatusOr<HardwareProfile> p = ParseProfile(text, "p.json");
    ASSERT_FALSE(p.ok()) << c.from;
    EXPECT_NE(p.status().message().find(c.message), std::string::npos)
        << p.status();
    EXPECT_NE(p.status().message().find("profile p.json"), std::string::npos);
  }
  EXPECT_FALSE(ParseProfile("{not json", "p").ok());
  const absl::Status unknown = LoadProfile("tpu-v9").status();
  EXPECT_NE(unknown.message().find("a100, h100, h200"), std::string::npos)
      << unknown;
}

TEST(Profile, MatmulRatesInterpolateOverShapesAndThreads) {
  const HardwareProfile p = Cpu();
  // A grid point is its own rate.
  EXPECT_DOUBLE_EQ(p.MatmulFlopsPerS("fp32", false, 1024, 1024, 1024, 1), 4e10);
  EXPECT_DOUBLE_EQ(p.MatmulFlopsPerS("fp32", true, 1024, 1024, 1024, 2), 5e10);
  // Between two points, between their rates.
  const double mid = p.MatmulFlopsPerS("fp32", false, 512, 512, 512, 1);
  EXPECT_GT(mid, 2e10);
  EXPECT_LT(mid, 4e10);
  // Threads: linear between measured counts; a share of a core below one.
  EXPECT_NEAR(p.MatmulFlopsPerS("fp32", false, 1024, 1024, 1024, 1.5), 5.5e10,
              1);
  EXPECT_NEAR(p.MatmulFlopsPerS("fp32", false, 1024, 1024, 1024, 0.5), 2e10, 1);
  // Attention scales as B·T²·C from the nearest entry.
  const double t = p.AttentionSeconds("fp32", false, 4, 256, 256, 64, 1);
  EXPECT_NEAR(t, 0.002, 1e-12);
  EXPECT_NEAR(p.AttentionSeconds("fp32", false, 8, 512, 256, 64, 1), 8 * t,
              1e-12);
  // Collectives: alpha + bus factor × bytes / bandwidth.
  EXPECT_NEAR(p.CollectiveSeconds(LinkClass::kIntraNode, Collective::kAllReduce,
                                  4, 3e9),
              2e-5 + 1.5, 1e-9);
  EXPECT_EQ(p.CollectiveSeconds(LinkClass::kIntraNode, Collective::kAllReduce,
                                1, 3e9),
            0);
}

// --- the cost model -------------------------------------------------------

TEST(CostModel, MemoryIsTheJobsOwnEstimate) {
  const HardwareProfile cpu = Cpu();
  for (const std::vector<std::string>& sets :
       std::vector<std::vector<std::string>>{
           {"parallel.dp=2", "parallel.zero=1"},
           {"parallel.tp=2", "parallel.sequence_parallel=true"},
           {"parallel.pp=2", "parallel.microbatches=4", "train.recompute=full"},
           {"parallel.pp=2", "parallel.microbatches=4",
            "parallel.schedule=zb1p"},
           {"parallel.dp=2", "parallel.zero=3"}}) {
    const v1::JobSpec spec = With(ConfigM(), sets);
    Cluster cluster{1, 2, 0};
    CostModel model(spec, 65, cluster, cpu);
    const Prediction p = model.Predict(spec);
    const MemoryEstimate e = EstimateRankMemory(spec, 65);
    EXPECT_EQ(p.memory.total(), e.total()) << sets[0];
    EXPECT_EQ(p.memory_need, e.host());
    EXPECT_EQ(p.memory_limit, model.MemoryLimit());
  }
}

TEST(CostModel, EachTermMovesAsTheEngineWorkDoes) {
  const HardwareProfile h100 = Shipped("h100");
  const v1::JobSpec base = Gpt(24, 16, 2048, 64);
  Cluster node{1, 8, 0};
  CostModel model(base, 51200, node, h100);
  const auto step = [&](std::vector<std::string> sets) {
    return model.Time(With(base, sets));
  };
  const Prediction dp8 = step({"parallel.dp=8"});
  // Recomputation adds a forward; selective only the attention's.
  const Prediction full = step({"parallel.dp=8", "train.recompute=full"});
  const Prediction sel = step({"parallel.dp=8", "train.recompute=selective"});
  EXPECT_GT(full.step_s, sel.step_s);
  EXPECT_GT(sel.step_s, dp8.step_s);
  EXPECT_NEAR(full.compute_s / dp8.compute_s, 4.0 / 3.0, 0.1);
  // tp: each rank computes less but all-reduces every layer.
  const Prediction tp2 = step({"parallel.dp=4", "parallel.tp=2"});
  ASSERT_EQ(tp2.comm.front().group, "tp");
  EXPECT_GT(tp2.comm.front().seconds, 0);
  EXPECT_FALSE(tp2.comm.front().crosses_nodes);
  // ZeRO-3 gathers the weights every pass: more exposed dp time than
  // ZeRO-0's one reduction hidden behind the backward.
  const auto dp_time = [](const Prediction& p) {
    for (const GroupTime& g : p.comm) {
      if (g.group == "dp") return g.seconds;
    }
    return 0.0;
  };
  const Prediction z3 =
      step({"parallel.dp=8", "parallel.zero=3", "parallel.microbatches=4"});
  const Prediction z0 = step({"parallel.dp=8", "parallel.microbatches=4"});
  EXPECT_GT(dp_time(z3), dp_time(z0));
  // ZeRO-1 updates a shard: an eighth of the optimizer's time.
  const Prediction z1 = step({"parallel.dp=8", "parallel.zero=1"});
  EXPECT_NEAR(z1.optimizer_s * 8, dp8.optimizer_s, dp8.optimizer_s * 1e-9);
  // A pipeline idles: the bubble of the simulator, near the textbook
  // (pp−1)/(m+pp−1) for even stages, less with more microbatches.
  const Prediction pp4 =
      step({"parallel.dp=2", "parallel.pp=4", "parallel.microbatches=8"});
  const Prediction pp4m32 =
      step({"parallel.dp=2", "parallel.pp=4", "parallel.microbatches=32"});
  EXPECT_GT(pp4.bubble, 0.15);
  EXPECT_LT(pp4m32.bubble, pp4.bubble);
  // Zero-bubble fills it.
  const Prediction zb =
      step({"parallel.dp=2", "parallel.pp=4", "parallel.microbatches=8",
            "parallel.schedule=zb1p"});
  EXPECT_LT(zb.bubble, pp4.bubble);
  EXPECT_LT(zb.step_s, pp4.step_s);
  // Without simulating, the bound leaves the bubble out: never above.
  const v1::JobSpec pp =
      With(base, {"parallel.dp=2", "parallel.pp=4", "parallel.microbatches=8"});
  EXPECT_LT(model.Time(pp, /*simulate=*/false).step_s, pp4.step_s);
  // MFU: the model's FLOPs over the step, the ranks and the peak.
  EXPECT_NEAR(dp8.mfu,
              dp8.model_flops / (dp8.step_s * 8 * h100.PeakFlopsPerS("bf16")),
              1e-12);
  EXPECT_GT(dp8.mfu, 0.2);
  EXPECT_LT(dp8.mfu, 0.9);
}

TEST(CostModel, GroupsCrossNodesWhereTheRankOrderPutsThem) {
  const HardwareProfile h100 = Shipped("h100");
  const v1::JobSpec base = Gpt(24, 16, 2048, 64);
  CostModel model(base, 51200, Cluster{4, 8, 0}, h100);
  const v1::JobSpec s =
      With(base, {"parallel.dp=2", "parallel.tp=4", "parallel.pp=4",
                  "parallel.microbatches=4"});
  EXPECT_FALSE(model.CrossesNodes(s, "tp"));  // ranks 0-3
  EXPECT_FALSE(model.CrossesNodes(s, "dp"));  // stride 4, 2 of them: ≤ 8
  EXPECT_TRUE(model.CrossesNodes(
      With(base, {"parallel.dp=8", "parallel.tp=4", "parallel.microbatches=4"}),
      "dp"));
  EXPECT_TRUE(model.CrossesNodes(s, "pp"));  // stride 8
}

// --- the search -----------------------------------------------------------

TEST(Search, RanksValidLayoutsThatFitFastestFirst) {
  const HardwareProfile cpu = Cpu();
  const PlanInput in = PlanInputOf(ConfigM(), cpu);
  absl::StatusOr<PlanResult> r =
      PlanLayouts(in, Cluster{1, 4, 0}, cpu, SearchOptions{});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->best.size(), 10u);
  for (size_t i = 0; i < r->best.size(); ++i) {
    const RankedLayout& l = r->best[i];
    EXPECT_TRUE(ValidateJobSpec(l.spec).ok()) << LayoutWords(l.spec);
    EXPECT_EQ(JobWorldSize(l.spec), 4);
    EXPECT_TRUE(l.prediction.fits());
    const ParallelLayout layout = JobLayout(l.spec);
    EXPECT_LE(layout.degree("tp") * layout.degree("cp"), 4);
    if (i > 0) {
      EXPECT_GE(l.prediction.step_s, r->best[i - 1].prediction.step_s);
      EXPECT_EQ(l.why.rfind("+", 0), 0u) << l.why;
    }
  }
  EXPECT_GT(r->layouts, 50);
  EXPECT_LE(r->sized, r->layouts);
  // Each is costed as the same layout alone would be.
  CostModel model(in.spec, 65, Cluster{1, 4, 0}, cpu);
  EXPECT_DOUBLE_EQ(model.Time(r->best[3].spec).step_s,
                   r->best[3].prediction.step_s);
}

TEST(Search, TheFastestRejectedSayWhy) {
  // 2 nodes × 4: a tp of 8 would cross nodes; rejected with the rule.
  const HardwareProfile h100 = Shipped("h100");
  PlanInput in = PlanInputOf(Gpt(16, 32, 4096, 32), h100);
  absl::StatusOr<PlanResult> r =
      PlanLayouts(in, Cluster{2, 4, 0}, h100, SearchOptions{});
  ASSERT_TRUE(r.ok()) << r.status();
  for (const RankedLayout& l : r->rejected) {
    EXPECT_LT(l.prediction.step_s, r->best.back().prediction.step_s);
    EXPECT_TRUE(l.why.find("crosses nodes") != std::string::npos ||
                l.why.rfind("OOM by ", 0) == 0)
        << l.why;
  }
}

TEST(Search, TooSmallAClusterSaysWhatWouldFit) {
  // 30B parameters: ~16 bytes each of weights, gradients and Adam's.
  const HardwareProfile a100 = Shipped("a100");
  const PlanInput in = PlanInputOf(Gpt(48, 56, 7168, 64), a100);
  absl::StatusOr<PlanResult> r =
      PlanLayouts(in, Cluster{1, 2, 0}, a100, SearchOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(r.status().message());
  EXPECT_NE(m.find("no layout fits 1 nodes × 2 GPUs of 72.0 GiB usable"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("needs at least"), std::string::npos) << m;
  EXPECT_NE(m.find("smallest fit is dp="), std::string::npos) << m;
}

TEST(Search, FixedCostsTheSpecsOwnLayout) {
  const HardwareProfile cpu = Cpu();
  const v1::JobSpec spec = With(ConfigM(), {"parallel.dp=2"});
  SearchOptions fixed;
  fixed.fixed = true;
  absl::StatusOr<PlanResult> r =
      PlanLayouts(PlanInputOf(spec, cpu), Cluster{1, 2, 0}, cpu, fixed);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->best.size(), 1u);
  EXPECT_EQ(LayoutWords(r->best[0].spec), LayoutWords(spec));
  absl::StatusOr<PlanResult> wrong =
      PlanLayouts(PlanInputOf(spec, cpu), Cluster{1, 4, 0}, cpu, fixed);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("the spec's layout has 2 ranks"),
            std::string::npos)
      << wrong.status();
}

TEST(Search, AJobNoLayoutOfWhichIsValidSaysTheValidatorsReason) {
  // The MoE experts' CUDA kernels are refused by the spec on a GPU.
  absl::StatusOr<v1::JobSpec> moe =
      LoadJobSpecFile("examples/moe-shakespeare.yaml");
  ASSERT_TRUE(moe.ok()) << moe.status();
  const HardwareProfile h100 = Shipped("h100");
  absl::StatusOr<PlanResult> r = PlanLayouts(
      PlanInputOf(*moe, h100), Cluster{1, 8, 0}, h100, SearchOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no layout of this job is valid on 1 "
                                      "nodes × 8 GPUs: dp="),
            std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("model.moe"), std::string::npos)
      << r.status();
}

TEST(Search, AProfileWithoutTheLinksTheClusterNeedsIsRefused) {
  const HardwareProfile cpu = Cpu();  // intra_node only
  absl::StatusOr<PlanResult> r = PlanLayouts(
      PlanInputOf(ConfigM(), cpu), Cluster{2, 2, 0}, cpu, SearchOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("links.inter_node is missing"),
            std::string::npos)
      << r.status();
}

}  // namespace
}  // namespace ptrain::planner
