#include "worker/engine/model/attention_core.h"

namespace ptrain {

void AttentionCore::Forward(float* atty, float* att, float* qkv, int B, int T) {
  if (cp_.size() == 1) {
    ops_->attention_forward(Stored(atty), att, Stored(qkv), B, T, Cl_, NHl_,
                            KVHl_);
    return;
  }
  const int64_t BT = static_cast<int64_t>(B) * T;
  const Operands r = Widen(qkv, atty, BT, /*out=*/false);
  ring_attention_forward(r.out, att, r.qkv, B, T, Cl_, NHl_, KVHl_, cp_,
                         buffers_.ring, *ops_);
  if (r.out != atty) ops_->Convert(Stored(atty), r.out, BT, Cl_);
}

AttentionCore::Operands AttentionCore::Widen(float* qkv, float* atty,
                                             int64_t BT, bool out) {
  if (act_div_ == 1) return {qkv, atty};
  const Operands r{buffers_.widen, buffers_.widen + BT * row_};
  ops_->Convert(r.qkv, Stored(qkv), BT, row_);
  if (out) ops_->Convert(r.out, Stored(atty), BT, Cl_);
  return r;
}

void AttentionCore::Backward(float* dqkv, float* datt, float* datty, float* qkv,
                             float* atty, const float* att, int B, int T) {
  if (cp_.size() == 1) {  // attention_backward writes dqkv whole
    ops_->attention_backward(dqkv, datt, datty, Stored(qkv), Stored(atty), att,
                             B, T, Cl_, NHl_, KVHl_);
    return;
  }
  const int64_t BT = static_cast<int64_t>(B) * T;
  ops_->Zero(dqkv, BT * row_);
  const Operands r = Widen(qkv, atty, BT, /*out=*/true);
  ring_attention_backward(dqkv, datty, r.qkv, r.out, att, B, T, Cl_, NHl_,
                          KVHl_, cp_, buffers_.ring, *ops_);
}

}  // namespace ptrain
