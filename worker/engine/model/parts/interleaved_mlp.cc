// The MLP of a model whose MoE MLPs are in only some blocks
// (model.moe.every): the MoE part in the blocks config.moe.HasExperts
// names, the arch's dense MLP in the others, each with its own tensors
// (mlp.router, mlp.experts.* there; mlp.c_fc, ... here).
//
// Rows: every block's slab is laid out alike, so each row is the larger of
// the two parts' rows of its index: the MoE part's rows (the dense part's
// first ones in their places), then the dense part's rows past the MoE
// part's count, then the dense part's split rows (the MoE part keeps none
// for W). With every = 1 the rows are the MoE part's alone.
#include <algorithm>
#include <array>
#include <memory>
#include <utility>
#include <vector>

#include "common/check.h"
#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

class InterleavedMlp : public SublayerPart {
 public:
  InterleavedMlp(std::unique_ptr<SublayerPart> dense,
                 std::unique_ptr<SublayerPart> moe)
      : dense_(std::move(dense)), moe_(std::move(moe)) {}

  std::vector<PartTensor> Tensors(const GptConfig& c) const override {
    std::vector<PartTensor> out = moe_->Tensors(c);
    if (c.moe.every > 1) {
      for (PartTensor& t : dense_->Tensors(c)) out.push_back(std::move(t));
    }
    return out;
  }
  std::vector<PartTensor> TensorsAt(const GptConfig& c,
                                    int layer) const override {
    return Of(c.moe, layer).Tensors(c);
  }

  std::vector<ActivationRow> Rows(const StageActivationDims& d) const override {
    std::vector<ActivationRow> rows = moe_->Rows(d);
    if (d.moe.every <= 1) return rows;
    const std::vector<ActivationRow> dense = dense_->Rows(d);
    for (size_t i = 0; i < dense.size(); ++i) {
      if (i >= rows.size()) {
        rows.push_back(dense[i]);
        continue;
      }
      rows[i].floats = std::max(rows[i].floats, dense[i].floats);
      // Recomputed (one layer deep) only where both parts recompute it.
      rows[i].selective = rows[i].selective && dense[i].selective;
    }
    return rows;
  }
  std::vector<SplitRow> SplitRows(const StageActivationDims& d) const override {
    PT_CHECK(moe_->SplitRows(d).empty(), "an MoE part with rows for W");
    return d.moe.every > 1 ? dense_->SplitRows(d) : std::vector<SplitRow>{};
  }
  int64_t HiddenFloats(const StageActivationDims& d) const override {
    const int64_t moe = moe_->HiddenFloats(d);
    return d.moe.every > 1 ? std::max(moe, dense_->HiddenFloats(d)) : moe;
  }
  // The mean of a block's: the stack's sum over n_layer blocks is theirs.
  double FlopsPerToken(const GptConfig& c, int T) const override {
    const int L = std::max(c.n_layer, 1);
    int moe_blocks = 0;
    for (int l = 0; l < L; ++l) moe_blocks += c.moe.HasExperts(l) ? 1 : 0;
    return (moe_blocks * moe_->FlopsPerToken(c, T) +
            (L - moe_blocks) * dense_->FlopsPerToken(c, T)) /
           L;
  }

  void Forward(const PartPass& p, kernels::ConstAct in,
               float* out) const override {
    if (p.config().moe.HasExperts(p.layer())) return moe_->Forward(p, in, out);
    const DenseRows r(p, *this);
    dense_->Forward(r.pass, in, out);
  }
  void Backward(const PartPass& p, float* din, const float* dout,
                kernels::ConstAct in) const override {
    if (p.config().moe.HasExperts(p.layer())) {
      return moe_->Backward(p, din, dout, in);
    }
    const DenseRows r(p, *this);
    dense_->Backward(r.pass, din, dout, in);
  }
  void BackwardWeights(const PartPass& p, kernels::ConstAct in) const override {
    if (p.config().moe.HasExperts(p.layer())) {
      return moe_->BackwardWeights(p, in);
    }
    const DenseRows r(p, *this);
    dense_->BackwardWeights(r.pass, in);
  }

 private:
  const SublayerPart& Of(const GptConfig::Moe& m, int layer) const {
    return m.HasExperts(layer) ? *moe_ : *dense_;
  }

  // The dense part's rows in this part's order: its own Rows at their
  // index, its split rows after all of this part's Rows.
  struct DenseRows {
    std::array<float*, kMaxPartRows> rows{};
    std::array<bool, kMaxPartRows> deferred{};
    PartPass pass;
    DenseRows(const PartPass& p, const InterleavedMlp& part)
        : pass(p.WithRows(rows.data(), deferred.data())) {
      const StageActivationDims d = part.Dims(p);
      const int own = static_cast<int>(part.dense_->Rows(d).size());
      const int all = static_cast<int>(part.Rows(d).size());
      const int split = static_cast<int>(part.dense_->SplitRows(d).size());
      PT_CHECK(own + split <= kMaxPartRows, "a dense MLP with too many rows");
      for (int i = 0; i < own + split; ++i) {
        const int at = i < own ? i : all + (i - own);
        rows[i] = p.Row(at);
        deferred[i] = p.Deferred(at);
      }
    }
  };
  // The row counts depend only on the config (not on the sizes).
  static StageActivationDims Dims(const PartPass& p) {
    StageActivationDims d;
    d.moe = p.config().moe;
    return d;
  }

  std::unique_ptr<SublayerPart> dense_, moe_;
};

}  // namespace

std::unique_ptr<SublayerPart> InterleavedMlpPart(
    std::unique_ptr<SublayerPart> dense, std::unique_ptr<SublayerPart> moe) {
  return std::make_unique<InterleavedMlp>(std::move(dense), std::move(moe));
}

}  // namespace ptrain
