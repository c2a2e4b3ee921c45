// RecordingOps: inner's ops, run at once or kept for a graph.
#include "tests/testing/recording_ops.h"

#include <algorithm>

namespace ptrain::testing {

namespace {

using kernels::Act;
using kernels::ConstAct;
using kernels::Ops;

// What the ops a capture cannot hold do (ops.h, Ops::Capture).
constexpr char kAllocates[] = "allocates or frees memory";
constexpr char kCopies[] = "copies between the host and the backend";
constexpr char kWaits[] = "waits for the device";
constexpr char kReads[] = "reads a result on the host";

}  // namespace

class RecordingOps::Graph final : public kernels::OpsGraph {
 public:
  Graph(RecordingOps* owner, uint64_t epoch,
        std::vector<std::function<void()>> ops)
      : owner_(owner), epoch_(epoch), ops_(std::move(ops)) {}

  bool Replay() override {
    if (owner_->capturing_) {
      owner_->Fail("Replay", "issues a graph's ops");
      return false;
    }
    if (owner_->epoch_ != epoch_) return false;
    for (const std::function<void()>& op : ops_) op();
    ++owner_->replays_;
    return true;
  }

 private:
  RecordingOps* const owner_;
  const uint64_t epoch_;  // the owner's when captured
  const std::vector<std::function<void()>> ops_;
};

std::unique_ptr<kernels::OpsGraph> RecordingOps::Capture(
    const std::function<void()>& fn, std::string* error) {
  if (capturing_) {
    Fail("Capture", "is nested in another capture");
    *error = failure_;
    return nullptr;
  }
  capturing_ = true;
  recording_.clear();
  failure_.clear();
  try {
    fn();
  } catch (...) {
    capturing_ = false;
    recording_.clear();
    throw;
  }
  capturing_ = false;
  std::vector<std::function<void()>> ops = std::move(recording_);
  recording_.clear();
  if (!failure_.empty()) {
    ++failed_captures_;
    *error = failure_;
    return nullptr;
  }
  ++captures_;
  ops_recorded_ += static_cast<int64_t>(ops.size());
  return std::make_unique<Graph>(this, epoch_, std::move(ops));
}

void RecordingOps::Record(std::function<void()> op) {
  if (failure_.empty()) recording_.push_back(std::move(op));
}

void RecordingOps::Fail(const char* op, const char* why) {
  if (failure_.empty()) {
    failure_ = std::string(op) + " " + why + " during a capture";
  }
}

bool RecordingOps::Eager(const char* op, const char* why) {
  if (capturing_) {
    Fail(op, why);
    return false;
  }
  ++eager_ops_;
  return true;
}

// The ops a capture cannot hold.

float* RecordingOps::Alloc(int64_t n) {
  return Eager("Alloc", kAllocates) ? inner_.Alloc(n) : nullptr;
}
void RecordingOps::Free(float* p) {
  if (Eager("Free", kAllocates)) inner_.Free(p);
}
int32_t* RecordingOps::AllocTokens(int64_t n) {
  return Eager("AllocTokens", kAllocates) ? inner_.AllocTokens(n) : nullptr;
}
void RecordingOps::FreeTokens(int32_t* p) {
  if (Eager("FreeTokens", kAllocates)) inner_.FreeTokens(p);
}
// Always into `staging`, as a backend over memory the host cannot read:
// the engine must read the tokens from what this returns.
const int32_t* RecordingOps::StageTokens(int32_t* staging, const int32_t* host,
                                         int64_t n) {
  // A caller without staging buffers (a CPU stage that records nothing)
  // reads the host's, as on the CPU.
  if (staging == nullptr) return host;
  if (Eager("StageTokens", kCopies)) std::copy_n(host, n, staging);
  return staging;
}
void RecordingOps::ToHost(float* host, const float* src, int64_t n) {
  if (Eager("ToHost", kCopies)) inner_.ToHost(host, src, n);
}
void RecordingOps::FromHost(float* dst, const float* host, int64_t n) {
  if (Eager("FromHost", kCopies)) inner_.FromHost(dst, host, n);
}
float* RecordingOps::AllocHost(int64_t n) {
  return Eager("AllocHost", kAllocates) ? inner_.AllocHost(n) : nullptr;
}
void RecordingOps::FreeHost(float* p) {
  if (Eager("FreeHost", kAllocates)) inner_.FreeHost(p);
}
int64_t RecordingOps::ToHostAsync(float* host, const float* src, int64_t n) {
  return Eager("ToHostAsync", kCopies) ? inner_.ToHostAsync(host, src, n) : 0;
}
void RecordingOps::FromHostAsync(float* dst, const float* host, int64_t n) {
  if (Eager("FromHostAsync", kCopies)) inner_.FromHostAsync(dst, host, n);
}
void RecordingOps::WaitCopy(int64_t k) {
  if (Eager("WaitCopy", kWaits)) inner_.WaitCopy(k);
}
void RecordingOps::ComputeAfterCopies() {
  if (Eager("ComputeAfterCopies", "waits for copies to and from the host")) {
    inner_.ComputeAfterCopies();
  }
}
void RecordingOps::Synchronize() {
  if (Eager("Synchronize", kWaits)) inner_.Synchronize();
}
double RecordingOps::Sum(const float* x, int64_t n) {
  return Eager("Sum", kReads) ? inner_.Sum(x, n) : 0.0;
}
double RecordingOps::SumSquares(const float* x, int64_t n) {
  return Eager("SumSquares", kReads) ? inner_.SumSquares(x, n) : 0.0;
}
void RecordingOps::SumSquaresRuns(const float* x, const Run* runs, int n,
                                  double sums[2]) {
  if (Eager("SumSquaresRuns", kReads)) {
    inner_.SumSquaresRuns(x, runs, n, sums);
  } else {
    sums[0] = sums[1] = 0.0;
  }
}

// The ops a capture holds.

void RecordingOps::Zero(float* p, int64_t n) { Issue(&Ops::Zero, p, n); }
void RecordingOps::Copy(float* dst, const float* src, int64_t n) {
  Issue(&Ops::Copy, dst, src, n);
}
void RecordingOps::Add(float* dst, const float* src, int64_t n) {
  Issue(&Ops::Add, dst, src, n);
}
void RecordingOps::CopyRows(float* dst, int64_t dst_stride, const float* src,
                            int64_t src_stride, int64_t rows, int64_t cols,
                            bool add) {
  Issue(&Ops::CopyRows, dst, dst_stride, src, src_stride, rows, cols, add);
}
void RecordingOps::Convert(Act dst, ConstAct src, int64_t rows, int64_t cols) {
  Issue(&Ops::Convert, dst, src, rows, cols);
}

void RecordingOps::embedding_forward(float* out, const int32_t* inp,
                                     const float* wte, int B, int T, int C,
                                     int vocab_begin, int Vl) {
  Issue(&Ops::embedding_forward, out, inp, wte, B, T, C, vocab_begin, Vl);
}
void RecordingOps::embedding_backward(float* dwte, const float* dout,
                                      const int32_t* inp, int B, int T, int C,
                                      int vocab_begin, int Vl) {
  Issue(&Ops::embedding_backward, dwte, dout, inp, B, T, C, vocab_begin, Vl);
}
void RecordingOps::position_forward(float* out, const float* wpe, int B, int T,
                                    int C, int t0) {
  Issue(&Ops::position_forward, out, wpe, B, T, C, t0);
}
void RecordingOps::position_backward(float* dwpe, const float* dout, int B,
                                     int T, int C, int t0) {
  Issue(&Ops::position_backward, dwpe, dout, B, T, C, t0);
}
void RecordingOps::layernorm_forward(Act out, float* mean, float* rstd,
                                     const float* inp, const float* weight,
                                     const float* bias, int B, int T, int C) {
  Issue(&Ops::layernorm_forward, out, mean, rstd, inp, weight, bias, B, T, C);
}
void RecordingOps::layernorm_backward(float* dinp, float* dweight, float* dbias,
                                      const float* dout, const float* inp,
                                      const float* weight, const float* mean,
                                      const float* rstd, int B, int T, int C) {
  Issue(&Ops::layernorm_backward, dinp, dweight, dbias, dout, inp, weight, mean,
        rstd, B, T, C);
}
void RecordingOps::rmsnorm_forward(Act out, float* rstd, const float* inp,
                                   const float* weight, float eps, int B, int T,
                                   int C) {
  Issue(&Ops::rmsnorm_forward, out, rstd, inp, weight, eps, B, T, C);
}
void RecordingOps::rmsnorm_backward(float* dinp, float* dweight,
                                    const float* dout, const float* inp,
                                    const float* weight, const float* rstd,
                                    int B, int T, int C) {
  Issue(&Ops::rmsnorm_backward, dinp, dweight, dout, inp, weight, rstd, B, T,
        C);
}
void RecordingOps::matmul_forward(Act out, ConstAct inp, ConstAct weight,
                                  const float* bias, int B, int T, int C,
                                  int OC) {
  Issue(&Ops::matmul_forward, out, inp, weight, bias, B, T, C, OC);
}
void RecordingOps::matmul_backward(float* dinp, float* dweight, float* dbias,
                                   ConstAct dout, ConstAct inp, ConstAct weight,
                                   int B, int T, int C, int OC) {
  Issue(&Ops::matmul_backward, dinp, dweight, dbias, dout, inp, weight, B, T, C,
        OC);
}
void RecordingOps::gelu_matmul_forward(float* out, float* hidden, float* saved,
                                       ConstAct inp, ConstAct weight,
                                       const float* bias, int B, int T, int C,
                                       int OC) {
  Issue(&Ops::gelu_matmul_forward, out, hidden, saved, inp, weight, bias, B, T,
        C, OC);
}
void RecordingOps::gelu_matmul_backward(Act dinp, float* dweight, float* dbias,
                                        const float* dout, float* hidden,
                                        const float* saved, ConstAct inp,
                                        ConstAct weight, int B, int T, int C,
                                        int OC) {
  Issue(&Ops::gelu_matmul_backward, dinp, dweight, dbias, dout, hidden, saved,
        inp, weight, B, T, C, OC);
}
void RecordingOps::attention_forward(Act out, float* att, ConstAct inp, int B,
                                     int T, int C, int NH, int KVH) {
  Issue(&Ops::attention_forward, out, att, inp, B, T, C, NH, KVH);
}
void RecordingOps::attention_backward(float* dinp, float* datt,
                                      const float* dout, ConstAct inp,
                                      ConstAct out, const float* att, int B,
                                      int T, int C, int NH, int KVH) {
  Issue(&Ops::attention_backward, dinp, datt, dout, inp, out, att, B, T, C, NH,
        KVH);
}
void RecordingOps::attention_block_forward(float* out, float* lse,
                                           const float* qkv, const float* kv,
                                           int64_t kv_stride, int B, int Tl,
                                           int C, int NH, int KVH, int cp,
                                           int q_rank, int k_rank, bool first) {
  Issue(&Ops::attention_block_forward, out, lse, qkv, kv, kv_stride, B, Tl, C,
        NH, KVH, cp, q_rank, k_rank, first);
}
void RecordingOps::attention_block_backward(
    float* dqkv, float* dkv, const float* dout, const float* qkv,
    const float* out, const float* lse, const float* kv, int64_t kv_stride,
    int B, int Tl, int C, int NH, int KVH, int cp, int q_rank, int k_rank) {
  Issue(&Ops::attention_block_backward, dqkv, dkv, dout, qkv, out, lse, kv,
        kv_stride, B, Tl, C, NH, KVH, cp, q_rank, k_rank);
}
void RecordingOps::attention_decode(Act out, float* kcache, float* vcache,
                                    ConstAct qkv, int n, int pos, int C, int NH,
                                    int KVH, int capacity) {
  Issue(&Ops::attention_decode, out, kcache, vcache, qkv, n, pos, C, NH, KVH,
        capacity);
}
void RecordingOps::gelu_forward(float* out, const float* inp, int64_t N) {
  Issue(&Ops::gelu_forward, out, inp, N);
}
void RecordingOps::gelu_backward(float* dinp, ConstAct inp, const float* dout,
                                 int64_t N) {
  Issue(&Ops::gelu_backward, dinp, inp, dout, N);
}
void RecordingOps::rope_forward(float* x, int64_t stride, int B, int n,
                                int heads, int hs, int pos0,
                                const kernels::math::Rope& rope, bool inverse) {
  Issue(&Ops::rope_forward, x, stride, B, n, heads, hs, pos0, rope, inverse);
}
void RecordingOps::swiglu_forward(float* out, kernels::ConstAct gate_up,
                                  int64_t rows, int H) {
  Issue(&Ops::swiglu_forward, out, gate_up, rows, H);
}
void RecordingOps::swiglu_backward(float* dgate_up, const float* dout,
                                   kernels::ConstAct gate_up, int64_t rows,
                                   int H) {
  Issue(&Ops::swiglu_backward, dgate_up, dout, gate_up, rows, H);
}
void RecordingOps::bias_forward(float* out, const float* bias, int64_t rows,
                                int OC) {
  Issue(&Ops::bias_forward, out, bias, rows, OC);
}
void RecordingOps::residual_forward(float* out, const float* inp1,
                                    const float* inp2, int64_t N) {
  Issue(&Ops::residual_forward, out, inp1, inp2, N);
}
void RecordingOps::residual_layernorm_forward(
    float* residual, Act out, float* mean, float* rstd, const float* inp1,
    const float* inp2, const float* weight, const float* bias, int B, int T,
    int C) {
  Issue(&Ops::residual_layernorm_forward, residual, out, mean, rstd, inp1, inp2,
        weight, bias, B, T, C);
}
void RecordingOps::residual_rmsnorm_forward(float* residual, Act out,
                                            float* rstd, const float* inp1,
                                            const float* inp2,
                                            const float* weight, float eps,
                                            int B, int T, int C) {
  Issue(&Ops::residual_rmsnorm_forward, residual, out, rstd, inp1, inp2, weight,
        eps, B, T, C);
}
void RecordingOps::crossentropy_parallel_max(float* maxes, const float* logits,
                                             int B, int T, int Vl,
                                             int vocab_begin, int V) {
  Issue(&Ops::crossentropy_parallel_max, maxes, logits, B, T, Vl, vocab_begin,
        V);
}
void RecordingOps::crossentropy_parallel_exp(float* sums, float* target_shifted,
                                             float* probs, const float* logits,
                                             const float* maxes,
                                             const int32_t* targets, int B,
                                             int T, int Vl, int vocab_begin,
                                             int V) {
  Issue(&Ops::crossentropy_parallel_exp, sums, target_shifted, probs, logits,
        maxes, targets, B, T, Vl, vocab_begin, V);
}
void RecordingOps::crossentropy_parallel_finish(float* losses, float* probs,
                                                const float* sums,
                                                const float* target_shifted,
                                                int B, int T, int Vl) {
  Issue(&Ops::crossentropy_parallel_finish, losses, probs, sums, target_shifted,
        B, T, Vl);
}
void RecordingOps::crossentropy_forward(float* losses, float* probs,
                                        const float* logits,
                                        const int32_t* targets, float* stats,
                                        int B, int T, int Vl, int V) {
  Issue(&Ops::crossentropy_forward, losses, probs, logits, targets, stats, B, T,
        Vl, V);
}
void RecordingOps::crossentropy_parallel_backward(float* dlogits,
                                                  const float* probs,
                                                  const int32_t* targets,
                                                  float dloss, int B, int T,
                                                  int Vl, int vocab_begin) {
  Issue(&Ops::crossentropy_parallel_backward, dlogits, probs, targets, dloss, B,
        T, Vl, vocab_begin);
}
void RecordingOps::crossentropy_forward_backward(float* losses, Act logits,
                                                 const int32_t* targets,
                                                 float dloss, float* stats,
                                                 int B, int T, int Vl, int V) {
  Issue(&Ops::crossentropy_forward_backward, losses, logits, targets, dloss,
        stats, B, T, Vl, V);
}
void RecordingOps::crossentropy_parallel_finish_backward(
    float* losses, float* exps, const float* sums, const float* target_shifted,
    const int32_t* targets, float dloss, int B, int T, int Vl,
    int vocab_begin) {
  Issue(&Ops::crossentropy_parallel_finish_backward, losses, exps, sums,
        target_shifted, targets, dloss, B, T, Vl, vocab_begin);
}
void RecordingOps::adamw_update(float* params, float* m, float* v,
                                const float* grads, int64_t N, float lr,
                                float beta1, float beta2, float eps,
                                float weight_decay, int64_t t,
                                float grad_scale) {
  Issue(&Ops::adamw_update, params, m, v, grads, N, lr, beta1, beta2, eps,
        weight_decay, t, grad_scale);
}
// The runs are a host array the caller may change once this returns: the
// graph keeps a copy.
void RecordingOps::adamw_update_runs(float* params, void* params_bf16, float* m,
                                     float* v, const float* grads,
                                     const Run* runs, int n, float lr,
                                     float beta1, float beta2, float eps,
                                     float weight_decay, int64_t t,
                                     float grad_scale) {
  if (!capturing_) {
    ++eager_ops_;
    inner_.adamw_update_runs(params, params_bf16, m, v, grads, runs, n, lr,
                             beta1, beta2, eps, weight_decay, t, grad_scale);
    return;
  }
  Record([inner = &inner_, params, params_bf16, m, v, grads,
          kept = std::vector<Run>(runs, runs + n), lr, beta1, beta2, eps,
          weight_decay, t, grad_scale] {
    inner->adamw_update_runs(params, params_bf16, m, v, grads, kept.data(),
                             static_cast<int>(kept.size()), lr, beta1, beta2,
                             eps, weight_decay, t, grad_scale);
  });
}

}  // namespace ptrain::testing
