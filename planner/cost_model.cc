#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <utility>

#include "common/check.h"
#include "common/mesh.h"
#include "common/spec.h"
#include "worker/engine/model/plan.h"
#include "worker/engine/parallel/rank_build.h"
#include "worker/engine/parallel/schedule.h"

namespace ptrain::planner {

namespace {

constexpr double kFloat = 4;

// Elements an elementwise pass reads and writes per token and layer,
// forward, over the residual stream's C channels (two norms, two residual
// adds, the bias adds the matmuls do not fuse) and over the MLP's hidden
// width (its activation: read the hidden, write it; SwiGLU reads two). The
// backward moves about twice that. A stated estimate, not a count of the
// engine's kernels (docs/planner.md).
constexpr double kStreamElements = 10;
constexpr double kBackwardElementwise = 2;
// The head's cross-entropy over the rank's vocabulary rows: the logits
// read, exponentiated and the probabilities written, then the gradient.
constexpr double kLossForwardElements = 3, kLossBackwardElements = 2;

struct Mm {
  double rows_per_token = 1;  // routed experts: top_k / experts
  double n = 0, k = 0;
};

// A pass split into compute and each group's communication.
struct Pass {
  double matmul = 0, attention = 0, elementwise = 0;
  double tp = 0, cp = 0, ep = 0, pp = 0;
  double compute() const { return matmul + attention + elementwise; }
  double total() const { return compute() + tp + cp + ep + pp; }
  Pass& operator+=(const Pass& o) {
    matmul += o.matmul, attention += o.attention, elementwise += o.elementwise;
    tp += o.tp, cp += o.cp, ep += o.ep, pp += o.pp;
    return *this;
  }
};

struct LayerCost {
  Pass forward, backward;  // backward: B and W together
  double weight = 0;       // the W part of backward (its weight gradients)
  double attention_forward = 0;
};

}  // namespace

// The matmuls of one block of each kind (a model with model.moe.every = N
// has N kinds of block, layer l being kind l mod N) on one tp rank, and
// each kind's local parameters.
struct LayerShapes {
  std::vector<std::vector<Mm>> layers;
  std::vector<int64_t> layer_params;  // local, per kind
  std::vector<int64_t> layer_expert_params;
  std::vector<double> mlp_widths;  // per kind
  int64_t embedding_params = 0, final_params = 0, head_params = 0;
  GptConfig config;
};

double Prediction::comm_s() const {
  double s = 0;
  for (const GroupTime& g : comm) s += g.seconds;
  return s;
}

CostModel::CostModel(const v1::JobSpec& base, int vocab_size,
                     const Cluster& cluster, const HardwareProfile& profile)
    : base_(base),
      vocab_size_(vocab_size),
      cluster_(cluster),
      profile_(profile) {}

CostModel::~CostModel() = default;

double CostModel::Threads() const {
  if (profile_.device != "cpu") return 0;
  if (cluster_.threads_per_rank > 0) {
    // Ranks asking more threads than the cores share them.
    return std::min<double>(
        cluster_.threads_per_rank,
        static_cast<double>(profile_.cores) / cluster_.ranks_per_node);
  }
  return static_cast<double>(profile_.cores) / cluster_.ranks_per_node;
}

int64_t CostModel::MemoryLimit() const {
  if (profile_.device == "cuda") {
    return static_cast<int64_t>(static_cast<double>(profile_.memory_bytes) *
                                (1 - kGpuMemoryMargin));
  }
  return static_cast<int64_t>(static_cast<double>(profile_.memory_bytes) *
                              (1 - kHostMemoryMargin) /
                              cluster_.ranks_per_node);
}

const LayerShapes& CostModel::Shapes(int tp) {
  auto it = shapes_.find(tp);
  if (it != shapes_.end()) return *it->second;
  v1::JobSpec spec = base_;
  spec.mutable_parallel()->set_tp(tp);
  GptConfig config = ModelConfig(spec, vocab_size_);
  auto s = std::make_unique<LayerShapes>();
  s->config = config;
  const int kinds = config.has_moe() ? std::max(1, config.moe.every) : 1;
  GptConfig few = config;
  few.n_layer = kinds;
  std::vector<ParamInfo> tensors = GptTensors(few);
  ApplyTensorParallel(&tensors, few, tp, 0);
  if (few.has_moe()) KeepExperts(&tensors, few, tp, 0, 0);
  s->layers.assign(kinds, {});
  s->layer_params.assign(kinds, 0);
  s->layer_expert_params.assign(kinds, 0);
  s->mlp_widths.assign(kinds, 0);
  for (const ParamInfo& p : tensors) {
    const int64_t numel = ShapeNumel(p.shape);
    if (p.layer >= 0) {
      (p.expert >= 0 ? s->layer_expert_params : s->layer_params)[p.layer] +=
          numel;
      if (p.shape.size() == 2) {
        Mm mm;
        mm.n = static_cast<double>(p.shape[0]);
        mm.k = static_cast<double>(p.shape[1]);
        if (p.expert >= 0) {
          mm.rows_per_token =
              static_cast<double>(config.moe.top_k) / config.moe.experts;
        }
        s->layers[p.layer].push_back(mm);
      }
    } else if (p.layer == kBeforeBlocks) {
      s->embedding_params += numel;
    } else {
      (p.shape.size() == 2 ? s->head_params : s->final_params) += numel;
    }
  }
  // The MLP's hidden width a token passes through, on this rank.
  const double swiglu = config.arch == "llama" ? 1.5 : 1.0;
  for (int l = 0; l < kinds; ++l) {
    if (config.has_moe() && config.moe.HasExperts(l)) {
      s->mlp_widths[l] = swiglu * (config.moe.top_k + config.moe.shared) *
                         config.moe.hidden / config.moe.ExpertTp(tp);
    } else {
      s->mlp_widths[l] = swiglu * config.hidden() / tp;
    }
  }
  return *shapes_.emplace(tp, std::move(s)).first->second;
}

CostModel::GroupSpan CostModel::Span(const v1::JobSpec& spec,
                                     std::string_view name) const {
  const ParallelLayout layout = JobLayout(spec);
  GroupSpan g{1, layout.degree(name)};
  if (name == "ep" || name == "dp") {
    g.stride = layout.degree("tp");
    if (name == "dp")
      g.size = int64_t{layout.degree("dp")} * layout.degree("cp");
  } else {
    const auto& dims = MeshDimensions();
    const int place = dims[MeshDimensionIndex(name)].rank_place;
    for (int i : RankOrder()) {
      if (dims[i].rank_place < place) g.stride *= layout.degrees[i];
    }
  }
  return g;
}

bool CostModel::CrossesNodes(const v1::JobSpec& spec,
                             std::string_view name) const {
  return CrossesNodes(Span(spec, name));
}

bool CostModel::CrossesNodes(const GroupSpan& g) const {
  return g.size > 1 && g.stride * g.size > cluster_.ranks_per_node;
}

namespace {

// What costing one layout reads: its degrees and sizes, the profile's
// rates for its ranks, and the model's shapes on its tp rank.
struct Layout {
  const v1::JobSpec& spec;
  const CostModel& model;
  const LayerShapes& shapes;
  ParallelLayout layout;
  int tp, pp, cp, dp, ep, v, m, R;
  bool sp;
  int T, B;
  double N;  // tokens a microbatch on one rank
  bool bf16;
  std::string_view precision;
  double act, threads, elem_rate, opt_rate, C;
  Recompute recompute;

  Layout(const v1::JobSpec& s, const CostModel& cm, const LayerShapes& sh,
         double rank_threads)
      : spec(s), model(cm), shapes(sh), layout(JobLayout(s)) {
    tp = layout.degree("tp"), pp = layout.degree("pp");
    cp = layout.degree("cp"), dp = layout.degree("dp");
    ep = layout.degree("ep");
    v = layout.virtual_stages, m = layout.microbatches;
    sp = layout.sequence_parallel;
    R = dp * cp;
    T = s.model().block_size();
    B = s.train().global_batch() / (dp * m);
    N = static_cast<double>(B) * T / cp;
    bf16 = SpecPrecision(s) == Precision::kBf16;
    precision = bf16 ? "bf16" : "fp32";
    act = bf16 ? 2 : kFloat;
    threads = rank_threads;
    // A CPU's memory bandwidth is the node's, shared by its ranks.
    const HardwareProfile& p = cm.profile();
    const double share = p.device == "cpu" ? cm.cluster().ranks_per_node : 1;
    elem_rate = p.elementwise_bytes_per_s / share;
    opt_rate = p.optimizer_params_per_s / share;
    C = sh.config.n_embd;
    recompute = RecomputeOf(s.train().recompute());
  }

  // A group's collective: within a node, or across nodes at the bandwidth
  // of the adapters its members on one node share (each rank its own).
  double Collective(std::string_view group, planner::Collective c, int p,
                    double bytes) const {
    if (p <= 1) return 0.0;
    const HardwareProfile& profile = model.profile();
    const CostModel::GroupSpan span = model.Span(spec, group);
    if (!model.CrossesNodes(span)) {
      return profile.CollectiveSeconds(LinkClass::kIntraNode, c, p, bytes);
    }
    const int64_t stride = span.stride;
    const double per_node = std::max<double>(
        1, std::min<double>(
               p, static_cast<double>(model.cluster().ranks_per_node) /
                      static_cast<double>(stride)));
    const LinkCost& inter = (*profile.links[1])[static_cast<int>(c)];
    double bw = inter.bus_bytes_per_s * per_node;
    if (profile.HasLink(LinkClass::kIntraNode)) {
      bw = std::min(bw,
                    (*profile.links[0])[static_cast<int>(c)].bus_bytes_per_s);
    }
    return inter.alpha_s + BusFactor(c, p) * bytes / bw;
  }

  // Seconds of one matmul's forward, or of half its backward (dinp;
  // dweight takes the same).
  double Matmul(const Mm& mm, bool backward) const {
    const double rows = N * mm.rows_per_token;
    if (rows <= 0) return 0.0;
    return 2 * rows * mm.n * mm.k /
           model.profile().MatmulFlopsPerS(precision, backward, rows, mm.n,
                                           mm.k, threads);
  }
};

// One block of each kind: its passes by part and group.
std::vector<LayerCost> LayerCosts(const Layout& x) {
  const GptConfig& config = x.shapes.config;
  const HardwareProfile& profile = x.model.profile();
  const int kinds = static_cast<int>(x.shapes.layers.size());
  std::vector<LayerCost> layer(kinds);
  const double c_local =
      static_cast<double>(config.n_head) / x.tp * config.head_size();
  const double kv_local =
      static_cast<double>(config.kv_heads_local(x.tp)) * config.head_size();
  for (int l = 0; l < kinds; ++l) {
    LayerCost& c = layer[l];
    for (const Mm& mm : x.shapes.layers[l]) {
      c.forward.matmul += x.Matmul(mm, false);
      const double half = x.Matmul(mm, true);
      c.backward.matmul += 2 * half;
      c.weight += half;
    }
    // A cp rank computes a cp-th of the causal attention (zigzag).
    const double attn_f =
        profile.AttentionSeconds(x.precision, false, x.B, x.T, c_local,
                                 config.head_size(), x.threads) /
        x.cp;
    const double attn_b =
        profile.AttentionSeconds(x.precision, true, x.B, x.T, c_local,
                                 config.head_size(), x.threads) /
        x.cp;
    c.attention_forward = attn_f;
    c.forward.attention += attn_f;
    c.backward.attention += attn_b;
    const double stream = kStreamElements * x.C / (x.sp ? x.tp : 1);
    const double elem =
        (stream + 2 * x.shapes.mlp_widths[l]) * x.N * x.act / x.elem_rate;
    c.forward.elementwise += elem;
    c.backward.elementwise += kBackwardElementwise * elem;
    if (x.tp > 1) {
      // Two all-reduces a pass (or under sp an all-gather and a
      // reduce-scatter each: the same bytes on the bus).
      const double t = 2 * x.Collective("tp", Collective::kAllReduce, x.tp,
                                        x.N * x.C * x.act);
      c.forward.tp += t;
      c.backward.tp += t;
    }
    if (x.cp > 1) {
      // The ring passes each block of keys and values (fp32) while the
      // attention of the previous one computes: what it cannot hide.
      const double kv = x.N * 2 * kv_local * kFloat;
      const double step_f = x.Collective("cp", Collective::kSendRecv, 2, kv);
      const double step_b =
          x.Collective("cp", Collective::kSendRecv, 2, 2 * kv);
      c.forward.cp += (x.cp - 1) * std::max(0.0, step_f - attn_f / x.cp);
      c.backward.cp += (x.cp - 1) * std::max(0.0, step_b - attn_b / x.cp);
    }
    if (x.ep > 1 && config.has_moe() && config.moe.HasExperts(l)) {
      // Dispatch and combine: each token's top_k copies.
      const double bytes = x.N * config.moe.top_k * x.C * x.act;
      const double t =
          2 * x.Collective("ep", Collective::kAllToAll, x.ep, bytes);
      c.forward.ep += t;
      c.backward.ep += t;
    }
    if (x.recompute == Recompute::kFull) {
      c.backward += c.forward;
    } else if (x.recompute == Recompute::kSelective) {
      c.backward.attention += attn_f;
    }
  }
  return layer;
}

// Each pipeline rank's passes over its chunks (virtual stages r, r+pp, ..)
// and what it holds.
struct RankPasses {
  std::vector<double> F, B, Bin, W;  // a microbatch's, over all its chunks
  std::vector<Pass> passes;          // forward + backward, by part and group
  std::vector<double> params, expert_params;  // local, unsharded
  std::vector<int> layers;
  int slowest = 0;  // the rank with the most work
};

RankPasses PassesOf(const Layout& x, const std::vector<LayerCost>& layer) {
  const LayerShapes& shapes = x.shapes;
  const GptConfig& config = shapes.config;
  absl::StatusOr<std::vector<int>> stage_layers = JobStageLayers(x.spec);
  PT_CHECK(stage_layers.ok(), "a validated spec's stages");
  std::vector<int> first_layer(stage_layers->size() + 1, 0);
  for (size_t s = 0; s < stage_layers->size(); ++s) {
    first_layer[s + 1] = first_layer[s] + (*stage_layers)[s];
  }
  const int kinds = static_cast<int>(layer.size()), pp = x.pp;
  const double p2p =
      pp > 1 ? x.Collective("pp", Collective::kSendRecv, 2, x.N * x.C * x.act)
             : 0;
  const double V_local = static_cast<double>(config.padded_vocab) / x.tp;
  RankPasses r{std::vector<double>(pp),    std::vector<double>(pp),
               std::vector<double>(pp),    std::vector<double>(pp),
               std::vector<Pass>(pp),      std::vector<double>(pp, 0),
               std::vector<double>(pp, 0), std::vector<int>(pp, 0)};
  for (int k = 0; k < pp; ++k) {
    Pass f, b;
    double w = 0;
    for (int c = 0; c < x.v; ++c) {
      const int s = c * pp + k;
      r.layers[k] += first_layer[s + 1] - first_layer[s];
      for (int l = first_layer[s]; l < first_layer[s + 1]; ++l) {
        f += layer[l % kinds].forward;
        b += layer[l % kinds].backward;
        w += layer[l % kinds].weight;
        r.params[k] += static_cast<double>(shapes.layer_params[l % kinds]);
        r.expert_params[k] +=
            static_cast<double>(shapes.layer_expert_params[l % kinds]);
      }
      if (s == 0) {
        const double e = 2 * x.C * x.N * x.act / x.elem_rate;
        f.elementwise += e;
        b.elementwise += e;
        r.params[k] += static_cast<double>(shapes.embedding_params);
      } else {
        f.pp += p2p;  // receive the activations
        b.pp += p2p;  // send their gradient back
      }
      if (s == pp * x.v - 1) {
        const Mm head{1, V_local, x.C};
        const double half = x.Matmul(head, true);
        f.matmul += x.Matmul(head, false);
        b.matmul += 2 * half;
        f.elementwise +=
            (2 * x.C * x.act + kLossForwardElements * V_local * x.act) * x.N /
            x.elem_rate;
        b.elementwise +=
            (2 * x.C * x.act + kLossBackwardElements * V_local * x.act) * x.N /
            x.elem_rate;
        w += half;
        r.params[k] += static_cast<double>(
            shapes.final_params + shapes.head_params +
            (config.tie_embeddings && pp > 1 ? V_local * x.C : 0));
      }
    }
    r.F[k] = f.total();
    r.B[k] = b.total();
    r.W[k] = w;
    r.Bin[k] = r.B[k] - w;
    r.passes[k] = f;
    r.passes[k] += b;
    if (r.F[k] + r.B[k] > r.F[r.slowest] + r.B[r.slowest]) r.slowest = k;
  }
  return r;
}

// The pipeline's makespan (simulated, or without `simulate` the busiest
// rank's passes alone), its bubble and the busiest rank's parts into `p`.
void Pipeline(const Layout& x, const RankPasses& r, bool simulate,
              Prediction* p) {
  const int k = r.slowest, m = x.m;
  if (x.pp == 1 || !simulate) {
    p->pipeline_s = m * (r.F[k] + r.B[k]);
  } else {
    PipelineSimulation sim;
    const ScheduleKind kind = ScheduleKindOf(x.layout.schedule);
    if (kind == ScheduleKind::kZeroBubble) {
      std::vector<std::vector<PipeAction>> orders;
      for (int i = 0; i < x.pp; ++i) {
        orders.push_back(ZeroBubbleOrder(x.pp, i, m));
      }
      sim = SimulateOrders(orders, 1, r.F, r.Bin, r.W);
    } else {
      sim = SimulatePipeline(kind, x.pp, m, x.v, r.F, r.B);
    }
    p->pipeline_s = sim.makespan;
    p->bubble = sim.bubble_fraction();
  }
  const Pass& busy = r.passes[k];
  p->compute_s = m * busy.compute();
  p->matmul_s = m * busy.matmul;
  p->attention_s = m * busy.attention;
  p->elementwise_s = m * busy.elementwise;
  const auto group = [&](const char* name, int degree, double seconds) {
    if (degree > 1) {
      p->comm.push_back(
          {name, m * seconds, x.model.CrossesNodes(x.spec, name)});
    }
  };
  group("tp", x.tp, busy.tp);
  group("cp", x.cp, busy.cp);
  group("ep", x.ep, busy.ep);
  group("pp", x.pp, busy.pp);
}

// The gradients' reduction and ZeRO's gathers over the R replicas (the
// routed experts' over R/ep), against the backward they hide behind, and
// the optimizer: the exposed dp time and the update's into `p`.
void DataParallel(const Layout& x, const RankPasses& r, Prediction* p) {
  const int zero = x.layout.zero, R = x.R, m = x.m;
  const double wbytes = x.bf16 ? 2 : kFloat;
  double exposed_most = 0, updated = 0;
  for (int k = 0; k < x.pp; ++k) {
    const double dense = r.params[k], experts = r.expert_params[k];
    const auto over = [&](Collective c, double per_param) {
      return x.Collective("dp", c, R, dense * per_param) +
             (experts > 0 ? x.Collective("dp", c, R / x.ep, experts * per_param)
                          : 0);
    };
    double exposed = 0;
    const double bwd = r.B[k] / std::max(1, x.v);  // a chunk's backward
    if (R > 1 && zero == 0) {
      const double bucket = x.Collective(
          "dp", Collective::kAllReduce, R,
          static_cast<double>(x.layout.bucket_bytes > 0 ? x.layout.bucket_bytes
                                                        : int64_t{25} << 20));
      const double all = over(Collective::kAllReduce, kFloat);
      exposed = std::max(std::min(bucket, all), all - bwd);
    } else if (R > 1 && zero <= 2) {
      // One reduce-scatter a step (ZeRO-1) or one a microbatch (ZeRO-2),
      // then the updated weights gathered.
      exposed =
          (zero == 1 ? 1 : m) *
              std::max(0.0, over(Collective::kReduceScatter, kFloat) - bwd) +
          over(Collective::kAllGather, wbytes);
    } else if (R > 1) {
      // Each pass waits for its first unit's gather; the rest hide behind
      // the units before them as far as compute lasts.
      const double gather = over(Collective::kAllGather, wbytes);
      const double first = gather / (4.0 * r.layers[k] + 1);
      exposed =
          m * (2 * first + std::max(0.0, gather - r.F[k]) +
               std::max(0.0, gather + over(Collective::kReduceScatter, kFloat) -
                                 r.B[k]));
    }
    updated = std::max(updated,
                       zero >= 1 ? dense / R + experts / std::max(1, R / x.ep)
                                 : dense + experts);
    exposed_most = std::max(exposed_most, exposed);
  }
  if (R > 1) {
    p->comm.push_back({"dp", exposed_most, x.model.CrossesNodes(x.spec, "dp")});
  }
  // The update, and the gradient norm's pass over the gradients.
  p->optimizer_s = updated / x.opt_rate + updated * kFloat / x.elem_rate;
}

}  // namespace

Prediction CostModel::Time(const v1::JobSpec& spec, bool simulate) {
  const Layout x(spec, *this, Shapes(JobLayout(spec).degree("tp")), Threads());
  const RankPasses passes = PassesOf(x, LayerCosts(x));
  Prediction p;
  Pipeline(x, passes, simulate, &p);
  DataParallel(x, passes, &p);
  double dp_exposed = 0;
  for (const GroupTime& g : p.comm) {
    if (g.group == "dp") dp_exposed = g.seconds;
  }
  p.step_s = p.pipeline_s + dp_exposed + p.optimizer_s;
  const double tokens = static_cast<double>(spec.train().global_batch()) * x.T;
  p.tokens_per_s = tokens / p.step_s;
  p.model_flops = GptFlopsPerToken(x.shapes.config, x.T) * tokens;
  const double peak = profile_.PeakFlopsPerS(x.precision);
  const double world = static_cast<double>(JobWorldSize(spec));
  p.mfu = peak > 0 ? p.model_flops / (p.step_s * world * peak) : 0;
  return p;
}

void CostModel::Memory(const v1::JobSpec& spec, Prediction* p) {
  const bool async_copy = AsyncCheckpointCopy(spec);
  MemoryEstimate most;
  for (int rank : FullestStageCandidates(JobLayout(spec).degree("pp"))) {
    const RankBuild b = RankBuild::Of(spec, vocab_size_, 0, rank);
    const auto key = std::make_tuple(
        b.tp, b.pp, b.virtual_stages, b.replicas(), b.zero.zero, b.ep, rank,
        int64_t{b.microbatches} << 40 | b.zero.bucket_bytes);
    auto it = footprints_.find(key);
    if (it == footprints_.end()) {
      it = footprints_
               .emplace(key, ZeroStore::Measure(BuildPlan(b.model, b.plan),
                                                b.replicas(), b.zero,
                                                b.expert_replicas()))
               .first;
    }
    const MemoryEstimate e = EstimateRankMemory(b, async_copy, it->second);
    if (rank == 0 || e.total() > most.total()) most = e;
  }
  p->memory = most;
  p->memory_need = most.gpu ? most.device() : most.host();
  p->memory_limit = MemoryLimit();
}

Prediction CostModel::Predict(const v1::JobSpec& spec) {
  Prediction p = Time(spec);
  Memory(spec, &p);
  return p;
}

}  // namespace ptrain::planner
