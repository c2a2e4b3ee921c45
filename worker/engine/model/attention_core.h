// AttentionCore: a block's attention in training, between its qkv
// projection and its output projection — the backend's attention where
// this rank holds whole sequences, ring attention over the cp group where
// context parallelism splits them (its log-sum-exp kept where the
// backend's attention keeps what its backward reads). It holds the ring's
// glue: ring attention computes in fp32, so under bf16 storage its
// operands are widened into a buffer that is free around attention, and
// its output narrowed back. GptStage holds one for all its blocks; the
// buffers are the stage's working set (activation_table.h).
#ifndef PTRAIN_WORKER_ENGINE_MODEL_ATTENTION_CORE_H_
#define PTRAIN_WORKER_ENGINE_MODEL_ATTENTION_CORE_H_

#include <cstdint>

#include "kernels/ops.h"
#include "worker/engine/model/layers.h"

namespace ptrain {

class AttentionCore {
 public:
  struct Buffers {
    float* ring = nullptr;  // cp > 1: 4·(B,T,2Kl) floats, the ring's blocks
    // cp > 1 under bf16 storage: (B,T,Cl+2Kl+Cl) floats free around
    // attention (the MLP's hidden buffer), the widened qkv and output.
    float* widen = nullptr;
  };
  AttentionCore() = default;
  // `Cl` channels, `NHl` query heads and `KVHl` key/value heads on this
  // rank (kernels/ops.h attention_forward's rows, Cl + 2Kl wide); `act_div`
  // stored elements per float of the slabs (2 where qkv and the output are
  // bf16).
  AttentionCore(kernels::Ops* ops, CpGroup cp, int Cl, int NHl, int KVHl,
                int64_t act_div, Buffers buffers)
      : ops_(ops),
        cp_(cp),
        Cl_(Cl),
        NHl_(NHl),
        KVHl_(KVHl),
        row_(kernels::math::MakeAttentionHeads(Cl, NHl, KVHl).row()),
        act_div_(act_div),
        buffers_(buffers) {}

  // The width of this rank's keys (and of its values): a cached
  // position's in generation.
  int64_t Kl() const { return (row_ - Cl_) / 2; }

  // atty (B,T,Cl) from qkv (B,T,Cl+2Kl), both in the stored type; `att`
  // keeps what Backward reads (the probabilities or the log-sum-exp).
  void Forward(float* atty, float* att, float* qkv, int B, int T);
  // dqkv (B,T,Cl+2Kl, fp32, written whole) from datty (B,T,Cl) and
  // Forward's qkv, atty and att; `datt`: the backend's scratch.
  void Backward(float* dqkv, float* datt, float* datty, float* qkv, float* atty,
                const float* att, int B, int T);

 private:
  kernels::Act Stored(float* p) const {
    return kernels::Act(
        p, act_div_ == 2 ? kernels::DType::kBf16 : kernels::DType::kF32);
  }
  // Ring attention's fp32 qkv and output (B·T rows): the slabs themselves
  // under fp32 storage; under bf16, fp32 copies in buffers_.widen, qkv
  // widened into it (and the output, with `out`).
  struct Operands {
    float* qkv;
    float* out;
  };
  Operands Widen(float* qkv, float* atty, int64_t BT, bool out);

  kernels::Ops* ops_ = nullptr;
  CpGroup cp_;
  int Cl_ = 0, NHl_ = 0, KVHl_ = 0;
  int64_t row_ = 0;  // qkv's row: Cl + 2Kl
  int64_t act_div_ = 1;
  Buffers buffers_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_ATTENTION_CORE_H_
