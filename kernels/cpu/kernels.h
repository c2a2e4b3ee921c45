// CPU kernels of the GPT forward and backward passes: pure math on raw buffers.
// No MPI, no model, no allocation; OpenMP inside. Not thread-safe to call on
// overlapping outputs from several threads.
//
// Dimension legend: B batch, T sequence, C channels, OC output channels,
// V vocabulary, NH heads, hs = C / NH head size, N element count.
// Every kernel is instantiated for float (training) and double (gradient
// checks). Tensors are dense row-major.
//
// Conventions (llm.c's): forward and backward sit side by side; backward takes
// forward's arguments mirrored. Every gradient output (`d` + forward name)
// ACCUMULATES (+=), activation gradients included: callers zero them first.
// The exceptions: the cross-entropy's dlogits, written in place of probs,
// and the input gradients of matmul_backward and gelu_backward, written
// (=): what they write is a fresh buffer at every caller, and zeroing it
// first cost a pass over memory and slower (accumulating) GEMMs; and for
// the same reason moe_unpermute_backward's two.
#ifndef PTRAIN_KERNELS_CPU_KERNELS_H_
#define PTRAIN_KERNELS_CPU_KERNELS_H_

#include <cstdint>

#include "kernels/backends.h"
#include "kernels/common/math.h"

namespace ptrain::kernels {

// Row-major C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C(M,N).
// float goes to oneDNN's sgemm, double to BLAS dgemm. Called from inside an
// OpenMP parallel region it runs on the calling thread only.
template <typename F>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, F alpha,
          const F* A, int64_t lda, const F* B, int64_t ldb, F beta, F* C,
          int64_t ldc);

// The same product in bf16: op(A) and op(B) rounded to bf16 (nearest, ties
// to even), products accumulated in fp32 into C (alpha 1), plus `bias` (N,
// fp32, added to every row) when not null. oneDNN's bf16 matmul; fast only
// where CpuHasBf16().
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const float* A, int64_t lda, const float* B, int64_t ldb,
               float beta, float* C, int64_t ldc, const float* bias = nullptr);
// matmul_backward's products in bf16 (as gemm_bf16 rounds them) over
// rows = B*T; dout is rounded once for both, and dbias (OC, may be null)
// sums the unrounded dout.
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias,
                          const float* dout, const float* inp,
                          const float* weight, int64_t rows, int C, int OC);
// matmul_forward in bf16 of GELU(inp) (rows,C): GELU (gelu_forward's, bit
// for bit) is applied as inp is rounded, its fp32 output never written. Its
// rounded output is left in `saved` (rows*C bf16) when not null.
void gelu_matmul_forward_bf16(float* out, const float* inp, const float* weight,
                              const float* bias, int64_t rows, int C, int OC,
                              uint16_t* saved = nullptr);
// matmul_backward_bf16 whose input is GELU(inp): what the forward left in
// `saved`, or (null) applied again as inp is rounded for dweight. `hidden`
// (rows,C) is working space where oneDNN asks for a layout not packed here
// (then it holds GELU(inp)). Either way the same products, bit for bit.
void gelu_matmul_backward_bf16(float* dinp, float* dweight, float* dbias,
                               const float* dout, const float* inp,
                               float* hidden, const float* weight, int64_t rows,
                               int C, int OC, const uint16_t* saved = nullptr);
// matmul_forward and matmul_backward_bf16 of an input stored in bf16
// (inp16, (rows,C) dense): the same products as of the fp32 input it was
// rounded from, without the rounding pass.
void matmul_forward_bf16_input(float* out, const uint16_t* inp16,
                               const float* weight, const float* bias,
                               int64_t rows, int C, int OC);
// The same product rounded to bf16 as oneDNN writes it (out16 (rows,OC)
// bf16, nearest even): a bf16-stored output (qkv, fch) of a bf16-stored
// input, without an fp32 pass.
void matmul_forward_bf16_output(uint16_t* out16, const uint16_t* inp16,
                                const float* weight, const float* bias,
                                int64_t rows, int C, int OC);
void matmul_backward_bf16_input(float* dinp, float* dweight, float* dbias,
                                const float* dout, const uint16_t* inp16,
                                const float* weight, int64_t rows, int C,
                                int OC);
// GELU of a bf16-stored fch in the MLP projection: gelu_matmul_forward_bf16
// and gelu_matmul_backward_bf16 whose inp is bf16 (rows,C): GELU of the
// stored value, rounded (`saved` as there).
void gelu_matmul_forward_bf16_input(float* out, const uint16_t* inp16,
                                    const float* weight, const float* bias,
                                    int64_t rows, int C, int OC,
                                    uint16_t* saved = nullptr);
void gelu_matmul_backward_bf16_input(float* dinp, float* dweight, float* dbias,
                                     const float* dout, const uint16_t* inp16,
                                     const float* weight, int64_t rows, int C,
                                     int OC, const uint16_t* saved = nullptr);
// gelu_backward of a bf16-stored inp (N); dinp may be dout.
void gelu_backward_bf16_input(float* dinp, const uint16_t* inp,
                              const float* dout, int64_t N);
// The same, its output rounded to bf16 (dinp (N) bf16): the gradient of a
// bf16-stored fch, which only the fc matmul's backward reads.
void gelu_backward_bf16(uint16_t* dinp, const uint16_t* inp, const float* dout,
                        int64_t N);
// matmul_backward_bf16 of a bf16-stored dout (dout16 (rows,OC)): the
// products take it as it is, dbias (may be null) sums its values; the
// input bf16-stored (inp16) or fp32 (inp, rounded) — one of the two.
void matmul_backward_bf16_dout(float* dinp, float* dweight, float* dbias,
                               const uint16_t* dout16, const float* inp,
                               const uint16_t* inp16, const float* weight,
                               int64_t rows, int C, int OC);
// The calling thread's fp32 scratch `which` (< 4; n floats, kept) for a
// bf16-stored tensor unpacked, or an output rounded to bf16 afterwards; the
// rounding (src (rows,cols) dense into dst, as gemm_bf16 rounds) and the
// unpacking (exact).
float* Bf16Scratch(int which, int64_t n);
void RoundToBf16Rows(uint16_t* dst, const float* src, int64_t rows,
                     int64_t cols);
void FromBf16Values(float* dst, const uint16_t* src, int64_t n);
// layernorm_forward and residual_layernorm_forward (float) with the output
// rounded to bf16 (out (B,T,C) bf16), as gemm_bf16 would round it.
void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd,
                            const float* inp, const float* weight,
                            const float* bias, int B, int T, int C);
void residual_layernorm_forward_bf16(float* residual, uint16_t* out,
                                     float* mean, float* rstd,
                                     const float* inp1, const float* inp2,
                                     const float* weight, const float* bias,
                                     int B, int T, int C);
// rmsnorm_forward and residual_rmsnorm_forward (float) likewise.
void rmsnorm_forward_bf16(uint16_t* out, float* rstd, const float* inp,
                          const float* weight, float eps, int B, int T, int C);
void residual_rmsnorm_forward_bf16(float* residual, uint16_t* out, float* rstd,
                                   const float* inp1, const float* inp2,
                                   const float* weight, float eps, int B, int T,
                                   int C);
// x rounded to the nearest bf16, as gemm_bf16 rounds its operands.
float Bf16Round(float x);

// out is (B,T,C), inp is (B,T) token ids, wte is (V,C), wpe is (>=T,C).
// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
template <typename F>
void encoder_forward(F* out, const int32_t* inp, const F* wte, const F* wpe,
                     int B, int T, int C);
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* inp,
                      int B, int T, int C);
// The encoder in parts, for a vocabulary split over ranks. wte is (Vl,C):
// rows [vocab_begin, vocab_begin + Vl) of the vocabulary; out (B,T,C) gets
// the row of each token this rank holds and zeros for the others.
template <typename F>
void embedding_forward(F* out, const int32_t* inp, const F* wte, int B, int T,
                       int C, int vocab_begin, int Vl);
template <typename F>
void embedding_backward(F* dwte, const F* dout, const int32_t* inp, int B,
                        int T, int C, int vocab_begin, int Vl);
// out (B,T,C) += wpe[t0 + t]: the batch holds positions [t0, t0 + T).
template <typename F>
void position_forward(F* out, const F* wpe, int B, int T, int C, int t0);
template <typename F>
void position_backward(F* dwpe, const F* dout, int B, int T, int C, int t0);

// out is (B,T,C), mean and rstd are (B,T) saved for backward, inp is (B,T,C),
// weight and bias are (C). eps = 1e-5.
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight,
                       const F* bias, int B, int T, int C);
// residual = inp1 + inp2, then layernorm_forward of it into out, mean and
// rstd, in one pass over the rows: bit for bit residual_forward then
// layernorm_forward, without reading residual back.
template <typename F>
void residual_layernorm_forward(F* residual, F* out, F* mean, F* rstd,
                                const F* inp1, const F* inp2, const F* weight,
                                const F* bias, int B, int T, int C);
template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout,
                        const F* inp, const F* weight, const F* mean,
                        const F* rstd, int B, int T, int C);
// RMSNorm: out = x * rstd * weight per row, rstd = 1/sqrt(mean(x^2) + eps)
// saved for backward (B,T); no bias. Shapes as layernorm_forward's.
template <typename F>
void rmsnorm_forward(F* out, F* rstd, const F* inp, const F* weight, F eps,
                     int B, int T, int C);
// residual = inp1 + inp2, then rmsnorm_forward of it, in one pass over the
// rows (bit for bit the two).
template <typename F>
void residual_rmsnorm_forward(F* residual, F* out, F* rstd, const F* inp1,
                              const F* inp2, const F* weight, F eps, int B,
                              int T, int C);
// dinp and dweight accumulate.
template <typename F>
void rmsnorm_backward(F* dinp, F* dweight, const F* dout, const F* inp,
                      const F* weight, const F* rstd, int B, int T, int C);

// out is (B,T,OC), inp is (B,T,C), weight is (OC,C), bias is (OC) or null.
// out = inp @ weight^T + bias. dinp and dbias may be null (not wanted), and
// dweight with dbias (the input gradient only: a zero-bubble schedule's B
// pass, whose W pass passes a null dinp). The backward writes dinp and
// accumulates dweight and dbias.
// bf16: the products through gemm_bf16 (float only; biases stay fp32).
template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int B,
                    int T, int C, int OC, bool bf16 = false);
template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp,
                     const F* weight, int B, int T, int C, int OC,
                     bool bf16 = false);

// Causal grouped-query self-attention (math::AttentionHeads).
// inp is (B,T,C+2K): per position NH query heads (C = NH*hs, head h at
// columns [h*hs, (h+1)*hs)), then KVH key heads and KVH value heads (K =
// KVH*hs); query head h reads key/value head h / (NH/KVH). KVH = NH is
// multi-head attention, rows (B,T,3C).
// out is (B,T,C), att is (B,NH,T,T): the softmax probabilities, saved for
// backward (entries above the diagonal are 0). Scores are scaled by 1/sqrt(hs).
template <typename F>
void attention_forward(F* out, F* att, const F* inp, int B, int T, int C,
                       int NH, int KVH);
// datt is scratch of (B,NH,T,T), overwritten; dinp is laid out as inp,
// accumulated (a key/value head's gradient sums its group's).
template <typename F>
void attention_backward(F* dinp, F* datt, const F* dout, const F* inp,
                        const F* att, int B, int T, int C, int NH, int KVH);
// The same attention with its products in bf16 (q, k, v, probabilities
// and the gradients entering a product rounded as gemm_bf16 rounds, fp32
// accumulation, softmax in fp32): the bf16 CPU backend's below
// kFlashAttentionT. att holds the probabilities rounded, (B,NH,T,T) bf16
// (half the floats), written only on and below the diagonal; the backward
// needs no datt (null allowed). Fast only where CpuHasBf16().
// Grouped rows (KVH < NH) are read as they are, each key/value head once;
// a key/value head's gradient sums its group's in one order, whatever the
// thread count.
void attention_forward_bf16(float* out, float* att, const float* inp, int B,
                            int T, int C, int NH, int KVH);
void attention_backward_bf16(float* dinp, float* datt, const float* dout,
                             const float* inp, const float* att, int B, int T,
                             int C, int NH, int KVH);
// The same attention without the probabilities (FlashAttention-2's
// scheme): lse (B,NH,T) keeps each query row's log-sum-exp of its scaled
// scores, from which the backward recomputes them tile by tile. Memory is
// O(T) per head instead of O(T²). dinp accumulates; the backward reads the
// forward's out.
template <typename F>
void flash_attention_forward(F* out, F* lse, const F* inp, int B, int T, int C,
                             int NH, int KVH);
template <typename F>
void flash_attention_backward(F* dinp, const F* dout, const F* inp,
                              const F* out, const F* lse, int B, int T, int C,
                              int NH, int KVH);

// Context parallelism's zigzag positions (kernels/common/math.h).
using math::ZigzagPosition;

// Attention between the Tl queries zigzag rank q_rank holds and the Tl keys
// and values rank k_rank holds, of cp: query t sees key j where j's
// position is not after t's (the causal mask across blocks; ring
// attention's pieces). qkv (B,Tl,C+2K) holds the queries as
// attention_forward's inp; kv rows of kv_stride floats hold key heads in
// columns [0,K) and value heads in [K,2K) (another rank's qkv + C with
// stride C+2K, or packed, 2K). The forward folds the block into out (B,Tl,C)
// and lse (B,NH,Tl), each row's log-sum-exp of its scaled scores so far, by the
// log-sum-exp rule (`first`: starts them); a row that sees no key of the
// block is left as it was. Over every rank's block, in any order, out is
// attention_forward's at the rows' positions. The backward of one block
// takes the whole attention's out and lse: dqkv's query columns
// (B,Tl,C+2K) and dkv (laid out as kv) accumulate that block's share.
template <typename F>
void attention_block_forward(F* out, F* lse, const F* qkv, const F* kv,
                             int64_t kv_stride, int B, int Tl, int C, int NH,
                             int KVH, int cp, int q_rank, int k_rank,
                             bool first);
template <typename F>
void attention_block_backward(F* dqkv, F* dkv, const F* dout, const F* qkv,
                              const F* out, const F* lse, const F* kv,
                              int64_t kv_stride, int B, int Tl, int C, int NH,
                              int KVH, int cp, int q_rank, int k_rank);

// The same attention for n new positions [pos, pos + n) of one sequence
// (B = 1), over a cache of every earlier position's keys and values:
// generation without recomputing the prefix. qkv is (n,C+2K) as inp above;
// kcache and vcache are (KVH,capacity,hs) each, and rows [0, pos) of every
// key/value head must hold the earlier positions. The new keys and values are
// written to rows [pos, pos + n), then out (n,C) row i attends to rows [0, pos
// + i]. pos + n <= capacity.
template <typename F>
void attention_decode(F* out, F* kcache, F* vcache, const F* qkv, int n,
                      int pos, int C, int NH, int KVH, int capacity);

// GELU, tanh approximation. out, inp are (N).
template <typename F>
void gelu_forward(F* out, const F* inp, int64_t N);
// dinp = GELU'(inp) * dout, written; dinp may be dout (in place).
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, int64_t N);

// Rotary positions (math.h's Rope), in place: x holds B sequences of n
// rows each (rows `stride` elements apart; sequence b's first row is row
// b·n), each row starting with `heads` heads of hs (even) channels; row t
// of a sequence is at position pos0 + t. `inverse` turns back by the same
// angle (the backward: the gradient of a rotation is the inverse one).
template <typename F>
void rope_forward(F* x, int64_t stride, int B, int n, int heads, int hs,
                  int pos0, const math::Rope& rope, bool inverse);

// SwiGLU: out (rows,H) = silu(gate)·up, where each row of gate_up
// (rows,2H) is [gate (H) | up (H)] (a fused column-parallel matmul's
// output). The backward writes dgate_up (rows,2H) whole.
template <typename F>
void swiglu_forward(F* out, const F* gate_up, int64_t rows, int H);
template <typename F>
void swiglu_backward(F* dgate_up, const F* dout, const F* gate_up, int64_t rows,
                     int H);
// The same of a gate_up stored in bf16 (widened exactly).
void swiglu_forward_bf16_input(float* out, const uint16_t* gate_up,
                               int64_t rows, int H);
void swiglu_backward_bf16_input(float* dgate_up, const float* dout,
                                const uint16_t* gate_up, int64_t rows, int H);

// out (rows,OC) += bias (OC) on every row; its backward is the column sum
// that matmul_backward's dbias computes.
template <typename F>
void bias_forward(F* out, const F* bias, int64_t rows, int OC);

// out = inp1 + inp2, all (N).
template <typename F>
void residual_forward(F* out, const F* inp1, const F* inp2, int64_t N);
template <typename F>
void residual_backward(F* dinp1, F* dinp2, const F* dout, int64_t N);

// Fused softmax + cross-entropy. logits is (B,T,V), targets is (B,T),
// losses is (B,T): -log softmax(logits)[target]; probs is (B,T,V), saved for
// backward; probs may alias logits.
template <typename F>
void crossentropy_softmax_forward(F* losses, F* probs, const F* logits,
                                  const int32_t* targets, int B, int T, int V);
// dlogits = (probs - onehot(targets)) * dloss, where dloss is the gradient of
// the total loss with respect to each position's loss (1/(B*T) for a mean).
// The one backward that OVERWRITES: dlogits may alias probs, so the largest
// activation gradient needs neither its own buffer nor zeroing.
template <typename F>
void crossentropy_softmax_backward(F* dlogits, const F* probs,
                                   const int32_t* targets, F dloss, int B,
                                   int T, int V);

// The same over a vocabulary split by columns: logits is (B,T,Vl), column j
// is vocabulary entry vocab_begin + j, and entries at or past V (padding)
// take no part. A tensor-parallel caller takes the maximum of `maxes` over
// its group after step 1 and the sums of `sums` and `target_shifted` after
// step 2; a single rank calls the steps back to back.
// 1. maxes (B,T) = max of this rank's real logits (-inf when it has none).
template <typename F>
void crossentropy_parallel_max(F* maxes, const F* logits, int B, int T, int Vl,
                               int vocab_begin, int V);
// 2. probs = exp(logits - maxes) on real columns, 0 on padding (may alias
// logits); sums (B,T) = their sum; target_shifted (B,T) = logit of the
// target minus the max where this rank holds the target, else 0.
template <typename F>
void crossentropy_parallel_exp(F* sums, F* target_shifted, F* probs,
                               const F* logits, const F* maxes,
                               const int32_t* targets, int B, int T, int Vl,
                               int vocab_begin, int V);
// 3. probs /= sums; losses (B,T) = log(sums) - target_shifted.
template <typename F>
void crossentropy_parallel_finish(F* losses, F* probs, const F* sums,
                                  const F* target_shifted, int B, int T,
                                  int Vl);
// dlogits (B,T,Vl) = (probs - onehot(targets)) * dloss on this rank's
// columns (overwritten; may alias probs).
template <typename F>
void crossentropy_parallel_backward(F* dlogits, const F* probs,
                                    const int32_t* targets, F dloss, int B,
                                    int T, int Vl, int vocab_begin);

// Mixture-of-Experts routing and dispatch (token choice, top-k). Here N is
// the number of tokens (rows), E the number of experts, k the experts each
// token chooses (k <= E), C channels, and M the (token, choice) pairs kept
// after capacity: M = N·k less the dropped. A pair (t, j) is indexed t·k + j.
//
// The router's score of each expert: math::RouterScore.
using math::RouterScore;

// scores (N,E): each token's scores, saved for backward; experts (N,k): the
// k experts of highest selection score s[e] + bias[e], highest first, ties
// going to the lower expert index. bias (E) may be null: the auxiliary-loss-
// free balancing bias, which changes which experts are chosen but never the
// weights, and has no gradient. weights (N,k): the chosen experts' scores,
// divided by their sum over the k when `normalize` (+1e-20, so a row whose
// scores all underflow gives 0 rather than NaN). Switch and GShard take
// softmax without it, Mixtral softmax with it, DeepSeek-V3 sigmoid with it.
template <typename F>
void moe_router_forward(int32_t* experts, F* weights, F* scores,
                        const F* logits, const F* bias, int N, int E, int k,
                        RouterScore kind, bool normalize);
// dlogits (N,E) += the gradient through weights (N,k) of dweights (N,k),
// experts held fixed.
template <typename F>
void moe_router_backward(F* dlogits, const F* dweights, const int32_t* experts,
                         const F* scores, int N, int E, int k, RouterScore kind,
                         bool normalize);

// The load-balancing auxiliary loss (Switch Transformer, GShard):
//   aux = coef · E · Σ_e f_e · P_e,
//   f_e = (pairs of `experts` naming e) / (N·k), a constant,
//   P_e = (1/N) Σ_t q[t,e], q the softmax probabilities, or for sigmoid the
//         scores normalised to sum 1 over each token's E.
// Equal to coef when routing is uniform, larger as it concentrates. Returns
// aux and adds dloss · d aux / d logits into dlogits (N,E) (dloss: the
// gradient of the training loss with respect to aux; null dlogits: the value
// only). scores and experts are moe_router_forward's (f counts every
// choice, capacity drops or not).
// Part of a sequence of `length` tokens (context parallelism: the others
// on other ranks): `counts` (E) are the whole sequence's pairs per expert,
// f_e = counts[e] / (length·k) and P_e sums these N tokens over length; the
// value returned is then this part's share of aux, the parts' values
// summing to the sequence's. counts null: the N tokens are the sequence.
template <typename F>
F moe_aux_loss(F* dlogits, const F* scores, const int32_t* experts, F coef,
               F dloss, int N, int E, int k, RouterScore kind,
               const F* counts = nullptr, int length = 0);

// The router z-loss (ST-MoE): z = coef · (1/N) Σ_t logsumexp(logits[t])²,
// which keeps the logits small. Returns z and adds dloss · dz / dlogits
// into dlogits (N,E) (null: the value only).
template <typename F>
F moe_z_loss(F* dlogits, const F* logits, F coef, F dloss, int N, int E);

// The dispatch plan of experts (N,k): the pairs in a stable order grouped
// by expert (expert 0's first, each expert's in pair order, so in token
// order), expert e's at [offsets[e], offsets[e+1]) of it. capacity > 0 keeps
// at most that many pairs per expert in each segment of `segment` tokens
// (0: all N; it divides N), the segment's first in token order, and drops
// the rest; 0 drops none. `base` (N/segment × E; null: zeros): each
// segment's pairs per expert before it in its sequence that are not among
// the N (context parallelism: on other ranks), counted against the
// capacity first. Writes counts (E): pairs kept per expert; offsets
// (E+1): their running sum from 0, offsets[E] = M; slots (N,k): each pair's
// position in the order, -1 when dropped; order (N·k): order[s] = the pair
// at position s for s < M, -1 past it. Returns the number dropped, N·k - M.
// Every expert index must lie in [0, E); N·k must fit int32.
int64_t moe_dispatch_plan(int32_t* slots, int32_t* order, int32_t* counts,
                          int32_t* offsets, const int32_t* experts, int N,
                          int k, int E, int capacity, int segment = 0,
                          const int32_t* base = nullptr);

// out (M,C) row s = inp (N,C) row of the token of pair order[s]: the
// experts' input, packed in plan order.
template <typename F>
void moe_permute_forward(F* out, const F* inp, const int32_t* order, int M,
                         int k, int C);
// dinp (N,C) += for each token the sum of dout (M,C) rows at its kept slots
// (an unpermute of weight 1), in choice order.
template <typename F>
void moe_permute_backward(F* dinp, const F* dout, const int32_t* slots, int N,
                          int k, int C);
// out (N,C) row t = Σ_j weights[t,j] · inp[slots[t,j]] over the token's
// kept choices, summed in choice order; inp (M,C) is the experts' output. A
// token with every choice dropped gets zeros (written): a caller adds the
// layer's residual around it, so such a token passes through unchanged.
template <typename F>
void moe_unpermute_forward(F* out, const F* inp, const F* weights,
                           const int32_t* slots, int N, int k, int C);
// dinp (M,C) row slots[t,j] = weights[t,j] · dout[t]; dweights (N,k) =
// dot(dout[t], inp[slots[t,j]]), 0 for a dropped choice. Both WRITTEN, not
// accumulated: each row of dinp belongs to one pair, and both are fresh
// buffers at every caller (the experts' output gradient, the router's
// dweights).
template <typename F>
void moe_unpermute_backward(F* dinp, F* dweights, const F* dout, const F* inp,
                            const F* weights, const int32_t* slots, int N,
                            int k, int C);

// AdamW on a slice of N parameters, PyTorch's formulation:
//   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
//   param -= lr * (weight_decay * param + mhat / (sqrt(vhat) + eps))
// with bias corrections for step t (1-based). grad_scale applies clipping.
template <typename F>
void adamw_update(F* params, F* m, F* v, const F* grads, int64_t N, float lr,
                  float beta1, float beta2, float eps, float weight_decay,
                  int64_t t, float grad_scale);

// adamw_update<float> that also writes each updated parameter rounded to
// bf16 (nearest even) into params_bf16 (N): the compute copy, in the same
// pass.
void adamw_update_with_copy(float* params, uint16_t* params_bf16, float* m,
                            float* v, const float* grads, int64_t N, float lr,
                            float beta1, float beta2, float eps,
                            float weight_decay, int64_t t, float grad_scale);

// Sum of squares of x (N), accumulated in double.
template <typename F>
double sum_squares(const F* x, int64_t N);

}  // namespace ptrain::kernels

#endif  // PTRAIN_KERNELS_CPU_KERNELS_H_
