// GPT-2 on one rank: parameter layout, layout-invariant initialisation, and the
// forward and backward passes over the CPU kernels. Not parallel by itself;
// the parallel engines slice its buffers. Not thread-safe.
//
// Parameters, gradients and saved activations each live in one contiguous
// buffer. Parameters are grouped per layer ([wte, wpe] [h.0 ...] ... [ln_f]),
// so that a layer, a pipeline stage or a ZeRO shard is a plain slice.
#ifndef PTRAIN_WORKER_ENGINE_GPT_H_
#define PTRAIN_WORKER_ENGINE_GPT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain {

struct GptConfig {
  int n_layer = 0;     // L
  int n_head = 0;      // NH
  int n_embd = 0;      // C
  int block_size = 0;  // maximum T
  int vocab_size = 0;  // V
};

// One named parameter tensor inside the flat buffer.
struct ParamInfo {
  std::string name;            // e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // global shape, row-major
  int64_t offset = 0;          // element offset in the flat buffer
  int64_t numel = 0;
  int layer = -1;      // block index, -1 for embeddings and ln_f
  bool decay = false;  // AdamW weight decay applies (matrices only)
  enum class Init { kNormal, kZeros, kOnes } init = Init::kNormal;
  double init_std = 0.0;
};

// The parameter table of a config: data, not code, so that sharding plans and
// checkpoints can walk it.
std::vector<ParamInfo> GptParamLayout(const GptConfig& config);
int64_t GptNumParams(const GptConfig& config);

// Initial value of element `index` of parameter `info`: a pure function of
// (seed, name, index). Any shard of any layout gets the same numbers.
float InitialValue(const ParamInfo& info, uint64_t seed, int64_t index);

// Model FLOPs per trained token (forward + backward): 6 per matmul weight
// (wpe does no matmul) plus 12·L·C·T for attention scores and mixing.
double GptFlopsPerToken(const GptConfig& config, int T);

// Views into one layer's slice of a parameter-shaped buffer.
struct LayerParams {
  float *ln1w, *ln1b;          // (C), (C)
  float *qkvw, *qkvb;          // (3C,C), (3C)
  float *attprojw, *attprojb;  // (C,C), (C)
  float *ln2w, *ln2b;          // (C), (C)
  float *fcw, *fcb;            // (4C,C), (4C)
  float *fcprojw, *fcprojb;    // (C,4C), (C)
};

struct MemoryBytes {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0;
};

class Gpt {
 public:
  // Allocates parameters, gradients and activations for batches of up to
  // max_B sequences of up to max_T tokens.
  Gpt(const GptConfig& config, int max_B, int max_T);
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const GptConfig& config() const { return config_; }
  const std::vector<ParamInfo>& layout() const { return layout_; }
  int64_t num_params() const { return num_params_; }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }

  // Fills every parameter with InitialValue(seed).
  void InitParams(uint64_t seed);
  void ZeroGrad();

  // inputs, targets are (B,T) token ids. With targets, returns the mean loss
  // over the B·T positions and keeps what backward needs; without, returns 0
  // and leaves logits() valid.
  float Forward(const int32_t* inputs, const int32_t* targets, int B, int T);
  // Accumulates parameter gradients of sum(losses) · dloss into grads(), for
  // the batch of the last Forward (which must have had targets). dloss is
  // 1/(tokens of the whole optimizer step) for a mean over the global batch.
  void Backward(const int32_t* inputs, const int32_t* targets, float dloss);

  // (B,T,V) logits of the last Forward without targets.
  const float* logits() const { return logits_; }

  // Bytes of this model's buffers; optimizer is filled in by the optimizer.
  MemoryBytes memory() const;

 private:
  LayerParams LayerView(float* base, int l) const;
  float* Slice(std::vector<float>& buf, int64_t count);

  const GptConfig config_;
  const int max_B_, max_T_;
  std::vector<ParamInfo> layout_;
  int64_t num_params_ = 0;
  std::vector<float> params_, grads_;

  // Saved activations, one buffer. Per layer l: (L,B,T,·) slabs.
  std::vector<float> acts_;
  int64_t acts_used_ = 0;
  float* encoded_;    // (B,T,C)
  float* ln1_;        // (L,B,T,C)
  float* ln1_mean_;   // (L,B,T)
  float* ln1_rstd_;   // (L,B,T)
  float* qkv_;        // (L,B,T,3C)
  float* atty_;       // (L,B,T,C)
  float* att_;        // (L,B,NH,T,T)
  float* residual2_;  // (L,B,T,C)
  float* ln2_;        // (L,B,T,C)
  float* ln2_mean_;   // (L,B,T)
  float* ln2_rstd_;   // (L,B,T)
  float* fch_;        // (L,B,T,4C)
  float* fch_gelu_;   // (L,B,T,4C)
  float* residual3_;  // (L,B,T,C)
  float* lnf_;        // (B,T,C)
  float* lnf_mean_;   // (B,T)
  float* lnf_rstd_;   // (B,T)
  float* logits_;     // (B,T,V); softmax probabilities after a loss forward
  float* losses_;     // (B,T)
  // Backward working set, reused by every layer.
  float* scratch_;    // (B,T,C) projection output before the residual add
  float* dresidual_;  // (B,T,C)
  float* dln_;        // (B,T,C)
  float* dqkv_;       // (B,T,3C)
  float* datty_;      // (B,T,C)
  float* datt_;       // (B,NH,T,T)
  float* dfch_;       // (B,T,4C)
  float* dfch_gelu_;  // (B,T,4C)
  float* dlogits_;    // (B,T,V)

  int B_ = 0, T_ = 0;  // dims of the last Forward
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_GPT_H_
