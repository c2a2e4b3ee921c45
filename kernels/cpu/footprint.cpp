// The CPU backend's activation footprint (kernels/footprint.h), apart from
// the backend so that sizing a CPU job links no BLAS.
#include "kernels/footprint.h"

namespace ptrain::kernels {

namespace {

class CpuActivationFootprint final : public ActivationFootprint {
 public:
  explicit CpuActivationFootprint(bool bf16) : bf16_(bf16) {}
  // bf16 keeps LayerNorm outputs in bf16, the values its matmuls would
  // round them to: the same products, without the rounding pass.
  DType activation_type() const override {
    return bf16_ ? DType::kBf16 : DType::kF32;
  }
  // bf16 keeps GELU's input rounded, two in a float.
  int64_t gelu_saved_floats(int64_t rows, int C) const override {
    return bf16_ ? (rows * C + 1) / 2 : 0;
  }
  // From kFlashAttentionT positions on, attention keeps one float per query
  // row (flash_attention_forward's log-sum-exp) and needs no scratch; below
  // it the probabilities (bf16: rounded, two in a float).
  int64_t attention_saved_floats(int64_t B, int64_t T, int C,
                                 int NH) const override {
    (void)C;
    if (T >= kFlashAttentionT) return B * NH * T;
    return bf16_ ? (B * NH * T * T + 1) / 2 : B * NH * T * T;
  }
  // bf16 works in per-thread scratch.
  int64_t attention_scratch_floats(int64_t B, int64_t T, int C,
                                   int NH) const override {
    (void)C;
    return T >= kFlashAttentionT || bf16_ ? 0 : B * NH * T * T;
  }

 private:
  const bool bf16_;
};

}  // namespace

const ActivationFootprint& CpuFootprint(bool bf16) {
  static const CpuActivationFootprint fp32(false), bf16_footprint(true);
  return bf16 ? bf16_footprint : fp32;
}

}  // namespace ptrain::kernels
