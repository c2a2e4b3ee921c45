// The parallel plan: where every parameter of GPT-2 lives, as data. One
// table of the model's tensors, then ordered pure steps, each separately
// tested: split into pipeline stages -> apply the tensor-parallel plan (a
// table keyed by tensor name, as torchtitan's layer plans) -> lay the
// stage's tensors out in units for ZeRO. The model, the optimizer, ZeRO and
// checkpoints all read the result; none of them knows another copy of it.
//
// Dimension legend: L layers, NH heads, C channels, V vocabulary, Vp the
// padded vocabulary (a multiple of 128·tp), T positions (block_size).
#ifndef PTRAIN_WORKER_ENGINE_MODEL_PLAN_H_
#define PTRAIN_WORKER_ENGINE_MODEL_PLAN_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/common/math.h"

namespace ptrain {

struct GptConfig {
  int n_layer = 0;     // L
  int n_head = 0;      // NH
  int n_embd = 0;      // C
  int block_size = 0;  // maximum T
  int vocab_size = 0;  // V
  // Vp: the vocabulary rounded up to a multiple of 128·tp, so that every
  // tensor-parallel rank holds as many rows of wte (the padding rows are
  // zero and never take part). 0: not set yet (PaddedVocab sets it).
  int padded_vocab = 0;
  // model.arch: which parts the model is made of (ModelPartsOf, model_parts.h).
  std::string arch = "gpt";
  // model.tie_embeddings: the head reads wte (GPT-2's), or lm_head.weight.
  bool tie_embeddings = true;
  // The RMSNorm parts' epsilon (GPT-2's LayerNorm keeps PyTorch's 1e-5,
  // kernels/common/math.h).
  float norm_eps = 1e-5f;
  // Llama's (model_parts.h's parts for arch llama): the key and value
  // heads (n_head: multi-head attention), rotary positions, the MLP's
  // hidden width (GPT-2's: 4C).
  int n_kv_head = 0;  // 0: n_head
  int head_dim = 0;   // an attention head's channels; 0: n_embd / n_head
  // Each query and key head RMS-normalised over its channels before rotary
  // positions (Qwen3's q_norm and k_norm).
  bool qk_norm = false;
  kernels::math::Rope rope{};
  int ffn_hidden = 0;  // 0: 4·n_embd
  // model.moe (MoeOf, common/spec.h): the MLP as `experts` routed experts
  // of `hidden` channels each, top_k per token, and `shared` experts every
  // token passes through (one MLP of shared·hidden); experts 0: dense.
  struct Moe {
    int experts = 0, top_k = 0, shared = 0, hidden = 0;
    // model.moe.every: an MoE MLP in every `every`-th block (layers every−1,
    // 2·every−1, ...: the last of each run of `every`), the arch's dense MLP
    // in the others.
    int every = 1;
    bool HasExperts(int layer) const {
      return every <= 1 || (layer + 1) % every == 0;
    }
    // parallel.ep: the ranks the routed experts are split over, each
    // holding experts/ep of them.
    int ep = 1;
    // parallel.expert_tp: the tp ranks each expert is split over (0: all
    // of tp). Below tp, the tp group's tp/expert_tp slices (consecutive
    // runs of expert_tp ranks) hold different experts: every tp rank
    // routes the whole microbatch, and each slice computes the tokens of
    // its own experts (expert parallelism over tp without an all-to-all:
    // the tokens are already there).
    int expert_tp = 0;
    int ExpertTp(int tp) const { return expert_tp > 0 ? expert_tp : tp; }
    int Slices(int tp) const { return tp / ExpertTp(tp); }
    // The routed experts one rank holds.
    int LocalExperts(int tp) const { return experts / (ep * Slices(tp)); }
    // The first of them on tp rank `tp_rank` and ep rank `ep_rank`: slice
    // tp_rank/expert_tp holds the slice's experts/slices consecutive
    // experts, split over its ep group as ep splits them all.
    int FirstExpert(int tp, int tp_rank, int ep_rank) const {
      return tp_rank / ExpertTp(tp) * (experts / Slices(tp)) +
             ep_rank * LocalExperts(tp);
    }
    kernels::math::RouterScore router = kernels::math::RouterScore::kSoftmax;
    float capacity_factor = 0, aux_coef = 0, z_coef = 0;
    // balance: bias (DeepSeek-V3's auxiliary-loss-free balancing): each
    // layer's selection bias (mlp.router.expert_bias, E), added to the
    // scores when choosing experts, never to the weights, moved by
    // bias_rate after each step against the expert's load.
    bool bias = false;
    float bias_rate = 0;
    // The most of a sequence's T tokens an expert takes: ceil(capacity
    // factor · T · top_k / experts); 0: no limit.
    int Capacity(int T) const {
      if (capacity_factor <= 0) return 0;
      return static_cast<int>(std::ceil(static_cast<double>(capacity_factor) *
                                        T * top_k / experts));
    }
  };
  Moe moe{};
  bool has_moe() const { return moe.experts > 0; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  // The query heads' channels (the attention's width): n_embd unless
  // head_dim is set apart from it.
  int64_t attention_channels() const { return int64_t{n_head} * head_size(); }
  int hidden() const { return ffn_hidden > 0 ? ffn_hidden : 4 * n_embd; }
  // The key and value heads a rank of tp computes with: its share where tp
  // divides them, else the one its query heads read (every rank holds them
  // all: TpSplit::kKvHeads).
  int kv_heads_local(int tp) const {
    return kv_heads() % tp == 0 ? kv_heads() / tp : 1;
  }
};

// model.moe.router's names ("softmax", "sigmoid") of the router scores,
// and back (nullopt for any other name).
const char* RouterName(kernels::math::RouterScore router);
std::optional<kernels::math::RouterScore> RouterNamed(std::string_view name);

// V rounded up to a multiple of 128·tp.
int PaddedVocab(int V, int tp);
// The elements of a tensor of `shape`.
int64_t ShapeNumel(const std::vector<int64_t>& shape);

// How tensor parallelism splits a tensor (Megatron's layouts).
enum class TpSplit {
  kReplicated,  // every tp rank holds all of it
  kColumn,      // dim 0 (output features) in tp equal parts
  kRow,         // dim 1 (input features) in tp equal parts
  kVocab,       // dim 0 of wte: Vp/tp rows per rank, real rows those < V
  kQkv,         // dim 0 is [q; k; v], C rows each: each split by heads
  kStacked2,    // dim 0 is two equal parts ([gate; up]): each split in tp
  // dim 0 is n_kv_head heads: split by heads where tp divides them, else
  // every rank holds all of them (kReplicated, tp_partial) and computes
  // with head tp_rank·n_kv_head/tp.
  kKvHeads,
};
const char* TpSplitName(TpSplit split);  // "replicated", "column", ...

// An n-dimensional slice of a tensor: [lo[d], hi[d]) in every dimension.
struct Box {
  std::vector<int64_t> lo, hi;
  int64_t numel() const;
  bool empty() const { return numel() == 0; }
};
// The intersection (possibly empty) of two boxes of one tensor.
Box Intersect(const Box& a, const Box& b);
Box WholeBox(const std::vector<int64_t>& shape);
// The row-major index of `coord` inside `frame` (coord lies in frame).
int64_t BoxIndex(const Box& frame, const std::vector<int64_t>& coord);
// Calls fn(coord) for the first element of every row of `box` (a row: its
// extent along the last dimension, contiguous in any row-major frame that
// contains the box), in row-major order.
template <typename Fn>
void ForEachBoxRow(const Box& box, Fn fn);
// "" when `boxes` tile a tensor of `shape` exactly (each inside it and
// non-empty, no two overlapping, together covering it); else what is
// wrong. O(n log n) plus the overlaps of boxes that share rows.
std::string CheckTiling(const std::vector<int64_t>& shape,
                        const std::vector<Box>& boxes);

// ParamInfo::layer of the tensors before the blocks and after them.
constexpr int kBeforeBlocks = -1, kAfterBlocks = -2;

struct ParamInfo {
  enum class Init { kNormal, kZeros, kOnes };

  // From the tensor table.
  std::string name;                   // e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> global_shape;  // wte is (V, C): real rows only
  // Its block's index; kBeforeBlocks for the embeddings (wte, wpe),
  // kAfterBlocks for the final norm and the head.
  int layer = -1;
  bool decay = false;  // AdamW weight decay (matrices)
  Init init = Init::kNormal;
  double init_std = 0.0;
  // Its gradient is a partial sum over tp ranks under sequence parallelism
  // (each rank saw only its positions): LayerNorm weights and biases, wpe.
  bool sequence_partial = false;
  // Replicated over tp but each tp rank's gradient a part of the whole,
  // summed over tp with or without sp: key and value heads fewer than tp
  // ranks (each rank computes with one of them).
  bool tp_partial = false;
  // A routed expert's tensor (model.moe): the expert's index, held by one
  // rank of each ep group (KeepExperts), its gradients summed and sharded
  // over the ranks holding it; -1 for every other tensor.
  int expert = -1;

  // From SplitStages: the pipeline stage that holds it (the virtual stage
  // under an interleaved schedule: pipeline rank stage % pp holds it).
  int stage = 0;
  // The table a tied head reads (wte, where model.tie_embeddings), on
  // stage 0 and, when pp > 1, as a copy on the last stage (tied_copy),
  // whose head reads it there: the LM head is tied to the embedding. The
  // two stay equal because their gradients are summed over the embedding
  // group (stage 0 and the last stage) before each update; the copy is not
  // written to checkpoints and its gradient norm is not counted (the
  // primary's is).
  bool tied = false;
  bool tied_copy = false;

  // From ApplyTensorParallel: this rank's part.
  TpSplit split = TpSplit::kReplicated;
  std::vector<int64_t> shape;  // local shape (wte: Vp/tp rows)
  // The global boxes this rank holds, in local order: the local tensor is
  // their concatenation along dim 0 (c_attn holds three, one each of q, k
  // and v; wte's box leaves out the padding rows, possibly all of them).
  std::vector<Box> boxes;

  // From LayoutUnits: the place in this rank's flat buffers.
  int64_t numel = 0;   // local elements, padding rows included
  int64_t offset = 0;  // element offset in the flat buffer
  int unit = 0;        // ZeRO unit
  int64_t unit_offset = 0;

  // Replicated over the tp group: its gradient norm counts once, one tp
  // rank writes it to checkpoints.
  bool tp_replicated() const { return split == TpSplit::kReplicated; }
};

// The global index (flat, row-major in global_shape) of local element
// `local` of `p`; nullopt for wte's padding rows.
std::optional<int64_t> GlobalIndex(const ParamInfo& p, int64_t local);

// Local elements [lo, hi) of `p` as global boxes: fn(box, local_start) for
// each, in order, where local elements [local_start, local_start +
// box.numel()) are the box in row-major order. Padding rows (wte past V)
// are left out. Tensors of one or two dimensions.
template <typename Fn>
void ForEachLocalBox(const ParamInfo& p, int64_t lo, int64_t hi, Fn fn);

// --- the steps ---------------------------------------------------------

// 1. The model's tensors with their global shapes, in the order of llm.c's
// and PyTorch's GPT-2 state: wte, wpe, per block ln_1.{weight,bias},
// attn.c_attn.{weight,bias}, attn.c_proj.{weight,bias}, ln_2.{..},
// mlp.c_fc.{..}, mlp.c_proj.{..}, then ln_f.{weight,bias} and, where the
// head is not tied, lm_head.weight: the tensors of the model's parts
// (ModelPartsOf) in their order.
std::vector<ParamInfo> GptTensors(const GptConfig& config);
// The suffixes of a block's tensors, in table order ("ln_1.weight", ...).
const std::vector<std::string>& GptBlockTensorNames();

// 2. Splits the layers into stage_layers.size() pipeline stages of
// contiguous layers, stage s holding stage_layers[s] of them (at least one,
// adding up to L); the embeddings (wte, wpe) are on stage 0, the final norm
// and the head (kAfterBlocks) on the last stage and, with more than one
// stage and a tied head, a copy of the table it reads (ParamInfo::tied) in
// the final unit.
void SplitStages(std::vector<ParamInfo>* tensors,
                 const std::vector<int>& stage_layers);
// pp stages of L/pp layers each (pp | L).
std::vector<int> EvenStageLayers(int n_layer, int pp);

// 3. Applies the tensor-parallel plan for rank `tp_rank` of `tp`: sets
// split, shape and boxes. Requires tp | NH and Vp a multiple of tp.
void ApplyTensorParallel(std::vector<ParamInfo>* tensors,
                         const GptConfig& config, int tp, int tp_rank);

// 3b. Keeps of the routed experts' tensors those of the rank at `tp_rank`
// of `tp` and `ep_rank` of config.moe.ep: its LocalExperts from
// FirstExpert (Moe) of every layer.
void KeepExperts(std::vector<ParamInfo>* tensors, const GptConfig& config,
                 int tp, int tp_rank, int ep_rank);

// 4. Keeps the tensors of `stage` and lays them out in ZeRO units — [wte
// wpe] on the first stage; per block [ln_1 c_attn] [attn.c_proj] [ln_2
// c_fc] [mlp.c_proj]; [ln_f] on the last — each unit padded to a multiple
// of `pad` (the dp degree) with zeros after its tensors.
std::vector<ParamInfo> LayoutUnits(const std::vector<ParamInfo>& tensors,
                                   int stage, int pad);
// The same for a rank that holds several stages (the virtual stages of an
// interleaved pipeline, in increasing order): one after the other in one
// flat buffer, units numbered on from one stage to the next.
std::vector<ParamInfo> LayoutUnits(const std::vector<ParamInfo>& tensors,
                                   const std::vector<int>& stages, int pad);

// The entries of a rank's layout that belong to `stage`, with their units
// and offsets counted from the stage's first unit: the layout of one model
// chunk. *first_unit gets that unit's index in `layout`.
std::vector<ParamInfo> StageSlice(const std::vector<ParamInfo>& layout,
                                  int stage, int* first_unit);

// A unit's place in the flat buffer: [begin, begin + size), size padded.
struct UnitRange {
  int64_t begin = 0, size = 0;
  // Its tensors are routed experts' (a unit holds only experts' or none).
  bool expert = false;
};
std::vector<UnitRange> Units(const std::vector<ParamInfo>& layout, int pad);

// Where this rank stands in the mesh, for the plan.
struct PlanOptions {
  int tp = 1, tp_rank = 0;
  int pp = 1, pp_rank = 0;
  int pad = 1;  // dp·cp: ZeRO's shard count (a multiple of an expert's)
  // Model chunks per pipeline rank (interleaved schedule): the model is
  // split into pp·v virtual stages and rank r holds stages r, r+pp, ...
  int virtual_stages = 1;
  // Layers of each of the pp·v stages (PipelineStageLayers of the spec);
  // empty: EvenStageLayers.
  std::vector<int> stage_layers;
  int ep_rank = 0;  // which experts/ep of each MoE layer's experts it holds
};

// The virtual stages pipeline rank `pp_rank` holds, in increasing order.
std::vector<int> RankStages(const PlanOptions& options);

// Steps 1-4 for one rank: its stages' tensors, tensor-parallel and laid
// out. `config.padded_vocab` must be PaddedVocab(V, tp).
std::vector<ParamInfo> BuildPlan(const GptConfig& config,
                                 const PlanOptions& options);

// Sizes multiplied and added without overflow: a result past int64 stays
// INT64_MAX ("too large"). For memory estimates of absurd configurations.
int64_t SatAdd(int64_t a, int64_t b);
int64_t SatMul(int64_t a, int64_t b);

// Real parameters of the whole model (no padding, no sharding).
int64_t GptNumParams(const GptConfig& config);

// Initial value of element `index` (global, flat) of parameter `info`: a
// pure function of (seed, name, index). Any shard of any layout gets the
// same numbers.
float InitialValue(const ParamInfo& info, uint64_t seed, int64_t index);

// Model FLOPs per trained token (forward + backward): 6 per matmul weight
// (wpe does no matmul) plus 12·L·C·T for attention scores and mixing.
double GptFlopsPerToken(const GptConfig& config, int T);

// --- templates -----------------------------------------------------------

template <typename Fn>
void ForEachBoxRow(const Box& box, Fn fn) {
  const size_t n = box.lo.size();
  if (box.empty()) return;
  std::vector<int64_t> coord = box.lo;
  while (true) {
    fn(coord);
    // Odometer over every dimension but the last.
    size_t d = n - 1;
    while (d > 0) {
      --d;
      if (++coord[d] < box.hi[d]) break;
      coord[d] = box.lo[d];
      if (d == 0) return;
    }
    if (n == 1) return;
  }
}

template <typename Fn>
void ForEachLocalBox(const ParamInfo& p, int64_t lo, int64_t hi, Fn fn) {
  const bool matrix = p.shape.size() == 2;
  const int64_t width = matrix ? p.shape[1] : 1;  // elements per local row
  int64_t pos = lo;
  while (pos < hi) {
    const int64_t row = pos / width, col = pos % width;
    // The box that holds this local row, and the row's place in it.
    int64_t first_row = 0;
    const Box* box = nullptr;
    for (const Box& b : p.boxes) {
      const int64_t rows = b.hi[0] - b.lo[0];
      if (row < first_row + rows) {
        box = &b;
        break;
      }
      first_row += rows;
    }
    if (box == nullptr) return;  // padding rows to the end of the tensor
    const int64_t g_row = box->lo[0] + (row - first_row);
    Box out = *box;
    if (col != 0 || hi - pos < width) {
      // Part of one row.
      const int64_t end = std::min(hi - pos, width - col);
      out.lo[0] = g_row;
      out.hi[0] = g_row + 1;
      out.lo[1] = box->lo[1] + col;
      out.hi[1] = box->lo[1] + col + end;
      fn(out, pos);
      pos += end;
      continue;
    }
    // Whole rows, up to the end of the stretch or of the box.
    const int64_t rows = std::min((hi - pos) / width, box->hi[0] - g_row);
    out.lo[0] = g_row;
    out.hi[0] = g_row + rows;
    fn(out, pos);
    pos += rows * width;
  }
}

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_PLAN_H_
