// The tensor-parallel layers; see layers.h. The math is kernels/cpu's; here
// only where each layer talks to its group.
#include "worker/engine/model/layers.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "kernels/common/math.h"

namespace ptrain {

namespace {

bool Parallel(const TpGroup& g) { return g.size() > 1; }

// (tp, B, Ts, C) <-> (B, T, C): rank r's block of the gathered sequence is
// positions [r·Ts, (r+1)·Ts) of every sequence. to_sequence: ranks -> seq.
void Permute(float* seq, float* ranks, bool to_sequence, int tp, int B, int Ts,
             int C, kernels::Ops& ops) {
  const int64_t run = static_cast<int64_t>(Ts) * C;
  auto at_seq = [&](int r, int b) {
    return seq + (static_cast<int64_t>(b) * tp + r) * run;
  };
  auto at_ranks = [&](int r, int b) {
    return ranks + (static_cast<int64_t>(r) * B + b) * run;
  };
  if (ops.device() != kernels::Device::kCpu) {
    for (int r = 0; r < tp; r++) {
      for (int b = 0; b < B; b++) {
        if (to_sequence) ops.Copy(at_seq(r, b), at_ranks(r, b), run);
        if (!to_sequence) ops.Copy(at_ranks(r, b), at_seq(r, b), run);
      }
    }
    return;
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (int r = 0; r < tp; r++) {
    for (int b = 0; b < B; b++) {
      float* dst = to_sequence ? at_seq(r, b) : at_ranks(r, b);
      const float* src = to_sequence ? at_ranks(r, b) : at_seq(r, b);
      std::memcpy(dst, src, run * sizeof(float));
    }
  }
}

// A column-parallel layer's input over the whole sequence: gathered into
// s.b under sequence parallelism (bf16 data as it is, two to a float), else
// inp itself.
kernels::ConstAct FullSequence(kernels::ConstAct inp, int B, int T, int C,
                               const TpGroup& g, const LayerContext& s) {
  if (!g.sp || !Parallel(g)) return inp;
  if (inp.type == kernels::DType::kF32) {
    sequence_gather(s.b, inp.f32(), B, T, C, g, s.a, s.ops());
    return s.b;
  }
  PT_CHECK(C % 2 == 0, "bf16 activations with an odd width");
  sequence_gather(s.b, static_cast<const float*>(inp.p), B, T, C / 2, g, s.a,
                  s.ops());
  return kernels::ConstAct(s.b, inp.type);
}

// The vocabulary-parallel softmax's statistics over the group: stats holds
// the row maxima, then the sums of exponentials and the target's shifted
// logit (summed over the group), and probs the row's exponentials.
void VocabSoftmaxSums(float* probs, const float* logits, const int32_t* targets,
                      int B, int T, int vocab_begin, int Vl, int V,
                      const TpGroup& g, float* stats, const LayerContext& s) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  float* maxes = stats;
  float* sums = stats + rows;  // followed by target_shifted: one reduction
  float* target_shifted = stats + 2 * rows;
  s.ops().crossentropy_parallel_max(maxes, logits, B, T, Vl, vocab_begin, V);
  g.comm->AllReduceMax(maxes, rows);
  s.ops().crossentropy_parallel_exp(sums, target_shifted, probs, logits, maxes,
                                    targets, B, T, Vl, vocab_begin, V);
  g.comm->AllReduce(sums, 2 * rows);
}

}  // namespace

void sequence_gather(float* full, const float* local, int B, int T, int C,
                     const TpGroup& g, float* scratch, kernels::Ops& ops) {
  if (!g.sp || !Parallel(g)) {
    ops.Copy(full, local, static_cast<int64_t>(B) * T * C);
    return;
  }
  const int Ts = g.SeqLocal(T);
  g.comm->AllGather(local, scratch, static_cast<int64_t>(B) * Ts * C);
  Permute(full, scratch, /*to_sequence=*/true, g.size(), B, Ts, C, ops);
}

void sequence_reduce(float* local, float* partial, int B, int T, int C,
                     const TpGroup& g, float* scratch, kernels::Ops& ops) {
  const int Ts = g.SeqLocal(T);
  const int64_t n_local = static_cast<int64_t>(B) * Ts * C;
  if (Parallel(g)) {
    if (g.sp) {
      // The permuted copy is what is scattered; the reduced part lands in
      // the front of `partial`, which is free by then.
      Permute(partial, scratch, /*to_sequence=*/false, g.size(), B, Ts, C, ops);
      g.comm->ReduceScatter(scratch, partial, n_local);
    } else {
      g.comm->AllReduce(partial, n_local);
    }
  }
  ops.Copy(local, partial, n_local);
}

void column_linears_forward(std::initializer_list<ColumnOut> linears,
                            kernels::ConstAct inp, int B, int T, int C,
                            const TpGroup& g, const LayerContext& s) {
  const kernels::ConstAct full = FullSequence(inp, B, T, C, g, s);
  for (const ColumnOut& l : linears) {
    s.ops().matmul_forward(l.out, full, l.weight, l.bias, B, T, C, l.OCl);
  }
}

void column_linear_forward(kernels::Act out, kernels::ConstAct inp,
                           kernels::ConstAct weight, const float* bias, int B,
                           int T, int C, int OCl, const TpGroup& g,
                           const LayerContext& s) {
  column_linears_forward({{out, weight, bias, OCl}}, inp, B, T, C, g, s);
}

void column_linears_backward(float* dinp, float* part,
                             std::initializer_list<ColumnGrad> linears,
                             kernels::ConstAct inp, int B, int T, int C,
                             const TpGroup& g, const LayerContext& s) {
  const bool parallel = Parallel(g);
  bool weights = false;
  for (const ColumnGrad& l : linears) weights |= l.dweight != nullptr;
  // The whole input is an operand of the weight gradients only.
  const kernels::ConstAct full =
      weights ? FullSequence(inp, B, T, C, g, s) : inp;
  // Under tp this rank's rows of the weights give a part of the input
  // gradient; the group sums the parts (Megatron's f operator, backward).
  float* sum = parallel ? s.a : dinp;
  const int64_t n = static_cast<int64_t>(B) * T * C;
  bool first = true;
  for (const ColumnGrad& l : linears) {
    float* d = dinp == nullptr ? nullptr : first ? sum : part;
    s.ops().matmul_backward(d, l.dweight, l.dbias, l.dout, full, l.weight, B, T,
                            C, l.OCl);
    if (d != nullptr && !first) s.ops().Add(sum, part, n);
    first = false;
  }
  if (dinp != nullptr && parallel) {
    sequence_reduce(dinp, s.a, B, T, C, g, s.b, s.ops());
  }
}

void column_linear_backward(float* dinp, float* dweight, float* dbias,
                            kernels::ConstAct dout, kernels::ConstAct inp,
                            kernels::ConstAct weight, int B, int T, int C,
                            int OCl, const TpGroup& g, const LayerContext& s) {
  column_linears_backward(dinp, nullptr, {{dout, weight, dweight, dbias, OCl}},
                          inp, B, T, C, g, s);
}

void row_linear_forward(float* out, kernels::ConstAct inp,
                        kernels::ConstAct weight, const float* bias, int B,
                        int T, int Cl, int OC, const TpGroup& g,
                        const LayerContext& s, float* gelu_hidden,
                        float* gelu_saved) {
  auto matmul = [&](float* y, const float* b) {
    if (gelu_hidden != nullptr) {
      s.ops().gelu_matmul_forward(y, gelu_hidden, gelu_saved, inp, weight, b, B,
                                  T, Cl, OC);
    } else {
      s.ops().matmul_forward(y, inp, weight, b, B, T, Cl, OC);
    }
  };
  if (!Parallel(g)) {
    matmul(out, bias);
    return;
  }
  // Each rank's columns give a part of the output; the bias joins the sum
  // once, after the reduction (Megatron's g operator).
  matmul(s.a, nullptr);
  sequence_reduce(out, s.a, B, T, OC, g, s.b, s.ops());
  if (bias != nullptr) {
    s.ops().bias_forward(out, bias, static_cast<int64_t>(B) * g.SeqLocal(T),
                         OC);
  }
}

void row_linear_backward(kernels::Act dinp, float* dweight, float* dbias,
                         const float* dout, kernels::ConstAct inp,
                         kernels::ConstAct weight, int B, int T, int Cl, int OC,
                         const TpGroup& g, const LayerContext& s,
                         float* gelu_hidden, const float* gelu_saved) {
  const float* full = dout;
  if (g.sp && Parallel(g)) {
    sequence_gather(s.a, dout, B, T, OC, g, s.b, s.ops());
    full = s.a;
  }
  if (gelu_hidden != nullptr) {
    s.ops().gelu_matmul_backward(dinp, dweight, dbias, full, gelu_hidden,
                                 gelu_saved, inp, weight, B, T, Cl, OC);
  } else {
    s.ops().matmul_backward(dinp.f32(), dweight, dbias, full, inp, weight, B, T,
                            Cl, OC);
  }
}

void CpGroup::TakeLocal(const int32_t* whole, int B, int T,
                        int32_t* local) const {
  const int n = size(), r = rank(), Tl = T / n;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tl; ++t) {
      local[int64_t{b} * Tl + t] =
          whole[int64_t{b} * T + kernels::math::ZigzagPosition(t, Tl, n, r)];
    }
  }
}

namespace {

// The rows this rank holds outside the tensor-parallel regions (Ts of each
// of B sequences of T) and their positions, in pieces of consecutive rows
// at consecutive positions: fn(first row, sequences, rows each, first
// position), as position_forward and position_backward take them. Without
// context parallelism one piece, from position t0 + SeqBegin; under it the
// cp rank's zigzag chunks, each sequence's rows in at most two runs.
template <typename Fn>
void ForEachPositionRun(int B, int T, int t0, const TpGroup& g,
                        const CpGroup& cp, Fn fn) {
  const int Ts = g.SeqLocal(T), r0 = g.SeqBegin(T);
  if (cp.size() == 1) {
    fn(int64_t{0}, B, Ts, t0 + r0);
    return;
  }
  PT_CHECK(t0 == 0, "generation under context parallelism");
  const int chunk = T / 2;
  const int runs[2][2] = {{r0, std::min(r0 + Ts, chunk)},
                          {std::max(r0, chunk), r0 + Ts}};
  for (int b = 0; b < B; ++b) {
    for (const auto& run : runs) {
      if (run[0] < run[1]) {
        fn(int64_t{b} * Ts + run[0] - r0, 1, run[1] - run[0],
           kernels::math::ZigzagPosition(run[0], T, cp.size(), cp.rank()));
      }
    }
  }
}

}  // namespace

void token_embedding_forward(float* out, const int32_t* inp, const float* wte,
                             int B, int T, int C, int vocab_begin, int Vl,
                             const TpGroup& g, const LayerContext& s) {
  if (!Parallel(g)) {
    s.ops().embedding_forward(out, inp, wte, B, T, C, vocab_begin, Vl);
  } else {
    s.ops().embedding_forward(s.a, inp, wte, B, T, C, vocab_begin, Vl);
    sequence_reduce(out, s.a, B, T, C, g, s.b, s.ops());
  }
}

void rope_forward(float* x, int64_t stride, int heads, int hs, int B, int T,
                  int t0, const kernels::math::Rope& rope, bool inverse,
                  const CpGroup& cp, kernels::Ops& ops) {
  ForEachPositionRun(B, T, t0, TpGroup{}, cp,
                     [&](int64_t row, int b, int n, int p) {
                       ops.rope_forward(x + row * stride, stride, b, n, heads,
                                        hs, p, rope, inverse);
                     });
}

void position_embedding_forward(float* out, const float* wpe, int B, int T,
                                int t0, int C, const TpGroup& g,
                                const LayerContext& s, const CpGroup& cp) {
  ForEachPositionRun(B, T, t0, g, cp, [&](int64_t row, int b, int n, int p) {
    s.ops().position_forward(out + row * C, wpe, b, n, C, p);
  });
}

void position_embedding_backward(float* dwpe, const float* dout, int B, int T,
                                 int C, const TpGroup& g, const LayerContext& s,
                                 const CpGroup& cp) {
  ForEachPositionRun(B, T, 0, g, cp, [&](int64_t row, int b, int n, int p) {
    s.ops().position_backward(dwpe, dout + row * C, b, n, C, p);
  });
}

void token_embedding_backward(float* dwte, const float* dout,
                              const int32_t* inp, int B, int T, int C,
                              int vocab_begin, int Vl, const TpGroup& g,
                              const LayerContext& s) {
  const float* full = dout;
  if (g.sp && Parallel(g)) {
    sequence_gather(s.a, dout, B, T, C, g, s.b, s.ops());
    full = s.a;
  }
  s.ops().embedding_backward(dwte, full, inp, B, T, C, vocab_begin, Vl);
}

void vocab_embedding_forward(float* out, const int32_t* inp, const float* wte,
                             const float* wpe, int B, int T, int t0, int C,
                             int vocab_begin, int Vl, const TpGroup& g,
                             const LayerContext& s, const CpGroup& cp) {
  token_embedding_forward(out, inp, wte, B, T, C, vocab_begin, Vl, g, s);
  position_embedding_forward(out, wpe, B, T, t0, C, g, s, cp);
}

void vocab_embedding_backward(float* dwte, float* dwpe, const float* dout,
                              const int32_t* inp, int B, int T, int C,
                              int vocab_begin, int Vl, const TpGroup& g,
                              const LayerContext& s, const CpGroup& cp) {
  position_embedding_backward(dwpe, dout, B, T, C, g, s, cp);
  token_embedding_backward(dwte, dout, inp, B, T, C, vocab_begin, Vl, g, s);
}

void vocab_crossentropy_forward(float* losses, float* probs,
                                const float* logits, const int32_t* targets,
                                int B, int T, int vocab_begin, int Vl, int V,
                                const TpGroup& g, float* stats,
                                const LayerContext& s) {
  if (!Parallel(g)) {
    s.ops().crossentropy_forward(losses, probs, logits, targets, stats, B, T,
                                 Vl, V);
    return;
  }
  VocabSoftmaxSums(probs, logits, targets, B, T, vocab_begin, Vl, V, g, stats,
                   s);
  const int64_t rows = static_cast<int64_t>(B) * T;
  s.ops().crossentropy_parallel_finish(losses, probs, stats + rows,
                                       stats + 2 * rows, B, T, Vl);
}

void vocab_crossentropy_forward_backward(float* losses, kernels::Act logits,
                                         const int32_t* targets, float dloss,
                                         int B, int T, int vocab_begin, int Vl,
                                         int V, const TpGroup& g, float* stats,
                                         const LayerContext& s) {
  if (!Parallel(g)) {
    s.ops().crossentropy_forward_backward(losses, logits, targets, dloss, stats,
                                          B, T, Vl, V);
    return;
  }
  PT_CHECK(logits.type == kernels::DType::kF32,
           "vocabulary-split logits are fp32");
  float* l = logits.f32();
  VocabSoftmaxSums(l, l, targets, B, T, vocab_begin, Vl, V, g, stats, s);
  const int64_t rows = static_cast<int64_t>(B) * T;
  s.ops().crossentropy_parallel_finish_backward(losses, l, stats + rows,
                                                stats + 2 * rows, targets,
                                                dloss, B, T, Vl, vocab_begin);
}

void vocab_crossentropy_backward(float* dlogits, const float* probs,
                                 const int32_t* targets, float dloss, int B,
                                 int T, int vocab_begin, int Vl,
                                 const LayerContext& s) {
  s.ops().crossentropy_parallel_backward(dlogits, probs, targets, dloss, B, T,
                                         Vl, vocab_begin);
}

void ring_attention_forward(float* out, float* lse, const float* qkv, int B,
                            int Tl, int C, int NH, int KVH, const CpGroup& g,
                            float* ring, kernels::Ops& ops) {
  const int cp = g.size(), r = g.rank();
  const kernels::math::AttentionHeads heads =
      kernels::math::MakeAttentionHeads(C, NH, KVH);
  const int64_t R = heads.row(), K2 = 2 * heads.K();
  if (cp == 1) {
    ops.attention_block_forward(out, lse, qkv, qkv + C, R, B, Tl, C, NH, KVH, 1,
                                0, 0, /*first=*/true);
    return;
  }
  const int64_t rows = int64_t{B} * Tl, n = rows * K2;
  const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  // Step s holds rank (r − s)'s keys and values, packed (B,Tl,2K): its own
  // first, then each neighbour's as it arrives, in the other buffer (free
  // again once its block has been passed on).
  float* blocks[2] = {ring, ring + n};
  ops.CopyRows(blocks[0], K2, qkv + C, R, rows, K2, /*add=*/false);
  for (int s = 0; s < cp; ++s) {
    float* block = blocks[s % 2];
    std::unique_ptr<CommHandle> send, recv;
    if (s + 1 < cp) {
      recv = g.comm->RecvAsync(blocks[(s + 1) % 2], n, prev, s);
      send = g.comm->SendAsync(block, n, next, s);
    }
    ops.attention_block_forward(out, lse, qkv, block, K2, B, Tl, C, NH, KVH, cp,
                                r, (r - s + cp) % cp, /*first=*/s == 0);
    if (recv != nullptr) {
      recv->Wait();
      send->Wait();
    }
  }
}

void ring_attention_backward(float* dqkv, const float* dout, const float* qkv,
                             const float* out, const float* lse, int B, int Tl,
                             int C, int NH, int KVH, const CpGroup& g,
                             float* ring, kernels::Ops& ops) {
  const int cp = g.size(), r = g.rank();
  const kernels::math::AttentionHeads heads =
      kernels::math::MakeAttentionHeads(C, NH, KVH);
  const int64_t R = heads.row(), K2 = 2 * heads.K();
  if (cp == 1) {
    ops.attention_block_backward(dqkv, dqkv + C, dout, qkv, out, lse, qkv + C,
                                 R, B, Tl, C, NH, KVH, 1, 0, 0);
    return;
  }
  const int64_t rows = int64_t{B} * Tl, n = rows * K2;
  const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  // Two blocks of keys and values in transit and two gradients of them,
  // packed (B,Tl,2K).
  float* blocks[2] = {ring, ring + n};
  float* grads[2] = {ring + 2 * n, ring + 3 * n};
  ops.CopyRows(blocks[0], K2, qkv + C, R, rows, K2, /*add=*/false);
  float* grad = grads[0];
  ops.Zero(grad, n);
  for (int s = 0; s < cp; ++s) {
    // The block moves on while its gradient is computed; the gradient
    // follows once every key of it has been seen here.
    float* block = blocks[s % 2];
    std::unique_ptr<CommHandle> send, recv;
    if (s + 1 < cp) {
      recv = g.comm->RecvAsync(blocks[(s + 1) % 2], n, prev, 2 * s);
      send = g.comm->SendAsync(block, n, next, 2 * s);
    }
    ops.attention_block_backward(dqkv, grad, dout, qkv, out, lse, block, K2, B,
                                 Tl, C, NH, KVH, cp, r, (r - s + cp) % cp);
    // After the last step the gradient goes home: rank r + 1's block.
    float* grad_in = grads[(s + 1) % 2];
    auto grad_recv = g.comm->RecvAsync(grad_in, n, prev, 2 * s + 1);
    auto grad_send = g.comm->SendAsync(grad, n, next, 2 * s + 1);
    grad_recv->Wait();
    grad_send->Wait();
    grad = grad_in;
    if (recv != nullptr) {
      recv->Wait();
      send->Wait();
    }
  }
  // This rank's own keys and values, with every rank's share of their
  // gradient.
  ops.CopyRows(dqkv + C, R, grad, K2, rows, K2, /*add=*/true);
}

}  // namespace ptrain
