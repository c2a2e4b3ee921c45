// A model part on its own, through the PartPass a BlockStack gives it: its
// tensors' table entries, its rows, and its forward and backward on its
// own places in the store and rows in the table. RMSNorm (Llama's norm).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cpu/kernels.h"
#include "worker/engine/model/activation_table.h"
#include "worker/engine/model/model_parts.h"
#include "worker/engine/model/part_pass.h"

namespace ptrain {
namespace {

constexpr int kB = 2, kT = 5, kC = 16;

std::vector<float> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// One unit whose tensor sits `offset` floats in, with every Begin and End
// written down.
class OneUnitStore : public UnitStore {
 public:
  explicit OneUnitStore(std::vector<float> params)
      : params_(std::move(params)), grads_(params_.size(), 0.5f) {}
  const float* Params(int u) override { return Unit(u), params_.data(); }
  float* Grads(int u) override { return Unit(u), grads_.data(); }
  void BeginForward(int u) override { calls.push_back("Bf" + Unit(u)); }
  void EndForward(int u) override { calls.push_back("Ef" + Unit(u)); }
  void BeginBackward(int u) override { calls.push_back("Bb" + Unit(u)); }
  void EndBackward(int u) override { calls.push_back("Eb" + Unit(u)); }
  std::vector<float> params_, grads_;
  std::vector<std::string> calls;

 private:
  static std::string Unit(int u) {
    EXPECT_EQ(u, 3);
    return std::to_string(u);
  }
};

TEST(RmsNormPart, TensorsRowsAndFlops) {
  GptConfig config{
      /*n_layer=*/2,    /*n_head=*/2,      /*n_embd=*/kC,
      /*block_size=*/8, /*vocab_size=*/13, /*padded_vocab=*/128};
  const auto part = RmsNormPart("ln_2", 2);
  const std::vector<PartTensor> tensors = part->Tensors(config);
  ASSERT_EQ(tensors.size(), 1u);  // a weight, no bias
  EXPECT_EQ(tensors[0].name, "ln_2.weight");
  EXPECT_EQ(tensors[0].shape, std::vector<int64_t>{kC});
  EXPECT_EQ(tensors[0].init, ParamInfo::Init::kOnes);
  EXPECT_EQ(tensors[0].unit, 2);
  EXPECT_EQ(tensors[0].split, TpSplit::kReplicated);
  EXPECT_TRUE(tensors[0].sequence_partial);
  EXPECT_EQ(part->FlopsPerToken(config, 8), 6.0 * kC);
  StageActivationDims d;
  d.C = kC;
  d.BTs = kB * kT;
  for (int64_t div : {1, 2}) {
    d.act_div = div;
    const std::vector<ActivationRow> rows = part->Rows(d);
    ASSERT_EQ(rows.size(), 2u);  // its output and 1/rms: no mean
    EXPECT_EQ(rows[0].name, "ln_2.out");
    EXPECT_EQ(rows[0].floats, kB * kT * kC / div);
    EXPECT_EQ(rows[1].name, "ln_2.rstd");
    EXPECT_EQ(rows[1].floats, kB * kT);
  }
}

// The part's forward adds the branch to the stream and normalises the sum
// with its weight at its place and config.norm_eps, into its rows; its
// backward accumulates the input gradient and its weight's gradient there.
// Both bracket its unit, as the pass's Place says.
TEST(RmsNormPart, RunsTheOpsOnItsPlacesAndRows) {
  GptConfig config{
      /*n_layer=*/2,    /*n_head=*/2,      /*n_embd=*/kC,
      /*block_size=*/8, /*vocab_size=*/13, /*padded_vocab=*/128};
  config.norm_eps = 1e-6f;
  const auto part = RmsNormPart("ln_1", 0);
  constexpr int64_t kOffset = 7, n = kB * kT * kC;
  std::vector<float> params = Random(kOffset + kC, 1);
  OneUnitStore store(params);
  const float* weight = params.data() + kOffset;
  const std::vector<float> x = Random(n, 2), branch = Random(n, 3),
                           dout = Random(n, 4);
  kernels::Ops& ops = kernels::CpuOps();
  BlockWork work;
  PartPass::Shared shared;
  shared.store = &store;
  shared.ops = &ops;
  shared.config = &config;
  shared.work = &work;
  shared.B = kB;
  shared.T = kT;
  shared.C = kC;
  const PartPass::Place place{3, kOffset, true, true};
  std::vector<float> out(n), rstd(kB * kT), sum(n);
  float* rows[] = {out.data(), rstd.data()};
  const bool deferred[] = {false, false};
  part->Forward(PartPass(shared, &place, rows, deferred, false), x.data(),
                branch.data(), sum.data());

  std::vector<float> want_sum(n), want_out(n), want_rstd(kB * kT);
  kernels::residual_forward(want_sum.data(), x.data(), branch.data(), n);
  kernels::rmsnorm_forward(want_out.data(), want_rstd.data(), want_sum.data(),
                           weight, 1e-6f, kB, kT, kC);
  EXPECT_EQ(sum, want_sum);
  EXPECT_EQ(out, want_out);
  EXPECT_EQ(rstd, want_rstd);

  shared.kind = PartPass::Kind::kBackward;
  std::vector<float> dx(n, 0.25f);
  part->Backward(PartPass(shared, &place, rows, deferred, false), dx.data(),
                 dout.data(), sum.data());
  std::vector<float> want_dx(n, 0.25f), want_grads(kOffset + kC, 0.5f);
  kernels::rmsnorm_backward(want_dx.data(), want_grads.data() + kOffset,
                            dout.data(), want_sum.data(), weight,
                            want_rstd.data(), kB, kT, kC);
  EXPECT_EQ(dx, want_dx);
  EXPECT_EQ(store.grads_, want_grads);  // its weight's only
  EXPECT_EQ(store.calls,
            (std::vector<std::string>{"Bf3", "Ef3", "Bb3", "Eb3"}));
}

}  // namespace
}  // namespace ptrain
