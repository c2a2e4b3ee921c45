// Hugging Face model folders in (model.init_from: hf:DIR) and out
// (`ptworker export --checkpoint CKPT --hf OUT`): config.json
// (common/hf_config.h) and safetensors files (safetensors.h), one
// (model.safetensors) or several with an index
// (model.safetensors.index.json, its weight_map naming each tensor's file).
//
// The tensors under Hugging Face's names for GPT2LMHeadModel ("transformer."
// before every name but lm_head's when written; read with or without it),
// whose linear weights are stored transposed (in × out), and for
// LlamaForCausalLM, whose gate and up projections are two tensors where
// ptrain stacks them in one (mlp.gate_up_proj.weight). Read, each rank
// reads the byte ranges of the slices it holds, never a whole file.
// Written in fp32 (export then import is bit-exact) or bf16 (each weight
// rounded to nearest even).
#ifndef PTRAIN_WORKER_ENGINE_CHECKPOINT_HF_CHECKPOINT_H_
#define PTRAIN_WORKER_ENGINE_CHECKPOINT_HF_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/confined_fs.h"
#include "common/hf_config.h"
#include "common/hf_tokenizer_export.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/safetensors.h"
#include "worker/engine/model/plan.h"

namespace ptrain {

// One tensor of ptrain's (or a stretch of its leading dimension) under its
// Hugging Face name.
struct HfTensorName {
  std::string hf, ours;
  std::vector<int64_t> hf_shape;
  int64_t row0 = 0;        // where it begins in ours (dim 0)
  bool transpose = false;  // stored (in, out): GPT-2's linear weights
};
// Every tensor of `config`'s model under its Hugging Face name, with
// `prefix` before GPT-2's (not lm_head's).
std::vector<HfTensorName> HfTensorNames(const GptConfig& config,
                                        const std::string& prefix);

// A Hugging Face folder's weights for `config`'s model, as ptrain's
// tensors. Open checks every tensor the model needs is there with its
// shape (GPT-2's position table may hold more positions than block_size;
// a tied model's lm_head.weight, and GPT-2's attention-mask buffers, are
// passed over), and that the folder holds no other: errors name `field`,
// the file and the tensor.
class HfSource : public TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<HfSource>> Open(
      const std::string& dir, const GptConfig& config,
      const ConfinedFs& fs = ConfinedFs(),
      const std::string& field = "model.init_from");
  absl::Status Read(const std::string& name, const Box& box,
                    float* dst) override;

 private:
  std::vector<std::unique_ptr<SafetensorsSource>> files_;
  // Ours → its Hugging Face pieces, each with the file that holds it.
  struct Piece {
    HfTensorName name;
    SafetensorsSource* file;
  };
  std::map<std::string, std::vector<Piece>> pieces_;
};

// The largest shard an export writes: 5 GB, as Hugging Face's own.
inline constexpr int64_t kHfShardBytes = int64_t{5000} * 1000 * 1000;

// Writes `config`'s model from `source` (ptrain's names, global boxes) to
// the folder `out` (created; files already there are replaced):
// config.json (its torch_dtype `dtype`'s), the weights in `dtype` (F32 or
// BF16) in shards of at most `shard_bytes` (5 GB, counted in `dtype`'s
// bytes) (one file, model.safetensors, when they fit; else
// model-0000i-of-0000n.safetensors and model.safetensors.index.json), and
// `tokenizer_files` (hf_tokenizer_export.h's HfTokenizerFiles), and in
// config.json the tokenizer's special ids `tokens`. Each file is written
// beside its name and renamed. Errors name `field`.
absl::Status ExportHf(TensorSource& source, const GptConfig& config,
                      const std::string& out,
                      const std::vector<HfFile>& tokenizer_files,
                      const ConfinedFs& fs = ConfinedFs(),
                      const std::string& field = "--hf",
                      SafetensorsDtype dtype = SafetensorsDtype::kF32,
                      int64_t shard_bytes = kHfShardBytes,
                      HfTokenIds tokens = {});

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_CHECKPOINT_HF_CHECKPOINT_H_
