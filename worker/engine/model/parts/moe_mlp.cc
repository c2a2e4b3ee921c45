// The Mixture-of-Experts MLP (model.moe): a router picks top_k of E experts
// for each token, the tokens are packed by expert (the dispatch plan), each
// expert is the arch's MLP without biases (gpt: GELU, llama: SwiGLU) run
// over its packed tokens with one matmul per linear layer, and each token's
// output is its experts' outputs weighted by the router; `shared` experts,
// one MLP of shared·hidden channels, add their output for every token.
//
// Tensors: mlp.router.weight (E,C), replicated over tp, and the shared
// MLP's two linears in the block's third unit; the routed experts' first
// linears in its fourth, their second linears in its fifth (a unit holds
// experts' tensors or none: under expert parallelism their gradients are
// summed over other ranks). An expert is split over tp as the dense MLP
// is (first linear by columns, second by rows), so every tp rank routes
// every token of the microbatch (the input is gathered under sequence
// parallelism) and the experts' partial outputs are summed over tp as the
// dense MLP's are. With parallel.expert_tp below tp (Moe::ExpertTp), each
// slice of expert_tp tp ranks holds its own experts, split over those
// ranks: it computes its experts' rows, zeroes the other slices' (in the
// packed output and input gradient), and the sum over tp adds the slices.
//
// Expert parallelism (config.moe.ep > 1): each rank of the ep group holds
// E/ep consecutive experts. A rank routes its own tokens over all E; the
// per-expert counts go to the experts' ranks first (one small all-to-all),
// then the packed rows (an all-to-all of rows), which the receiver orders
// by expert (each expert's rows by source rank: the one-rank order) and
// computes; its outputs go back the same way. The backward sends the
// outputs' gradients and returns the inputs'. The received rows are kept
// for the backward, up to LocalRows of them: a dispatch past it fails,
// naming the layer, the expert and the counts.
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
// N·k each; counts E; offsets E+1; the counts received by expert and
// source, E), the local experts' hidden layer before its activation
// (LocalRows) and their outputs in this rank's packed order (N·k,C), the
// shared MLP's hidden layer (N,shared·hidden/tp, or twice for SwiGLU) and,
// under ep, the rows received (LocalRows,C). N = B·T, the whole microbatch.
//
// A split backward's B computes the weight gradients too (W only ends the
// units): zero-bubble schedules run, with less of the backward to fill the
// bubble with.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

enum Row { kLogits, kScores, kWeights, kRoute, kHidden, kOut, kShared, kIn };

// The first linear's width for a hidden layer of h channels: SwiGLU's gate
// and up halves, or GELU's one.
int64_t GateWidth(bool swiglu, int64_t h) { return swiglu ? 2 * h : h; }

// A rank's experts take, dropless, at most this many times their share of
// the ep group's choices per microbatch.
constexpr int kDroplessSlack = 2;

// The rows a rank's experts take from one microbatch of B sequences of T
// positions (of T·cp: context parallelism) on each rank of its ep group, at
// most: all N·k choices of its own (one rank holding every expert); else
// the most its experts (LocalExperts: E/ep, over the tp group's `slices`
// too) keep of the B·ep sequences at the capacity, dropless
// kDroplessSlack times their share; never more than every choice of the
// group.
int64_t LocalRows(const GptConfig::Moe& m, int64_t B, int64_t T, int cp,
                  int slices) {
  const int64_t Nk = SatMul(SatMul(B, T), m.top_k);
  if (m.ep == 1 && slices == 1) return Nk;
  const int64_t all = SatMul(Nk, m.ep);
  const int cap = m.Capacity(static_cast<int>(SatMul(T, cp)));
  const int64_t bound =
      cap > 0
          ? SatMul(SatMul(m.experts / (m.ep * slices), cap), SatMul(B, m.ep))
          : SatMul(Nk, kDroplessSlack) / slices;
  return std::min(all, bound);
}

// The index (in Tensors' order) of this rank's first routed expert's first
// linear: after the router's tensors and the shared MLP's two; the second
// linears follow every expert's first.
int FirstExpertTensor(const PartPass& p) {
  const GptConfig::Moe& m = p.config().moe;
  return 1 + (m.bias ? 1 : 0) + (m.shared > 0 ? 2 : 0) +
         m.FirstExpert(p.tp().size(), p.tp().rank(),
                       p.ep() != nullptr ? p.ep()->rank() : 0);
}

// Where the routing's int32 arrays lie in its row.
struct RouteRows {
  int32_t *experts, *slots, *order, *counts, *offsets, *received;
  RouteRows(float* row, int64_t N, int k, int E) {
    auto* p = reinterpret_cast<int32_t*>(row);
    const int64_t Nk = N * k;
    experts = p;
    slots = p + Nk;
    order = p + 2 * Nk;
    counts = p + 3 * Nk;
    offsets = counts + E;
    received = offsets + E + 1;
  }
  static int64_t Floats(int64_t N, int k, int E) {
    return 3 * N * k + 3 * int64_t{E} + 1;
  }
};

class MoeMlp : public SublayerPart {
 public:
  explicit MoeMlp(bool swiglu) : swiglu_(swiglu) {}

  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    const GptConfig::Moe& m = c.moe;
    const int64_t C = c.n_embd, H = m.hidden, S = int64_t{m.shared} * H;
    using Init = ParamInfo::Init;
    const std::string first = swiglu_ ? ".gate_up_proj" : ".c_fc";
    const std::string second = swiglu_ ? ".down_proj" : ".c_proj";
    const TpSplit gate = swiglu_ ? TpSplit::kStacked2 : TpSplit::kColumn;
    std::vector<PartTensor> out = {{"mlp.router.weight",
                                    {m.experts, C},
                                    Init::kNormal,
                                    false,
                                    2,
                                    TpSplit::kReplicated,
                                    false}};
    if (m.bias) {
      // Moved after each step (MoveExpertBias), never by the optimizer: its
      // gradient is zero.
      out.push_back({"mlp.router.expert_bias",
                     {m.experts},
                     Init::kZeros,
                     false,
                     2,
                     TpSplit::kReplicated,
                     false});
    }
    if (m.shared > 0) {
      out.push_back({"mlp.shared" + first + ".weight",
                     {Gate(S), C},
                     Init::kNormal,
                     false,
                     2,
                     gate,
                     false});
      out.push_back({"mlp.shared" + second + ".weight",
                     {C, S},
                     Init::kNormal,
                     true,
                     2,
                     TpSplit::kRow,
                     false});
    }
    // The routed experts' first linears (the fourth unit), then their
    // second linears (the fifth): a unit's tensors lie together.
    for (int e = 0; e < m.experts; ++e) {
      out.push_back({"mlp.experts." + std::to_string(e) + first + ".weight",
                     {Gate(H), C},
                     Init::kNormal,
                     false,
                     3,
                     gate,
                     false,
                     e});
    }
    for (int e = 0; e < m.experts; ++e) {
      out.push_back({"mlp.experts." + std::to_string(e) + second + ".weight",
                     {C, H},
                     Init::kNormal,
                     true,
                     4,
                     TpSplit::kRow,
                     false,
                     e});
    }
    return out;
  }

  std::vector<ActivationRow> Rows(const StageActivationDims& d) const override {
    const GptConfig::Moe& m = d.moe;
    const int64_t N = d.BT, Nk = SatMul(N, m.top_k);
    const int64_t R = LocalRows(m, d.T > 0 ? d.BT / d.T : 0, d.T, d.cp,
                                m.Slices(static_cast<int>(d.tp)));
    return {
        {"mlp.logits", SatMul(N, m.experts)},
        {"mlp.scores", SatMul(N, m.experts)},
        {"mlp.weights", Nk},
        {"mlp.route", RouteRows::Floats(N, m.top_k, m.experts)},
        {"mlp.hidden", SatMul(R, Gate(int64_t{m.hidden} /
                                      m.ExpertTp(static_cast<int>(d.tp))))},
        {"mlp.out", SatMul(Nk, d.C)},
        {"mlp.shared", SatMul(N, Gate(int64_t{m.shared} * m.hidden / d.tp))},
        {"mlp.received", m.ep > 1 ? SatMul(R, d.C) : 0}};
  }

  // hidden_a: the gathered input, the partial output (or the input's
  // gradient), the gathered output gradient (the shared MLP's output in
  // the forward), the packed rows and their gradients, the router's
  // gradients and, under ep, two buffers of the received rows; hidden_b:
  // an activation, its gradient and the hidden layer's gradient (the
  // experts', then the shared MLP's).
  int64_t HiddenFloats(const StageActivationDims& d) const override {
    const GptConfig::Moe& m = d.moe;
    const int64_t N = d.BT, Nk = SatMul(N, m.top_k);
    const int tp = static_cast<int>(d.tp);
    const int64_t R =
        LocalRows(m, d.T > 0 ? d.BT / d.T : 0, d.T, d.cp, m.Slices(tp));
    const int64_t Hl = m.hidden / m.ExpertTp(tp),
                  Sl = int64_t{m.shared} * m.hidden / d.tp;
    const int64_t a = SatAdd(
        SatMul(3 * N, d.C) + SatMul(2 * Nk, d.C) + SatMul(N, m.experts) + Nk,
        m.ep > 1 ? SatMul(2 * R, d.C) : 0);
    const int64_t b = 2 * std::max(SatMul(R, Hl), SatMul(N, Sl)) +
                      SatMul(R, Gate(Hl)) + SatMul(N, Gate(Sl));
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
    w.SharedForward();
    p.End(kRouterTensor);
    p.Begin(w.first());
    w.FirstForward();
    p.End(w.first());
    p.Begin(w.second());
    w.SecondForward();
    // Full recomputation's forward again stops at the rows the backward
    // reads.
    if (!p.recomputing()) w.Combine(out);
    p.End(w.second());
  }

  // One unit at a time (a ZeRO-3 store holds one block unit and
  // prefetches the next): the experts' second linears' backward, their
  // first linears', then the shared MLP's and the router's.
  void Backward(const PartPass& p, float* din, const float* dout,
                kernels::ConstAct in) const override {
    Work w(p, swiglu_);
    w.Gather(in);
    p.Begin(w.second());
    w.SecondBackward(dout);
    if (!p.split()) p.End(w.second());
    p.Begin(w.first());
    w.FirstBackward();
    if (!p.split()) p.End(w.first());
    p.Begin(kRouterTensor);
    w.RouterBackward(din);
    p.Poll();
    if (!p.split()) p.End(kRouterTensor);
  }

  void BackwardWeights(const PartPass& p, kernels::ConstAct) const override {
    const int first = FirstExpertTensor(p);
    p.End(first + p.config().moe.experts);
    p.End(first);
    p.End(kRouterTensor);
    p.Poll();
  }

 private:
  static constexpr int kRouterTensor = 0;
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
          Hl_(m_.hidden / m_.ExpertTp(p.tp().size())),
          Sl_(int64_t{m_.shared} * m_.hidden / p.tp().size()),
          El_(m_.LocalExperts(p.tp().size())),
          e0_(m_.FirstExpert(p.tp().size(), p.tp().rank(),
                             p.ep() != nullptr ? p.ep()->rank() : 0)),
          b0_(m_.FirstExpert(p.tp().size(), p.tp().rank(), 0)),
          slices_(m_.Slices(p.tp().size())),
          cp_(p.cp().size()),
          Tg_(T_ * cp_),
          R_max_(LocalRows(m_, p.B(), p.T(), p.cp().size(), slices_)),
          route_(p.Row(kRoute), N_, m_.top_k, m_.experts) {
      PT_CHECK((p.ep() != nullptr ? p.ep()->size() : 1) == m_.ep,
               "the ep group's size differs from model.moe's ep");
      PT_CHECK(p.tp().size() % m_.ExpertTp(p.tp().size()) == 0,
               "model.moe's expert_tp does not divide the tp group");
      const int64_t Nk = N_ * m_.top_k;
      float* a = p.work().hidden_a;
      x_ = a;
      partial_ = x_ + N_ * C_;
      dout_ = partial_ + N_ * C_;
      packed_ = dout_ + N_ * C_;
      dpacked_ = packed_ + Nk * C_;
      dlogits_ = dpacked_ + Nk * C_;
      dweights_ = dlogits_ + N_ * m_.experts;
      mine_ = dweights_ + Nk;
      moved_ = mine_ + (m_.ep > 1 ? R_max_ * C_ : 0);
      const int64_t act = std::max(R_max_ * Hl_, N_ * Sl_);
      act_ = p.work().hidden_b;
      dact_ = act_ + act;
      dhidden_ = dact_ + act;
      dshared_ = dhidden_ + R_max_ * Gate(Hl_);
    }

    // The tensors whose units hold this rank's routed experts.
    int first() const { return FirstExpertTensor(p_); }
    int second() const { return first() + m_.experts; }

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

    // The router's rows and the dispatch plan, the packed input, and the
    // rows of this rank's experts (received, under ep).
    void Route() {
      const int E = m_.experts, k = m_.top_k;
      float* logits = p_.Row(kLogits);
      ops_.matmul_forward(logits, x_, p_.Weight(kRouterTensor), nullptr, 1,
                          static_cast<int>(N_), C_, E);
      ops_.moe_router_forward(route_.experts, p_.Row(kWeights), p_.Row(kScores),
                              logits, m_.bias ? p_.Param(1) : nullptr,
                              static_cast<int>(N_), E, k, m_.router, k > 1);
      Plan();
      ops_.moe_permute_forward(packed_, x_, route_.order, M(), k, C_);
      if (m_.ep > 1) {
        ExchangeCounts();
        Dispatch(p_.Row(kIn), packed_ + Sent() * C_);
      }
      if (p_.recomputing() || p_.decoding()) return;
      p_.AddLoad(offsets_.data(), E, dropped_);
      p_.AddLoss(BalanceLosses(nullptr, 0.0f));
    }

    // The shared MLP's hidden row and (not recomputing) its output, kept
    // in dout_ until Combine.
    void SharedForward() {
      if (m_.shared == 0) return;
      ops_.matmul_forward(p_.Row(kShared), x_, p_.Weight(Shared(0)), nullptr, 1,
                          static_cast<int>(N_), C_,
                          static_cast<int>(Gate(Sl_)));
      if (p_.recomputing()) return;
      Activate(act_, p_.Row(kShared), N_, Sl_);
      ops_.matmul_forward(dout_, act_, p_.Weight(Shared(1)), nullptr, 1,
                          static_cast<int>(N_), static_cast<int>(Sl_), C_);
    }

    // The balance loss (each sequence's, their mean) and the z-loss (the
    // tokens' mean): their value over the microbatch; with dlogits, their
    // gradient added to it, `dloss` being the training loss's per token.
    // Under cp each sequence's balance loss is over its pairs on every cp
    // rank (their counts summed over cp), and each rank's value is its
    // part: the cp ranks' values sum to the microbatch's.
    double BalanceLosses(float* dlogits, float dloss) {
      const int N = static_cast<int>(N_), E = m_.experts;
      double loss = 0;
      if (m_.aux_coef > 0) {
        std::vector<float> counts;
        if (cp_ > 1) {
          counts = PairCounts(T_);
          p_.cp().comm->AllReduce(counts.data(),
                                  static_cast<int64_t>(counts.size()));
        }
        loss += ops_.moe_aux_loss(dlogits, p_.Row(kScores), route_.experts,
                                  m_.aux_coef, dloss * Tg_, N, T_, E, m_.top_k,
                                  m_.router, cp_ > 1 ? counts.data() : nullptr,
                                  Tg_) /
                B_;
      }
      if (m_.z_coef > 0) {
        loss += ops_.moe_z_loss(dlogits, p_.Row(kLogits), m_.z_coef,
                                dloss * static_cast<float>(N_), N, E) /
                cp_;
      }
      return loss;
    }
    // The pairs naming each expert in each run of `segment` tokens
    // (N_/segment × E).
    std::vector<float> PairCounts(int segment) const {
      const int64_t Nk = N_ * m_.top_k;
      std::vector<int32_t> experts(Nk);
      static_assert(sizeof(int32_t) == sizeof(float));
      ops_.ToHost(reinterpret_cast<float*>(experts.data()),
                  reinterpret_cast<const float*>(route_.experts), Nk);
      std::vector<float> counts(N_ / segment * m_.experts, 0.0f);
      for (int64_t i = 0; i < Nk; ++i) {
        counts[i / m_.top_k / segment * m_.experts + experts[i]] += 1;
      }
      return counts;
    }
    // Under cp with a capacity: each local chunk's (two a sequence,
    // kernels::math::ZigzagPosition's) pairs per expert in its sequence's
    // chunks before it, on every cp rank ((B·2) × E).
    std::vector<int32_t> ChunkBase() const {
      const int E = m_.experts, r = p_.cp().rank();
      const std::vector<float> mine = PairCounts(T_ / 2);
      const int64_t n = static_cast<int64_t>(mine.size());
      std::vector<float> all(n * cp_);
      p_.cp().comm->AllGather(mine.data(), all.data(), n);
      // Global chunk g of a sequence is local chunk g < cp ? 0 : 1 of rank
      // g < cp ? g : 2·cp−1−g.
      auto at = [&](int b, int g, int e) {
        const int q = g < cp_ ? g : 2 * cp_ - 1 - g, j = g < cp_ ? 0 : 1;
        return all[q * n + (int64_t{b} * 2 + j) * E + e];
      };
      std::vector<int32_t> base(mine.size(), 0);
      for (int b = 0; b < B_; ++b) {
        for (int j = 0; j < 2; ++j) {
          const int g = j == 0 ? r : 2 * cp_ - 1 - r;
          for (int before = 0; before < g; ++before) {
            for (int e = 0; e < E; ++e) {
              base[(b * 2 + j) * E + e] +=
                  static_cast<int32_t>(at(b, before, e));
            }
          }
        }
      }
      return base;
    }

    // The local experts' first linear: the hidden row.
    void FirstForward() {
      float* hidden = p_.Row(kHidden);
      const float* in = Input();
      const int64_t G = Gate(Hl_);
      ForEachExpert([&](int i, int64_t at, int n) {
        ops_.matmul_forward(hidden + at * G, in + at * C_,
                            p_.Weight(first() + i), nullptr, 1, n, C_,
                            static_cast<int>(G));
      });
    }

    // The experts' outputs, in this rank's packed order (the out row).
    void SecondForward() {
      float* out = p_.Row(kOut);
      float* y = m_.ep > 1 ? mine_ : out + Mine() * C_;
      OthersZero(out);
      Activate(act_, p_.Row(kHidden), Rows(), Hl_);
      ForEachExpert([&](int i, int64_t at, int n) {
        ops_.matmul_forward(y + at * C_, act_ + at * Hl_,
                            p_.Weight(second() + i), nullptr, 1, n,
                            static_cast<int>(Hl_), C_);
      });
      if (m_.ep > 1) Return(out + Sent() * C_, mine_);
    }

    // out (B,Ts,C): the weighted experts' outputs and the shared MLP's,
    // summed over tp.
    void Combine(float* out) {
      ops_.moe_unpermute_forward(partial_, p_.Row(kOut), p_.Row(kWeights),
                                 route_.slots, static_cast<int>(N_), m_.top_k,
                                 C_);
      if (m_.shared > 0) ops_.Add(partial_, dout_, N_ * C_);
      sequence_reduce(out, partial_, B_, T_, C_, p_.tp(), p_.scratch().a, ops_);
    }

    // The second linears' weight gradients and the experts' hidden
    // layers' gradient (kept in hidden_b for FirstBackward); the router
    // weights' gradient.
    void SecondBackward(const float* dout) {
      const int k = m_.top_k, N = static_cast<int>(N_);
      ReadPlan();
      sequence_gather(dout_, dout, B_, T_, C_, p_.tp(), p_.scratch().a, ops_);
      ops_.moe_unpermute_backward(dpacked_, dweights_, dout_, p_.Row(kOut),
                                  p_.Row(kWeights), route_.slots, N, k, C_);
      // Under tp the out row holds this rank's part of each expert's output,
      // so the router weights' gradient (a dot with it) is summed over tp.
      if (p_.tp().comm != nullptr) {
        p_.tp().comm->AllReduce(dweights_, N_ * k);
      }
      float* dy = dpacked_ + Mine() * C_;
      if (m_.ep > 1) {
        Dispatch(mine_, dpacked_ + Sent() * C_);
        dy = mine_;
      }
      const float* hidden = p_.Row(kHidden);
      Activate(act_, hidden, Rows(), Hl_);
      ForEachExpert([&](int i, int64_t at, int n) {
        ops_.matmul_backward(dact_ + at * Hl_, p_.Grad(second() + i), nullptr,
                             dy + at * C_, act_ + at * Hl_,
                             p_.Weight(second() + i), 1, n,
                             static_cast<int>(Hl_), C_);
      });
      ActivationBackward(dhidden_, dact_, hidden, Rows(), Hl_);
    }

    // The first linears' weight gradients, and the input's gradient
    // through the experts (partial_, before the sum over tp).
    void FirstBackward() {
      const int k = m_.top_k, N = static_cast<int>(N_);
      const int64_t G = Gate(Hl_);
      if (m_.ep == 1) {
        ops_.moe_permute_forward(packed_, x_, route_.order, M(), k, C_);
      }
      const float* in = Input();
      // Each expert's input gradient over its output gradient, which
      // SecondBackward is done with.
      float* dx = m_.ep > 1 ? mine_ : dpacked_ + Mine() * C_;
      ForEachExpert([&](int i, int64_t at, int n) {
        ops_.matmul_backward(dx + at * C_, p_.Grad(first() + i), nullptr,
                             dhidden_ + at * G, in + at * C_,
                             p_.Weight(first() + i), 1, n, C_,
                             static_cast<int>(G));
      });
      if (m_.ep > 1) Return(dpacked_ + Sent() * C_, mine_);
      OthersZero(dpacked_);
      ops_.Zero(partial_, N_ * C_);
      ops_.moe_permute_backward(partial_, dpacked_, route_.slots, N, k, C_);
    }

    // The shared MLP's backward, din (B,Ts,C), and the router's weight
    // gradient.
    void RouterBackward(float* din) {
      const int E = m_.experts, k = m_.top_k, N = static_cast<int>(N_);
      if (m_.shared > 0) {
        const float* h = p_.Row(kShared);
        Activate(act_, h, N_, Sl_);
        ops_.matmul_backward(dact_, p_.Grad(Shared(1)), nullptr, dout_, act_,
                             p_.Weight(Shared(1)), 1, N, static_cast<int>(Sl_),
                             C_);
        ActivationBackward(dshared_, dact_, h, N_, Sl_);
        ops_.matmul_backward(packed_, p_.Grad(Shared(0)), nullptr, dshared_, x_,
                             p_.Weight(Shared(0)), 1, N, C_,
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
    // The shared MLP's first (0) or second (1) linear, after the router's
    // tensors.
    int Shared(int i) const { return 1 + (m_.bias ? 1 : 0) + i; }
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
    // Capacity per sequence: under cp each of its chunks here counts after
    // its pairs in the chunks before it (ChunkBase).
    void Plan() {
      offsets_.resize(m_.experts + 1);
      const int capacity = p_.decoding() ? 0 : m_.Capacity(Tg_);
      const bool chunked = cp_ > 1 && capacity > 0;
      const std::vector<int32_t> base =
          chunked ? ChunkBase() : std::vector<int32_t>{};
      dropped_ = ops_.moe_dispatch_plan(
          route_.slots, route_.order, route_.counts, route_.offsets,
          offsets_.data(), route_.experts, static_cast<int>(N_), m_.top_k,
          m_.experts, capacity, chunked ? T_ / 2 : T_,
          chunked ? base.data() : nullptr);
      if (m_.ep == 1) Local();
    }
    // The forward's plan's offsets (and the counts received), on the host.
    void ReadPlan() {
      const int E = m_.experts;
      std::vector<int32_t> host(2 * E + 1);
      static_assert(sizeof(int32_t) == sizeof(float));
      ops_.ToHost(reinterpret_cast<float*>(host.data()),
                  reinterpret_cast<const float*>(route_.offsets), 2 * E + 1);
      offsets_.assign(host.begin(), host.begin() + E + 1);
      if (m_.ep == 1) {
        Local();
        return;
      }
      received_.assign(host.begin() + E + 1,
                       host.begin() + E + 1 + int64_t{m_.ep} * El_);
      Received();
    }
    // Without ep the local experts' rows are this rank's own: their counts
    // as received from one source.
    void Local() {
      received_.resize(El_);
      for (int i = 0; i < El_; ++i) received_[i] = Count(e0_ + i);
      Received();
    }

    // Under ep: each rank's counts per expert to the experts' ranks; what
    // this rank's experts receive, by source and expert, kept in the route
    // row for the backward.
    void ExchangeCounts() {
      const int n = m_.ep * El_;  // the experts of this rank's tp slice
      std::vector<float> mine(n), theirs(n);
      for (int e = 0; e < n; ++e) mine[e] = static_cast<float>(Count(b0_ + e));
      const std::vector<int64_t> each(m_.ep, El_);
      p_.ep()->AllToAllV(mine.data(), each.data(), theirs.data(), each.data());
      received_.resize(n);
      for (int i = 0; i < n; ++i) {
        received_[i] = static_cast<int32_t>(theirs[i]);
      }
      ops_.FromHost(reinterpret_cast<float*>(route_.received),
                    reinterpret_cast<const float*>(received_.data()), n);
      Received();
    }
    // From received_: the local experts' offsets and each (source, expert)
    // block's place in the all-to-all's order (by source) and in the
    // experts' (by expert); fails past the buffers.
    void Received() {
      const int ep = m_.ep;
      local_.assign(El_ + 1, 0);
      for (int s = 0; s < ep; ++s) {
        for (int i = 0; i < El_; ++i) local_[i + 1] += received_[s * El_ + i];
      }
      for (int i = 0; i < El_; ++i) local_[i + 1] += local_[i];
      if (local_[El_] > R_max_) Overflow();
      by_source_.resize(ep * El_);
      by_expert_.resize(ep * El_);
      int64_t at = 0;
      std::vector<int64_t> next(local_.begin(), local_.end() - 1);
      for (int s = 0; s < ep; ++s) {
        for (int i = 0; i < El_; ++i) {
          by_source_[s * El_ + i] = at;
          by_expert_[s * El_ + i] = next[i];
          at += received_[s * El_ + i];
          next[i] += received_[s * El_ + i];
        }
      }
    }
    [[noreturn]] void Overflow() const {
      int worst = 0;
      for (int i = 1; i < El_; ++i) {
        if (local_[i + 1] - local_[i] > local_[worst + 1] - local_[worst]) {
          worst = i;
        }
      }
      std::string from;
      for (int s = 0; s < m_.ep; ++s) {
        absl::StrAppend(&from, s > 0 ? ", " : "", received_[s * El_ + worst]);
      }
      const std::string what = absl::StrCat(
          "layer ", p_.layer(), ": expert ", e0_ + worst, " received ",
          local_[worst + 1] - local_[worst], " rows (by ep rank: ", from,
          "); this rank's experts ", local_[El_], " rows, past their ", R_max_,
          "-row buffer (dropless routing takes at most ", kDroplessSlack,
          "× a rank's share; set model.moe.capacity_factor to bound it)");
      PT_CHECK(false, what.c_str());
      std::abort();
    }
    // Rows to the experts' ranks: `packed` (this rank's, by expert) into
    // `received` (the local experts', by expert then source), through
    // moved_.
    void Dispatch(float* received, const float* packed) {
      std::vector<int64_t> send(m_.ep), recv(m_.ep);
      Counts(send.data(), recv.data());
      p_.ep()->AllToAllV(packed, send.data(), moved_, recv.data());
      Regroup(received, moved_, /*to_experts=*/true);
    }
    // The way back: the local experts' rows `rows` (by expert; not
    // moved_) to the ranks they came from, into `packed` (this rank's, by
    // expert).
    void Return(float* packed, float* rows) {
      std::vector<int64_t> send(m_.ep), recv(m_.ep);
      Counts(send.data(), recv.data());
      Regroup(moved_, rows, /*to_experts=*/false);
      p_.ep()->AllToAllV(moved_, recv.data(), packed, send.data());
    }
    // Elements this rank sends to each ep rank's experts, and receives
    // from each for its own.
    void Counts(int64_t* send, int64_t* recv) const {
      for (int r = 0; r < m_.ep; ++r) {
        send[r] =
            (int64_t{offsets_[b0_ + (r + 1) * El_]} - offsets_[b0_ + r * El_]) *
            C_;
        recv[r] = 0;
        for (int i = 0; i < El_; ++i) recv[r] += received_[r * El_ + i];
        recv[r] *= C_;
      }
    }
    // The received rows between the all-to-all's order and the experts'.
    void Regroup(float* dst, const float* src, bool to_experts) {
      for (int b = 0; b < m_.ep * El_; ++b) {
        const int64_t n = received_[b];
        if (n == 0) continue;
        const int64_t from = to_experts ? by_source_[b] : by_expert_[b];
        const int64_t to = to_experts ? by_expert_[b] : by_source_[b];
        ops_.Copy(dst + to * C_, src + from * C_, n * C_);
      }
    }
    // The local experts' input rows, by expert.
    const float* Input() const {
      return m_.ep > 1 ? p_.Row(kIn) : packed_ + Mine() * C_;
    }
    // The packed rows (by expert) of this rank's own experts (without
    // ep), and of its tp slice's experts, which it sends to their ep ranks.
    int64_t Mine() const { return offsets_[e0_]; }
    int64_t Sent() const { return offsets_[b0_]; }
    // With the tp group in slices, zeroes the packed rows `rows` (M, C)
    // of the other slices' experts: the combine sums the slices' outputs
    // over tp, and the input gradient their parts.
    void OthersZero(float* rows) {
      if (slices_ == 1) return;
      const int64_t lo = Sent(), hi = offsets_[b0_ + m_.ep * El_];
      ops_.Zero(rows, lo * C_);
      ops_.Zero(rows + hi * C_, (M() - hi) * C_);
    }
    int M() const { return offsets_[m_.experts]; }
    int64_t Rows() const { return local_[El_]; }
    int Count(int e) const { return offsets_[e + 1] - offsets_[e]; }
    // fn(local expert, first row, rows) for each local expert with rows.
    template <typename Fn>
    void ForEachExpert(Fn fn) const {
      for (int i = 0; i < El_; ++i) {
        const int n = local_[i + 1] - local_[i];
        if (n > 0) fn(i, int64_t{local_[i]}, n);
      }
    }

    const PartPass& p_;
    kernels::Ops& ops_;
    const GptConfig::Moe& m_;
    const bool swiglu_;
    const int B_, T_, C_;
    const int64_t N_, Hl_, Sl_;
    // The routed experts here (E/ep, over the tp slices too), the first of
    // them, the first of this rank's tp slice, and the slices.
    const int El_, e0_, b0_, slices_;
    // Context parallelism: the ranks a sequence is split over, and its
    // whole length (T_ of it here, in two zigzag chunks).
    const int cp_, Tg_;
    const int64_t R_max_;
    RouteRows route_;
    std::vector<int32_t> offsets_, received_;
    std::vector<int64_t> local_, by_source_, by_expert_;
    int64_t dropped_ = 0;
    float *x_, *partial_, *dout_, *packed_, *dpacked_, *dlogits_, *dweights_;
    float *mine_, *moved_;
    float *act_, *dact_, *dhidden_, *dshared_;
  };

  const bool swiglu_;
};

}  // namespace

std::unique_ptr<SublayerPart> MoeMlpPart(bool swiglu) {
  return std::make_unique<MoeMlp>(swiglu);
}

}  // namespace ptrain
