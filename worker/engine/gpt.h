// GPT-2 on one rank: parameter layout, layout-invariant initialisation, and the
// forward and backward passes over the CPU kernels. Not parallel by itself;
// the parallel engines slice its buffers. Not thread-safe.
//
// Parameters, gradients and saved activations each live in one contiguous
// buffer. Parameters are grouped in units — [wte, wpe] [h.0 ...] ... [h.L-1]
// [ln_f] — each unit padded to a multiple of the shard count, so that a layer,
// a pipeline stage or a ZeRO shard is a plain slice. A UnitStore says where a
// unit's weights and gradients are while a pass uses them: the model's own
// flat buffers on one rank, gathered or sharded buffers under ZeRO.
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
  int layer = -1;           // block index, -1 for embeddings and ln_f
  int unit = 0;             // 0 embeddings, 1+layer blocks, L+1 ln_f
  int64_t unit_offset = 0;  // element offset inside its unit
  bool decay = false;       // AdamW weight decay applies (matrices only)
  enum class Init { kNormal, kZeros, kOnes } init = Init::kNormal;
  double init_std = 0.0;
};

// The parameter table of a config: data, not code, so that sharding plans and
// checkpoints can walk it. Each unit's size is rounded up to a multiple of
// `pad` (the ZeRO shard count) with unused zero elements after its tensors.
std::vector<ParamInfo> GptParamLayout(const GptConfig& config, int pad = 1);
int64_t GptNumParams(const GptConfig& config);  // real elements, no padding

// A unit's place in the flat buffer: [begin, begin + size), size padded.
struct UnitRange {
  int64_t begin = 0, size = 0;
};
std::vector<UnitRange> GptUnits(const std::vector<ParamInfo>& layout, int pad);
// Units: 0 [wte wpe]; per block l four, from BlockUnit(l): [ln_1 c_attn]
// [attn.c_proj] [ln_2 c_fc] [mlp.c_proj] — each kernel's weights are one
// unit, so ZeRO-3 holds at most one matrix's worth gathered; last [ln_f].
inline int GptNumUnits(const GptConfig& c) { return 4 * c.n_layer + 2; }
inline int BlockUnit(int l) { return 1 + 4 * l; }

// Where the weights and gradients of each unit live while a pass runs. The
// model brackets its use of unit u with Begin/End calls, with F the last:
// forward: B(0) [B(u) E(u) for u = 1..F-1] B(F) E(F) E(0);
// backward: B(0) B(F) E(F) [B(u) E(u) for u = F-1..1] E(0).
// Params(u)/Grads(u) are valid between Begin and End and point at the unit's
// first element (unit-relative offsets). Gradients accumulate (+=).
class UnitStore {
 public:
  virtual ~UnitStore() = default;
  virtual const float* Params(int u) = 0;
  virtual float* Grads(int u) = 0;
  virtual void BeginForward(int u) {}
  virtual void EndForward(int u) {}
  virtual void BeginBackward(int u) {}
  // The unit's gradients of this pass are complete.
  virtual void EndBackward(int u) {}
  // Called between kernels of backward: a chance to progress communication.
  virtual void Poll() {}
};

// Initial value of element `index` of parameter `info`: a pure function of
// (seed, name, index). Any shard of any layout gets the same numbers.
float InitialValue(const ParamInfo& info, uint64_t seed, int64_t index);

// Model FLOPs per trained token (forward + backward): 6 per matmul weight
// (wpe does no matmul) plus 12·L·C·T for attention scores and mixing.
double GptFlopsPerToken(const GptConfig& config, int T);

struct MemoryBytes {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0;
};

class Gpt : private UnitStore {
 public:
  // Allocates parameters, gradients and activations for batches of up to
  // max_B sequences of up to max_T tokens. With a `store` (not owned, must
  // outlive the model) weights and gradients live there instead, laid out by
  // GptParamLayout(config, pad), and params()/grads() are null.
  Gpt(const GptConfig& config, int max_B, int max_T, UnitStore* store = nullptr,
      int pad = 1);
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const GptConfig& config() const { return config_; }
  const std::vector<ParamInfo>& layout() const { return layout_; }
  const std::vector<UnitRange>& units() const { return units_; }
  int64_t num_params() const { return num_params_; }    // real elements
  int64_t buffer_size() const { return buffer_size_; }  // padded elements
  float* params() { return params_.empty() ? nullptr : params_.data(); }
  const float* params() const {
    return params_.empty() ? nullptr : params_.data();
  }
  float* grads() { return grads_.empty() ? nullptr : grads_.data(); }
  const float* grads() const {
    return grads_.empty() ? nullptr : grads_.data();
  }

  // Fills the model's own parameters with InitialValue(seed).
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
  // The model's own flat buffers, when no external store is given.
  const float* Params(int u) override {
    return params_.data() + units_[u].begin;
  }
  float* Grads(int u) override { return grads_.data() + units_[u].begin; }

  // Block l's tensors in layout order, addressed inside their unit.
  enum BlockTensor {
    kLn1W,
    kLn1B,
    kQkvW,
    kQkvB,
    kAttProjW,
    kAttProjB,
    kLn2W,
    kLn2B,
    kFcW,
    kFcB,
    kFcProjW,
    kFcProjB
  };
  const float* Tensor(const float* unit_base, int l, int i) const;
  int FinalUnit() const { return static_cast<int>(units_.size()) - 1; }
  float* Slice(std::vector<float>& buf, int64_t count);

  const GptConfig config_;
  const int max_B_, max_T_;
  std::vector<ParamInfo> layout_;
  std::vector<UnitRange> units_;
  int64_t num_params_ = 0, buffer_size_ = 0;
  UnitStore* store_;
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
