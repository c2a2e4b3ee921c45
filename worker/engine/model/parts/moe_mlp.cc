// The Mixture-of-Experts MLP (model.moe): a router picks top_k of E experts
// for each token, the tokens are packed by expert (the dispatch plan), each
// expert is the arch's MLP without biases (gpt: GELU, llama: SwiGLU) run
// over its packed tokens with one matmul per linear layer, and each token's
// output is its experts' outputs weighted by the router; `shared` experts,
// one MLP of shared·hidden channels, add their output for every token.
//
// Tensors: mlp.router.weight (E,C), replicated over tp, and the first linear
// of every expert and of the shared MLP in the block's third unit; their
// second linears in its fourth. An expert is split over tp as the dense MLP
// is (first linear by columns, second by rows), so every tp rank routes
// every token of the microbatch (the input is gathered under sequence
// parallelism) and the experts' partial outputs are summed over tp as the
// dense MLP's are.
//
// Balance: the load-balancing loss and the router z-loss are added to the
// training loss with weights aux_coef and z_coef, each over a sequence (the
// balance loss is each sequence's, the z-loss each token's, both averaged
// over the global batch), and a capacity factor drops, for each sequence
// and expert, the tokens past its capacity: a sequence is the same on every
// layout, a microbatch is not, so every layout drops the same tokens and
// computes the same losses.
//
// Rows (fp32; indices as int32 in float slots): the router's logits and
// scores (N,E), its weights (N,k), the routing (experts, slots, order:
// N·k each; counts E; offsets E+1), the experts' hidden layer before its
// activation (N·k rows at most, dropless) and their outputs (N·k,C), and
// the shared MLP's hidden layer (N,shared·hidden/tp, or twice for SwiGLU).
// N = B·T, the whole microbatch.
//
// A split backward's B computes the weight gradients too (W only ends the
// units): zero-bubble schedules run, with less of the backward to fill the
// bubble with.
#include <algorithm>
#include <string>
#include <vector>

#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

enum Row { kLogits, kScores, kWeights, kRoute, kHidden, kOut, kShared };

// The first linear's width for a hidden layer of h channels: SwiGLU's gate
// and up halves, or GELU's one.
int64_t GateWidth(bool swiglu, int64_t h) { return swiglu ? 2 * h : h; }

// Where the routing's int32 arrays lie in its row.
struct RouteRows {
  int32_t *experts, *slots, *order, *counts, *offsets;
  RouteRows(float* row, int64_t N, int k, int E) {
    auto* p = reinterpret_cast<int32_t*>(row);
    const int64_t Nk = N * k;
    experts = p;
    slots = p + Nk;
    order = p + 2 * Nk;
    counts = p + 3 * Nk;
    offsets = counts + E;
  }
  static int64_t Floats(int64_t N, int k, int E) {
    return 3 * N * k + 2 * int64_t{E} + 1;
  }
};

class MoeMlp : public SublayerPart {
 public:
  explicit MoeMlp(bool swiglu) : swiglu_(swiglu) {}

  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    const GptConfig::Moe& m = c.moe;
    const int64_t C = c.n_embd, H = m.hidden;
    using Init = ParamInfo::Init;
    std::vector<PartTensor> out = {{"mlp.router.weight",
                                    {m.experts, C},
                                    Init::kNormal,
                                    false,
                                    2,
                                    TpSplit::kReplicated,
                                    false}};
    // The first linears (the third unit), then the second linears (the
    // fourth): a unit's tensors lie together.
    const std::string first = swiglu_ ? ".gate_up_proj" : ".c_fc";
    const std::string second = swiglu_ ? ".down_proj" : ".c_proj";
    const int n = m.experts + (m.shared > 0 ? 1 : 0);
    auto prefix = [&](int e) {
      return e < m.experts ? "mlp.experts." + std::to_string(e)
                           : std::string("mlp.shared");
    };
    auto hidden = [&](int e) {
      return e < m.experts ? H : int64_t{m.shared} * H;
    };
    for (int e = 0; e < n; ++e) {
      out.push_back({prefix(e) + first + ".weight",
                     {swiglu_ ? 2 * hidden(e) : hidden(e), C},
                     Init::kNormal,
                     false,
                     2,
                     swiglu_ ? TpSplit::kStacked2 : TpSplit::kColumn,
                     false});
    }
    for (int e = 0; e < n; ++e) {
      out.push_back({prefix(e) + second + ".weight",
                     {C, hidden(e)},
                     Init::kNormal,
                     true,
                     3,
                     TpSplit::kRow,
                     false});
    }
    return out;
  }

  std::vector<ActivationRow> Rows(const StageActivationDims& d) const override {
    const GptConfig::Moe& m = d.moe;
    const int64_t N = d.BT, Nk = SatMul(N, m.top_k);
    return {
        {"mlp.logits", SatMul(N, m.experts)},
        {"mlp.scores", SatMul(N, m.experts)},
        {"mlp.weights", Nk},
        {"mlp.route", RouteRows::Floats(N, m.top_k, m.experts)},
        {"mlp.hidden", SatMul(Nk, Gate(int64_t{m.hidden} / d.tp))},
        {"mlp.out", SatMul(Nk, d.C)},
        {"mlp.shared", SatMul(N, Gate(int64_t{m.shared} * m.hidden / d.tp))}};
  }

  // hidden_a: the gathered input, the partial output (or the input's
  // gradient), the gathered output gradient, the packed rows and their
  // gradients, the router's gradients; hidden_b: an activation, its
  // gradient and the hidden layer's gradient (the experts', then the
  // shared MLP's).
  int64_t HiddenFloats(const StageActivationDims& d) const override {
    const GptConfig::Moe& m = d.moe;
    const int64_t N = d.BT, Nk = SatMul(N, m.top_k);
    const int64_t Hl = m.hidden / d.tp,
                  Sl = int64_t{m.shared} * m.hidden / d.tp;
    const int64_t a =
        SatMul(3 * N, d.C) + SatMul(2 * Nk, d.C) + SatMul(N, m.experts) + Nk;
    const int64_t b = 2 * std::max(SatMul(Nk, Hl), SatMul(N, Sl)) +
                      SatMul(Nk, Gate(Hl)) + SatMul(N, Gate(Sl));
    return std::max(a, b);
  }

  double FlopsPerToken(const GptConfig& c, int) const override {
    const GptConfig::Moe& m = c.moe;
    const double C = c.n_embd;
    // The router, and the experts a token passes through.
    return 6.0 * C *
           (m.experts + static_cast<double>(m.top_k + m.shared) *
                            static_cast<double>(Gate(m.hidden) + m.hidden));
  }

  void Forward(const PartPass& p, kernels::ConstAct in,
               float* out) const override {
    Work w(p, swiglu_);
    w.Gather(in);
    p.Begin(kRouterTensor);
    w.Route();
    w.ExpertsForward();
    p.End(kRouterTensor);
    p.Begin(SecondTensor(p.config().moe, 0));
    w.SecondForward();
    // Full recomputation's forward again stops at the rows the backward
    // reads.
    if (!p.recomputing()) w.Combine(out);
    p.End(SecondTensor(p.config().moe, 0));
  }

  // One unit at a time (a ZeRO-3 store holds one block unit and
  // prefetches the next): the second linears' backward, then the first
  // linears' and the router's.
  void Backward(const PartPass& p, float* din, const float* dout,
                kernels::ConstAct in) const override {
    Work w(p, swiglu_);
    w.Gather(in);
    p.Begin(SecondTensor(p.config().moe, 0));
    w.SecondBackward(dout);
    if (!p.split()) p.End(SecondTensor(p.config().moe, 0));
    p.Begin(kRouterTensor);
    w.FirstBackward(din);
    p.Poll();
    if (!p.split()) p.End(kRouterTensor);
  }

  void BackwardWeights(const PartPass& p, kernels::ConstAct) const override {
    p.End(SecondTensor(p.config().moe, 0));
    p.End(kRouterTensor);
    p.Poll();
  }

 private:
  static constexpr int kRouterTensor = 0;
  // Expert e's (e = E: the shared MLP's) first and second linear.
  static int FirstTensor(int e) { return 1 + e; }
  static int SecondTensor(const GptConfig::Moe& m, int e) {
    return 1 + m.experts + (m.shared > 0 ? 1 : 0) + e;
  }
  int64_t Gate(int64_t h) const { return GateWidth(swiglu_, h); }

  // One pass's buffers and sizes.
  class Work {
   public:
    Work(const PartPass& p, bool swiglu)
        : p_(p),
          ops_(p.ops()),
          m_(p.config().moe),
          swiglu_(swiglu),
          B_(p.B()),
          T_(p.T()),
          C_(p.C()),
          N_(int64_t{p.B()} * p.T()),
          Hl_(m_.hidden / p.tp().size()),
          Sl_(int64_t{m_.shared} * m_.hidden / p.tp().size()),
          route_(p.Row(kRoute), N_, m_.top_k, m_.experts) {
      const int64_t Nk = N_ * m_.top_k;
      float* a = p.work().hidden_a;
      x_ = a;
      partial_ = x_ + N_ * C_;
      dout_ = partial_ + N_ * C_;
      packed_ = dout_ + N_ * C_;
      dpacked_ = packed_ + Nk * C_;
      dlogits_ = dpacked_ + Nk * C_;
      dweights_ = dlogits_ + N_ * m_.experts;
      const int64_t act = std::max(Nk * Hl_, N_ * Sl_);
      act_ = p.work().hidden_b;
      dact_ = act_ + act;
      dhidden_ = dact_ + act;
      dshared_ = dhidden_ + Nk * Gate(Hl_);
    }

    // x_ (N,C), fp32: the whole microbatch's input.
    void Gather(kernels::ConstAct in) {
      const int Ts = p_.Ts();
      const float* local = in.f32();
      if (in.type != kernels::DType::kF32) {
        ops_.Convert(kernels::Act(partial_), in, int64_t{B_} * Ts, C_);
        local = partial_;
      }
      sequence_gather(x_, local, B_, T_, C_, p_.tp(), p_.scratch().a, ops_);
    }

    // The router's rows and the dispatch plan, then the packed input.
    void Route() {
      const int E = m_.experts, k = m_.top_k;
      float* logits = p_.Row(kLogits);
      ops_.matmul_forward(logits, x_, p_.Weight(kRouterTensor), nullptr, 1,
                          static_cast<int>(N_), C_, E);
      ops_.moe_router_forward(route_.experts, p_.Row(kWeights), p_.Row(kScores),
                              logits, nullptr, static_cast<int>(N_), E, k,
                              m_.router, k > 1);
      Plan();
      ops_.moe_permute_forward(packed_, x_, route_.order, M(), k, C_);
      if (p_.recomputing() || p_.decoding()) return;
      p_.AddLoad(offsets_.data(), E, dropped_);
      p_.AddLoss(BalanceLosses(nullptr, 0.0f));
    }

    // The balance loss (each sequence's, their mean) and the z-loss (the
    // tokens' mean): their value over the microbatch; with dlogits, their
    // gradient added to it, `dloss` being the training loss's per token.
    double BalanceLosses(float* dlogits, float dloss) {
      const int N = static_cast<int>(N_), E = m_.experts;
      double loss = 0;
      if (m_.aux_coef > 0) {
        loss += ops_.moe_aux_loss(dlogits, p_.Row(kScores), route_.experts,
                                  m_.aux_coef, dloss * T_, N, T_, E, m_.top_k,
                                  m_.router) /
                B_;
      }
      if (m_.z_coef > 0) {
        loss += ops_.moe_z_loss(dlogits, p_.Row(kLogits), m_.z_coef,
                                dloss * static_cast<float>(N_), N, E);
      }
      return loss;
    }

    // The experts' first linear and activation's input: the hidden row.
    void ExpertsForward() {
      float* hidden = p_.Row(kHidden);
      const int64_t G = Gate(Hl_);
      ForEachExpert([&](int e, int64_t at, int n) {
        ops_.matmul_forward(hidden + at * G, packed_ + at * C_,
                            p_.Weight(FirstTensor(e)), nullptr, 1, n, C_,
                            static_cast<int>(G));
      });
      if (m_.shared > 0) {
        ops_.matmul_forward(
            p_.Row(kShared), x_, p_.Weight(FirstTensor(m_.experts)), nullptr, 1,
            static_cast<int>(N_), C_, static_cast<int>(Gate(Sl_)));
      }
    }

    // The experts' outputs (the out row) from the hidden row.
    void SecondForward() {
      float* y = p_.Row(kOut);
      Activate(act_, p_.Row(kHidden), M(), Hl_);
      ForEachExpert([&](int e, int64_t at, int n) {
        ops_.matmul_forward(y + at * C_, act_ + at * Hl_,
                            p_.Weight(SecondTensor(m_, e)), nullptr, 1, n,
                            static_cast<int>(Hl_), C_);
      });
    }

    // out (B,Ts,C): the weighted experts' outputs and the shared MLP's,
    // summed over tp.
    void Combine(float* out) {
      const int k = m_.top_k;
      ops_.moe_unpermute_forward(partial_, p_.Row(kOut), p_.Row(kWeights),
                                 route_.slots, static_cast<int>(N_), k, C_);
      if (m_.shared > 0) {
        Activate(act_, p_.Row(kShared), N_, Sl_);
        ops_.matmul_forward(packed_, act_,
                            p_.Weight(SecondTensor(m_, m_.experts)), nullptr, 1,
                            static_cast<int>(N_), static_cast<int>(Sl_), C_);
        ops_.Add(partial_, packed_, N_ * C_);
      }
      sequence_reduce(out, partial_, B_, T_, C_, p_.tp(), p_.scratch().a, ops_);
    }

    // The gradients of the second linears' weights, and of the experts'
    // and the shared MLP's hidden layers (kept in hidden_b for
    // FirstBackward); the router weights' gradient.
    void SecondBackward(const float* dout) {
      const int E = m_.experts, k = m_.top_k, N = static_cast<int>(N_);
      ReadPlan();
      sequence_gather(dout_, dout, B_, T_, C_, p_.tp(), p_.scratch().a, ops_);
      ops_.moe_unpermute_backward(dpacked_, dweights_, dout_, p_.Row(kOut),
                                  p_.Row(kWeights), route_.slots, N, k, C_);
      // Under tp the out row holds this rank's part of each expert's output,
      // so the router weights' gradient (a dot with it) is summed over tp.
      if (p_.tp().comm != nullptr) {
        p_.tp().comm->AllReduce(dweights_, N_ * k);
      }
      const float* hidden = p_.Row(kHidden);
      Activate(act_, hidden, M(), Hl_);
      ForEachExpert([&](int e, int64_t at, int n) {
        ops_.matmul_backward(dact_ + at * Hl_, p_.Grad(SecondTensor(m_, e)),
                             nullptr, dpacked_ + at * C_, act_ + at * Hl_,
                             p_.Weight(SecondTensor(m_, e)), 1, n,
                             static_cast<int>(Hl_), C_);
      });
      ActivationBackward(dhidden_, dact_, hidden, M(), Hl_);
      if (m_.shared == 0) return;
      const float* h = p_.Row(kShared);
      Activate(act_, h, N_, Sl_);
      ops_.matmul_backward(dact_, p_.Grad(SecondTensor(m_, E)), nullptr, dout_,
                           act_, p_.Weight(SecondTensor(m_, E)), 1, N,
                           static_cast<int>(Sl_), C_);
      ActivationBackward(dshared_, dact_, h, N_, Sl_);
    }

    // din (B,Ts,C) and the first linears' and the router's weight
    // gradients.
    void FirstBackward(float* din) {
      const int E = m_.experts, k = m_.top_k, N = static_cast<int>(N_);
      const int64_t G = Gate(Hl_);
      ops_.moe_permute_forward(packed_, x_, route_.order, M(), k, C_);
      // Each expert's packed input gradient over its output gradient,
      // which SecondBackward is done with.
      ForEachExpert([&](int e, int64_t at, int n) {
        ops_.matmul_backward(dpacked_ + at * C_, p_.Grad(FirstTensor(e)),
                             nullptr, dhidden_ + at * G, packed_ + at * C_,
                             p_.Weight(FirstTensor(e)), 1, n, C_,
                             static_cast<int>(G));
      });
      ops_.Zero(partial_, N_ * C_);
      ops_.moe_permute_backward(partial_, dpacked_, route_.slots, N, k, C_);
      if (m_.shared > 0) {
        ops_.matmul_backward(packed_, p_.Grad(FirstTensor(E)), nullptr,
                             dshared_, x_, p_.Weight(FirstTensor(E)), 1, N, C_,
                             static_cast<int>(Gate(Sl_)));
        ops_.Add(partial_, packed_, N_ * C_);
      }
      sequence_reduce(din, partial_, B_, T_, C_, p_.tp(), p_.scratch().a, ops_);
      // The router: its weights' gradient, the balance and z losses'; the
      // same on every tp rank, so added to din after the sum over tp (this
      // rank's positions of it).
      ops_.Zero(dlogits_, N_ * E);
      ops_.moe_router_backward(dlogits_, dweights_, route_.experts,
                               p_.Row(kScores), N, E, k, m_.router, k > 1);
      BalanceLosses(dlogits_, p_.dloss());
      ops_.matmul_backward(packed_, p_.Grad(kRouterTensor), nullptr, dlogits_,
                           x_, p_.Weight(kRouterTensor), 1, N, C_, E);
      const int Ts = p_.Ts();
      ops_.CopyRows(din, int64_t{Ts} * C_,
                    packed_ + int64_t{p_.tp().SeqBegin(T_)} * C_,
                    int64_t{T_} * C_, B_, int64_t{Ts} * C_, /*add=*/true);
    }

   private:
    int64_t Gate(int64_t h) const { return GateWidth(swiglu_, h); }
    // act (rows,h) from the hidden layer's rows (rows,Gate(h)).
    void Activate(float* act, const float* hidden, int64_t rows, int64_t h) {
      if (swiglu_) {
        ops_.swiglu_forward(act, hidden, rows, static_cast<int>(h));
      } else {
        ops_.gelu_forward(act, hidden, rows * h);
      }
    }
    void ActivationBackward(float* dhidden, const float* dact,
                            const float* hidden, int64_t rows, int64_t h) {
      if (swiglu_) {
        ops_.swiglu_backward(dhidden, dact, hidden, rows, static_cast<int>(h));
      } else {
        ops_.gelu_backward(dhidden, hidden, dact, rows * h);
      }
    }
    void Plan() {
      offsets_.resize(m_.experts + 1);
      dropped_ = ops_.moe_dispatch_plan(
          route_.slots, route_.order, route_.counts, route_.offsets,
          offsets_.data(), route_.experts, static_cast<int>(N_), m_.top_k,
          m_.experts, p_.decoding() ? 0 : m_.Capacity(T_), T_);
    }
    // The forward's plan's offsets, on the host.
    void ReadPlan() {
      offsets_.resize(m_.experts + 1);
      static_assert(sizeof(int32_t) == sizeof(float));
      ops_.ToHost(reinterpret_cast<float*>(offsets_.data()),
                  reinterpret_cast<const float*>(route_.offsets),
                  m_.experts + 1);
    }
    int M() const { return offsets_[m_.experts]; }
    // fn(e, first row, rows) for each expert with rows in the plan.
    template <typename Fn>
    void ForEachExpert(Fn fn) const {
      for (int e = 0; e < m_.experts; ++e) {
        if (Count(e) > 0) fn(e, Offset(e), Count(e));
      }
    }
    int64_t Offset(int e) const { return offsets_[e]; }
    int Count(int e) const { return offsets_[e + 1] - offsets_[e]; }

    const PartPass& p_;
    kernels::Ops& ops_;
    const GptConfig::Moe& m_;
    const bool swiglu_;
    const int B_, T_, C_;
    const int64_t N_, Hl_, Sl_;
    RouteRows route_;
    std::vector<int32_t> offsets_;
    int64_t dropped_ = 0;
    float *x_, *partial_, *dout_, *packed_, *dpacked_, *dlogits_, *dweights_;
    float *act_, *dact_, *dhidden_, *dshared_;
  };

  const bool swiglu_;
};

}  // namespace

std::unique_ptr<SublayerPart> MoeMlpPart(bool swiglu) {
  return std::make_unique<MoeMlp>(swiglu);
}

}  // namespace ptrain
