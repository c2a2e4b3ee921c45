// The tensor-parallel layers of GPT (Megatron's): column- and row-parallel
// linear, vocabulary-parallel embedding and cross-entropy, and the
// conversions between the sequence-parallel and the whole sequence. Not the
// model: a stage (gpt_stage.h) strings them together. Each takes its
// tensor-parallel group explicitly; with no group (tp = 1) it is the plain
// single-rank layer and communicates nothing.
//
// llm.c's conventions: forward and backward side by side, backward takes
// forward's arguments mirrored, every gradient output ACCUMULATES (+=).
//
// Dimensions: B batch, T the whole sequence, Ts = T/tp under sequence
// parallelism (else T), C channels, Cl = C/tp, OC output channels,
// OCl = OC/tp, Vl = Vp/tp rows of the padded vocabulary per rank.
//
// Sequence parallelism (sp): activations outside the tensor-parallel
// regions (LayerNorm, residual stream) are split along T, rank r holding
// positions [r·Ts, (r+1)·Ts). A column-parallel layer all-gathers its input
// along T and reduce-scatters its input gradient; a row-parallel layer
// reduce-scatters its output and all-gathers its output gradient. Without
// sp the same places all-reduce (column backward, row forward).
#ifndef PTRAIN_WORKER_ENGINE_MODEL_LAYERS_H_
#define PTRAIN_WORKER_ENGINE_MODEL_LAYERS_H_

#include <cstdint>
#include <initializer_list>

#include "common/check.h"
#include "kernels/ops.h"
#include "worker/engine/comm/comm.h"

namespace ptrain {

// The tensor-parallel group of a layer. Not owned.
struct TpGroup {
  Communicator* comm = nullptr;  // null: tp = 1
  bool sp = false;               // sequence parallelism
  int size() const { return comm != nullptr ? comm->size() : 1; }
  int rank() const { return comm != nullptr ? comm->rank() : 0; }
  // Positions of the sequence this rank holds outside the regions.
  int SeqLocal(int T) const { return sp ? T / size() : T; }
  int SeqBegin(int T) const { return sp ? rank() * (T / size()) : 0; }
};

// Context parallelism (cp): the group across which every sequence's
// positions are split, zigzag (kernels::ZigzagPosition: rank r holds
// chunks r and 2cp−1−r of 2cp, Tl = T/cp positions, the same causal work
// on every rank). Weights are replicated over it. Not owned.
struct CpGroup {
  Communicator* comm = nullptr;  // null: cp = 1
  int size() const { return comm != nullptr ? comm->size() : 1; }
  int rank() const { return comm != nullptr ? comm->rank() : 0; }
  // This rank's positions of B sequences of T tokens each: `local` gets
  // (B, T/cp), row t of sequence b being `whole`'s position
  // kernels::ZigzagPosition(t) of it. Host memory.
  void TakeLocal(const int32_t* whole, int B, int T, int32_t* local) const;
};

// What every layer call runs with: two scratch buffers of B·T·C floats,
// reused by every call (nothing in them outlives a call), and the backend
// whose memory holds every buffer passed (kernels::CpuOps() for the CPU's);
// the group's communicator must communicate that memory.
struct LayerContext {
  float* a = nullptr;
  float* b = nullptr;
  kernels::Ops* backend = nullptr;
  kernels::Ops& ops() const {
    PT_CHECK(backend != nullptr, "a layer call without its backend");
    return *backend;
  }
};

// Gathers the sequence: full (B,T,C) from every rank's local (B,Ts,C).
// Without sp, a copy. scratch is (B,T,C). Every buffer in `ops`' memory.
void sequence_gather(float* full, const float* local, int B, int T, int C,
                     const TpGroup& g, float* scratch, kernels::Ops& ops);
// Sums partial (B,T,C) over the group into this rank's part: local (B,Ts,C).
// Without sp every rank gets the whole sum. partial is destroyed; scratch
// is (B,T,C).
void sequence_reduce(float* local, float* partial, int B, int T, int C,
                     const TpGroup& g, float* scratch, kernels::Ops& ops);

// Column-parallel linear: weight (OCl,C) holds this rank's rows of the
// whole (OC,C). out (B,T,OCl) = gather(inp) @ weight^T + bias; inp is
// (B,Ts,C); bias (OCl) or null. Under sp the gathered input is rebuilt in
// backward rather than kept (activation memory is the point of sp).
// scratch: a, b.
// inp may be stored in bf16 (a LayerNorm output, Ops::activation_type;
// with an even C): gathered as it is; out too (fch).
void column_linear_forward(kernels::Act out, kernels::ConstAct inp,
                           kernels::ConstAct weight, const float* bias, int B,
                           int T, int C, int OCl, const TpGroup& g,
                           const LayerContext& s);
// dinp (B,Ts,C) = reduce over the group of dout @ weight; dweight, dbias
// accumulate this rank's rows. Either half may be left out (null dinp, or
// null dweight and dbias: Ops::matmul_backward), with its communication.
void column_linear_backward(float* dinp, float* dweight, float* dbias,
                            kernels::ConstAct dout, kernels::ConstAct inp,
                            kernels::ConstAct weight, int B, int T, int C,
                            int OCl, const TpGroup& g, const LayerContext& s);

// Several column-parallel linears over one input, each with a tensor of its
// own (a projection kept as several tensors: Llama's q_proj, k_proj and
// v_proj): under sp the input is gathered once for them all, and their
// input gradients are summed before one reduction. column_linear_forward
// and column_linear_backward are the case of one.
struct ColumnOut {
  kernels::Act out;  // (B,T,OCl)
  kernels::ConstAct weight;
  const float* bias;
  int OCl;
};
void column_linears_forward(std::initializer_list<ColumnOut> linears,
                            kernels::ConstAct inp, int B, int T, int C,
                            const TpGroup& g, const LayerContext& s);
struct ColumnGrad {
  kernels::ConstAct dout;  // (B,T,OCl)
  kernels::ConstAct weight;
  float* dweight;
  float* dbias;
  int OCl;
};
// dinp (B,Ts,C) = reduce over the group of the sum over the linears of
// dout @ weight; each dweight, dbias accumulates. `part`: (B,T,C) floats
// of working space, the second and later linears' input gradients (unused
// with one linear or a null dinp).
void column_linears_backward(float* dinp, float* part,
                             std::initializer_list<ColumnGrad> linears,
                             kernels::ConstAct inp, int B, int T, int C,
                             const TpGroup& g, const LayerContext& s);

// Row-parallel linear: weight (OC,Cl) holds this rank's columns of the whole
// (OC,C). out (B,Ts,OC) = reduce(inp @ weight^T) + bias; inp is (B,T,Cl),
// bias (OC) is added once, after the reduction. scratch: a, b.
// `gelu_hidden` (B,T,Cl), when set: the layer's input is GELU(inp) instead
// of inp, computed there (or as the backend's matmul reads inp) in forward
// and again in backward, its fp32 values never kept (the MLP's projection).
// `gelu_saved`, when set, is what the backend keeps of it from forward to
// backward (Ops::gelu_saved_floats).
void row_linear_forward(float* out, kernels::ConstAct inp,
                        kernels::ConstAct weight, const float* bias, int B,
                        int T, int Cl, int OC, const TpGroup& g,
                        const LayerContext& s, float* gelu_hidden = nullptr,
                        float* gelu_saved = nullptr);
// dinp (B,T,Cl) = gather(dout) @ weight; dweight += gather(dout)^T inp;
// dbias += column sums of gather(dout) (the same on every rank). Either
// half may be left out, as in column_linear_backward (each gathers dout).
void row_linear_backward(kernels::Act dinp, float* dweight, float* dbias,
                         const float* dout, kernels::ConstAct inp,
                         kernels::ConstAct weight, int B, int T, int Cl, int OC,
                         const TpGroup& g, const LayerContext& s,
                         float* gelu_hidden = nullptr,
                         const float* gelu_saved = nullptr);

// Rotary positions (Ops::rope_forward) on x (B,T rows `stride` floats
// apart, `heads` heads of hs channels each from the row's start) at this
// rank's positions: [t0, t0 + T), or under context parallelism (t0 0) the
// cp rank's zigzag positions. `inverse`: the backward's rotation.
void rope_forward(float* x, int64_t stride, int heads, int hs, int B, int T,
                  int t0, const kernels::math::Rope& rope, bool inverse,
                  const CpGroup& cp, kernels::Ops& ops);

// Vocabulary-parallel token embedding: wte (Vl,C) holds vocabulary rows
// [vocab_begin, vocab_begin + Vl). out (B,Ts,C) = reduce(rows of inp held
// here), inp (B,T). scratch: a, b.
void token_embedding_forward(float* out, const int32_t* inp, const float* wte,
                             int B, int T, int C, int vocab_begin, int Vl,
                             const TpGroup& g, const LayerContext& s);
// dwte += rows of gather(dout) for the tokens held here.
void token_embedding_backward(float* dwte, const float* dout,
                              const int32_t* inp, int B, int T, int C,
                              int vocab_begin, int Vl, const TpGroup& g,
                              const LayerContext& s);
// Learned positions: out (B,Ts,C) += wpe (>=t0+T,C) at this rank's
// positions: of inp's tokens at [t0, t0 + T) (t0 > 0: generation
// continuing a cached prefix), or under context parallelism (cp > 1, t0
// 0) the cp rank's zigzag positions, of those the rank's Ts under sp.
void position_embedding_forward(float* out, const float* wpe, int B, int T,
                                int t0, int C, const TpGroup& g,
                                const LayerContext& s, const CpGroup& cp = {});
// dwpe += dout at this rank's positions (under sp only those: the caller
// sums dwpe over the group, as it does LayerNorm's gradients).
void position_embedding_backward(float* dwpe, const float* dout, int B, int T,
                                 int C, const TpGroup& g, const LayerContext& s,
                                 const CpGroup& cp = {});
// Both: GPT-2's embedding, the token's then its position's; the backward
// in reverse.
void vocab_embedding_forward(float* out, const int32_t* inp, const float* wte,
                             const float* wpe, int B, int T, int t0, int C,
                             int vocab_begin, int Vl, const TpGroup& g,
                             const LayerContext& s, const CpGroup& cp = {});
void vocab_embedding_backward(float* dwte, float* dwpe, const float* dout,
                              const int32_t* inp, int B, int T, int C,
                              int vocab_begin, int Vl, const TpGroup& g,
                              const LayerContext& s, const CpGroup& cp = {});

// Vocabulary-parallel softmax + cross-entropy over the (B,T,Vl) logits of
// this rank's vocabulary columns (entries at or past V pad the vocabulary).
// losses (B,T), the same on every rank; probs (B,T,Vl), saved for backward,
// may alias logits. stats is scratch of 3·B·T floats. The logits are never
// gathered.
void vocab_crossentropy_forward(float* losses, float* probs,
                                const float* logits, const int32_t* targets,
                                int B, int T, int vocab_begin, int Vl, int V,
                                const TpGroup& g, float* stats,
                                const LayerContext& s);
// dlogits (B,T,Vl) = (probs - onehot(targets)) · dloss on this rank's
// columns, overwritten (may alias probs): nothing to communicate.
void vocab_crossentropy_backward(float* dlogits, const float* probs,
                                 const int32_t* targets, float dloss, int B,
                                 int T, int vocab_begin, int Vl,
                                 const LayerContext& s);
// Both at once for training (the fused classifier): losses as the forward's,
// and `logits` overwritten with what the backward leaves (no probabilities
// in between); the forward's communication, none more.
void vocab_crossentropy_forward_backward(float* losses, kernels::Act logits,
                                         const int32_t* targets, float dloss,
                                         int B, int T, int vocab_begin, int Vl,
                                         int V, const TpGroup& g, float* stats,
                                         const LayerContext& s);

// Ring attention: causal attention of this rank's Tl queries (qkv
// (B,Tl,3C), its positions' rows) over every position of the sequence.
// The keys and values of each rank travel the ring (rank r receives from
// r−1 and passes on to r+1), the next block's transfer in flight while the
// current one's attention is computed, each folded in with the
// log-sum-exp rule: out (B,Tl,C) and lse (B,NH,Tl), each row's log-sum-exp,
// which the backward needs. qkv: grouped-query rows of KVH key/value heads
// (kernels/ops.h attention_forward; C + 2K wide, K = KVH·C/NH). `ring`:
// 2·B·Tl·2K floats of the backend's memory (the keys and values in
// transit, packed). cp = 1: the attention of the block over itself,
// nothing sent (`ring` unused).
void ring_attention_forward(float* out, float* lse, const float* qkv, int B,
                            int Tl, int C, int NH, int KVH, const CpGroup& g,
                            float* ring, kernels::Ops& ops);
// dqkv (laid out as qkv) accumulates the gradient of this rank's queries,
// keys and values: each block goes round the ring again with the gradient
// of its keys and values, which every rank adds to, and is back with its
// owner after cp steps. `ring`: 4·B·Tl·2K floats (two blocks of keys and
// values and their gradients, packed).
void ring_attention_backward(float* dqkv, const float* dout, const float* qkv,
                             const float* out, const float* lse, int B, int Tl,
                             int C, int NH, int KVH, const CpGroup& g,
                             float* ring, kernels::Ops& ops);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_LAYERS_H_
