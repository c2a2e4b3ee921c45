// The backend seam: the kernels the engine runs, on buffers of one
// backend's memory (host for the CPU, a GPU's for CUDA), behind one
// interface so that a model is written once. The op names and arguments are
// kernels/cpu/kernels.h's (llm.c's mirrored forward/backward, gradients
// accumulate but for the input gradients of matmul_backward and
// gelu_backward, which are written); each backend documents only what
// differs.
//
// Tokens and targets come from the host: a backend stages them into its
// memory with StageTokens. Everything else stays on the backend; ToHost /
// FromHost are for checkpoints, logs and sampling.
#ifndef PTRAIN_KERNELS_OPS_H_
#define PTRAIN_KERNELS_OPS_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "kernels/common/math.h"

namespace ptrain::kernels {

enum class Device { kCpu, kCuda };

// How a tensor of activations is stored: fp32, or bf16 (two bytes an
// element, rounded to nearest even) where a backend computing in bf16 keeps
// the activations Ops::activation_type names.
enum class DType { kF32, kBf16 };

// A tensor of activations in a backend's memory and its type; a float
// pointer is an fp32 one. bf16 data sits in a float buffer two to a float.
struct Act {
  void* p = nullptr;
  DType type = DType::kF32;
  Act(float* f) : p(f) {}  // NOLINT: fp32, as every other tensor
  Act(void* data, DType t) : p(data), type(t) {}
  float* f32() const { return static_cast<float*>(p); }
};
struct ConstAct {
  const void* p = nullptr;
  DType type = DType::kF32;
  ConstAct(const float* f) : p(f) {}         // NOLINT
  ConstAct(Act a) : p(a.p), type(a.type) {}  // NOLINT
  ConstAct(const void* data, DType t) : p(data), type(t) {}
  const float* f32() const { return static_cast<const float*>(p); }
  // The tensor from element n on (n elements of its type further).
  ConstAct Offset(int64_t n) const {
    const int64_t bytes = n * (type == DType::kBf16 ? 2 : 4);
    return ConstAct(static_cast<const char*>(p) + bytes, type);
  }
};

// Ops recorded once and run again as a unit (on a GPU a CUDA graph: one
// launch instead of one per op): Ops::Capture makes one.
class OpsGraph {
 public:
  virtual ~OpsGraph() = default;
  // Issues the recorded ops again, in their order, on the same buffers and
  // with the same arguments as recorded. False, with nothing issued, where
  // the graph can no longer be replayed: the backend has since moved a
  // buffer of its own the ops use (its scratch grew); capture again.
  virtual bool Replay() = 0;
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // Memory of this backend. Alloc returns zeroed floats (never null for
  // n > 0; out of memory is fatal).
  virtual float* Alloc(int64_t n) = 0;
  virtual void Free(float* p) = 0;
  virtual int32_t* AllocTokens(int64_t n) = 0;
  virtual void FreeTokens(int32_t* p) = 0;
  // host (n) -> the backend: returns `host` itself where the backend reads
  // host memory, else copies into `staging` (n, AllocTokens') and returns it.
  virtual const int32_t* StageTokens(int32_t* staging, const int32_t* host,
                                     int64_t n) = 0;
  virtual void ToHost(float* host, const float* src, int64_t n) = 0;
  virtual void FromHost(float* dst, const float* host, int64_t n) = 0;
  // Host memory the backend copies to and from fastest and asynchronously
  // (page-locked on a GPU; on the CPU its own memory); null when that much
  // cannot be had. FreeHost gives it back.
  virtual float* AllocHost(int64_t n) { return Alloc(n); }
  virtual void FreeHost(float* p) { Free(p); }
  // Copies between the backend's memory and AllocHost memory on a copy
  // queue beside the compute queue, each after the work issued before it
  // and in the order issued. ToHostAsync returns a number to wait for:
  // WaitCopy(k) returns once copy k and every copy before it are done.
  // ComputeAfterCopies(): the backend's later work waits for every copy
  // issued so far (the host does not wait). The defaults copy at once.
  virtual int64_t ToHostAsync(float* host, const float* src, int64_t n) {
    ToHost(host, src, n);
    return 0;
  }
  virtual void FromHostAsync(float* dst, const float* host, int64_t n) {
    FromHost(dst, host, n);
  }
  virtual void WaitCopy(int64_t k) { (void)k; }
  virtual void ComputeAfterCopies() {}
  // The type this backend may keep activations in that matmuls, attention
  // and GELU read: bf16 where it computes matmuls in bf16, else fp32. The
  // LayerNorm outputs (the values a matmul would round them to anyway),
  // attention's input (qkv) and output, and the MLP's hidden layer before
  // GELU (fch). The ops with Act or ConstAct arguments take such tensors;
  // every other argument is fp32.
  virtual DType activation_type() const { return DType::kF32; }
  // Capture: the ops `fn` issues on this backend are recorded, not run, and
  // the returned graph issues them (OpsGraph::Replay). Only ops whose every
  // argument is fixed at capture can be recorded: the host values they
  // take (sizes, scalars, pointers) are kept as they were, so a replay
  // reads and writes the same buffers; whatever changes from one replay to
  // the next must be written into those buffers before it. What cannot be
  // recorded — allocation, a copy to or from the host (StageTokens
  // included), a wait for the device or a result read on the host (Sum,
  // SumSquares, Synchronize) — fails the capture: null with *error saying
  // which, nothing has run, and fn's ops must be issued again. Host code in
  // fn runs once, at capture. CaptureUnsupported(): why this backend
  // records nothing ("" where it can; the CPU cannot: launches cost it
  // nothing).
  virtual std::string CaptureUnsupported() const {
    return "the " + name() + " backend does not record ops";
  }
  virtual std::unique_ptr<OpsGraph> Capture(const std::function<void()>& fn,
                                            std::string* error) {
    (void)fn;
    *error = CaptureUnsupported();
    return nullptr;
  }
  // Waits until every op issued so far is done (a no-op on the CPU).
  virtual void Synchronize() = 0;
  // True when `p` points into this backend's memory and the host cannot
  // read it directly (never on the CPU): a communicator over host memory
  // must stage it.
  virtual bool IsDeviceMemory(const void* p) const = 0;

  virtual void Zero(float* p, int64_t n) = 0;
  virtual void Copy(float* dst, const float* src, int64_t n) = 0;
  virtual void Add(float* dst, const float* src, int64_t n) = 0;  // dst += src
  // `rows` rows of `cols` floats from src (rows `src_stride` apart) to dst
  // (rows `dst_stride` apart): copied, or with `add` added (dst += src).
  // Column slices of row-major tensors (ring attention's keys and values).
  virtual void CopyRows(float* dst, int64_t dst_stride, const float* src,
                        int64_t src_stride, int64_t rows, int64_t cols,
                        bool add) = 0;
  // rows × cols activations (dense) from src's type into dst's: fp32 to
  // bf16 rounds to nearest even, bf16 to fp32 is exact, the same type
  // copies. For kernels that take fp32 only (ring attention's blocks).
  virtual void Convert(Act dst, ConstAct src, int64_t rows, int64_t cols) = 0;
  // Sum of x (n), in double, on the host.
  virtual double Sum(const float* x, int64_t n) = 0;
  virtual double SumSquares(const float* x, int64_t n) = 0;

  virtual void embedding_forward(float* out, const int32_t* inp,
                                 const float* wte, int B, int T, int C,
                                 int vocab_begin, int Vl) = 0;
  virtual void embedding_backward(float* dwte, const float* dout,
                                  const int32_t* inp, int B, int T, int C,
                                  int vocab_begin, int Vl) = 0;
  virtual void position_forward(float* out, const float* wpe, int B, int T,
                                int C, int t0) = 0;
  virtual void position_backward(float* dwpe, const float* dout, int B, int T,
                                 int C, int t0) = 0;
  virtual void layernorm_forward(Act out, float* mean, float* rstd,
                                 const float* inp, const float* weight,
                                 const float* bias, int B, int T, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias,
                                  const float* dout, const float* inp,
                                  const float* weight, const float* mean,
                                  const float* rstd, int B, int T, int C) = 0;
  // RMSNorm (kernels/cpu/kernels.h rmsnorm_forward): out = x * rstd *
  // weight, rstd (B,T) kept for the backward; eps is the model's.
  virtual void rmsnorm_forward(Act out, float* rstd, const float* inp,
                               const float* weight, float eps, int B, int T,
                               int C) = 0;
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout,
                                const float* inp, const float* weight,
                                const float* rstd, int B, int T, int C) = 0;
  // The weight of the matmuls below may be bf16 (the compute copy a store
  // keeps beside the fp32 master weights where the backend computes in
  // bf16, Ops::activation_type): taken as it is, the same values the
  // backend would have rounded an fp32 weight to.
  virtual void matmul_forward(Act out, ConstAct inp, ConstAct weight,
                              const float* bias, int B, int T, int C,
                              int OC) = 0;
  // dout may be stored in bf16 (the MLP hidden layer's gradient, which
  // gelu_matmul_backward writes in the stored type): the products take it as
  // it is and dbias sums its bf16 values. Either half may be left out: a
  // null dinp computes the weight gradients only, a null dweight (and
  // dbias) the input gradient only — a zero-bubble schedule's W and B
  // passes, each bit for bit what the whole backward computes.
  // gelu_matmul_backward likewise (dinp.p null, or dweight null).
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias,
                               ConstAct dout, ConstAct inp, ConstAct weight,
                               int B, int T, int C, int OC) = 0;
  // matmul_forward of GELU(inp), GELU's fp32 output not kept: `hidden`
  // (B,T,C) is working space for it, which a backend that applies GELU as it
  // reads inp may leave alone. The model's MLP projection, whose backward
  // (gelu_matmul_backward) computes GELU(inp) again, or reads what the
  // forward left in `saved` (gelu_saved_floats; none by default, and null
  // there): the bf16 CPU backend keeps the operand it rounded.
  // The defaults take an fp32 inp only (a backend that stores bf16
  // overrides them).
  virtual void gelu_matmul_forward(float* out, float* hidden, float* saved,
                                   ConstAct inp, ConstAct weight,
                                   const float* bias, int B, int T, int C,
                                   int OC) {
    (void)saved;
    gelu_forward(hidden, inp.f32(), static_cast<int64_t>(B) * T * C);
    matmul_forward(out, hidden, weight, bias, B, T, C, OC);
  }
  // matmul_backward whose input is GELU(inp), through GELU: dinp is the
  // gradient of inp itself (the MLP's hidden layer before GELU), written in
  // dinp.type — the stored type where inp is stored, as it feeds only the
  // backward of the matmul that made inp. GELU(inp) is computed again
  // (`hidden` as above), or read from what the forward of this inp left in
  // `saved` when not null: the same result either way. The default: the
  // two ops over fp32 tensors.
  virtual void gelu_matmul_backward(Act dinp, float* dweight, float* dbias,
                                    const float* dout, float* hidden,
                                    const float* saved, ConstAct inp,
                                    ConstAct weight, int B, int T, int C,
                                    int OC) {
    (void)saved;
    const int64_t n = static_cast<int64_t>(B) * T * C;
    if (dweight != nullptr) gelu_forward(hidden, inp.f32(), n);
    matmul_backward(dinp.f32(), dweight, dbias, dout, hidden, weight, B, T, C,
                    OC);
    if (dinp.p != nullptr) gelu_backward(dinp.f32(), inp, dinp.f32(), n);
  }
  // Floats of `saved` above for `rows` rows of C.
  virtual int64_t gelu_saved_floats(int64_t rows, int C) const {
    (void)rows;
    (void)C;
    return 0;
  }
  // Causal grouped-query attention over inp (B,T,NH+2·KVH,hs) into out
  // (B,T,NH,hs): each row holds NH query heads, then KVH key heads, then
  // KVH value heads (C = NH·hs; KVH divides NH; KVH = NH is multi-head
  // attention, rows of 3C). Query head h reads key/value head
  // h / (NH / KVH); keys and values are never repeated. `att` holds what
  // the forward keeps for the backward (attention_saved_floats: the
  // (B,NH,T,T) probabilities by default); `datt` is the backward's scratch
  // (attention_scratch_floats). The backward also reads the forward's out,
  // and writes dinp (laid out as inp) whole (not added to: it needs no
  // zeroing before); a key/value head's gradient sums its query heads'.
  virtual void attention_forward(Act out, float* att, ConstAct inp, int B,
                                 int T, int C, int NH, int KVH) = 0;
  virtual void attention_backward(float* dinp, float* datt, const float* dout,
                                  ConstAct inp, ConstAct out, const float* att,
                                  int B, int T, int C, int NH, int KVH) = 0;
  // Context parallelism's attention between the zigzag blocks of ranks
  // q_rank and k_rank of cp (kernels/cpu/kernels.h attention_block_forward
  // and attention_block_backward; ring attention's pieces): fp32 tensors,
  // qkv rows as attention_forward's inp, kv and dkv rows of kv_stride
  // floats (KVH key heads, then KVH value heads).
  virtual void attention_block_forward(float* out, float* lse, const float* qkv,
                                       const float* kv, int64_t kv_stride,
                                       int B, int Tl, int C, int NH, int KVH,
                                       int cp, int q_rank, int k_rank,
                                       bool first) = 0;
  virtual void attention_block_backward(float* dqkv, float* dkv,
                                        const float* dout, const float* qkv,
                                        const float* out, const float* lse,
                                        const float* kv, int64_t kv_stride,
                                        int B, int Tl, int C, int NH, int KVH,
                                        int cp, int q_rank, int k_rank) = 0;
  // Generation's cached attention for n new positions [pos, pos + n) of one
  // sequence: qkv (n,C+2K) as attention_forward's inp (K = KVH·hs), caches
  // (KVH,capacity,hs) each, out (n,C) (kernels/cpu/kernels.h
  // attention_decode).
  virtual void attention_decode(Act out, float* kcache, float* vcache,
                                ConstAct qkv, int n, int pos, int C, int NH,
                                int KVH, int capacity) = 0;
  virtual int64_t attention_saved_floats(int64_t B, int64_t T, int C,
                                         int NH) const {
    (void)C;
    return B * NH * T * T;
  }
  virtual int64_t attention_scratch_floats(int64_t B, int64_t T, int C,
                                           int NH) const {
    return attention_saved_floats(B, T, C, NH);
  }
  virtual void gelu_forward(float* out, const float* inp, int64_t N) = 0;
  virtual void gelu_backward(float* dinp, ConstAct inp, const float* dout,
                             int64_t N) = 0;
  // Rotary positions (kernels/cpu/kernels.h rope_forward), in place: x
  // holds B sequences of n rows each, rows `stride` floats apart, each row
  // `heads` heads of hs channels from its start; row t of a sequence is at
  // position pos0 + t. `inverse` turns back (the gradient's rotation). fp32.
  virtual void rope_forward(float* x, int64_t stride, int B, int n, int heads,
                            int hs, int pos0, const math::Rope& rope,
                            bool inverse) = 0;
  // SwiGLU (kernels/cpu/kernels.h swiglu_forward): out (rows,H) =
  // silu(gate)·up from gate_up (rows,2H), [gate | up] per row, stored in
  // fp32 or bf16; the backward writes dgate_up whole. out, dout and
  // dgate_up fp32.
  virtual void swiglu_forward(float* out, ConstAct gate_up, int64_t rows,
                              int H) = 0;
  virtual void swiglu_backward(float* dgate_up, const float* dout,
                               ConstAct gate_up, int64_t rows, int H) = 0;
  // Mixture-of-Experts routing and dispatch (kernels/cpu/kernels.h moe_*,
  // where each is defined): fp32 tensors; int32 indices and counts in the
  // backend's memory (AllocTokens'). The defaults stop the process: a
  // backend without them is refused MoE jobs before they start.
  virtual void moe_router_forward(int32_t* experts, float* weights,
                                  float* scores, const float* logits,
                                  const float* bias, int N, int E, int k,
                                  math::RouterScore kind, bool normalize) {
    Unsupported("moe_router_forward");
  }
  virtual void moe_router_backward(float* dlogits, const float* dweights,
                                   const int32_t* experts, const float* scores,
                                   int N, int E, int k, math::RouterScore kind,
                                   bool normalize) {
    Unsupported("moe_router_backward");
  }
  // The load-balancing loss of each run of `segment` tokens (N/segment of
  // them, a sequence each), as moe_aux_loss: returns the sum of their
  // values, on the host, and adds dloss times each one's gradient into
  // dlogits (null: the values only). `counts` (N/segment × E, host; null:
  // each run's own): each run's sequence's pairs per expert, the sequence
  // being `length` tokens of which the run is part (context parallelism).
  virtual double moe_aux_loss(float* dlogits, const float* scores,
                              const int32_t* experts, float coef, float dloss,
                              int N, int segment, int E, int k,
                              math::RouterScore kind, const float* counts,
                              int length) {
    Unsupported("moe_aux_loss");
  }
  virtual double moe_z_loss(float* dlogits, const float* logits, float coef,
                            float dloss, int N, int E) {
    Unsupported("moe_z_loss");
  }
  // moe_dispatch_plan, its offsets also copied to host_offsets (E+1, host
  // memory: the experts' matmuls are sized by them); `base` in host memory.
  virtual int64_t moe_dispatch_plan(int32_t* slots, int32_t* order,
                                    int32_t* counts, int32_t* offsets,
                                    int32_t* host_offsets,
                                    const int32_t* experts, int N, int k, int E,
                                    int capacity, int segment,
                                    const int32_t* base) {
    Unsupported("moe_dispatch_plan");
  }
  virtual void moe_permute_forward(float* out, const float* inp,
                                   const int32_t* order, int M, int k, int C) {
    Unsupported("moe_permute_forward");
  }
  virtual void moe_permute_backward(float* dinp, const float* dout,
                                    const int32_t* slots, int N, int k, int C) {
    Unsupported("moe_permute_backward");
  }
  virtual void moe_unpermute_forward(float* out, const float* inp,
                                     const float* weights, const int32_t* slots,
                                     int N, int k, int C) {
    Unsupported("moe_unpermute_forward");
  }
  virtual void moe_unpermute_backward(float* dinp, float* dweights,
                                      const float* dout, const float* inp,
                                      const float* weights,
                                      const int32_t* slots, int N, int k,
                                      int C) {
    Unsupported("moe_unpermute_backward");
  }
  virtual void bias_forward(float* out, const float* bias, int64_t rows,
                            int OC) = 0;
  virtual void residual_forward(float* out, const float* inp1,
                                const float* inp2, int64_t N) = 0;
  // residual = inp1 + inp2 (B,T,C), then layernorm_forward of it: the
  // residual stream's add and the next LayerNorm. By default the two ops;
  // a backend may do both in one pass (bit for bit the same).
  virtual void residual_layernorm_forward(float* residual, Act out, float* mean,
                                          float* rstd, const float* inp1,
                                          const float* inp2,
                                          const float* weight,
                                          const float* bias, int B, int T,
                                          int C) {
    residual_forward(residual, inp1, inp2, static_cast<int64_t>(B) * T * C);
    layernorm_forward(out, mean, rstd, residual, weight, bias, B, T, C);
  }
  // residual = inp1 + inp2, then rmsnorm_forward of it, as
  // residual_layernorm_forward.
  virtual void residual_rmsnorm_forward(float* residual, Act out, float* rstd,
                                        const float* inp1, const float* inp2,
                                        const float* weight, float eps, int B,
                                        int T, int C) {
    residual_forward(residual, inp1, inp2, static_cast<int64_t>(B) * T * C);
    rmsnorm_forward(out, rstd, residual, weight, eps, B, T, C);
  }
  virtual void crossentropy_parallel_max(float* maxes, const float* logits,
                                         int B, int T, int Vl, int vocab_begin,
                                         int V) = 0;
  virtual void crossentropy_parallel_exp(float* sums, float* target_shifted,
                                         float* probs, const float* logits,
                                         const float* maxes,
                                         const int32_t* targets, int B, int T,
                                         int Vl, int vocab_begin, int V) = 0;
  virtual void crossentropy_parallel_finish(float* losses, float* probs,
                                            const float* sums,
                                            const float* target_shifted, int B,
                                            int T, int Vl) = 0;
  // The three steps above over a vocabulary this rank holds whole
  // (vocab_begin 0; Vl columns, the first V real), with nothing to reduce
  // in between: losses (B,T), probs (B,T,Vl, may alias logits); stats is
  // (3,B,T) scratch. A backend may fuse them into fewer passes.
  virtual void crossentropy_forward(float* losses, float* probs,
                                    const float* logits, const int32_t* targets,
                                    float* stats, int B, int T, int Vl, int V) {
    const int64_t rows = static_cast<int64_t>(B) * T;
    float* sums = stats + rows;
    float* target_shifted = stats + 2 * rows;
    crossentropy_parallel_max(stats, logits, B, T, Vl, 0, V);
    crossentropy_parallel_exp(sums, target_shifted, probs, logits, stats,
                              targets, B, T, Vl, 0, V);
    crossentropy_parallel_finish(losses, probs, sums, target_shifted, B, T, Vl);
  }
  // Overwrites dlogits, which may alias probs (kernels.h).
  virtual void crossentropy_parallel_backward(float* dlogits,
                                              const float* probs,
                                              const int32_t* targets,
                                              float dloss, int B, int T, int Vl,
                                              int vocab_begin) = 0;
  // Training's loss and its gradient together (the fused classifier): over
  // a vocabulary this rank holds whole, losses (B,T) as crossentropy_forward
  // gives them, and `logits` (B,T,Vl) overwritten with dlogits =
  // (softmax - onehot(target)) * dloss, 0 in the padding columns: what
  // crossentropy_forward then crossentropy_parallel_backward in place leave,
  // bit for bit on the CPU (the default). No probabilities are kept: a
  // backend may do it in two passes over each row. stats as
  // crossentropy_forward's. Logits stored in bf16 (the stored type, where
  // the model fuses the classifier of a whole vocabulary): the loss of
  // their values, the gradient written over them rounded to bf16 (only the
  // head's matmul backward reads it). The default takes fp32 logits only.
  virtual void crossentropy_forward_backward(float* losses, Act logits,
                                             const int32_t* targets,
                                             float dloss, float* stats, int B,
                                             int T, int Vl, int V) {
    float* l = logits.f32();
    crossentropy_forward(losses, l, l, targets, stats, B, T, Vl, V);
    crossentropy_parallel_backward(l, l, targets, dloss, B, T, Vl, 0);
  }
  // The same over a vocabulary split by columns, once the group has reduced
  // the sums of crossentropy_parallel_exp (whose unnormalized exponentials
  // `exps` holds, in place of the logits): losses (B,T), and `exps`
  // overwritten with dlogits; crossentropy_parallel_finish then
  // crossentropy_parallel_backward in place by default.
  virtual void crossentropy_parallel_finish_backward(
      float* losses, float* exps, const float* sums,
      const float* target_shifted, const int32_t* targets, float dloss, int B,
      int T, int Vl, int vocab_begin) {
    crossentropy_parallel_finish(losses, exps, sums, target_shifted, B, T, Vl);
    crossentropy_parallel_backward(exps, exps, targets, dloss, B, T, Vl,
                                   vocab_begin);
  }
  virtual void adamw_update(float* params, float* m, float* v,
                            const float* grads, int64_t N, float lr,
                            float beta1, float beta2, float eps,
                            float weight_decay, int64_t t,
                            float grad_scale) = 0;
  // Stretches of a buffer for the ops over many at once: `count` elements
  // from `begin`, with a tag saying what each is (0 or 1).
  struct Run {
    int64_t begin = 0, count = 0;
    int tag = 0;
  };
  // adamw_update over every run of a buffer (host array `runs`, n of them,
  // ascending and disjoint), weight_decay where a run's tag is 1 and 0
  // where it is 0: one pass over all parameters, which a backend may make
  // one launch (the default: adamw_update run by run; the same result
  // either way). params_bf16, when not null, is the parameters' bf16
  // compute copy (same indices, two to a float): each updated parameter is
  // written there too, rounded to nearest even, in the same pass where the
  // backend can (the default: Convert after each run).
  virtual void adamw_update_runs(float* params, void* params_bf16, float* m,
                                 float* v, const float* grads, const Run* runs,
                                 int n, float lr, float beta1, float beta2,
                                 float eps, float weight_decay, int64_t t,
                                 float grad_scale) {
    for (int i = 0; i < n; ++i) {
      const Run& r = runs[i];
      adamw_update(params + r.begin, m + r.begin, v + r.begin, grads + r.begin,
                   r.count, lr, beta1, beta2, eps,
                   r.tag != 0 ? weight_decay : 0.0f, t, grad_scale);
      if (params_bf16 != nullptr) {
        Convert(
            Act(static_cast<uint16_t*>(params_bf16) + r.begin, DType::kBf16),
            params + r.begin, 1, r.count);
      }
    }
  }
  // The sums of squares of x over runs (host array, n of them, ascending and
  // disjoint), by tag: sums[0] and sums[1] (doubles, on the host) get those
  // of the runs tagged 0 and 1. One pass and one wait for a device, which a
  // backend may make one launch (the default: SumSquares run by run, added
  // in order).
  virtual void SumSquaresRuns(const float* x, const Run* runs, int n,
                              double sums[2]) {
    sums[0] = sums[1] = 0.0;
    for (int i = 0; i < n; ++i) {
      sums[runs[i].tag] += SumSquares(x + runs[i].begin, runs[i].count);
    }
  }

 protected:
  // Stops the process: `op` is not on this backend.
  [[noreturn]] void Unsupported(const char* op) const {
    std::fprintf(stderr, "fatal: %s is not implemented on the %s backend\n", op,
                 name().c_str());
    std::abort();
  }
};

// The CPU backend (kernels/cpu): host memory, OpenMP and oneDNN. One shared
// instance; its ops are as thread-safe as the kernels.
Ops& CpuOps();
// The CPU backend with bf16 matmul products (kernels/cpu/kernels.h
// gemm_bf16: bf16 inputs, fp32 accumulation and outputs); every other op
// as CpuOps'. Fast where kernels::CpuHasBf16().
Ops& CpuBf16Ops();
// Sequence length from which the CPU backend's attention keeps no
// probabilities (kernels/cpu/kernels.h flash_attention_forward): the
// length where it became the faster one on this project's machines.
constexpr int64_t kFlashAttentionT = 1024;

// `n` floats of one backend's memory of a kind (Alloc/Free: its own;
// AllocHost/FreeHost: host memory it copies to and from fastest), given
// back with it. Move-only. Empty when the backend could not give them
// (AllocHost may not: failed() then says so).
template <float* (Ops::*kGet)(int64_t), void (Ops::*kPut)(float*)>
class OwnedFloats {
 public:
  OwnedFloats() = default;
  OwnedFloats(Ops* ops, int64_t n)
      : ops_(ops),
        data_(n > 0 ? (ops->*kGet)(n) : nullptr),
        size_(data_ != nullptr ? n : 0),
        asked_(n) {}
  OwnedFloats(OwnedFloats&& o) noexcept { *this = std::move(o); }
  OwnedFloats& operator=(OwnedFloats&& o) noexcept {
    if (this != &o) {
      Reset();
      ops_ = o.ops_;
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      asked_ = std::exchange(o.asked_, 0);
    }
    return *this;
  }
  OwnedFloats(const OwnedFloats&) = delete;
  OwnedFloats& operator=(const OwnedFloats&) = delete;
  ~OwnedFloats() { Reset(); }

  float* data() const { return data_; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool failed() const { return asked_ > 0 && data_ == nullptr; }

 private:
  void Reset() {
    if (data_ != nullptr) (ops_->*kPut)(data_);
    data_ = nullptr;
    size_ = asked_ = 0;
  }
  Ops* ops_ = nullptr;
  float* data_ = nullptr;
  int64_t size_ = 0, asked_ = 0;
};
// In the backend's memory.
using Buffer = OwnedFloats<&Ops::Alloc, &Ops::Free>;
// In host memory the backend copies to and from fastest (page-locked on a
// GPU).
using HostBuffer = OwnedFloats<&Ops::AllocHost, &Ops::FreeHost>;

}  // namespace ptrain::kernels

#endif  // PTRAIN_KERNELS_OPS_H_
