// The job spec: YAML text <-> ptrain.v1.JobSpec, defaults, `--set` overrides
// and validation. Shared by ptctl, ptcoord and ptworker so that all three
// accept and refuse exactly the same files. Checks that need the data (the
// vocabulary) or the MPI world (its size) live with those, not here.
#ifndef PTRAIN_COMMON_SPEC_H_
#define PTRAIN_COMMON_SPEC_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

// A job spec is a page of YAML; anything this large, as a file or after
// `--set` overrides, is a wrong file or a mistake, and refusing it keeps a
// stray path from pulling gigabytes into ptctl, ptcoord or ptworker.
inline constexpr size_t kMaxSpecBytes = size_t{1} << 20;

// Bounds on the parallel degrees, one by one and multiplied together.
inline constexpr int64_t kMaxDegree = int64_t{1} << 16;
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

// The world size of a layout: the product of its parallel degrees, every
// dimension of the mesh (common/mesh.h), in 64 bits.
int64_t ParallelWorldSize(const v1::ParallelSpec& parallel);

// How often a rank under ptcoord says it is alive (ReportAlive), in
// milliseconds: a quarter of restart.hang_timeout_s, kept within
// [250 ms, 10 s]. ptcoord takes a rank silent for several of these as one
// that stopped.
int64_t AliveIntervalMs(int64_t hang_timeout_s);

// RankTimes.comm_ms (coordinator.proto), which ranks send and ptcoord
// checks: at most kMaxRankTimesGroups groups, each named by 1 to
// kMaxRankTimesGroupBytes letters, digits or '_' (IsRankTimesGroupName).
inline constexpr size_t kMaxRankTimesGroups = 8;
inline constexpr size_t kMaxRankTimesGroupBytes = 16;
bool IsRankTimesGroupName(std::string_view name);
// ParallelWorldSize of the spec's parallel section.
int64_t JobWorldSize(const v1::JobSpec& spec);
// The world size's factors for messages: "parallel.dp × parallel.tp ×
// parallel.pp = 2 × 1 × 1", with " × parallel.cp" and its degree when cp > 1.
std::string ParallelWorldFactors(const v1::ParallelSpec& parallel);

// The string-valued fields of a validated spec as the engine uses them:
// the parser is the only code that compares their text.
//
// parallel.schedule.
enum class ScheduleKind {
  kGpipe,        // every forward, then every backward
  k1F1B,         // warm-up forwards, one forward one backward, cool-down
  kInterleaved,  // 1F1B over v model chunks per rank (virtual stages)
  // ZB-H1 ("zb1p"): 1F1B's forwards and input-gradient passes, each
  // backward's weight-gradient pass deferred into what would be bubble.
  kZeroBubble,
};
// "gpipe", "interleaved", "zb1p", else 1F1B (the name of a validated spec).
ScheduleKind ScheduleKindOf(std::string_view name);
// "gpipe", "1f1b", "interleaved", "zb1p".
const char* ScheduleName(ScheduleKind kind);
// What a stage recomputes in backward instead of keeping from forward
// (train.recompute): nothing; the attention's core (its probabilities, or
// whatever the backend's attention keeps) — Megatron's "selective"; or
// whole blocks, keeping only each block's input.
enum class Recompute { kNone, kSelective, kFull };
// train.recompute's value ("none", "selective", "full"; validated).
Recompute RecomputeOf(std::string_view name);
// resources.device.
enum class Device { kCpu, kCuda };
// train.precision with `auto` resolved: bf16 on a GPU, fp32 on the CPU.
enum class Precision { kFp32, kBf16 };
Device SpecDevice(const v1::JobSpec& spec);
Precision SpecPrecision(const v1::JobSpec& spec);
// train.cuda_graphs ("auto", "on", "off"; validated; anything else is off).
enum class CudaGraphs { kOff, kAuto, kOn };
CudaGraphs CudaGraphsOf(const v1::JobSpec& spec);
// Why the job's passes cannot be recorded as CUDA graphs, naming the field
// and the reason (a pass that communicates or copies between host and GPU
// in the middle), or "" where they can: on cuda, dp = tp = cp = 1 (a
// pipeline's stages pass activations between passes, not inside them; not
// zb1p, whose backward is two), parallel.zero=0, parallel.offload=none.
std::string CudaGraphsUnsupported(const v1::JobSpec& spec);

// model.tie_embeddings; absent (a spec stored before the field): true.
bool TiesEmbeddings(const v1::ModelSpec& model);
// arch llama's fields with their defaults (docs/job-spec.md): the key and
// value heads (n_head where 0), and the MLP's hidden width (ffn_hidden, or
// Llama's rule: 8C/3, times ffn_dim_multiplier where set, rounded up to a
// multiple of multiple_of, 256 where 0). For arch gpt: n_head and 4C.
int KvHeads(const v1::ModelSpec& model);
int FfnHidden(const v1::ModelSpec& model);
// An attention head's channels: model.head_dim, or n_embd / n_head.
int HeadDim(const v1::ModelSpec& model);
// model.moe with its defaults (docs/job-spec.md): top_k 2, every 1,
// expert_hidden FfnHidden, router softmax, aux_loss_coef 0.01, balance
// aux; all zero (experts 0) where the model has no experts.
v1::MoeSpec MoeOf(const v1::ModelSpec& model);
// arch llama's RMSNorm epsilon (1e-5 where 0), RoPE base (10000 where 0)
// and Llama 3 scaling (factor as given, 0: none; low_freq_factor 1,
// high_freq_factor 4, original_context 8192 where 0): the one place their
// defaults are spelt.
double NormEps(const v1::ModelSpec& model);
double RopeTheta(const v1::ModelSpec& model);
v1::RopeScalingSpec RopeScaling(const v1::ModelSpec& model);

// The path of token files' pattern up to its file name's last "_train"
// (data/web/web_train_*.bin: data/web/web), where `ptworker prepare`
// writes what belongs to them; "" where the file name has none.
std::string TrainFilesPrefix(std::string_view train_bin);
// A blend source's name: its own, else the file name of its train files'
// prefix (data/web/web_train_*.bin: web); "" where neither gives one.
std::string BlendSourceName(const v1::BlendSource& source);
// data.blend's bounds: sources, and a name's bytes (names label metrics and
// ride in progress reports; no control characters either).
inline constexpr int kMaxBlendSources = 64;
inline constexpr size_t kMaxBlendNameBytes = 64;
// 1 to kMaxBlendNameBytes bytes, none a control character.
bool IsBlendSourceName(std::string_view name);
// The data of blend source i alone: its token files with data.tokenizer.
v1::DataSpec BlendSourceData(const v1::DataSpec& data, int i);

// A JobSpec with every field at its documented default (docs/job-spec.md).
v1::JobSpec DefaultJobSpec();

// Parses YAML onto DefaultJobSpec(), applies `overrides` ("a.b.c=value", in
// order) and validates. The text and each override must be UTF-8, and the
// spec after overrides at most kMaxSpecBytes. Errors are InvalidArgument and
// name the field path and the rule, e.g. "train.steps: expected an integer, got
// 'abc' (line 4, column 10)" or "parallel.tp=3 does not divide model.n_head=4".
// An unknown key is an error. `source` names the text in messages (a file
// name).
// With `read_file`, a job whose model.init_from is hf:DIR takes the model
// fields it leaves out from DIR/config.json (common/hf_config.h; read with
// read_file, and block_size capped at the model's positions), and those
// it gives must agree with the config's (CheckSpecAgainstHf).
using SpecFileReader =
    std::function<absl::StatusOr<std::string>(const std::string& path)>;
absl::StatusOr<v1::JobSpec> ParseJobSpec(
    std::string_view yaml_text, const std::vector<std::string>& overrides = {},
    std::string_view source = "job spec",
    const SpecFileReader& read_file = nullptr);
// model.init_from's prefix for a Hugging Face model folder.
inline constexpr absl::string_view kHfPrefix = "hf:";

// The text of the job spec file `path`: ReadBoundedFile (a regular file of
// at most kMaxSpecBytes; a folder, a device or a pipe is refused), whose
// messages `what` leads (the flag that named the file, e.g. "--config").
// NotFound when it does not exist; InvalidArgument (PermissionDenied)
// naming `what` and the path otherwise.
absl::StatusOr<std::string> ReadJobSpecFile(const std::string& path,
                                            std::string_view what = "job spec");

// ReadJobSpecFile, then ParseJobSpec with the path as the source.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(
    const std::string& path, const std::vector<std::string>& overrides = {},
    std::string_view what = "job spec",
    const SpecFileReader& read_file = nullptr);

// GPT-2's vocabulary: an llm.c token file's when model.vocab_size is 0.
inline constexpr int kGpt2VocabSize = 50257;

// Applies one "dotted.path=value" assignment; the value is parsed as a YAML
// scalar of the field's type. Does not validate the whole spec.
absl::Status ApplyOverride(v1::JobSpec* spec, std::string_view assignment);

// The layers of each of the pp · virtual_stages pipeline stages (model
// chunks), in order: parallel.first_stage_layers on the first and
// parallel.last_stage_layers on the last when set (> 0), the rest split
// evenly over the others. InvalidArgument naming the fields and the rule
// when the layers cannot be split so (each stage holds at least one).
absl::StatusOr<std::vector<int>> PipelineStageLayers(
    const v1::ParallelSpec& parallel, int n_layer);

// Checks ranges and cross-field rules (degrees dividing heads, layers, batch).
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// Whether the spec leaves its layout to the planner (`parallel: auto`),
// which ptcoord resolves at submit (docs/planner.md).
bool IsAutoLayout(const v1::JobSpec& spec);
// What runs ranks (ptworker) asks of a spec beyond ValidateJobSpec: a
// layout written out. InvalidArgument for `parallel: auto`, saying where
// it is resolved.
absl::Status CheckLayoutResolved(const v1::JobSpec& spec);

// Job priorities (JobSpec.priority): the words and the range of numbers.
inline constexpr int kPriorityLow = 200;
inline constexpr int kPriorityNormal = 500;
inline constexpr int kPriorityHigh = 800;
inline constexpr int kMaxPriority = 1000;

// `text` as a priority: "low", "normal" ("" too), "high", or a whole number
// in [0, kMaxPriority]. InvalidArgument naming `priority` and the rule.
absl::StatusOr<int> PriorityValue(std::string_view text);

// A priority as a user reads it: "high (800)", or "650".
std::string PriorityWords(int priority);

// restart.preemptible, unset meaning true.
inline bool Preemptible(const v1::JobSpec& spec) {
  return !spec.restart().has_preemptible() || spec.restart().preemptible();
}

// Valid but likely unintended choices, each a sentence naming the fields
// (e.g. fewer microbatches than pipeline stages under 1F1B: the bubble
// dominates). ptctl prints them before sending; ptworker logs them.
std::vector<std::string> JobSpecWarnings(const v1::JobSpec& spec);

// Every field, defaults included, as YAML that ParseJobSpec reads back to an
// equal JobSpec.
std::string JobSpecToYaml(const v1::JobSpec& spec);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_SPEC_H_
