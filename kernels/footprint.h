// What a backend keeps of a pass's activations and its scratch, as the
// activation layout (worker/engine/model/activation_table.h) and the memory
// estimate ask: a backend's answers (OpsFootprint: its Ops'), or the CPU
// backend's without that backend (its BLAS and oneDNN) linked
// (CpuFootprint): the layout planner inside ptcoord sizes CPU jobs with
// it.
#ifndef PTRAIN_KERNELS_FOOTPRINT_H_
#define PTRAIN_KERNELS_FOOTPRINT_H_

#include <cstdint>

#include "kernels/ops.h"

namespace ptrain::kernels {

// Ops' methods of these names say what each answers.
class ActivationFootprint {
 public:
  virtual ~ActivationFootprint() = default;
  virtual DType activation_type() const = 0;
  virtual int64_t gelu_saved_floats(int64_t rows, int C) const = 0;
  virtual int64_t attention_saved_floats(int64_t B, int64_t T, int C,
                                         int NH) const = 0;
  virtual int64_t attention_scratch_floats(int64_t B, int64_t T, int C,
                                           int NH) const = 0;
};

// The CPU backend's answers (CpuOps, or CpuBf16Ops with `bf16`).
const ActivationFootprint& CpuFootprint(bool bf16);

// The answers of `ops` (Ops' methods of the same names).
class OpsFootprint final : public ActivationFootprint {
 public:
  explicit OpsFootprint(const Ops& ops) : ops_(ops) {}
  DType activation_type() const override { return ops_.activation_type(); }
  int64_t gelu_saved_floats(int64_t rows, int C) const override {
    return ops_.gelu_saved_floats(rows, C);
  }
  int64_t attention_saved_floats(int64_t B, int64_t T, int C,
                                 int NH) const override {
    return ops_.attention_saved_floats(B, T, C, NH);
  }
  int64_t attention_scratch_floats(int64_t B, int64_t T, int C,
                                   int NH) const override {
    return ops_.attention_scratch_floats(B, T, C, NH);
  }

 private:
  const Ops& ops_;
};

}  // namespace ptrain::kernels

#endif  // PTRAIN_KERNELS_FOOTPRINT_H_
