// A CPU backend that records ops (kernels::Ops::Capture) as a GPU backend
// does, for tests: the engine's use of graphs — fixed buffers, nothing read
// on the host inside a captured region, no host state that changes between
// replays — is checked in CI without a GPU. Not a backend to train with: it
// only wraps another one (CpuOps, CpuBf16Ops) and adds nothing to its math.
#ifndef PTRAIN_TESTS_TESTING_RECORDING_OPS_H_
#define PTRAIN_TESTS_TESTING_RECORDING_OPS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace ptrain::testing {

// Wraps `inner`. Outside a capture every op is inner's, bit for bit (the
// ops ops.h gives a default body included: inner's own, overridden or not).
// StageTokens copies into the staging buffer as a GPU backend does, so
// that code which uses the host pointer instead is caught (without a
// staging buffer it returns the host's, as the CPU does).
//
// Inside Capture(fn) the ops fn issues are not run: each is kept with a
// copy of its arguments (pointers and values as given; the Run array of
// adamw_update_runs copied) and the graph re-issues them on inner, one op
// per op issued (a default body such as gelu_matmul_forward's is one op,
// inner's, as a replay must run what the eager call runs). The ops ops.h
// says cannot be recorded (allocation, copies to and from the host and
// their waits, Synchronize, Sum, SumSquares, SumSquaresRuns, a nested
// Capture, a Replay) fail the capture: they do nothing and return null, 0
// or zeros (StageTokens: the staging buffer, unwritten), nothing more is
// recorded, and Capture returns null with *error naming the first of them
// ("Sum reads a result on the host during a capture"). Nothing fn issues
// runs, as ops.h's contract says.
//
// Not thread-safe: one thread issues the ops, as one stream does on a GPU.
// `inner` must outlive this, and this every graph it returns.
class RecordingOps final : public kernels::Ops {
 public:
  explicit RecordingOps(kernels::Ops& inner) : inner_(inner) {}
  RecordingOps(const RecordingOps&) = delete;
  RecordingOps& operator=(const RecordingOps&) = delete;

  // What a GPU backend does when its scratch grows: every graph captured so
  // far can no longer be replayed (Replay returns false and runs nothing).
  void MoveScratch() { ++epoch_; }

  bool capturing() const { return capturing_; }
  // Captures that returned a graph, and those that returned null.
  int64_t captures() const { return captures_; }
  int64_t failed_captures() const { return failed_captures_; }
  // Replays that ran their ops.
  int64_t replays() const { return replays_; }
  // Ops in the graphs captured (failed captures' not counted).
  int64_t ops_recorded() const { return ops_recorded_; }
  // Ops run on inner outside a capture and outside a replay; queries that
  // issue nothing (name(), activation_type(), the *_floats sizes) not
  // counted.
  int64_t eager_ops() const { return eager_ops_; }

  kernels::Device device() const override { return inner_.device(); }
  std::string name() const override { return "recording " + inner_.name(); }

  float* Alloc(int64_t n) override;
  void Free(float* p) override;
  int32_t* AllocTokens(int64_t n) override;
  void FreeTokens(int32_t* p) override;
  const int32_t* StageTokens(int32_t* staging, const int32_t* host,
                             int64_t n) override;
  void ToHost(float* host, const float* src, int64_t n) override;
  void FromHost(float* dst, const float* host, int64_t n) override;
  float* AllocHost(int64_t n) override;
  void FreeHost(float* p) override;
  int64_t ToHostAsync(float* host, const float* src, int64_t n) override;
  void FromHostAsync(float* dst, const float* host, int64_t n) override;
  void WaitCopy(int64_t k) override;
  void ComputeAfterCopies() override;
  kernels::DType activation_type() const override {
    return inner_.activation_type();
  }
  std::string CaptureUnsupported() const override { return ""; }
  std::unique_ptr<kernels::OpsGraph> Capture(const std::function<void()>& fn,
                                             std::string* error) override;
  void Synchronize() override;
  bool IsDeviceMemory(const void* p) const override { return false; }

  void Zero(float* p, int64_t n) override;
  void Copy(float* dst, const float* src, int64_t n) override;
  void Add(float* dst, const float* src, int64_t n) override;
  void CopyRows(float* dst, int64_t dst_stride, const float* src,
                int64_t src_stride, int64_t rows, int64_t cols,
                bool add) override;
  void Convert(kernels::Act dst, kernels::ConstAct src, int64_t rows,
               int64_t cols) override;
  double Sum(const float* x, int64_t n) override;
  double SumSquares(const float* x, int64_t n) override;

  void embedding_forward(float* out, const int32_t* inp, const float* wte,
                         int B, int T, int C, int vocab_begin, int Vl) override;
  void embedding_backward(float* dwte, const float* dout, const int32_t* inp,
                          int B, int T, int C, int vocab_begin,
                          int Vl) override;
  void position_forward(float* out, const float* wpe, int B, int T, int C,
                        int t0) override;
  void position_backward(float* dwpe, const float* dout, int B, int T, int C,
                         int t0) override;
  void layernorm_forward(kernels::Act out, float* mean, float* rstd,
                         const float* inp, const float* weight,
                         const float* bias, int B, int T, int C) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias,
                          const float* dout, const float* inp,
                          const float* weight, const float* mean,
                          const float* rstd, int B, int T, int C) override;
  void rmsnorm_forward(kernels::Act out, float* rstd, const float* inp,
                       const float* weight, float eps, int B, int T,
                       int C) override;
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout,
                        const float* inp, const float* weight,
                        const float* rstd, int B, int T, int C) override;
  void matmul_forward(kernels::Act out, kernels::ConstAct inp,
                      kernels::ConstAct weight, const float* bias, int B, int T,
                      int C, int OC) override;
  void matmul_backward(float* dinp, float* dweight, float* dbias,
                       kernels::ConstAct dout, kernels::ConstAct inp,
                       kernels::ConstAct weight, int B, int T, int C,
                       int OC) override;
  void gelu_matmul_forward(float* out, float* hidden, float* saved,
                           kernels::ConstAct inp, kernels::ConstAct weight,
                           const float* bias, int B, int T, int C,
                           int OC) override;
  void gelu_matmul_backward(kernels::Act dinp, float* dweight, float* dbias,
                            const float* dout, float* hidden,
                            const float* saved, kernels::ConstAct inp,
                            kernels::ConstAct weight, int B, int T, int C,
                            int OC) override;
  int64_t gelu_saved_floats(int64_t rows, int C) const override {
    return inner_.gelu_saved_floats(rows, C);
  }
  void attention_forward(kernels::Act out, float* att, kernels::ConstAct inp,
                         int B, int T, int C, int NH, int KVH) override;
  void attention_backward(float* dinp, float* datt, const float* dout,
                          kernels::ConstAct inp, kernels::ConstAct out,
                          const float* att, int B, int T, int C, int NH,
                          int KVH) override;
  void attention_block_forward(float* out, float* lse, const float* qkv,
                               const float* kv, int64_t kv_stride, int B,
                               int Tl, int C, int NH, int KVH, int cp,
                               int q_rank, int k_rank, bool first) override;
  void attention_block_backward(float* dqkv, float* dkv, const float* dout,
                                const float* qkv, const float* out,
                                const float* lse, const float* kv,
                                int64_t kv_stride, int B, int Tl, int C, int NH,
                                int KVH, int cp, int q_rank,
                                int k_rank) override;
  void attention_decode(kernels::Act out, float* kcache, float* vcache,
                        kernels::ConstAct qkv, int n, int pos, int C, int NH,
                        int KVH, int capacity) override;
  int64_t attention_saved_floats(int64_t B, int64_t T, int C,
                                 int NH) const override {
    return inner_.attention_saved_floats(B, T, C, NH);
  }
  int64_t attention_scratch_floats(int64_t B, int64_t T, int C,
                                   int NH) const override {
    return inner_.attention_scratch_floats(B, T, C, NH);
  }
  void gelu_forward(float* out, const float* inp, int64_t N) override;
  void gelu_backward(float* dinp, kernels::ConstAct inp, const float* dout,
                     int64_t N) override;
  void rope_forward(float* x, int64_t stride, int B, int n, int heads, int hs,
                    int pos0, const kernels::math::Rope& rope,
                    bool inverse) override;
  void swiglu_forward(float* out, kernels::ConstAct gate_up, int64_t rows,
                      int H) override;
  void swiglu_backward(float* dgate_up, const float* dout,
                       kernels::ConstAct gate_up, int64_t rows, int H) override;
  void bias_forward(float* out, const float* bias, int64_t rows,
                    int OC) override;
  void residual_forward(float* out, const float* inp1, const float* inp2,
                        int64_t N) override;
  void residual_layernorm_forward(float* residual, kernels::Act out,
                                  float* mean, float* rstd, const float* inp1,
                                  const float* inp2, const float* weight,
                                  const float* bias, int B, int T,
                                  int C) override;
  void residual_rmsnorm_forward(float* residual, kernels::Act out, float* rstd,
                                const float* inp1, const float* inp2,
                                const float* weight, float eps, int B, int T,
                                int C) override;
  void crossentropy_parallel_max(float* maxes, const float* logits, int B,
                                 int T, int Vl, int vocab_begin,
                                 int V) override;
  void crossentropy_parallel_exp(float* sums, float* target_shifted,
                                 float* probs, const float* logits,
                                 const float* maxes, const int32_t* targets,
                                 int B, int T, int Vl, int vocab_begin,
                                 int V) override;
  void crossentropy_parallel_finish(float* losses, float* probs,
                                    const float* sums,
                                    const float* target_shifted, int B, int T,
                                    int Vl) override;
  void crossentropy_forward(float* losses, float* probs, const float* logits,
                            const int32_t* targets, float* stats, int B, int T,
                            int Vl, int V) override;
  void crossentropy_parallel_backward(float* dlogits, const float* probs,
                                      const int32_t* targets, float dloss,
                                      int B, int T, int Vl,
                                      int vocab_begin) override;
  void crossentropy_forward_backward(float* losses, kernels::Act logits,
                                     const int32_t* targets, float dloss,
                                     float* stats, int B, int T, int Vl,
                                     int V) override;
  void crossentropy_parallel_finish_backward(float* losses, float* exps,
                                             const float* sums,
                                             const float* target_shifted,
                                             const int32_t* targets,
                                             float dloss, int B, int T, int Vl,
                                             int vocab_begin) override;
  void adamw_update(float* params, float* m, float* v, const float* grads,
                    int64_t N, float lr, float beta1, float beta2, float eps,
                    float weight_decay, int64_t t, float grad_scale) override;
  void adamw_update_runs(float* params, void* params_bf16, float* m, float* v,
                         const float* grads, const Run* runs, int n, float lr,
                         float beta1, float beta2, float eps,
                         float weight_decay, int64_t t,
                         float grad_scale) override;
  void SumSquaresRuns(const float* x, const Run* runs, int n,
                      double sums[2]) override;

 private:
  class Graph;

  // An op that can be recorded: inner's `op` with `args`, run now outside a
  // capture, else kept with a copy of the arguments (dropped once the
  // capture has failed). Through the member pointer inner's override runs,
  // or Ops' default body dispatching to inner's ops.
  template <typename... Params, typename... Args>
  void Issue(void (kernels::Ops::*op)(Params...), Args... args) {
    if (!capturing_) {
      ++eager_ops_;
      (inner_.*op)(args...);
      return;
    }
    Record([inner = &inner_, op, args...] { (inner->*op)(args...); });
  }
  void Record(std::function<void()> op);
  // An op that cannot be recorded, `op` (`why`: what it does that a capture
  // cannot hold): false, and the capture failed, where one is under way;
  // else true, counted, and the caller runs it.
  bool Eager(const char* op, const char* why);
  // Fails the capture under way, naming `op` unless an earlier op has.
  void Fail(const char* op, const char* why);

  kernels::Ops& inner_;
  bool capturing_ = false;
  std::vector<std::function<void()>> recording_;
  std::string failure_;  // the first op that failed the capture under way
  uint64_t epoch_ = 0;   // MoveScratch's count
  int64_t captures_ = 0, failed_captures_ = 0, replays_ = 0, ops_recorded_ = 0,
          eager_ops_ = 0;
};

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_TESTING_RECORDING_OPS_H_
