// One stage of GPT-2 over the tensor-parallel layers; see gpt_stage.h.
#include "worker/engine/model/gpt_stage.h"

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kernels/footprint.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace {

// Multiply-adds per layer below which a Decode runs on one CPU thread.
constexpr int64_t kParallelDecodeMacs = int64_t{1} << 20;

}  // namespace

int GptStage::BlockCount(const std::vector<ParamInfo>& layout) {
  std::set<int> layers;
  for (const ParamInfo& p : layout) {
    if (p.layer >= 0) layers.insert(p.layer);
  }
  return static_cast<int>(layers.size());
}

int GptStage::FirstLayer(const std::vector<ParamInfo>& layout) {
  int first = INT_MAX;
  for (const ParamInfo& p : layout) {
    if (p.layer >= 0) first = std::min(first, p.layer);
  }
  return first == INT_MAX ? 0 : first;
}

GptStage::GptStage(const GptConfig& config, std::vector<ParamInfo> layout,
                   const StageOptions& o)
    : config_(config),
      layout_(std::move(layout)),
      stage_(o.stage),
      n_stages_(o.n_stages),
      n_blocks_(BlockCount(layout_)),
      first_layer_(FirstLayer(layout_)),
      max_B_(o.max_B),
      max_T_(o.max_T),
      tp_(o.tp),
      recompute_(o.recompute),
      split_(o.split_backward),
      cp_(o.cp),
      ep_(o.ep),
      graphs_(o.graphs),
      Cl_(static_cast<int>(config.attention_channels() / o.tp.size())),
      NHl_(config.n_head / o.tp.size()),
      Vl_(config.padded_vocab / o.tp.size()),
      vocab_begin_(o.tp.rank() * (config.padded_vocab / o.tp.size())),
      store_(o.store != nullptr ? o.store : this),
      ops_(o.ops != nullptr ? o.ops : &kernels::CpuOps()),
      blocks_(ModelPartsOf(config), config, layout_, first_layer_, n_blocks_) {
  const int tp = o.tp.size();
  PT_CHECK(config.n_layer >= 1 && config.n_head >= 1 && config.n_embd >= 1 &&
               config.n_embd % config.n_head == 0 && config.vocab_size >= 1 &&
               config.padded_vocab >= config.vocab_size &&
               config.n_head % tp == 0 && config.padded_vocab % tp == 0 &&
               o.n_stages >= 1 && n_blocks_ >= 1 &&
               first_layer_ + n_blocks_ <= config.n_layer && o.stage >= 0 &&
               o.stage < o.n_stages && o.max_T >= 1 &&
               o.max_T <= config.block_size && o.max_B >= 1 && o.slots >= 1 &&
               (!o.tp.sp || o.max_T % tp == 0),
           "inconsistent model config for a stage");
  PT_CHECK(!o.graphs || (tp == 1 && o.cp.size() == 1 && !o.split_backward),
           "recorded passes for a stage that communicates inside them");
  units_ = Units(layout_, o.pad);
  buffer_size_ = units_.empty() ? 0 : units_.back().begin + units_.back().size;
  if (o.store == nullptr) {
    params_ = kernels::Buffer(ops_, buffer_size_);
    grads_ = kernels::Buffer(ops_, buffer_size_);
  }
  FindTensors();

  const kernels::OpsFootprint footprint(*ops_);
  const ActivationDims d = ActivationDims::Of(
      config, max_B_, max_T_, o.slots, tp, tp_.sp, recompute_, n_blocks_,
      last(), &footprint, split_, cp_.size());
  PT_CHECK(cp_.size() == 1 ||
               (max_T_ % 2 == 0 && d.att >= int64_t{max_B_} * NHl_ * max_T_),
           "context parallelism needs an even number of positions per rank "
           "and room for the log-sum-exp");
  act_div_ = d.act_div;
  acts_ =
      kernels::Buffer(ops_, ptrain::ActivationFloats(ModelPartsOf(config), d));
  Working w;
  LayOutActivations(
      ModelPartsOf(config), d,
      [&](int64_t count) {
        float* p = acts_.data() + acts_used_;
        acts_used_ += count;
        return p;
      },
      &slots_, &w, &rows_);
  PT_CHECK(acts_used_ == acts_.size(),
           "the activation slabs do not add up to ActivationFloats");
  // A device reads its copy of the tokens; so does a recorded pass (the
  // replay reads the buffers the recording read).
  if (ops_->device() != kernels::Device::kCpu || graphs_) {
    const int64_t BT = static_cast<int64_t>(max_B_) * max_T_;
    for (Slot& slot : slots_) {
      slot.tokens_staged = ops_->AllocTokens(BT);
      slot.targets_staged = ops_->AllocTokens(BT);
    }
  }
  work_.scratch = LayerContext{w.scratch_a, w.scratch_b, ops_};
  work_.proj = w.proj;
  work_.dresidual = w.dresidual;
  work_.dln = w.dln;
  work_.hidden_a = w.dqkv;
  work_.hidden_b = w.dfch_gelu;
  work_.datt = w.datt;
  work_.max_BT = d.BT;
  ce_stats_ = w.ce_stats;
  attention_ =
      AttentionCore(ops_, cp_, Cl_, NHl_, config.kv_heads_local(o.tp.size()),
                    act_div_, {/*ring=*/w.ring, /*widen=*/w.dfch_gelu});
  work_.attention = &attention_;
}

void GptStage::FindTensors() {
  std::map<std::string, const ParamInfo*> by_name;
  for (const ParamInfo& p : layout_) by_name[p.name] = &p;
  auto find = [&](const std::string& name) -> const ParamInfo& {
    auto it = by_name.find(name);
    PT_CHECK(it != by_name.end(), ("the layout has no " + name).c_str());
    return *it->second;
  };
  if (first()) {
    emb_unit_ = find("wte").unit;
    const ModelParts& parts = ModelPartsOf(config_);
    for (const auto& part : parts.before) {
      embed_places_.push_back(PlacesOf(*part, config_, layout_, ""));
    }
  }
  if (last()) {
    final_unit_ = find("ln_f.weight").unit;
    final_places_ =
        PlacesOf(*ModelPartsOf(config_).final_norm, config_, layout_, "");
    // A head of its own: its table, in the final unit. Tied: the table
    // it reads, wte itself on a stage that also embeds, else the copy the
    // plan puts in the final unit.
    const HeadPart& head = *ModelPartsOf(config_).head;
    head_places_ = PlacesOf(head, config_, layout_, "");
    for (const ParamInfo& p : layout_) {
      if (p.tied) head_places_ = {PartPass::Place{p.unit, p.unit_offset}};
    }
    PT_CHECK(head_places_.size() == 1, "the last stage's layout has no head");
    head_unit_ = head_places_[0].unit;
  }
}

GptStage::~GptStage() {
  for (Slot& slot : slots_) {
    if (slot.tokens_staged != nullptr) ops_->FreeTokens(slot.tokens_staged);
    if (slot.targets_staged != nullptr) ops_->FreeTokens(slot.targets_staged);
  }
}

const int32_t* GptStage::Stage(int32_t* staged, const int32_t* host, int B,
                               int T) {
  // Already there: a recorded pass's tokens, staged before it.
  if (host == nullptr || host == staged) return host;
  return ops_->StageTokens(staged, host, static_cast<int64_t>(B) * T);
}

int64_t GptStage::ActivationFloats(const GptConfig& config, int max_B,
                                   int max_T, int slots, int tp, bool sp,
                                   Recompute recompute, int layers, bool last,
                                   const kernels::Ops* ops, bool split_backward,
                                   int cp) {
  std::optional<kernels::OpsFootprint> footprint;
  if (ops != nullptr) footprint.emplace(*ops);
  return ptrain::ActivationFloats(
      ModelPartsOf(config),
      ActivationDims::Of(config, max_B, max_T, slots, tp, sp, recompute, layers,
                         last, footprint.has_value() ? &*footprint : nullptr,
                         split_backward, cp));
}

void GptStage::InitParams(uint64_t seed) {
  PT_CHECK(!params_.empty(), "the stage's weights live in a store");
  // Computed on the host, then copied where the backend keeps them.
  std::vector<float> host;
  for (const ParamInfo& p : layout_) {
    host.resize(p.numel);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < p.numel; ++i) {
      const std::optional<int64_t> g = GlobalIndex(p, i);
      host[i] = g.has_value() ? InitialValue(p, seed, *g) : 0.0f;
    }
    ops_->FromHost(params_.data() + p.offset, host.data(), p.numel);
  }
}

void GptStage::ZeroGrad() { ops_->Zero(grads_.data(), grads_.size()); }

const float* GptStage::output(int slot) const {
  return BlockOutput(slots_[slot], n_blocks_ - 1);
}

float* GptStage::BlockOutput(const Slot& S, int b) const {
  return S.residual3 + static_cast<int64_t>(b) * max_B_ * tp_.SeqLocal(max_T_) *
                           config_.n_embd;
}

float GptStage::Forward(int slot, const int32_t* tokens, const float* hidden,
                        const int32_t* targets, int B, int T, float dloss) {
  PT_CHECK(B >= 1 && B <= max_B_ && T >= 1 && T <= max_T_ &&
               (!tp_.sp || T % tp_.size() == 0) && slot >= 0 &&
               slot < static_cast<int>(slots_.size()),
           "a microbatch larger than allocated (or T not divisible by tp "
           "under sequence parallelism)");
  Slot& S = slots_[slot];
  // Recorded: a forward with targets, or any forward of a stage before the
  // last (its output goes on; a last stage's without targets leaves logits
  // to sample from, op by op).
  if (graphs_ && (targets != nullptr || !last())) {
    // The tokens go into the slot's buffers first, which the recording
    // reads (a previous stage's output is read where it was received, one
    // recording per receive buffer), and the slot is told what its host
    // code would tell it (a replay runs none).
    const int32_t* tk = Stage(S.tokens_staged, tokens, B, T);
    const int32_t* tg = Stage(S.targets_staged, targets, B, T);
    BeginSlot(S, B, T, targets != nullptr, dloss);
    RunRecorded({slot, B, T, /*backward=*/false, dloss, S.dloss, hidden},
                [&] { ForwardPass(slot, tk, hidden, tg, B, T, -1, dloss); });
    return last() ? SlotLoss(S) : 0.0f;
  }
  ForwardPass(slot, tokens, hidden, targets, B, T, /*pos=*/-1, dloss);
  return last() && targets != nullptr ? SlotLoss(S) : 0.0f;
}

float GptStage::SlotLoss(const Slot& S) const {
  const int64_t BT = static_cast<int64_t>(S.B) * S.T;
  return static_cast<float>(ops_->Sum(S.losses, BT) / static_cast<double>(BT));
}

void GptStage::BeginSlot(Slot& S, int B, int T, bool targets,
                         float dloss) const {
  S.B = B;
  S.T = T;
  S.dloss = last() && targets ? dloss : 0.0f;
}

void GptStage::Decode(const int32_t* tokens, const float* hidden, int n,
                      int pos) {
  PT_CHECK(n >= 1 && n <= decode_max() && pos >= 0 && pos + n <= CacheT(),
           "a generation step past the stage's buffers or its cache");
  if (kv_.empty()) {
    kv_ = kernels::Buffer(ops_, 2 * n_blocks_ * CacheT() * attention_.Kl());
  }
  // A step of a few positions of a small model is less work per kernel
  // than waking the CPU's thread team costs: it runs on this thread alone
  // (config S, one position: 0.22 ms on one thread, 0.28 ms on two).
  const int64_t macs_per_layer = int64_t{n} * 12 * config_.n_embd * Cl_;
  const int threads = omp_get_max_threads();
  const bool serial = ops_->device() == kernels::Device::kCpu && threads > 1 &&
                      macs_per_layer < kParallelDecodeMacs;
  if (serial) omp_set_num_threads(1);
  ForwardPass(0, tokens, hidden, nullptr, 1, n, pos, /*dloss=*/0.0f);
  if (serial) omp_set_num_threads(threads);
}

float* GptStage::RowAt(const Slot& S, int i, int b) const {
  const StageRows::Row& r = rows_.rows[i];
  if (r.floats == 0) return nullptr;
  if (r.in_place_of == StageRows::kStream) return StreamAt(S, r.part / 2, b);
  if (r.in_place_of >= 0) return RowAt(S, r.in_place_of, b);
  // Per-layer slabs are laid out for the allocated maximum, so index them by
  // the maximum stride; a smaller batch uses the front of each slab.
  return S.rows[i] + (r.one_layer ? 0 : b) * r.floats;
}

float* GptStage::StreamAt(const Slot& S, int pair, int b) const {
  if (pair == static_cast<int>(S.stream.size())) return BlockOutput(S, b);
  const int64_t l = recompute_ == Recompute::kFull ? 0 : b;
  return S.stream[pair] + l * max_B_ * tp_.SeqLocal(max_T_) * config_.n_embd;
}

BlockStack::Rows GptStage::Acts(const Slot& S, int b) const {
  BlockStack::Rows r;
  const int parts = static_cast<int>(rows_.first.size());
  for (int q = 0; q < parts; ++q) {
    for (int i = rows_.first[q]; i < rows_.end(q); ++i) {
      r.part[q][i - rows_.first[q]] = RowAt(S, i, b);
    }
  }
  r.x[0] = b == 0 ? S.input : BlockOutput(S, b - 1);
  for (int p = 0; p < parts / 2; ++p) r.x[p + 1] = StreamAt(S, p, b);
  return r;
}

PartPass::Shared GptStage::Pass(int B, int T, const TpGroup& g) const {
  PartPass::Shared s;
  s.store = store_;
  s.ops = ops_;
  s.config = &config_;
  s.tp = g;
  s.cp = cp_;
  s.ep = ep_;
  s.work = &work_;
  s.act_div = act_div_;
  s.B = B;
  s.T = T;
  s.C = config_.n_embd;
  s.Cl = Cl_;
  s.NHl = NHl_;
  s.selective = recompute_ == Recompute::kSelective;
  return s;
}

void GptStage::ForwardPass(int slot, const int32_t* tokens, const float* hidden,
                           const int32_t* targets, int B, int T, int pos,
                           float dloss) {
  // Generation runs every position on every rank of the group: a step of
  // one token cannot be split along the sequence.
  const bool decode = pos >= 0;
  const TpGroup g{tp_.comm, tp_.sp && !decode};
  Slot& S = slots_[slot];
  BeginSlot(S, B, T, targets != nullptr, dloss);
  kernels::Ops& k = *ops_;
  tokens = Stage(S.tokens_staged, tokens, B, T);
  targets = Stage(S.targets_staged, targets, B, T);
  const int C = config_.n_embd, Ts = g.SeqLocal(T);
  const int64_t BTsC = static_cast<int64_t>(B) * Ts * C;

  UnitStore& st = *store_;
  PartPass::Shared pass = Pass(B, T, g);
  if (decode) pass.cp = CpGroup{};
  if (first()) {
    st.BeginForward(emb_unit_);
    const auto& embeddings = ModelPartsOf(config_).embeddings;
    for (size_t i = 0; i < embeddings.size(); ++i) {
      embeddings[i]->Forward(
          PartPass(pass, embed_places_[i].data(), nullptr, nullptr, false),
          S.input, tokens, decode ? pos : 0);
    }
  } else {
    k.Copy(S.input, hidden, BTsC);
  }
  if (decode) {
    pass.pos = pos;
    pass.cache_T = CacheT();
  }
  for (int b = 0; b < n_blocks_; ++b) {
    if (decode) pass.cache = kv_.data() + 2 * b * CacheT() * attention_.Kl();
    blocks_.Forward(pass, Acts(S, b), b, /*recomputing=*/false);
  }
  const float* x = BlockOutput(S, n_blocks_ - 1);
  if (!last()) {
    if (first()) st.EndForward(emb_unit_);
    return;
  }
  st.BeginForward(final_unit_);
  const ModelParts& parts = ModelPartsOf(config_);
  float* const* final_rows = S.final_rows.data();
  parts.final_norm->Forward(
      PartPass(pass, final_places_.data(), final_rows, nullptr, false), x,
      nullptr, nullptr);
  if (head_unit_ != final_unit_) st.EndForward(final_unit_);
  // Logits over this rank's vocabulary rows, never gathered for the loss.
  parts.head->Forward(
      PartPass(pass, head_places_.data(), nullptr, nullptr, false),
      Stored(S.final_rows[0]), Logits(S));
  st.EndForward(head_unit_);
  if (targets == nullptr) return;
  if (dloss != 0.0f) {
    vocab_crossentropy_forward_backward(
        S.losses, Logits(S), targets, dloss, B, T, vocab_begin_, Vl_,
        config_.vocab_size, g, ce_stats_, work_.scratch);
  } else {
    vocab_crossentropy_forward(S.losses, S.logits, S.logits, targets, B, T,
                               vocab_begin_, Vl_, config_.vocab_size, g,
                               ce_stats_, work_.scratch);
  }
}

void GptStage::HeadBackward(const Slot& S, const int32_t* targets, float dloss,
                            const PartPass::Shared& pass) {
  const int B = S.B, T = S.T;
  const int C = config_.n_embd, Ts = tp_.SeqLocal(T);
  UnitStore& st = *store_;
  st.BeginBackward(final_unit_);
  // The gradient of the logits replaces the probabilities in place, unless
  // the forward's fused classifier left it there already.
  const kernels::Act dlogits = Logits(S);
  if (S.dloss == 0.0f) {
    vocab_crossentropy_backward(S.logits, S.logits, targets, dloss, B, T,
                                vocab_begin_, Vl_, work_.scratch);
  } else {
    PT_CHECK(S.dloss == dloss,
             "a backward's dloss differs from its fused forward's");
  }
  // Split: the head's weight gradient waits for W, which reads dlogits
  // where they are.
  const ModelParts& parts = ModelPartsOf(config_);
  parts.head->Backward(
      PartPass(pass, head_places_.data(), nullptr, nullptr, false), work_.dln,
      dlogits, Stored(S.final_rows[0]));
  ops_->Zero(work_.dresidual, static_cast<int64_t>(B) * Ts * C);
  parts.final_norm->Backward(
      PartPass(pass, final_places_.data(), S.final_rows.data(), nullptr, false),
      work_.dresidual, work_.dln, BlockOutput(S, n_blocks_ - 1));
  if (!pass.split) st.EndBackward(final_unit_);
}

void GptStage::Backward(int slot, const int32_t* tokens, const int32_t* targets,
                        float dloss, const float* dout) {
  if (graphs_) {
    const Slot& S = slots_[slot];
    const int32_t* tk = Stage(S.tokens_staged, tokens, S.B, S.T);
    const int32_t* tg = Stage(S.targets_staged, targets, S.B, S.T);
    RunRecorded({slot, S.B, S.T, /*backward=*/true, dloss, S.dloss, dout},
                [&] { BackwardPass(slot, tk, tg, dloss, dout, false); });
    return;
  }
  BackwardPass(slot, tokens, targets, dloss, dout, /*split=*/false);
}

void GptStage::BackwardInput(int slot, const int32_t* tokens,
                             const int32_t* targets, float dloss,
                             const float* dout) {
  PT_CHECK(split_, "BackwardInput on a stage without split_backward");
  BackwardPass(slot, tokens, targets, dloss, dout, /*split=*/true);
}

void GptStage::BackwardPass(int slot, const int32_t* tokens,
                            const int32_t* targets, float dloss,
                            const float* dout, bool split) {
  const Slot& S = slots_[slot];
  const int B = S.B, T = S.T;
  tokens = Stage(S.tokens_staged, tokens, B, T);
  targets = Stage(S.targets_staged, targets, B, T);
  const int C = config_.n_embd;
  UnitStore& st = *store_;
  if (first()) st.BeginBackward(emb_unit_);
  PartPass::Shared pass = Pass(B, T, tp_);
  pass.split = split;
  pass.dloss = dloss;
  if (last()) {
    HeadBackward(S, targets, dloss, pass);
  } else {
    ops_->Copy(work_.dresidual, dout,
               static_cast<int64_t>(B) * tp_.SeqLocal(T) * C);
  }
  // work_.dresidual carries the gradient of the residual stream downwards; each
  // residual add passes it through unchanged, so branches accumulate into
  // it. Units finish in descending order, each as soon as its weights'
  // gradients are complete.
  for (int b = n_blocks_ - 1; b >= 0; --b) {
    blocks_.Backward(pass, Acts(S, b), b, recompute_ == Recompute::kFull);
  }
  if (first()) {
    const auto& embeddings = ModelPartsOf(config_).embeddings;
    for (size_t i = embeddings.size(); i-- > 0;) {
      embeddings[i]->Backward(
          PartPass(pass, embed_places_[i].data(), nullptr, nullptr, false),
          work_.dresidual, tokens);
    }
    if (!split) st.EndBackward(emb_unit_);
  }
}

void GptStage::BackwardWeights(int slot) {
  PT_CHECK(split_, "BackwardWeights on a stage without split_backward");
  const Slot& S = slots_[slot];
  const int B = S.B, T = S.T;
  UnitStore& st = *store_;
  // The same weight-gradient products as Backward's, from what B kept and
  // the forward's inputs (full recomputation: computed once more); no
  // weights are read but by that forward.
  const PartPass::Shared pass = Pass(B, T, tp_);
  if (last()) {
    ModelPartsOf(config_).head->BackwardWeights(
        PartPass(pass, head_places_.data(), nullptr, nullptr, false), Logits(S),
        Stored(S.final_rows[0]));
    st.EndBackward(final_unit_);
  }
  for (int b = n_blocks_ - 1; b >= 0; --b) {
    blocks_.BackwardWeights(pass, Acts(S, b), b,
                            recompute_ == Recompute::kFull);
  }
  if (first()) st.EndBackward(emb_unit_);
}

MemoryBytes GptStage::memory() const {
  MemoryBytes m;
  m.params = params_.size() * static_cast<int64_t>(sizeof(float));
  m.grads = grads_.size() * static_cast<int64_t>(sizeof(float));
  m.activations = acts_.size() * static_cast<int64_t>(sizeof(float));
  return m;
}

}  // namespace ptrain
