#include "worker/engine/model/block_stack.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace ptrain {

BlockStack::BlockStack(const ModelParts& parts, const GptConfig& config,
                       const std::vector<ParamInfo>& layout, int first_layer,
                       int n_blocks)
    : parts_list_(parts), first_layer_(first_layer), n_blocks_(n_blocks) {
  parts_ = static_cast<int>(parts.block.size());
  PT_CHECK(parts_ >= 2 && parts_ <= kMaxParts &&
               parts_ == 2 * static_cast<int>(parts.pairs.size()),
           "a block is one to four (norm, sublayer) pairs");
  // By block, then part: its tensors in that block (parts may differ by
  // layer: PartPass::TensorsAt).
  std::vector<std::vector<std::vector<PartTensor>>> tensors(n_blocks_);
  for (int b = 0; b < n_blocks_; ++b) {
    for (const auto& part : parts.block) {
      tensors[b].push_back(part->TensorsAt(config, first_layer + b));
      max_tensors_ =
          std::max(max_tensors_, static_cast<int>(tensors[b].back().size()));
    }
  }
  for (const auto& part : parts.block) {
    tensor_counts_.push_back(static_cast<int>(part->Tensors(config).size()));
  }
  places_.resize(static_cast<size_t>(kVariants) * n_blocks_ * parts_ *
                 max_tensors_);
  for (int b = 0; b < n_blocks_; ++b) {
    const std::vector<std::vector<PartTensor>>& of = tensors[b];
    int units = 0;
    for (const auto& list : of) {
      for (const PartTensor& t : list) units = std::max(units, t.unit + 1);
    }
    // Per unit of the block: the first and last part (block order) with a
    // tensor in it, and the first that has a weight pass (a sublayer).
    std::vector<int> first(units, parts_), last(units, -1),
        w_end(units, parts_);
    for (int q = 0; q < parts_; ++q) {
      for (const PartTensor& t : of[q]) {
        first[t.unit] = std::min(first[t.unit], q);
        last[t.unit] = std::max(last[t.unit], q);
        if (q % 2 == 1) w_end[t.unit] = std::min(w_end[t.unit], q);
      }
    }
    for (int q = 0; q < parts_; ++q) {
      const std::vector<PartPass::Place> found =
          PlacesOf(of[q], layout, absl::StrCat("h.", first_layer + b, "."));
      for (size_t i = 0; i < found.size(); ++i) {
        const int k = of[q][i].unit;
        auto set = [&](Variant v, bool begins, bool ends) {
          PartPass::Place p = found[i];
          p.begins = begins && p.unit >= 0;  // another ep rank's expert: none
          p.ends = ends && p.unit >= 0;
          places_[Index(v, b, q) + i] = p;
        };
        set(kForward, q == first[k], q == last[k]);
        set(kBackward, q == last[k], q == first[k]);
        set(kBackwardSplit, q == last[k], false);
        // W ends a unit after the last weight pass that reads it; one no
        // sublayer reads, after its first part's place in W.
        set(kWeights, false, w_end[k] < parts_ ? q == w_end[k] : q == first[k]);
      }
    }
  }
}

std::array<bool, BlockStack::kMaxRows> BlockStack::Deferred(const Rows& rows,
                                                            int q) const {
  std::array<bool, kMaxRows> deferred{};
  // After part q in the backward: the parts before it, and the norms'
  // inputs x[0..q/2] (pair i's norm reads x[i]).
  for (int j = 0; j < kMaxRows; ++j) {
    const float* row = rows.part[q][j];
    if (row == nullptr) continue;
    for (int r = 0; r < q && !deferred[j]; ++r) {
      deferred[j] = std::find(rows.part[r].begin(), rows.part[r].end(), row) !=
                    rows.part[r].end();
    }
    for (int i = 0; i <= q / 2 && !deferred[j]; ++i) {
      deferred[j] = rows.x[i] == row;
    }
  }
  return deferred;
}

void BlockStack::Forward(PartPass::Shared s, const Rows& rows, int b,
                         bool recomputing) const {
  s.kind = PartPass::Kind::kForward;
  s.stats = &stats_;
  s.layer = first_layer_ + b;
  const std::array<bool, kMaxRows> none{};
  const int pairs = parts_ / 2;
  float* proj = s.work->proj;
  for (int i = 0; i < pairs; ++i) {
    const auto [norm, sublayer] = parts_list_.pairs[i];
    const PartPass n(s, Places(kForward, b, 2 * i), rows.part[2 * i].data(),
                     none.data(), false);
    if (i == 0) {
      norm->Forward(n, rows.x[0], nullptr, nullptr);
    } else {
      norm->Forward(n, rows.x[i - 1], proj, rows.x[i]);
    }
    const bool stop = recomputing && i == pairs - 1;
    const PartPass p(s, Places(kForward, b, 2 * i + 1),
                     rows.part[2 * i + 1].data(), none.data(), stop);
    sublayer->Forward(p, n.Stored(rows.part[2 * i][0]), proj);
  }
  if (recomputing) return;
  s.ops->residual_forward(rows.x[pairs], rows.x[pairs - 1], proj,
                          static_cast<int64_t>(s.B) * s.tp.SeqLocal(s.T) * s.C);
}

void BlockStack::Backward(PartPass::Shared s, const Rows& rows, int b,
                          bool recompute) const {
  if (recompute) Forward(s, rows, b, /*recomputing=*/true);
  s.kind = PartPass::Kind::kBackward;
  s.stats = &stats_;
  s.layer = first_layer_ + b;
  std::vector<std::function<void()>> after;
  s.after_block = &after;
  const Variant v = s.split ? kBackwardSplit : kBackward;
  const BlockWork& w = *s.work;
  for (int i = parts_ / 2 - 1; i >= 0; --i) {
    const auto [norm, sublayer] = parts_list_.pairs[i];
    const std::array<bool, kMaxRows> dn = Deferred(rows, 2 * i);
    const std::array<bool, kMaxRows> ds = Deferred(rows, 2 * i + 1);
    const PartPass n(s, Places(v, b, 2 * i), rows.part[2 * i].data(), dn.data(),
                     false);
    const PartPass p(s, Places(v, b, 2 * i + 1), rows.part[2 * i + 1].data(),
                     ds.data(), false);
    sublayer->Backward(p, w.dln, w.dresidual, n.Stored(rows.part[2 * i][0]));
    norm->Backward(n, w.dresidual, w.dln, rows.x[i]);
  }
  for (const auto& f : after) f();
}

void BlockStack::BackwardWeights(PartPass::Shared s, const Rows& rows, int b,
                                 bool recompute) const {
  if (recompute) Forward(s, rows, b, /*recomputing=*/true);
  s.kind = PartPass::Kind::kWeights;
  s.stats = &stats_;
  s.layer = first_layer_ + b;
  const std::array<bool, kMaxRows> none{};
  for (int i = parts_ / 2 - 1; i >= 0; --i) {
    const auto [norm, sublayer] = parts_list_.pairs[i];
    const PartPass n(s, Places(kWeights, b, 2 * i), rows.part[2 * i].data(),
                     none.data(), false);
    const PartPass p(s, Places(kWeights, b, 2 * i + 1),
                     rows.part[2 * i + 1].data(), none.data(), false);
    sublayer->BackwardWeights(p, n.Stored(rows.part[2 * i][0]));
    // A unit only the norm reads ends here.
    for (int t = 0; t < tensor_counts_[2 * i]; ++t) n.End(t);
  }
}

std::vector<PartPass::Place> PlacesOf(const std::vector<PartTensor>& tensors,
                                      const std::vector<ParamInfo>& layout,
                                      const std::string& prefix) {
  std::vector<PartPass::Place> places;
  for (const PartTensor& t : tensors) {
    const std::string name = prefix + t.name;
    auto it = std::find_if(layout.begin(), layout.end(),
                           [&](const ParamInfo& p) { return p.name == name; });
    if (it == layout.end() && t.expert >= 0) {
      places.push_back({-1, 0});  // an expert another ep rank holds
      continue;
    }
    PT_CHECK(it != layout.end(), ("the layout has no " + name).c_str());
    places.push_back({it->unit, it->unit_offset});
  }
  return places;
}

std::vector<PartPass::Place> PlacesOf(const ModelPart& part,
                                      const GptConfig& config,
                                      const std::vector<ParamInfo>& layout,
                                      const std::string& prefix) {
  return PlacesOf(part.Tensors(config), layout, prefix);
}

}  // namespace ptrain
