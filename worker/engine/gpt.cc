// GPT-2 forward and backward on one rank, over kernels/cpu.
#include "worker/engine/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/kernels.h"
#include "worker/engine/rng.h"

namespace ptrain {

namespace k = kernels;

std::vector<ParamInfo> GptParamLayout(const GptConfig& cfg, int pad) {
  const int64_t C = cfg.n_embd, L = cfg.n_layer, V = cfg.vocab_size;
  const double std = 0.02;
  // GPT-2 scales the residual projections by 1/sqrt(2L): two per block.
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));
  std::vector<ParamInfo> out;
  int64_t offset = 0, unit_begin = 0;
  int unit = 0;
  auto close_unit = [&] {
    const int64_t size = offset - unit_begin;
    offset = unit_begin + (size + pad - 1) / pad * pad;
    unit_begin = offset;
    ++unit;
  };
  auto add = [&](std::string name, std::vector<int64_t> shape, int layer,
                 ParamInfo::Init init, double init_std) {
    ParamInfo p;
    p.name = std::move(name);
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.shape = std::move(shape);
    p.offset = offset;
    p.layer = layer;
    p.unit = unit;
    p.unit_offset = offset - unit_begin;
    p.decay = p.shape.size() == 2;
    p.init = init;
    p.init_std = init_std;
    offset += p.numel;
    out.push_back(std::move(p));
  };
  using I = ParamInfo::Init;
  add("wte", {V, C}, -1, I::kNormal, std);
  add("wpe", {cfg.block_size, C}, -1, I::kNormal, std);
  close_unit();
  for (int l = 0; l < L; ++l) {
    const std::string h = absl::StrCat("h.", l, ".");
    add(h + "ln_1.weight", {C}, l, I::kOnes, 0);
    add(h + "ln_1.bias", {C}, l, I::kZeros, 0);
    add(h + "attn.c_attn.weight", {3 * C, C}, l, I::kNormal, std);
    add(h + "attn.c_attn.bias", {3 * C}, l, I::kZeros, 0);
    close_unit();
    add(h + "attn.c_proj.weight", {C, C}, l, I::kNormal, proj_std);
    add(h + "attn.c_proj.bias", {C}, l, I::kZeros, 0);
    close_unit();
    add(h + "ln_2.weight", {C}, l, I::kOnes, 0);
    add(h + "ln_2.bias", {C}, l, I::kZeros, 0);
    add(h + "mlp.c_fc.weight", {4 * C, C}, l, I::kNormal, std);
    add(h + "mlp.c_fc.bias", {4 * C}, l, I::kZeros, 0);
    close_unit();
    add(h + "mlp.c_proj.weight", {C, 4 * C}, l, I::kNormal, proj_std);
    add(h + "mlp.c_proj.bias", {C}, l, I::kZeros, 0);
    close_unit();
  }
  add("ln_f.weight", {C}, -1, I::kOnes, 0);
  add("ln_f.bias", {C}, -1, I::kZeros, 0);
  close_unit();
  return out;
}

std::vector<UnitRange> GptUnits(const std::vector<ParamInfo>& layout, int pad) {
  std::vector<UnitRange> units(layout.back().unit + 1);
  for (const ParamInfo& p : layout) {
    UnitRange& u = units[p.unit];
    if (p.unit_offset == 0) u.begin = p.offset;
    u.size = std::max(u.size, p.unit_offset + p.numel);
  }
  for (UnitRange& u : units) u.size = (u.size + pad - 1) / pad * pad;
  return units;
}

int64_t GptNumParams(const GptConfig& config) {
  int64_t n = 0;
  for (const ParamInfo& p : GptParamLayout(config)) n += p.numel;
  return n;
}

float InitialValue(const ParamInfo& info, uint64_t seed, int64_t index) {
  switch (info.init) {
    case ParamInfo::Init::kZeros:
      return 0.0f;
    case ParamInfo::Init::kOnes:
      return 1.0f;
    case ParamInfo::Init::kNormal:
      break;
  }
  return static_cast<float>(
      info.init_std *
      CounterNormal(seed, StableHash(info.name), static_cast<uint64_t>(index)));
}

double GptFlopsPerToken(const GptConfig& cfg, int T) {
  const double N = static_cast<double>(GptNumParams(cfg)) -
                   static_cast<double>(cfg.block_size) * cfg.n_embd;
  return 6.0 * N + 12.0 * cfg.n_layer * cfg.n_embd * static_cast<double>(T);
}

Gpt::Gpt(const GptConfig& config, int max_B, int max_T, UnitStore* store,
         int pad)
    : config_(config),
      max_B_(max_B),
      max_T_(max_T),
      store_(store != nullptr ? store : this) {
  if (config.n_layer < 1 || config.n_head < 1 || config.n_embd < 1 ||
      config.n_embd % config.n_head != 0 || config.vocab_size < 1 ||
      max_T < 1 || max_T > config.block_size || max_B < 1) {
    throw std::invalid_argument("Gpt: inconsistent model config");
  }
  layout_ = GptParamLayout(config, pad);
  units_ = GptUnits(layout_, pad);
  num_params_ = GptNumParams(config);
  buffer_size_ = units_.back().begin + units_.back().size;
  if (store == nullptr) {
    params_.assign(buffer_size_, 0.0f);
    grads_.assign(buffer_size_, 0.0f);
  }

  const int64_t BT = static_cast<int64_t>(max_B) * max_T;
  const int64_t C = config.n_embd, L = config.n_layer, V = config.vocab_size;
  const int64_t NH = config.n_head;
  const int64_t att = static_cast<int64_t>(max_B) * NH * max_T * max_T;
  // Saved activations: 16C + 4 floats per token per layer, plus attention.
  const int64_t total = BT * C + L * BT * (16 * C + 4) + L * att +
                        BT * (C + 2) + BT * V + BT +
                        // backward working set of one layer
                        BT * C * 7 + BT * 8 * C + att + BT * V;
  acts_.assign(total, 0.0f);
  encoded_ = Slice(acts_, BT * C);
  ln1_ = Slice(acts_, L * BT * C);
  ln1_mean_ = Slice(acts_, L * BT);
  ln1_rstd_ = Slice(acts_, L * BT);
  qkv_ = Slice(acts_, L * BT * 3 * C);
  atty_ = Slice(acts_, L * BT * C);
  att_ = Slice(acts_, L * att);
  residual2_ = Slice(acts_, L * BT * C);
  ln2_ = Slice(acts_, L * BT * C);
  ln2_mean_ = Slice(acts_, L * BT);
  ln2_rstd_ = Slice(acts_, L * BT);
  fch_ = Slice(acts_, L * BT * 4 * C);
  fch_gelu_ = Slice(acts_, L * BT * 4 * C);
  residual3_ = Slice(acts_, L * BT * C);
  lnf_ = Slice(acts_, BT * C);
  lnf_mean_ = Slice(acts_, BT);
  lnf_rstd_ = Slice(acts_, BT);
  logits_ = Slice(acts_, BT * V);
  losses_ = Slice(acts_, BT);
  scratch_ = Slice(acts_, BT * C);
  dresidual_ = Slice(acts_, BT * C);
  dln_ = Slice(acts_, BT * C);
  dqkv_ = Slice(acts_, BT * 3 * C);
  datty_ = Slice(acts_, BT * C);
  datt_ = Slice(acts_, att);
  dfch_ = Slice(acts_, BT * 4 * C);
  dfch_gelu_ = Slice(acts_, BT * 4 * C);
  dlogits_ = Slice(acts_, BT * V);
  if (acts_used_ != total) throw std::logic_error("Gpt: activation layout");
}

float* Gpt::Slice(std::vector<float>& buf, int64_t count) {
  float* p = buf.data() + acts_used_;
  acts_used_ += count;
  return p;
}

const float* Gpt::Tensor(const float* unit_base, int l, int i) const {
  return unit_base + layout_[2 + 12 * l + i].unit_offset;
}

void Gpt::InitParams(uint64_t seed) {
  if (params_.empty()) throw std::logic_error("Gpt: weights live in a store");
  for (const auto& p : layout_) {
    float* dst = params_.data() + p.offset;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < p.numel; ++i) dst[i] = InitialValue(p, seed, i);
  }
}

void Gpt::ZeroGrad() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

float Gpt::Forward(const int32_t* inputs, const int32_t* targets, int B,
                   int T) {
  if (B < 1 || B > max_B_ || T < 1 || T > max_T_) {
    throw std::invalid_argument("Gpt::Forward: batch larger than allocated");
  }
  B_ = B;
  T_ = T;
  const int C = config_.n_embd, NH = config_.n_head, V = config_.vocab_size;
  const int L = config_.n_layer;
  const int64_t BTC = static_cast<int64_t>(B) * T * C;
  const int64_t BT = static_cast<int64_t>(B) * T;
  // Per-layer slabs are laid out for the allocated maximum, so index them by
  // the maximum stride; a smaller batch uses the front of each slab.
  const int64_t sBTC = static_cast<int64_t>(max_B_) * max_T_ * C;
  const int64_t sBT = static_cast<int64_t>(max_B_) * max_T_;
  const int64_t sAtt = static_cast<int64_t>(max_B_) * NH * max_T_ * max_T_;

  UnitStore& st = *store_;
  st.BeginForward(0);
  const float* wte = st.Params(0);
  const float* wpe = st.Params(0) + layout_[1].unit_offset;
  k::encoder_forward(encoded_, inputs, wte, wpe, B, T, C);
  for (int l = 0; l < L; ++l) {
    const int u = BlockUnit(l);  // u..u+3: [ln_1 c_attn] [c_proj] [ln_2 c_fc]
                                 // [mlp.c_proj]
    const float* residual = l == 0 ? encoded_ : residual3_ + (l - 1) * sBTC;
    float* ln1 = ln1_ + l * sBTC;
    float* qkv = qkv_ + l * 3 * sBTC;
    float* atty = atty_ + l * sBTC;
    float* att = att_ + l * sAtt;
    float* residual2 = residual2_ + l * sBTC;
    float* ln2 = ln2_ + l * sBTC;
    float* fch = fch_ + l * 4 * sBTC;
    float* fch_gelu = fch_gelu_ + l * 4 * sBTC;
    float* residual3 = residual3_ + l * sBTC;
    st.BeginForward(u);
    const float* w = st.Params(u);
    k::layernorm_forward(ln1, ln1_mean_ + l * sBT, ln1_rstd_ + l * sBT,
                         residual, Tensor(w, l, kLn1W), Tensor(w, l, kLn1B), B,
                         T, C);
    k::matmul_forward(qkv, ln1, Tensor(w, l, kQkvW), Tensor(w, l, kQkvB), B, T,
                      C, 3 * C);
    st.EndForward(u);
    k::attention_forward(atty, att, qkv, B, T, C, NH);
    st.BeginForward(u + 1);
    w = st.Params(u + 1);
    k::matmul_forward(scratch_, atty, Tensor(w, l, kAttProjW),
                      Tensor(w, l, kAttProjB), B, T, C, C);
    st.EndForward(u + 1);
    k::residual_forward(residual2, residual, scratch_, BTC);
    st.BeginForward(u + 2);
    w = st.Params(u + 2);
    k::layernorm_forward(ln2, ln2_mean_ + l * sBT, ln2_rstd_ + l * sBT,
                         residual2, Tensor(w, l, kLn2W), Tensor(w, l, kLn2B), B,
                         T, C);
    k::matmul_forward(fch, ln2, Tensor(w, l, kFcW), Tensor(w, l, kFcB), B, T, C,
                      4 * C);
    st.EndForward(u + 2);
    k::gelu_forward(fch_gelu, fch, 4 * BTC);
    st.BeginForward(u + 3);
    w = st.Params(u + 3);
    k::matmul_forward(scratch_, fch_gelu, Tensor(w, l, kFcProjW),
                      Tensor(w, l, kFcProjB), B, T, 4 * C, C);
    st.EndForward(u + 3);
    k::residual_forward(residual3, residual2, scratch_, BTC);
  }
  const int uf = FinalUnit();
  st.BeginForward(uf);
  const float* lnfw = st.Params(uf);
  const float* lnfb = lnfw + C;
  k::layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, residual3_ + (L - 1) * sBTC,
                       lnfw, lnfb, B, T, C);
  st.EndForward(uf);
  k::matmul_forward(logits_, lnf_, wte, static_cast<const float*>(nullptr), B,
                    T, C, V);
  st.EndForward(0);
  if (targets == nullptr) return 0.0f;
  k::crossentropy_softmax_forward(losses_, logits_, logits_, targets, B, T, V);
  double sum = 0.0;
  for (int64_t i = 0; i < BT; ++i) sum += losses_[i];
  return static_cast<float>(sum / static_cast<double>(BT));
}

void Gpt::Backward(const int32_t* inputs, const int32_t* targets, float dloss) {
  const int B = B_, T = T_;
  const int C = config_.n_embd, NH = config_.n_head, V = config_.vocab_size;
  const int L = config_.n_layer;
  const int64_t BTC = static_cast<int64_t>(B) * T * C;
  const int64_t sBTC = static_cast<int64_t>(max_B_) * max_T_ * C;
  const int64_t sBT = static_cast<int64_t>(max_B_) * max_T_;
  const int64_t sAtt = static_cast<int64_t>(max_B_) * NH * max_T_ * max_T_;
  auto zero = [](float* p, int64_t n) { std::memset(p, 0, n * sizeof(float)); };

  UnitStore& st = *store_;
  const int uf = FinalUnit();
  st.BeginBackward(0);
  st.BeginBackward(uf);
  zero(dlogits_, static_cast<int64_t>(B) * T * V);
  k::crossentropy_softmax_backward(dlogits_, logits_, targets, dloss, B, T, V);
  zero(dln_, BTC);
  k::matmul_backward(dln_, st.Grads(0), static_cast<float*>(nullptr), dlogits_,
                     lnf_, st.Params(0), B, T, C, V);
  zero(dresidual_, BTC);
  k::layernorm_backward(dresidual_, st.Grads(uf), st.Grads(uf) + C, dln_,
                        residual3_ + (L - 1) * sBTC, st.Params(uf), lnf_mean_,
                        lnf_rstd_, B, T, C);
  st.EndBackward(uf);
  // dresidual_ carries the gradient of the residual stream downwards; each
  // residual add passes it through unchanged, so branches accumulate into it.
  // Units finish in descending order, each as soon as its weights' gradients
  // are complete.
  for (int l = L - 1; l >= 0; --l) {
    const int u = BlockUnit(l);
    const float* residual = l == 0 ? encoded_ : residual3_ + (l - 1) * sBTC;
    const float* ln1 = ln1_ + l * sBTC;
    const float* qkv = qkv_ + l * 3 * sBTC;
    const float* atty = atty_ + l * sBTC;
    const float* att = att_ + l * sAtt;
    const float* residual2 = residual2_ + l * sBTC;
    const float* ln2 = ln2_ + l * sBTC;
    const float* fch = fch_ + l * 4 * sBTC;
    const float* fch_gelu = fch_gelu_ + l * 4 * sBTC;
    auto dT = [&](int unit, int i) {
      return const_cast<float*>(Tensor(st.Grads(unit), l, i));
    };

    st.BeginBackward(u + 3);
    zero(dfch_gelu_, 4 * BTC);
    k::matmul_backward(dfch_gelu_, dT(u + 3, kFcProjW), dT(u + 3, kFcProjB),
                       dresidual_, fch_gelu,
                       Tensor(st.Params(u + 3), l, kFcProjW), B, T, 4 * C, C);
    st.EndBackward(u + 3);
    zero(dfch_, 4 * BTC);
    k::gelu_backward(dfch_, fch, dfch_gelu_, 4 * BTC);
    st.BeginBackward(u + 2);
    const float* w = st.Params(u + 2);
    zero(dln_, BTC);
    k::matmul_backward(dln_, dT(u + 2, kFcW), dT(u + 2, kFcB), dfch_, ln2,
                       Tensor(w, l, kFcW), B, T, C, 4 * C);
    st.Poll();
    k::layernorm_backward(dresidual_, dT(u + 2, kLn2W), dT(u + 2, kLn2B), dln_,
                          residual2, Tensor(w, l, kLn2W), ln2_mean_ + l * sBT,
                          ln2_rstd_ + l * sBT, B, T, C);
    st.EndBackward(u + 2);
    st.BeginBackward(u + 1);
    zero(datty_, BTC);
    k::matmul_backward(datty_, dT(u + 1, kAttProjW), dT(u + 1, kAttProjB),
                       dresidual_, atty, Tensor(st.Params(u + 1), l, kAttProjW),
                       B, T, C, C);
    st.EndBackward(u + 1);
    zero(dqkv_, 3 * BTC);
    k::attention_backward(dqkv_, datt_, datty_, qkv, att, B, T, C, NH);
    st.Poll();
    st.BeginBackward(u);
    w = st.Params(u);
    zero(dln_, BTC);
    k::matmul_backward(dln_, dT(u, kQkvW), dT(u, kQkvB), dqkv_, ln1,
                       Tensor(w, l, kQkvW), B, T, C, 3 * C);
    st.Poll();
    k::layernorm_backward(dresidual_, dT(u, kLn1W), dT(u, kLn1B), dln_,
                          residual, Tensor(w, l, kLn1W), ln1_mean_ + l * sBT,
                          ln1_rstd_ + l * sBT, B, T, C);
    st.EndBackward(u);
  }
  k::encoder_backward(st.Grads(0), st.Grads(0) + layout_[1].unit_offset,
                      dresidual_, inputs, B, T, C);
  st.EndBackward(0);
}

MemoryBytes Gpt::memory() const {
  MemoryBytes m;
  m.params = static_cast<int64_t>(params_.size() * sizeof(float));
  m.grads = static_cast<int64_t>(grads_.size() * sizeof(float));
  m.activations = static_cast<int64_t>(acts_.size() * sizeof(float));
  return m;
}

}  // namespace ptrain
