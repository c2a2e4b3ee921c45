// The whole GPT against PyTorch: logits, loss, every parameter gradient and
// ten AdamW steps of the same model from the same initial weights. The
// reference file comes from tests/reference/make_gpt_reference.py (ctest runs
// it first); PT_REFERENCE_FILE names it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/kernels.h"
#include "tests/worker/engine/reference_io.h"
#include "worker/engine/parallel/optimizer.h"

namespace ptrain {
namespace {

using testing::ReferenceSetup;

// max |a-b| / max |b|: relative to the tensor's scale, so that elements near
// zero do not dominate.
double RelMaxDiff(const float* a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

class ModelReference : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* path = std::getenv("PT_REFERENCE_FILE");
    ASSERT_NE(path, nullptr) << "PT_REFERENCE_FILE is not set";
    ref_ = testing::ReadRecords(path);
  }
  const testing::Record& Get(const std::string& name) {
    auto it = ref_.find(name);
    EXPECT_NE(it, ref_.end()) << "reference lacks " << name;
    return it->second;
  }
  ReferenceSetup setup_;
  testing::Records ref_;
};

TEST_F(ModelReference, LogitsLossAndGradientsMatchPyTorch) {
  const auto model = testing::ReferenceModel(setup_);
  const int B = setup_.B, T = setup_.T, V = setup_.config.vocab_size;
  const int Vp = setup_.config.padded_vocab;
  model->Forward(0, setup_.inputs.data(), nullptr, nullptr, B, T);
  ASSERT_EQ(Get("logits").f32.size(), static_cast<size_t>(B) * T * V);
  // The real vocabulary's columns of the padded logits.
  std::vector<float> logits;
  for (int r = 0; r < B * T; ++r) {
    logits.insert(logits.end(), model->logits(0) + int64_t{r} * Vp,
                  model->logits(0) + int64_t{r} * Vp + V);
  }
  const double dlogits = RelMaxDiff(logits.data(), Get("logits").f32);
  std::printf("logits maxdiff (relative) %.3e (tolerance 1e-4)\n", dlogits);
  EXPECT_LE(dlogits, 1e-4);

  model->ZeroGrad();
  const float loss = model->Forward(0, setup_.inputs.data(), nullptr,
                                    setup_.targets.data(), B, T);
  const double ref_loss = Get("loss").f32[0];
  const double dloss = std::fabs(loss - ref_loss) / std::fabs(ref_loss);
  std::printf("loss %.7f vs %.7f, relative diff %.3e (tolerance 1e-5)\n", loss,
              ref_loss, dloss);
  EXPECT_LE(dloss, 1e-5);

  model->Backward(0, setup_.inputs.data(), setup_.targets.data(),
                  1.0f / static_cast<float>(B * T), nullptr);
  double worst = 0;
  std::string worst_name;
  for (const auto& p : model->layout()) {
    const auto& g = Get("grad." + p.name).f32;
    int64_t real = 1;  // wte's padding rows are not the model's
    for (int64_t d : p.global_shape) real *= d;
    ASSERT_EQ(g.size(), static_cast<size_t>(real)) << p.name;
    const double d = RelMaxDiff(model->grads() + p.offset, g);
    if (d > worst) worst = d, worst_name = p.name;
    EXPECT_LE(d, 1e-4) << "gradient of " << p.name;
  }
  std::printf("gradients maxdiff (relative) %.3e at %s (tolerance 1e-4)\n",
              worst, worst_name.c_str());
}

TEST_F(ModelReference, TenAdamWStepsTrackPyTorchLosses) {
  const auto model = testing::ReferenceModel(setup_);
  AdamW opt(model->layout(), 0, model->buffer_size(), setup_.train);
  const auto& ref_losses = Get("losses").f32;
  ASSERT_EQ(ref_losses.size(), static_cast<size_t>(setup_.train.steps()));
  const int B = setup_.B, T = setup_.T;
  double worst = 0;
  for (int64_t s = 0; s < setup_.train.steps(); ++s) {
    model->ZeroGrad();
    const float loss = model->Forward(0, setup_.inputs.data(), nullptr,
                                      setup_.targets.data(), B, T);
    model->Backward(0, setup_.inputs.data(), setup_.targets.data(),
                    1.0f / static_cast<float>(B * T), nullptr);
    const double norm =
        std::sqrt(kernels::sum_squares(model->grads(), model->buffer_size()));
    opt.Step(model->params(), nullptr, model->grads(),
             static_cast<float>(LearningRate(setup_.train, s)),
             ClipScale(norm, setup_.train.grad_clip()));
    const double d = std::fabs(loss - ref_losses[s]) / std::fabs(ref_losses[s]);
    std::printf("step %2lld loss %.7f vs %.7f (relative diff %.2e)\n",
                static_cast<long long>(s), loss, ref_losses[s], d);
    worst = std::max(worst, d);
  }
  std::printf("step losses maxdiff (relative) %.3e (tolerance 1e-5)\n", worst);
  EXPECT_LE(worst, 1e-5);
  // The run must actually learn, or matching losses would prove little.
  EXPECT_LT(ref_losses.back(), ref_losses.front() - 0.05);
}

}  // namespace
}  // namespace ptrain
