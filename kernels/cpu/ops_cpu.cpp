// The CPU backend of the Ops seam: kernels/cpu's float kernels on host
// memory.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/check.h"
#include "kernels/cpu/kernels.h"
#include "kernels/footprint.h"
#include "kernels/ops.h"

namespace ptrain::kernels {

namespace {

void* AlignedZeroed(int64_t bytes) {
  // Cache-line aligned, rounded up as aligned_alloc requires.
  const size_t size = (static_cast<size_t>(bytes) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, size);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, size);
  return p;
}

class CpuBackend final : public Ops {
 public:
  // bf16: matmul products in bf16 (gemm_bf16); everything else fp32.
  explicit CpuBackend(bool bf16) : bf16_(bf16) {}
  Device device() const override { return Device::kCpu; }
  std::string name() const override {
    return bf16_ ? "cpu (bf16 matmuls)" : "cpu";
  }

  float* Alloc(int64_t n) override {
    return static_cast<float*>(AlignedZeroed(n * sizeof(float)));
  }
  void Free(float* p) override { std::free(p); }
  int32_t* AllocTokens(int64_t n) override {
    return static_cast<int32_t*>(AlignedZeroed(n * sizeof(int32_t)));
  }
  void FreeTokens(int32_t* p) override { std::free(p); }
  const int32_t* StageTokens(int32_t*, const int32_t* host, int64_t) override {
    return host;
  }
  void ToHost(float* host, const float* src, int64_t n) override {
    Copy(host, src, n);
  }
  void FromHost(float* dst, const float* host, int64_t n) override {
    Copy(dst, host, n);
  }
  void Synchronize() override {}
  bool IsDeviceMemory(const void*) const override { return false; }

  void Zero(float* p, int64_t n) override {
    std::memset(p, 0, n * sizeof(float));
  }
  void Copy(float* dst, const float* src, int64_t n) override {
    if (dst != src) std::memcpy(dst, src, n * sizeof(float));
  }
  void Add(float* dst, const float* src, int64_t n) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
  }
  void CopyRows(float* dst, int64_t dst_stride, const float* src,
                int64_t src_stride, int64_t rows, int64_t cols,
                bool add) override {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* d = dst + r * dst_stride;
      const float* s = src + r * src_stride;
      if (add) {
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) d[c] += s[c];
      } else {
        std::memcpy(d, s, cols * sizeof(float));
      }
    }
  }
  void Convert(Act dst, ConstAct src, int64_t rows, int64_t cols) override {
    const int64_t n = rows * cols;
    if (dst.type == src.type) {
      if (dst.p != src.p) {
        std::memcpy(dst.p, src.p, n * (src.type == DType::kF32 ? 4 : 2));
      }
    } else if (src.type == DType::kBf16) {
      kernels::FromBf16Values(dst.f32(), static_cast<const uint16_t*>(src.p),
                              n);
    } else {
      kernels::RoundToBf16Rows(static_cast<uint16_t*>(dst.p), src.f32(), rows,
                               cols);
    }
  }
  double Sum(const float* x, int64_t n) override {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += x[i];
    return sum;
  }
  double SumSquares(const float* x, int64_t n) override {
    return sum_squares(x, n);
  }

  void embedding_forward(float* out, const int32_t* inp, const float* wte,
                         int B, int T, int C, int vocab_begin,
                         int Vl) override {
    kernels::embedding_forward(out, inp, wte, B, T, C, vocab_begin, Vl);
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* inp,
                          int B, int T, int C, int vocab_begin,
                          int Vl) override {
    kernels::embedding_backward(dwte, dout, inp, B, T, C, vocab_begin, Vl);
  }
  void position_forward(float* out, const float* wpe, int B, int T, int C,
                        int t0) override {
    kernels::position_forward(out, wpe, B, T, C, t0);
  }
  void position_backward(float* dwpe, const float* dout, int B, int T, int C,
                         int t0) override {
    kernels::position_backward(dwpe, dout, B, T, C, t0);
  }
  // What it keeps of activations: CpuFootprint's (kernels/footprint.h).
  DType activation_type() const override {
    return CpuFootprint(bf16_).activation_type();
  }
  void layernorm_forward(Act out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int B, int T,
                         int C) override {
    if (Bf16(out)) {
      kernels::layernorm_forward_bf16(static_cast<uint16_t*>(out.p), mean, rstd,
                                      inp, weight, bias, B, T, C);
      return;
    }
    kernels::layernorm_forward(out.f32(), mean, rstd, inp, weight, bias, B, T,
                               C);
  }
  void residual_layernorm_forward(float* residual, Act out, float* mean,
                                  float* rstd, const float* inp1,
                                  const float* inp2, const float* weight,
                                  const float* bias, int B, int T,
                                  int C) override {
    if (Bf16(out)) {
      kernels::residual_layernorm_forward_bf16(
          residual, static_cast<uint16_t*>(out.p), mean, rstd, inp1, inp2,
          weight, bias, B, T, C);
      return;
    }
    kernels::residual_layernorm_forward(residual, out.f32(), mean, rstd, inp1,
                                        inp2, weight, bias, B, T, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias,
                          const float* dout, const float* inp,
                          const float* weight, const float* mean,
                          const float* rstd, int B, int T, int C) override {
    kernels::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean,
                                rstd, B, T, C);
  }
  void rmsnorm_forward(Act out, float* rstd, const float* inp,
                       const float* weight, float eps, int B, int T,
                       int C) override {
    if (Bf16(out)) {
      kernels::rmsnorm_forward_bf16(static_cast<uint16_t*>(out.p), rstd, inp,
                                    weight, eps, B, T, C);
      return;
    }
    kernels::rmsnorm_forward(out.f32(), rstd, inp, weight, eps, B, T, C);
  }
  void residual_rmsnorm_forward(float* residual, Act out, float* rstd,
                                const float* inp1, const float* inp2,
                                const float* weight, float eps, int B, int T,
                                int C) override {
    if (Bf16(out)) {
      kernels::residual_rmsnorm_forward_bf16(
          residual, static_cast<uint16_t*>(out.p), rstd, inp1, inp2, weight,
          eps, B, T, C);
      return;
    }
    kernels::residual_rmsnorm_forward(residual, out.f32(), rstd, inp1, inp2,
                                      weight, eps, B, T, C);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout,
                        const float* inp, const float* weight,
                        const float* rstd, int B, int T, int C) override {
    kernels::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, B, T, C);
  }
  void matmul_forward(Act out, ConstAct inp, ConstAct weight_in,
                      const float* bias, int B, int T, int C, int OC) override {
    const int64_t rows = static_cast<int64_t>(B) * T;
    const float* weight = Weight(weight_in, C, OC);
    if (Bf16(out) && Bf16(inp)) {  // oneDNN writes the bf16 output
      kernels::matmul_forward_bf16_output(static_cast<uint16_t*>(out.p),
                                          static_cast<const uint16_t*>(inp.p),
                                          weight, bias, rows, C, OC);
      return;
    }
    // Else a bf16 output is computed in fp32 into scratch, then rounded.
    float* y = F32Target(out, rows * OC, 0);
    if (Bf16(inp)) {
      kernels::matmul_forward_bf16_input(y, static_cast<const uint16_t*>(inp.p),
                                         weight, bias, rows, C, OC);
    } else {
      kernels::matmul_forward(y, inp.f32(), weight, bias, B, T, C, OC, bf16_);
    }
    Finish(out, y, rows, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, ConstAct dout,
                       ConstAct inp, ConstAct weight_in, int B, int T, int C,
                       int OC) override {
    const int64_t rows = static_cast<int64_t>(B) * T;
    // The weight is an operand of the input gradient only.
    const float* weight = dinp != nullptr ? Weight(weight_in, C, OC) : nullptr;
    if (Bf16(dout)) {
      kernels::matmul_backward_bf16_dout(
          dinp, dweight, dbias, static_cast<const uint16_t*>(dout.p),
          Bf16(inp) ? nullptr : inp.f32(),
          Bf16(inp) ? static_cast<const uint16_t*>(inp.p) : nullptr, weight,
          rows, C, OC);
      return;
    }
    if (Bf16(inp)) {
      kernels::matmul_backward_bf16_input(dinp, dweight, dbias, dout.f32(),
                                          static_cast<const uint16_t*>(inp.p),
                                          weight, rows, C, OC);
      return;
    }
    kernels::matmul_backward(dinp, dweight, dbias, dout.f32(), inp.f32(),
                             weight, B, T, C, OC, bf16_);
  }
  // In bf16 GELU is applied as the matmul rounds its operand: no fp32 pass
  // over GELU's output in either direction. The rounded operand is kept in
  // `saved` (half a float each), which the backward lays out for dweight
  // instead of computing GELU and rounding again.
  void gelu_matmul_forward(float* out, float* hidden, float* saved,
                           ConstAct inp, ConstAct weight_in, const float* bias,
                           int B, int T, int C, int OC) override {
    const float* weight = Weight(weight_in, C, OC);
    if (!bf16_) {
      Ops::gelu_matmul_forward(out, hidden, saved, inp, weight, bias, B, T, C,
                               OC);
      return;
    }
    const int64_t rows = static_cast<int64_t>(B) * T;
    auto* kept = reinterpret_cast<uint16_t*>(saved);
    if (Bf16(inp)) {
      kernels::gelu_matmul_forward_bf16_input(
          out, static_cast<const uint16_t*>(inp.p), weight, bias, rows, C, OC,
          kept);
      return;
    }
    kernels::gelu_matmul_forward_bf16(out, inp.f32(), weight, bias, rows, C, OC,
                                      kept);
  }
  // Under bf16 the gradient through GELU is computed from the product in
  // fp32 scratch and, for a bf16-stored fch, rounded as it is written.
  void gelu_matmul_backward(Act dinp, float* dweight, float* dbias,
                            const float* dout, float* hidden,
                            const float* saved, ConstAct inp,
                            ConstAct weight_in, int B, int T, int C,
                            int OC) override {
    const float* weight =
        dinp.p != nullptr ? Weight(weight_in, C, OC) : nullptr;
    if (!bf16_) {
      Ops::gelu_matmul_backward(dinp, dweight, dbias, dout, hidden, saved, inp,
                                weight, B, T, C, OC);
      return;
    }
    const int64_t rows = static_cast<int64_t>(B) * T;
    const auto* kept = reinterpret_cast<const uint16_t*>(saved);
    // A null dinp: the weight gradients only (see Ops::matmul_backward).
    float* dgelu = dinp.p != nullptr ? F32Target(dinp, rows * C, 0) : nullptr;
    if (Bf16(inp)) {
      kernels::gelu_matmul_backward_bf16_input(
          dgelu, dweight, dbias, dout, static_cast<const uint16_t*>(inp.p),
          weight, rows, C, OC, kept);
    } else {
      kernels::gelu_matmul_backward_bf16(dgelu, dweight, dbias, dout, inp.f32(),
                                         hidden, weight, rows, C, OC, kept);
    }
    if (dgelu == nullptr) return;
    if (Bf16(dinp)) {
      PT_CHECK(Bf16(inp), "a bf16 GELU gradient of an fp32 input");
      kernels::gelu_backward_bf16(static_cast<uint16_t*>(dinp.p),
                                  static_cast<const uint16_t*>(inp.p), dgelu,
                                  rows * C);
      return;
    }
    gelu_backward(dinp.f32(), inp, dgelu, rows * C);
  }
  int64_t gelu_saved_floats(int64_t rows, int C) const override {
    return CpuFootprint(bf16_).gelu_saved_floats(rows, C);
  }
  // From kFlashAttentionT positions on, attention keeps one float per query
  // row (flash_attention_forward's log-sum-exp) and needs no scratch; below
  // it keeps the probabilities, which is faster there (10-30% on configs of
  // T 256 and 512) for memory that is still small next to the rest.
  // A bf16-stored qkv or output is unpacked into fp32 scratch around the
  // kernels (fp32 inside, as the fp32 values they stand for): the same
  // results as for those values, the output rounded afterwards.
  void attention_forward(Act out, float* att, ConstAct inp, int B, int T, int C,
                         int NH, int KVH) override {
    const int64_t BT = static_cast<int64_t>(B) * T, n = BT * C;
    const float* x =
        AsF32(inp, BT * math::MakeAttentionHeads(C, NH, KVH).row(), 1);
    float* y = F32Target(out, n, 2);
    if (T >= kFlashAttentionT) {
      kernels::flash_attention_forward(y, att, x, B, T, C, NH, KVH);
    } else if (bf16_) {
      kernels::attention_forward_bf16(y, att, x, B, T, C, NH, KVH);
    } else {
      kernels::attention_forward(y, att, x, B, T, C, NH, KVH);
    }
    Finish(out, y, BT, C);
  }
  void attention_block_forward(float* out, float* lse, const float* qkv,
                               const float* kv, int64_t kv_stride, int B,
                               int Tl, int C, int NH, int KVH, int cp,
                               int q_rank, int k_rank, bool first) override {
    kernels::attention_block_forward(out, lse, qkv, kv, kv_stride, B, Tl, C, NH,
                                     KVH, cp, q_rank, k_rank, first);
  }
  void attention_block_backward(float* dqkv, float* dkv, const float* dout,
                                const float* qkv, const float* out,
                                const float* lse, const float* kv,
                                int64_t kv_stride, int B, int Tl, int C, int NH,
                                int KVH, int cp, int q_rank,
                                int k_rank) override {
    kernels::attention_block_backward(dqkv, dkv, dout, qkv, out, lse, kv,
                                      kv_stride, B, Tl, C, NH, KVH, cp, q_rank,
                                      k_rank);
  }
  void attention_backward(float* dinp, float* datt, const float* dout,
                          ConstAct inp, ConstAct out, const float* att, int B,
                          int T, int C, int NH, int KVH) override {
    const int64_t BT = static_cast<int64_t>(B) * T, n = BT * C;
    const int64_t rows = BT * math::MakeAttentionHeads(C, NH, KVH).row();
    const float* x = AsF32(inp, rows, 1);
    Zero(dinp, rows);  // the kernels add to it
    if (T >= kFlashAttentionT) {
      kernels::flash_attention_backward(dinp, dout, x, AsF32(out, n, 2), att, B,
                                        T, C, NH, KVH);
    } else if (bf16_) {
      kernels::attention_backward_bf16(dinp, datt, dout, x, att, B, T, C, NH,
                                       KVH);
    } else {
      kernels::attention_backward(dinp, datt, dout, x, att, B, T, C, NH, KVH);
    }
  }
  int64_t attention_saved_floats(int64_t B, int64_t T, int C,
                                 int NH) const override {
    return CpuFootprint(bf16_).attention_saved_floats(B, T, C, NH);
  }
  int64_t attention_scratch_floats(int64_t B, int64_t T, int C,
                                   int NH) const override {
    return CpuFootprint(bf16_).attention_scratch_floats(B, T, C, NH);
  }
  void attention_decode(Act out, float* kcache, float* vcache, ConstAct qkv,
                        int n, int pos, int C, int NH, int KVH,
                        int capacity) override {
    float* y = F32Target(out, int64_t{n} * C, 2);
    const int64_t row = math::MakeAttentionHeads(C, NH, KVH).row();
    kernels::attention_decode(y, kcache, vcache, AsF32(qkv, n * row, 1), n, pos,
                              C, NH, KVH, capacity);
    Finish(out, y, n, C);
  }
  void gelu_forward(float* out, const float* inp, int64_t N) override {
    kernels::gelu_forward(out, inp, N);
  }
  void gelu_backward(float* dinp, ConstAct inp, const float* dout,
                     int64_t N) override {
    if (Bf16(inp)) {
      kernels::gelu_backward_bf16_input(
          dinp, static_cast<const uint16_t*>(inp.p), dout, N);
      return;
    }
    kernels::gelu_backward(dinp, inp.f32(), dout, N);
  }
  void rope_forward(float* x, int64_t stride, int B, int n, int heads, int hs,
                    int pos0, const math::Rope& rope, bool inverse) override {
    kernels::rope_forward(x, stride, B, n, heads, hs, pos0, rope, inverse);
  }
  void swiglu_forward(float* out, ConstAct gate_up, int64_t rows,
                      int H) override {
    if (Bf16(gate_up)) {
      kernels::swiglu_forward_bf16_input(
          out, static_cast<const uint16_t*>(gate_up.p), rows, H);
      return;
    }
    kernels::swiglu_forward(out, gate_up.f32(), rows, H);
  }
  void moe_router_forward(int32_t* experts, float* weights, float* scores,
                          const float* logits, const float* bias, int N, int E,
                          int k, math::RouterScore kind,
                          bool normalize) override {
    kernels::moe_router_forward<float>(experts, weights, scores, logits, bias,
                                       N, E, k, kind, normalize);
  }
  void moe_router_backward(float* dlogits, const float* dweights,
                           const int32_t* experts, const float* scores, int N,
                           int E, int k, math::RouterScore kind,
                           bool normalize) override {
    kernels::moe_router_backward<float>(dlogits, dweights, experts, scores, N,
                                        E, k, kind, normalize);
  }
  double moe_aux_loss(float* dlogits, const float* scores,
                      const int32_t* experts, float coef, float dloss, int N,
                      int segment, int E, int k, math::RouterScore kind,
                      const float* counts, int length) override {
    double sum = 0;
    for (int t = 0; t < N; t += segment) {
      const int64_t at = t;
      sum += kernels::moe_aux_loss<float>(
          dlogits != nullptr ? dlogits + at * E : nullptr, scores + at * E,
          experts + at * k, coef, dloss, segment, E, k, kind,
          counts != nullptr ? counts + at / segment * E : nullptr, length);
    }
    return sum;
  }
  double moe_z_loss(float* dlogits, const float* logits, float coef,
                    float dloss, int N, int E) override {
    return kernels::moe_z_loss<float>(dlogits, logits, coef, dloss, N, E);
  }
  int64_t moe_dispatch_plan(int32_t* slots, int32_t* order, int32_t* counts,
                            int32_t* offsets, int32_t* host_offsets,
                            const int32_t* experts, int N, int k, int E,
                            int capacity, int segment,
                            const int32_t* base) override {
    const int64_t dropped =
        kernels::moe_dispatch_plan(slots, order, counts, offsets, experts, N, k,
                                   E, capacity, segment, base);
    std::copy(offsets, offsets + E + 1, host_offsets);
    return dropped;
  }
  void moe_permute_forward(float* out, const float* inp, const int32_t* order,
                           int M, int k, int C) override {
    kernels::moe_permute_forward<float>(out, inp, order, M, k, C);
  }
  void moe_permute_backward(float* dinp, const float* dout,
                            const int32_t* slots, int N, int k,
                            int C) override {
    kernels::moe_permute_backward<float>(dinp, dout, slots, N, k, C);
  }
  void moe_unpermute_forward(float* out, const float* inp, const float* weights,
                             const int32_t* slots, int N, int k,
                             int C) override {
    kernels::moe_unpermute_forward<float>(out, inp, weights, slots, N, k, C);
  }
  void moe_unpermute_backward(float* dinp, float* dweights, const float* dout,
                              const float* inp, const float* weights,
                              const int32_t* slots, int N, int k,
                              int C) override {
    kernels::moe_unpermute_backward<float>(dinp, dweights, dout, inp, weights,
                                           slots, N, k, C);
  }
  void swiglu_backward(float* dgate_up, const float* dout, ConstAct gate_up,
                       int64_t rows, int H) override {
    if (Bf16(gate_up)) {
      kernels::swiglu_backward_bf16_input(
          dgate_up, dout, static_cast<const uint16_t*>(gate_up.p), rows, H);
      return;
    }
    kernels::swiglu_backward(dgate_up, dout, gate_up.f32(), rows, H);
  }
  void bias_forward(float* out, const float* bias, int64_t rows,
                    int OC) override {
    kernels::bias_forward(out, bias, rows, OC);
  }
  void residual_forward(float* out, const float* inp1, const float* inp2,
                        int64_t N) override {
    kernels::residual_forward(out, inp1, inp2, N);
  }
  void crossentropy_parallel_max(float* maxes, const float* logits, int B,
                                 int T, int Vl, int vocab_begin,
                                 int V) override {
    kernels::crossentropy_parallel_max(maxes, logits, B, T, Vl, vocab_begin, V);
  }
  void crossentropy_parallel_exp(float* sums, float* target_shifted,
                                 float* probs, const float* logits,
                                 const float* maxes, const int32_t* targets,
                                 int B, int T, int Vl, int vocab_begin,
                                 int V) override {
    kernels::crossentropy_parallel_exp(sums, target_shifted, probs, logits,
                                       maxes, targets, B, T, Vl, vocab_begin,
                                       V);
  }
  void crossentropy_parallel_finish(float* losses, float* probs,
                                    const float* sums,
                                    const float* target_shifted, int B, int T,
                                    int Vl) override {
    kernels::crossentropy_parallel_finish(losses, probs, sums, target_shifted,
                                          B, T, Vl);
  }
  // bf16 logits: the fp32 composition over their values, a block of rows
  // at a time in scratch (about 4 MiB: a large vocabulary's logits are not
  // unpacked whole), the gradient rounded back over them.
  void crossentropy_forward_backward(float* losses, Act logits,
                                     const int32_t* targets, float dloss,
                                     float* stats, int B, int T, int Vl,
                                     int V) override {
    if (!Bf16(logits)) {
      Ops::crossentropy_forward_backward(losses, logits, targets, dloss, stats,
                                         B, T, Vl, V);
      return;
    }
    const int64_t rows = static_cast<int64_t>(B) * T;
    const int64_t block = std::max<int64_t>(1, (int64_t{1} << 20) / Vl);
    auto* bits = static_cast<uint16_t*>(logits.p);
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
      const int64_t n = std::min(block, rows - r0);
      float* x = kernels::Bf16Scratch(0, n * Vl);
      kernels::FromBf16Values(x, bits + r0 * Vl, n * Vl);
      Ops::crossentropy_forward_backward(losses + r0, x, targets + r0, dloss,
                                         stats, 1, static_cast<int>(n), Vl, V);
      kernels::RoundToBf16Rows(bits + r0 * Vl, x, n, Vl);
    }
  }
  void crossentropy_parallel_backward(float* dlogits, const float* probs,
                                      const int32_t* targets, float dloss,
                                      int B, int T, int Vl,
                                      int vocab_begin) override {
    kernels::crossentropy_parallel_backward(dlogits, probs, targets, dloss, B,
                                            T, Vl, vocab_begin);
  }
  void adamw_update(float* params, float* m, float* v, const float* grads,
                    int64_t N, float lr, float beta1, float beta2, float eps,
                    float weight_decay, int64_t t, float grad_scale) override {
    kernels::adamw_update(params, m, v, grads, N, lr, beta1, beta2, eps,
                          weight_decay, t, grad_scale);
  }
  void adamw_update_runs(float* params, void* params_bf16, float* m, float* v,
                         const float* grads, const Run* runs, int n, float lr,
                         float beta1, float beta2, float eps,
                         float weight_decay, int64_t t,
                         float grad_scale) override {
    if (params_bf16 == nullptr) {
      Ops::adamw_update_runs(params, nullptr, m, v, grads, runs, n, lr, beta1,
                             beta2, eps, weight_decay, t, grad_scale);
      return;
    }
    auto* copy = static_cast<uint16_t*>(params_bf16);
    for (int i = 0; i < n; ++i) {
      const Run& r = runs[i];
      kernels::adamw_update_with_copy(
          params + r.begin, copy + r.begin, m + r.begin, v + r.begin,
          grads + r.begin, r.count, lr, beta1, beta2, eps,
          r.tag != 0 ? weight_decay : 0.0f, t, grad_scale);
    }
  }

 private:
  // x (n) in fp32: itself, or its bf16 values unpacked into the calling
  // thread's scratch `which`.
  const float* AsF32(ConstAct x, int64_t n, int which) const {
    if (!Bf16(x)) return x.f32();
    float* f = kernels::Bf16Scratch(which, n);
    kernels::FromBf16Values(f, static_cast<const uint16_t*>(x.p), n);
    return f;
  }
  // A matmul's weight (OC,C) in fp32: itself, or its bf16 compute copy
  // widened into scratch 3 (which no op uses for anything else). The bf16
  // products round it again to the same values.
  const float* Weight(ConstAct w, int C, int OC) const {
    return AsF32(w, static_cast<int64_t>(C) * OC, 3);
  }
  // Where an op writes `out` (n) in fp32: out itself, or scratch `which`
  // that Finish rounds into it.
  float* F32Target(Act out, int64_t n, int which) const {
    return Bf16(out) ? kernels::Bf16Scratch(which, n) : out.f32();
  }
  void Finish(Act out, const float* y, int64_t rows, int64_t cols) const {
    if (Bf16(out)) {
      kernels::RoundToBf16Rows(static_cast<uint16_t*>(out.p), y, rows, cols);
    }
  }
  // Whether `a` is stored in bf16, which only the bf16 backend takes.
  bool Bf16(ConstAct a) const {
    if (a.type == DType::kF32) return false;
    PT_CHECK(bf16_, "a bf16 activation passed to the fp32 CPU backend");
    return true;
  }

  const bool bf16_;
};

}  // namespace

Ops& CpuOps() {
  static CpuBackend* const backend = new CpuBackend(/*bf16=*/false);
  return *backend;
}

Ops& CpuBf16Ops() {
  static CpuBackend* const backend = new CpuBackend(/*bf16=*/true);
  return *backend;
}

}  // namespace ptrain::kernels
