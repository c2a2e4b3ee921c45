// A stage's blocks run part by part (BlockStack): each unit of a block is
// begun by the first part that reads it and ended by the last, in every
// pass, so the store sees the order UnitStore documents — with and
// without recomputation, and split into B and W.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/plan.h"

namespace ptrain {
namespace {

const GptConfig kTiny{/*n_layer=*/2,       /*n_head=*/2,
                      /*n_embd=*/12,
                      /*block_size=*/8,    /*vocab_size=*/13,
                      /*padded_vocab=*/128};
constexpr int kB = 2, kT = 4;

// Flat buffers that write down every Begin and End of a block unit (the
// embedding's and the final unit's are left out).
class RecordingStore : public UnitStore {
 public:
  explicit RecordingStore(const std::vector<ParamInfo>& layout)
      : units_(Units(layout, 1)) {
    const int64_t n = units_.back().begin + units_.back().size;
    params_.assign(n, 0.02f);
    grads_.assign(n, 0.0f);
  }
  const float* Params(int u) override {
    return params_.data() + units_[u].begin;
  }
  float* Grads(int u) override { return grads_.data() + units_[u].begin; }
  void BeginForward(int u) override { Note("Bf", u); }
  void EndForward(int u) override { Note("Ef", u); }
  void BeginBackward(int u) override { Note("Bb", u); }
  void EndBackward(int u) override { Note("Eb", u); }
  std::vector<std::string> calls;

 private:
  void Note(const char* what, int u) {
    if (u >= 1 && u + 1 < static_cast<int>(units_.size())) {
      calls.push_back(absl::StrCat(what, u));
    }
  }
  std::vector<UnitRange> units_;
  std::vector<float> params_, grads_;
};

struct StageRun {
  explicit StageRun(Recompute recompute, bool split = false)
      : layout(BuildPlan(kTiny, {})), store(layout) {
    StageOptions o;
    o.max_B = kB;
    o.max_T = kT;
    o.store = &store;
    o.recompute = recompute;
    o.split_backward = split;
    stage = std::make_unique<GptStage>(kTiny, layout, o);
    for (int i = 0; i < kB * kT; ++i) {
      tokens.push_back(i % kTiny.vocab_size);
      targets.push_back((i + 1) % kTiny.vocab_size);
    }
  }
  std::vector<ParamInfo> layout;
  RecordingStore store;
  std::unique_ptr<GptStage> stage;
  std::vector<int32_t> tokens, targets;
};

// Blocks 0 and 1 hold units 1..4 and 5..8. Each string: "Bf1 Ef1 ...".
std::vector<std::string> Calls(
    const std::vector<std::pair<const char*, int>>& calls) {
  std::vector<std::string> out;
  for (const auto& [what, u] : calls) out.push_back(absl::StrCat(what, u));
  return out;
}

std::vector<std::string> Forward(int first_unit, int units) {
  std::vector<std::string> out;
  for (int u = first_unit; u < first_unit + units; ++u) {
    out.push_back(absl::StrCat("Bf", u));
    out.push_back(absl::StrCat("Ef", u));
  }
  return out;
}

void Append(std::vector<std::string>* to, const std::vector<std::string>& v) {
  to->insert(to->end(), v.begin(), v.end());
}

TEST(BlockStack, ForwardBeginsAndEndsEachUnitOnceInOrder) {
  StageRun r(Recompute::kNone);
  r.stage->Forward(0, r.tokens.data(), nullptr, r.targets.data(), kB, kT);
  EXPECT_EQ(r.store.calls, Forward(1, 8));
}

TEST(BlockStack, BackwardBeginsAndEndsEachUnitInReverse) {
  for (Recompute recompute :
       {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    StageRun r(recompute);
    r.stage->Forward(0, r.tokens.data(), nullptr, r.targets.data(), kB, kT);
    r.store.calls.clear();
    r.stage->Backward(0, r.tokens.data(), r.targets.data(), 1.0f / (kB * kT),
                      nullptr);
    std::vector<std::string> want;
    for (int first : {5, 1}) {
      // Full recomputation: the block's first three units forward again.
      if (recompute == Recompute::kFull) Append(&want, Forward(first, 3));
      for (int u = first + 3; u >= first; --u) {
        Append(&want, Calls({{"Bb", u}, {"Eb", u}}));
      }
    }
    EXPECT_EQ(r.store.calls, want)
        << "recompute " << static_cast<int>(recompute);
  }
}

TEST(BlockStack, SplitBackwardBeginsInBAndEndsInW) {
  for (Recompute recompute : {Recompute::kNone, Recompute::kFull}) {
    StageRun r(recompute, /*split=*/true);
    r.stage->Forward(0, r.tokens.data(), nullptr, r.targets.data(), kB, kT);
    r.store.calls.clear();
    r.stage->BackwardInput(0, r.tokens.data(), r.targets.data(),
                           1.0f / (kB * kT), nullptr);
    std::vector<std::string> want_b, want_w;
    for (int first : {5, 1}) {
      if (recompute == Recompute::kFull) {
        Append(&want_b, Forward(first, 3));
        Append(&want_w, Forward(first, 3));
      }
      for (int u = first + 3; u >= first; --u) {
        Append(&want_b, Calls({{"Bb", u}}));
        Append(&want_w, Calls({{"Eb", u}}));
      }
    }
    EXPECT_EQ(r.store.calls, want_b);
    r.store.calls.clear();
    r.stage->BackwardWeights(0);
    EXPECT_EQ(r.store.calls, want_w);
  }
}

}  // namespace
}  // namespace ptrain
