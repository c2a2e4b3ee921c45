// Tests for common/spec: defaults, YAML mapping and its errors, --set
// overrides, validation rules and the YAML round trip. All in memory except
// the LoadJobSpecFile cases, which use the test's temporary directory.
#include "common/spec.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/hf_config.h"
#include "common/utf8.h"

namespace ptrain {
namespace {

using google::protobuf::util::MessageDifferencer;

// gmock is not linked; this reports a miss the way HasSubstr would.
::testing::AssertionResult Contains(absl::string_view text,
                                    absl::string_view part) {
  if (absl::StrContains(text, part)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "'" << text << "' does not contain '" << part << "'";
}

// The smallest spec that validates: everything else is at its default.
constexpr char kMinimal[] = R"(name: t
data: {path: data/tinyshakespeare.txt}
)";

// DESIGN.md §4, verbatim.
constexpr char kDesignExample[] = R"(name: shakespeare-3d
model:  {arch: gpt, n_layer: 4, n_head: 4, n_embd: 128, block_size: 64}
data:   {path: data/tinyshakespeare.txt, tokenizer: char, val_fraction: 0.1}   # or {train_bin: …, val_bin: …} llm.c token files
parallel: {dp: 2, tp: 2, pp: 2, zero: 1, sequence_parallel: false, microbatches: 4, schedule: 1f1b}
train:  {steps: 2000, global_batch: 32, lr: 1.0e-3, min_lr: 1.0e-4, warmup_steps: 100,
         weight_decay: 0.1, grad_clip: 1.0, seed: 1337, eval_every: 100, eval_batches: 20, sample_every: 500}
checkpoint: {every: 200, keep_last: 3, dir: checkpoints/shakespeare-3d}   # dir holds step-NNNNNNNN/ folders
resources:  {device: cpu, ranks_per_node: 4}          # device: cpu | cuda
restart:    {max_restarts: 3, hang_timeout_s: 300}
)";

// Parses `yaml` and returns the error message, failing the test if it
// parsed.
std::string ParseError(const std::string& yaml,
                       const std::vector<std::string>& overrides = {}) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(yaml, overrides, "job.yaml");
  EXPECT_FALSE(spec.ok()) << "parsed, expected an error:\n" << yaml;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

// The error from applying `overrides` to the minimal spec.
std::string OverrideError(const std::vector<std::string>& overrides) {
  return ParseError(kMinimal, overrides);
}

v1::JobSpec MustParse(const std::string& yaml,
                      const std::vector<std::string>& overrides = {}) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(yaml, overrides, "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

TEST(DefaultJobSpec, HasTheDocumentedDefaults) {
  const v1::JobSpec s = DefaultJobSpec();
  EXPECT_EQ(s.name(), "");
  EXPECT_EQ(s.priority(), "normal");
  EXPECT_TRUE(s.restart().preemptible());
  EXPECT_EQ(s.model().arch(), "gpt");
  EXPECT_EQ(s.model().n_layer(), 4);
  EXPECT_EQ(s.model().n_head(), 4);
  EXPECT_EQ(s.model().n_embd(), 128);
  EXPECT_EQ(s.model().block_size(), 64);
  EXPECT_EQ(s.model().vocab_size(), 0);
  EXPECT_EQ(s.model().init_from(), "");
  EXPECT_EQ(s.data().path(), "");
  EXPECT_EQ(s.data().tokenizer(), "auto");
  EXPECT_EQ(s.data().val_fraction(), 0.1);
  EXPECT_EQ(s.data().train_bin(), "");
  EXPECT_EQ(s.data().val_bin(), "");
  EXPECT_EQ(s.parallel().dp(), 1);
  EXPECT_EQ(s.parallel().tp(), 1);
  EXPECT_EQ(s.parallel().pp(), 1);
  EXPECT_EQ(s.parallel().zero(), 0);
  EXPECT_FALSE(s.parallel().sequence_parallel());
  EXPECT_EQ(s.parallel().microbatches(), 1);
  EXPECT_EQ(s.parallel().schedule(), "1f1b");
  EXPECT_EQ(s.parallel().bucket_bytes(), 26214400);
  EXPECT_EQ(s.train().steps(), 1000);
  EXPECT_EQ(s.train().global_batch(), 32);
  EXPECT_EQ(s.train().lr(), 1e-3);
  EXPECT_EQ(s.train().min_lr(), 1e-4);
  EXPECT_EQ(s.train().warmup_steps(), 100);
  EXPECT_EQ(s.train().weight_decay(), 0.1);
  EXPECT_EQ(s.train().grad_clip(), 1.0);
  EXPECT_EQ(s.train().seed(), 1337u);
  EXPECT_EQ(s.train().eval_every(), 100);
  EXPECT_EQ(s.train().eval_batches(), 20);
  EXPECT_EQ(s.train().sample_every(), 0);
  EXPECT_EQ(s.train().beta1(), 0.9);
  EXPECT_EQ(s.train().beta2(), 0.95);
  EXPECT_EQ(s.train().eps(), 1e-8);
  EXPECT_EQ(s.train().sample_prompt(), "\n");
  EXPECT_EQ(s.train().sample_tokens(), 200);
  EXPECT_EQ(s.train().sample_temperature(), 1.0);
  EXPECT_EQ(s.train().sample_top_k(), 0);
  EXPECT_EQ(s.train().log_every(), 10);
  EXPECT_EQ(s.checkpoint().every(), 0);
  EXPECT_EQ(s.checkpoint().keep_last(), 3);
  EXPECT_EQ(s.checkpoint().dir(), "");
  EXPECT_EQ(s.resources().device(), "cpu");
  EXPECT_EQ(s.resources().ranks_per_node(), 0);
  EXPECT_EQ(s.resources().threads_per_rank(), 0);
  EXPECT_EQ(s.restart().max_restarts(), 3);
  EXPECT_EQ(s.restart().hang_timeout_s(), 300);
}

TEST(ParseJobSpec, PriorityIsAWordOrAWholeNumberUpTo1000) {
  EXPECT_EQ(*PriorityValue(MustParse(kMinimal, {"priority=high"}).priority()),
            kPriorityHigh);
  EXPECT_EQ(*PriorityValue(MustParse(kMinimal, {"priority=700"}).priority()),
            700);
  EXPECT_EQ(*PriorityValue(MustParse(kMinimal).priority()), kPriorityNormal);
  EXPECT_EQ(*PriorityValue(""), kPriorityNormal);
  EXPECT_EQ(*PriorityValue("low"), kPriorityLow);
  for (const char* bad :
       {"priority=1001", "priority=-1", "priority=urgent", "priority=7.5"}) {
    const std::string e = OverrideError({bad});
    EXPECT_NE(e.find("priority:"), std::string::npos) << e;
    EXPECT_NE(e.find("[0, 1000]"), std::string::npos) << e;
  }
  EXPECT_FALSE(MustParse(kMinimal, {"restart.preemptible=false"})
                   .restart()
                   .preemptible());
  EXPECT_EQ(PriorityWords(800), "high (800)");
  EXPECT_EQ(PriorityWords(650), "650");
}

TEST(ParseJobSpec, FieldsMissingFromTheFileKeepTheirDefaults) {
  v1::JobSpec expected = DefaultJobSpec();
  expected.set_name("t");
  expected.mutable_data()->set_path("data/tinyshakespeare.txt");
  EXPECT_TRUE(MessageDifferencer::Equals(MustParse(kMinimal), expected));
}

TEST(ParseJobSpec, DesignExampleParsesToTheExpectedValues) {
  v1::JobSpec expected = DefaultJobSpec();
  expected.set_name("shakespeare-3d");
  expected.mutable_data()->set_path("data/tinyshakespeare.txt");
  expected.mutable_data()->set_tokenizer("char");
  v1::ParallelSpec* p = expected.mutable_parallel();
  p->set_dp(2);
  p->set_tp(2);
  p->set_pp(2);
  p->set_zero(1);
  p->set_microbatches(4);
  v1::TrainSpec* t = expected.mutable_train();
  t->set_steps(2000);
  t->set_sample_every(500);
  v1::CheckpointSpec* c = expected.mutable_checkpoint();
  c->set_every(200);
  c->set_dir("checkpoints/shakespeare-3d");
  expected.mutable_resources()->set_ranks_per_node(4);

  const v1::JobSpec got = MustParse(kDesignExample);
  std::string diff;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(got, expected)) << diff;
}

// `parallel: auto` (and `--set parallel=auto`) leaves the layout to
// ptcoord's planner: the spec validates with the default degrees, says it
// is auto, and is refused where ranks would run it.
TEST(ParseJobSpec, ParallelAutoIsALayoutLeftToThePlanner) {
  for (const v1::JobSpec& spec :
       {MustParse(absl::StrCat(kMinimal, "parallel: auto\n")),
        MustParse(kMinimal, {"parallel=auto"}),
        MustParse(absl::StrCat(kMinimal,
                               "parallel: {layout: auto, bucket_bytes: "
                               "1048576}\n"))}) {
    EXPECT_TRUE(IsAutoLayout(spec));
    EXPECT_EQ(JobWorldSize(spec), 1);
    const absl::Status resolved = CheckLayoutResolved(spec);
    EXPECT_EQ(resolved.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(resolved.message(), "ptctl submit"));
    // Printed (ptctl submit --dry-run) and read back, it is the same.
    EXPECT_TRUE(
        MessageDifferencer::Equals(MustParse(JobSpecToYaml(spec)), spec));
  }
  const v1::JobSpec written = MustParse(kMinimal, {"parallel.dp=1"});
  EXPECT_FALSE(IsAutoLayout(written));
  EXPECT_TRUE(CheckLayoutResolved(written).ok());
}

TEST(ParseJobSpec, ParallelAutoRefusesAChoiceOfItsOwnNamingIt) {
  EXPECT_TRUE(Contains(
      ParseError(absl::StrCat(kMinimal, "parallel: auto\n"), {"parallel.tp=2"}),
      "parallel: auto chooses parallel.tp itself: remove "
      "parallel.tp (2)"));
  EXPECT_TRUE(Contains(
      OverrideError({"parallel.layout=auto", "parallel.microbatches=4"}),
      "parallel: auto chooses parallel.microbatches"));
  EXPECT_TRUE(Contains(OverrideError({"parallel.layout=fastest"}),
                       "parallel.layout='fastest': expected auto"));
  EXPECT_TRUE(Contains(ParseError(absl::StrCat(kMinimal, "parallel: fast\n")),
                       "parallel: expected a map of fields or auto"));
  // Other sections take no single word.
  EXPECT_TRUE(Contains(ParseError(absl::StrCat(kMinimal, "train: auto\n")),
                       "train: expected a map of fields, got"));
}

TEST(ParseJobSpec, UnknownTopLevelKeyIsRefusedNamingIt) {
  const std::string msg = ParseError(absl::StrCat(kMinimal, "n_layer: 4\n"));
  EXPECT_TRUE(Contains(msg,
                       "job.yaml: n_layer: unknown key; expected one "
                       "of name, model, data, parallel"));
  EXPECT_TRUE(Contains(msg, "(line 3, column 1)"));
}

TEST(ParseJobSpec, UnknownNestedKeyIsRefusedNamingTheDottedPath) {
  const std::string msg =
      ParseError(absl::StrCat(kMinimal, "model:\n  n_layers: 4\n"));
  EXPECT_TRUE(Contains(
      msg,
      "model.n_layers: unknown key (did you mean n_layer?); "
      "expected one of arch, "
      "n_layer, n_head, n_embd, block_size, vocab_size, "
      "init_from, tie_embeddings, n_kv_head, norm_eps, rope_theta, "
      "rope_scaling, ffn_hidden, multiple_of, "
      "ffn_dim_multiplier, moe, head_dim, qk_norm (line 4, column 3)"));
}

TEST(ParseJobSpec, DuplicateKeyIsRefused) {
  EXPECT_TRUE(Contains(
      ParseError(absl::StrCat(kMinimal, "train: {steps: 1, steps: 2}\n")),
      "train.steps: duplicate key"));
}

TEST(ParseJobSpec, NonIntegerForIntegerFieldIsRefusedWithLineAndColumn) {
  const std::string yaml =
      "name: t\ndata: {path: a.txt}\ntrain:\n  steps: abc\n";
  EXPECT_TRUE(Contains(ParseError(yaml),
                       "train.steps: expected an integer, got 'abc' (line "
                       "4, column 10)"));
}

TEST(ParseJobSpec, FractionForIntegerFieldIsRefused) {
  EXPECT_TRUE(
      Contains(ParseError(absl::StrCat(kMinimal, "train: {steps: 1.5}\n")),
               "train.steps: expected an integer, got '1.5'"));
}

TEST(ParseJobSpec, NonNumberForDoubleFieldIsRefused) {
  EXPECT_TRUE(
      Contains(ParseError(absl::StrCat(kMinimal, "train: {lr: fast}\n")),
               "train.lr: expected a number, got 'fast'"));
}

TEST(ParseJobSpec, NonBooleanForBoolFieldIsRefused) {
  EXPECT_TRUE(Contains(
      ParseError(absl::StrCat(kMinimal, "parallel: {sequence_parallel: 1}\n")),
      "parallel.sequence_parallel: expected true or false, got '1'"));
}

TEST(ParseJobSpec, QuotedNumberIsAStringNotANumber) {
  EXPECT_TRUE(
      Contains(ParseError(absl::StrCat(kMinimal, "train: {steps: \"200\"}\n")),
               "train.steps: expected an integer, got the quoted "
               "string '200'"));
}

TEST(ParseJobSpec, EmptyValueIsATypeError) {
  EXPECT_TRUE(Contains(ParseError(absl::StrCat(kMinimal, "train:\n  steps:\n")),
                       "train.steps: expected an integer, got an empty value"));
  EXPECT_TRUE(
      Contains(ParseError(absl::StrCat(kMinimal, "checkpoint: {dir: ~}\n")),
               "checkpoint.dir: expected a string, got an empty "
               "value; write '' for an empty string"));
  EXPECT_TRUE(Contains(ParseError(absl::StrCat(kMinimal, "model:\n")),
                       "model: expected a map of fields, got an empty value"));
}

TEST(ParseJobSpec, EmptyQuotedStringIsAnEmptyString) {
  v1::JobSpec spec =
      MustParse(absl::StrCat(kMinimal, "train: {sample_prompt: ''}\n"));
  EXPECT_EQ(spec.train().sample_prompt(), "");
}

TEST(ParseJobSpec, MapWhereScalarExpectedIsRefused) {
  EXPECT_TRUE(
      Contains(ParseError(absl::StrCat(kMinimal, "train:\n  steps: {a: 1}\n")),
               "train.steps: expected an integer, got a map (line 4, column "
               "10)"));
}

TEST(ParseJobSpec, ScalarWhereMapExpectedIsRefused) {
  EXPECT_TRUE(Contains(ParseError(absl::StrCat(kMinimal, "model: gpt\n")),
                       "model: expected a map of fields, got 'gpt' (line 3, "
                       "column 8)"));
}

TEST(ParseJobSpec, ListWhereScalarExpectedIsRefused) {
  EXPECT_TRUE(Contains(ParseError("name: [a, b]\ndata: {path: a.txt}\n"),
                       "name: expected a string, got a list"));
}

TEST(ParseJobSpec, Int32OverflowIsRefused) {
  EXPECT_TRUE(Contains(
      ParseError(absl::StrCat(kMinimal, "model: {n_layer: 2147483648}\n")),
      "model.n_layer: 2147483648 is out of range for int32 "
      "[-2147483648, 2147483647]"));
  EXPECT_TRUE(Contains(
      ParseError(absl::StrCat(kMinimal, "model: {n_layer: -2147483649}\n")),
      "model.n_layer: -2147483649 is out of range for int32"));
  // The boundary itself reads; only validation may refuse it.
  v1::JobSpec spec = DefaultJobSpec();
  EXPECT_TRUE(ApplyOverride(&spec, "model.n_layer=2147483647").ok());
  EXPECT_EQ(spec.model().n_layer(), 2147483647);
}

TEST(ParseJobSpec, Int64AndUint64RangesAreEnforced) {
  EXPECT_TRUE(Contains(ParseError(absl::StrCat(
                           kMinimal, "train: {steps: 9223372036854775808}\n")),
                       "train.steps: 9223372036854775808 is out of range for "
                       "int64"));
  EXPECT_TRUE(
      Contains(ParseError(absl::StrCat(kMinimal, "train: {seed: -1}\n")),
               "train.seed: -1 is out of range for uint64"));
  v1::JobSpec spec = MustParse(
      absl::StrCat(kMinimal, "train: {seed: 18446744073709551615}\n"));
  EXPECT_EQ(spec.train().seed(), 18446744073709551615u);
}

TEST(ParseJobSpec, MalformedYamlReportsSourceLineAndColumn) {
  const std::string msg = ParseError("name: t\nmodel: {n_layer: 4\n");
  EXPECT_TRUE(Contains(msg, "job.yaml: malformed YAML at line 3, column 1"));
}

// yaml-cpp 0.7's LoadAll never returns on these (the fuzzer's first
// finding); the parser must refuse them at once.
TEST(ParseJobSpec, InputThatStallsTheYamlParserIsRefused) {
  for (const char* text :
       {",", ",a: b", "\n,\n", ",\x02ndel: {arch: g--\nt`"}) {
    const std::string e = ParseError(text);
    EXPECT_TRUE(Contains(e, "malformed YAML at line")) << text << ": " << e;
  }
}

TEST(ParseJobSpec, TopLevelThatIsNotAMapIsRefused) {
  EXPECT_TRUE(
      Contains(ParseError("- a\n- b\n"), "job.yaml: expected a map of fields"));
  EXPECT_TRUE(Contains(ParseError("just text\n"), "got 'just text'"));
  EXPECT_TRUE(Contains(ParseError(""), "got an empty document"));
  EXPECT_TRUE(
      Contains(ParseError("# only a comment\n"), "got an empty document"));
}

TEST(ParseJobSpec, SeveralDocumentsAreRefused) {
  EXPECT_TRUE(Contains(ParseError(absl::StrCat(kMinimal, "---\n", kMinimal)),
                       "job.yaml: holds more than one YAML document"));
}

TEST(ParseJobSpec, YamlNumberSpellingsAreRead) {
  v1::JobSpec spec = MustParse(absl::StrCat(
      kMinimal, "train: {lr: 3e-4, min_lr: 0, steps: +7, weight_decay: .5}\n"));
  EXPECT_EQ(spec.train().lr(), 3e-4);
  EXPECT_EQ(spec.train().min_lr(), 0.0);
  EXPECT_EQ(spec.train().steps(), 7);
  EXPECT_EQ(spec.train().weight_decay(), 0.5);
}

// --- validation -------------------------------------------------------------

TEST(ValidateJobSpec, MinimalSpecIsValid) { MustParse(kMinimal); }

// arch llama: its fields take their defaults where 0, and are refused on
// arch gpt; key/value heads divide the query heads, and tp divides them or
// they divide tp; heads are of even size (rotary positions turn pairs).
TEST(ValidateJobSpec, MoeFieldsTheirDefaultsAndRules) {
  const v1::MoeSpec moe =
      MoeOf(MustParse(kMinimal, {"model.moe.experts=8"}).model());
  EXPECT_EQ(moe.top_k(), 2);
  EXPECT_EQ(moe.every(), 1);
  EXPECT_EQ(moe.expert_hidden(), 512);  // the dense MLP's: 4C
  EXPECT_EQ(moe.router(), "softmax");
  EXPECT_EQ(moe.aux_loss_coef(), 0.01);
  EXPECT_EQ(moe.balance(), "aux");
  EXPECT_EQ(MoeOf(MustParse(kMinimal, {"model.moe.experts=8",
                                       "model.moe.aux_loss_coef=0"})
                      .model())
                .aux_loss_coef(),
            0.0);
  EXPECT_EQ(MoeOf(MustParse(kMinimal).model()).experts(), 0);
  MustParse(kMinimal,
            {"model.arch=llama", "model.moe.experts=4", "model.moe.top_k=4",
             "model.moe.router=sigmoid", "model.moe.capacity_factor=1.25",
             "model.moe.shared_experts=1", "parallel.tp=2"});
  EXPECT_EQ(OverrideError({"model.moe.top_k=2"}),
            "model.moe needs model.moe.experts >= 1 (every other model.moe "
            "field applies to experts)");
  EXPECT_EQ(OverrideError({"model.moe.experts=4", "model.moe.top_k=5"}),
            "model.moe.top_k=5 is more than model.moe.experts=4");
  EXPECT_EQ(
      OverrideError({"model.moe.experts=4", "model.moe.capacity_factor=-1"}),
      "model.moe.capacity_factor=-1 must be between 0 and 1000");
  EXPECT_EQ(OverrideError({"model.moe.experts=4", "model.moe.router=tanh"}),
            "model.moe.router='tanh' must be one of softmax, sigmoid");
  EXPECT_EQ(OverrideError({"model.moe.experts=4", "model.moe.expert_hidden=6",
                           "parallel.tp=4"}),
            "parallel.tp=4 does not divide model.moe.expert_hidden=6 (each "
            "expert is split over tp)");
  const v1::MoeSpec bias = MoeOf(
      MustParse(kMinimal, {"model.moe.experts=4", "model.moe.balance=bias"})
          .model());
  EXPECT_EQ(bias.bias_update_rate(), 0.001);  // DeepSeek-V3's
  EXPECT_EQ(
      OverrideError({"model.moe.experts=4", "model.moe.bias_update_rate=0.01"}),
      "model.moe.bias_update_rate applies to model.moe.balance=bias, "
      "not 'aux'");
  EXPECT_EQ(OverrideError({"model.moe.experts=4", "model.moe.balance=bias",
                           "model.moe.bias_update_rate=2"}),
            "model.moe.bias_update_rate=2 must be between 0 and 1");
  EXPECT_EQ(MustParse(kMinimal, {"model.moe.experts=4", "model.moe.every=4"})
                .model()
                .moe()
                .every(),
            4);
  EXPECT_EQ(OverrideError({"model.moe.experts=4", "model.moe.every=5"}),
            "model.moe.every=5 is more than model.n_layer=4: no block would "
            "have experts (the MoE MLP is in blocks every−1, 2·every−1, ...)");
  EXPECT_EQ(MustParse(kMinimal,
                      {"model.moe.experts=4", "parallel.cp=2", "parallel.ep=2"})
                .parallel()
                .ep(),
            2);  // ep carved out of the cp ranks
  EXPECT_EQ(OverrideError({"model.moe.experts=4", "resources.device=cuda"}),
            "model.moe with resources.device=cuda: the experts' CUDA kernels "
            "have not been verified on a GPU yet; use resources.device=cpu");
}

// parallel.ep: experts split over ep of the dp × cp ranks (no ranks of its
// own); it divides them and the experts, and needs experts to split.
TEST(ValidateJobSpec, ExpertParallelDividesTheDataParallelRanksAndExperts) {
  const v1::JobSpec spec = MustParse(
      kMinimal, {"model.moe.experts=4", "parallel.dp=4", "parallel.ep=2"});
  EXPECT_EQ(JobWorldSize(spec), 4);  // ep adds no ranks
  EXPECT_EQ(spec.parallel().ep(), 2);
  EXPECT_EQ(MustParse(kMinimal).parallel().ep(), 1);  // the default
  EXPECT_EQ(OverrideError({"parallel.ep=2"}),
            "parallel.ep=2 needs model.moe.experts (the experts ep splits)");
  EXPECT_EQ(OverrideError({"model.moe.experts=4", "parallel.dp=3",
                           "train.global_batch=6", "parallel.ep=2"}),
            "parallel.ep=2 does not divide parallel.dp=3 × parallel.cp=1 = 3 "
            "(the experts' ranks are carved out of the data-parallel ones)");
  EXPECT_EQ(
      OverrideError({"model.moe.experts=6", "parallel.dp=4", "parallel.ep=4"}),
      "parallel.ep=4 does not divide model.moe.experts=6 (each ep rank "
      "holds as many experts)");
  EXPECT_EQ(OverrideError({"model.moe.experts=4", "parallel.ep=0"}),
            "parallel.ep=0 must be between 1 and 65536");
}

// parallel.expert_tp: each expert split over expert_tp of the tp ranks (0,
// the default: all of them); it divides tp, and the slices of the tp
// group times ep divide the experts.
TEST(ValidateJobSpec, ExpertTensorParallelDividesTensorParallelAndExperts) {
  EXPECT_EQ(MustParse(kMinimal).parallel().expert_tp(), 0);
  const v1::JobSpec spec = MustParse(
      kMinimal,
      {"model.moe.experts=4", "parallel.tp=4", "parallel.expert_tp=2"});
  EXPECT_EQ(spec.parallel().expert_tp(), 2);
  EXPECT_EQ(JobWorldSize(spec), 4);  // no ranks of its own
  EXPECT_EQ(OverrideError({"parallel.expert_tp=1"}),
            "parallel.expert_tp=1 needs model.moe.experts (the experts it "
            "splits)");
  EXPECT_EQ(OverrideError({"model.moe.experts=4", "parallel.tp=2",
                           "parallel.expert_tp=4"}),
            "parallel.expert_tp=4 must be between 0 and 2");
  EXPECT_EQ(OverrideError({"model.moe.experts=4", "parallel.expert_tp=-1"}),
            "parallel.expert_tp=-1 must be between 0 and 1");
  EXPECT_EQ(
      OverrideError({"model.moe.experts=4", "model.n_head=6", "model.n_embd=96",
                     "parallel.tp=6", "parallel.expert_tp=4"}),
      "parallel.expert_tp=4 does not divide parallel.tp=6 (the tp "
      "group is cut into runs of expert_tp ranks, each holding its "
      "own experts)");
  EXPECT_EQ(
      OverrideError({"model.moe.experts=4", "parallel.dp=2", "parallel.ep=2",
                     "parallel.tp=4", "parallel.expert_tp=1"}),
      "parallel.ep=2 × parallel.tp/parallel.expert_tp=4 = 8 does not "
      "divide model.moe.experts=4 (each rank holds as many experts)");
  EXPECT_EQ(OverrideError({"model.moe.experts=4", "model.moe.expert_hidden=6",
                           "parallel.tp=4", "parallel.expert_tp=4"}),
            "parallel.expert_tp=4 does not divide model.moe.expert_hidden=6 "
            "(each expert is split over expert_tp)");
  MustParse(kMinimal, {"model.moe.experts=4", "model.moe.expert_hidden=6",
                       "parallel.tp=4", "parallel.expert_tp=2"});
}

TEST(ValidateJobSpec, LlamaFieldsAndTheirRules) {
  const v1::JobSpec llama = MustParse(kMinimal, {"model.arch=llama"});
  EXPECT_EQ(KvHeads(llama.model()), 4);
  // Llama's rule: 8·128/3 = 341, rounded up to 256's multiple.
  EXPECT_EQ(FfnHidden(llama.model()), 512);
  EXPECT_EQ(
      FfnHidden(MustParse(kMinimal, {"model.arch=llama", "model.multiple_of=32",
                                     "model.ffn_dim_multiplier=1.5"})
                    .model()),
      512);  // 1.5·341 = 511, up to 512
  EXPECT_EQ(FfnHidden(MustParse(kMinimal,
                                {"model.arch=llama", "model.ffn_hidden=100"})
                          .model()),
            100);
  EXPECT_EQ(FfnHidden(MustParse(kMinimal).model()), 512);  // gpt: 4C
  EXPECT_EQ(
      KvHeads(MustParse(kMinimal, {"model.arch=llama", "model.n_kv_head=2"})
                  .model()),
      2);
  EXPECT_EQ(OverrideError({"model.n_kv_head=2"}),
            "model.n_kv_head applies to model.arch=llama, not 'gpt'");
  EXPECT_EQ(OverrideError({"model.rope_scaling.factor=8"}),
            "model.rope_scaling applies to model.arch=llama, not 'gpt'");
  EXPECT_EQ(OverrideError({"model.arch=llama", "model.n_kv_head=3"}),
            "model.n_kv_head=3 does not divide model.n_head=4");
  EXPECT_EQ(
      OverrideError({"model.arch=llama", "model.n_embd=120", "model.n_head=8"}),
      "model.n_embd / model.n_head = 15 is odd; rotary positions turn "
      "channel pairs of each head");
  EXPECT_EQ(OverrideError({"model.arch=llama", "model.rope_scaling.factor=8",
                           "model.rope_scaling.low_freq_factor=4"}),
            "model.rope_scaling.high_freq_factor=4 must be greater than "
            "low_freq_factor=4");
  EXPECT_EQ(OverrideError({"model.arch=llama", "model.rope_theta=0.5"}),
            "model.rope_theta=0.5 must be > 1");
  EXPECT_EQ(
      OverrideError({"model.arch=llama", "model.n_head=12", "model.n_embd=120",
                     "model.n_kv_head=3", "parallel.tp=2"}),
      "parallel.tp=2 and model.n_kv_head=3: one must divide the other "
      "(key and value heads are split over tp, or replicated on tp / "
      "n_kv_head ranks each)");
  // 4 query heads, 2 key/value heads: tp 4 replicates them; tp 2 splits.
  MustParse(kMinimal,
            {"model.arch=llama", "model.n_kv_head=2", "parallel.tp=4"});
  MustParse(kMinimal,
            {"model.arch=llama", "model.n_kv_head=4", "model.n_head=8",
             "model.n_embd=256", "parallel.tp=8", "model.ffn_hidden=64"});
  EXPECT_EQ(OverrideError(
                {"model.arch=llama", "model.ffn_hidden=6", "parallel.tp=4"}),
            "parallel.tp=4 does not divide the MLP's hidden width 6 "
            "(model.ffn_hidden or its rule)");
}

// A Llama's config.json as Hugging Face publishes one (Llama 3.2 1B's
// fields at a small size).
constexpr char kLlamaConfig[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
  "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8,
  "max_position_embeddings": 131072, "vocab_size": 300,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
                   "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192,
                   "rope_type": "llama3"},
  "hidden_act": "silu", "attention_bias": false, "mlp_bias": false,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16"})";

// model.init_from: hf:DIR takes the model fields the spec leaves out from
// DIR/config.json; a field the spec gives must be the config's.
TEST(ParseJobSpec, AHuggingFaceModelsFieldsComeFromItsConfig) {
  const std::string yaml = absl::StrCat(
      kMinimal, "model: {init_from: 'hf:/models/llama', block_size: 128}\n");
  std::string asked;
  auto read = [&](const std::string& path) -> absl::StatusOr<std::string> {
    asked = path;
    return std::string(kLlamaConfig);
  };
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(yaml, {}, "job.yaml", read);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(asked, "/models/llama/config.json");
  const v1::ModelSpec& m = spec->model();
  EXPECT_EQ(m.arch(), "llama");
  EXPECT_EQ(m.n_layer(), 3);
  EXPECT_EQ(m.n_head(), 8);
  EXPECT_EQ(KvHeads(m), 2);
  EXPECT_EQ(m.n_embd(), 64);
  EXPECT_EQ(FfnHidden(m), 160);
  EXPECT_EQ(m.vocab_size(), 300);
  EXPECT_EQ(m.block_size(), 128);
  EXPECT_TRUE(TiesEmbeddings(m));
  EXPECT_EQ(m.rope_theta(), 500000.0);
  EXPECT_EQ(m.rope_scaling().factor(), 32.0);
  EXPECT_EQ(m.rope_scaling().original_context(), 8192);
  // The same fields given: accepted; another: refused, naming both.
  EXPECT_TRUE(ParseJobSpec(yaml, {"model.n_layer=3", "model.arch=llama"},
                           "job.yaml", read)
                  .ok());
  absl::StatusOr<v1::JobSpec> other =
      ParseJobSpec(yaml, {"model.n_kv_head=4"}, "job.yaml", read);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().message(),
            "model.init_from: /models/llama/config.json: model.n_kv_head=4 in "
            "the spec but 2 in the Hugging Face config; leave it out to take "
            "the config's, or give the same");
  other = ParseJobSpec(yaml, {"model.block_size=200000"}, "job.yaml", read);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find(
                "model.block_size=200000 is more positions than the model's "
                "131072"),
            std::string::npos)
      << other.status();
  // Without a reader, the spec's own fields: no file is read.
  asked.clear();
  EXPECT_TRUE(ParseJobSpec(yaml, {"model.arch=llama"}).ok());
  EXPECT_EQ(asked, "");
}

// What ptrain does not implement is refused naming the config's key.
TEST(ParseHfConfig, WhatIsNotImplementedIsRefusedByName) {
  const std::string base(kLlamaConfig);
  auto with = [&](const std::string& key, const std::string& value) {
    std::string text = base;
    text.insert(text.rfind('}'), absl::StrCat(", \"", key, "\": ", value));
    return text;
  };
  struct Case {
    std::string text, message;
  };
  for (const Case& k : {
           Case{with("sliding_window", "4096"),
                "'sliding_window'=4096: sliding-window attention is not "
                "implemented"},
           Case{with("num_local_experts", "8"),
                "'num_local_experts'=8: a mixture of experts is not "
                "implemented"},
           Case{with("qk_norm", "true"),
                "'qk_norm'=true: query/key normalization is not implemented"},
           Case{with("head_dim", "7"),
                "'head_dim'=7 is odd; rotary positions turn channel pairs of "
                "each head"},
           Case{with("hidden_act", "\"gelu\""),
                "'hidden_act'=gelu: only SwiGLU's SiLU (silu) is implemented"},
           Case{with("attention_bias", "true"),
                "'attention_bias'=true: biases in Llama's layers are not "
                "implemented"},
           Case{with("num_key_value_heads", "3"),
                "'num_key_value_heads'=3 does not divide num_attention_heads="
                "8"},
           Case{R"({"architectures": ["MistralForCausalLM"]})",
                "'architectures'=MistralForCausalLM: only GPT2LMHeadModel, "
                "LlamaForCausalLM, MixtralForCausalLM, Qwen3ForCausalLM and "
                "Qwen3MoeForCausalLM are implemented"},
           Case{R"({"architectures": ["LlamaForCausalLM"],
                    "rope_scaling": {"rope_type": "yarn", "factor": 4},
                    "hidden_size": 64, "intermediate_size": 160,
                    "num_hidden_layers": 3, "num_attention_heads": 8})",
                "'rope_scaling.rope_type'=yarn: only Llama 3's scaling "
                "(llama3) is implemented"},
           Case{R"({"architectures": ["GPT2LMHeadModel"], "n_layer": 2,
                    "n_head": 2, "n_embd": 8, "n_positions": 16,
                    "vocab_size": 10, "activation_function": "relu"})",
                "'activation_function'=relu: only GELU's tanh approximation "
                "(gelu_new) is implemented"},
           Case{"[1]", "not a JSON object"},
           Case{R"({"architectures": ["LlamaForCausalLM"]})",
                "'num_hidden_layers' is missing"},
       }) {
    absl::StatusOr<HfConfig> c = ParseHfConfig(k.text, "config.json");
    ASSERT_FALSE(c.ok()) << k.text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.status().message(), "config.json: " + k.message) << k.text;
  }
  EXPECT_TRUE(ParseHfConfig(base, "config.json").ok());
}

// Heads apart from the width (Qwen3's, Gemma's head_dim): model.head_dim,
// written back as it was read; the default width's stays unset.
TEST(ParseHfConfig, AHeadDimApartFromTheWidthIsModelHeadDim) {
  std::string text(kLlamaConfig);
  text.replace(text.find("\"head_dim\": 8"), 13, "\"head_dim\": 16");
  absl::StatusOr<HfConfig> c = ParseHfConfig(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.head_dim(), 16);
  EXPECT_EQ(HeadDim(c->model), 16);
  v1::ModelSpec written = c->model;
  written.set_block_size(64);
  absl::StatusOr<HfConfig> back =
      ParseHfConfig(HfConfigJson(written), "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->model.head_dim(), 16);
  absl::StatusOr<HfConfig> plain = ParseHfConfig(kLlamaConfig, "config.json");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->model.head_dim(), 0);
  EXPECT_EQ(HeadDim(plain->model), 8);
  EXPECT_EQ(OverrideError({"model.head_dim=16"}),
            "model.head_dim applies to model.arch=llama, not 'gpt'");
  EXPECT_EQ(OverrideError({"model.arch=llama", "model.head_dim=15"}),
            "model.head_dim=15 is odd; rotary positions turn channel pairs of "
            "each head");
}

// A config.json's text with `key` set to `value` (JSON): its flat value
// replaced where it has the key, else the key added.
std::string WithKey(std::string text, const std::string& key,
                    const std::string& value) {
  const size_t at = text.find("\"" + key + "\"");
  if (at != std::string::npos) {
    const size_t end = text.find_first_of(",}", at);
    text.replace(at, end - at, absl::StrCat("\"", key, "\": ", value));
  } else {
    text.insert(text.rfind('}'), absl::StrCat(", \"", key, "\": ", value));
  }
  return text;
}

// A Qwen3-MoE's config.json (Qwen3-30B-A3B's fields at a small size): arch
// llama with head_dim apart from the width, query/key norms and experts in
// every decoder_sparse_step-th block; written back and read again, the same
// model; what ptrain's experts cannot be is refused by key.
constexpr char kQwen3MoeConfig[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
  "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
  "head_dim": 16, "max_position_embeddings": 40960, "vocab_size": 300,
  "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true,
  "decoder_sparse_step": 2, "mlp_only_layers": [],
  "router_aux_loss_coef": 0.001, "output_router_logits": false,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_scaling": null,
  "attention_bias": false, "attention_dropout": 0.0,
  "use_sliding_window": false, "sliding_window": null,
  "max_window_layers": 4, "hidden_act": "silu",
  "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";

TEST(ParseHfConfig, Qwen3MoeIsLlamaWithQueryKeyNormsAndExperts) {
  absl::StatusOr<HfConfig> c = ParseHfConfig(kQwen3MoeConfig, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  const v1::ModelSpec& m = c->model;
  EXPECT_EQ(m.arch(), "llama");
  EXPECT_TRUE(m.qk_norm());
  EXPECT_EQ(HeadDim(m), 16);
  EXPECT_EQ(FfnHidden(m), 96);
  const v1::MoeSpec moe = MoeOf(m);
  EXPECT_EQ(moe.experts(), 8);
  EXPECT_EQ(moe.top_k(), 2);
  EXPECT_EQ(moe.expert_hidden(), 32);
  EXPECT_EQ(moe.every(), 2);
  EXPECT_EQ(moe.aux_loss_coef(), 0.001);
  v1::ModelSpec spec = m;
  spec.set_block_size(64);
  const std::string written = HfConfigJson(spec);
  EXPECT_NE(written.find("\"Qwen3MoeForCausalLM\""), std::string::npos)
      << written;
  absl::StatusOr<HfConfig> back = ParseHfConfig(written, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(CheckSpecAgainstHf(spec, *back, "config.json").ok());
  EXPECT_TRUE(back->model.qk_norm());
  EXPECT_EQ(MoeOf(back->model).every(), 2);
  // Without experts: Qwen3, dense.
  v1::ModelSpec dense = spec;
  dense.clear_moe();
  absl::StatusOr<HfConfig> qwen3 =
      ParseHfConfig(HfConfigJson(dense), "config.json");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_TRUE(qwen3->model.qk_norm());
  EXPECT_EQ(MoeOf(qwen3->model).experts(), 0);
  EXPECT_NE(HfConfigJson(dense).find("\"Qwen3ForCausalLM\""),
            std::string::npos);
  // Another every is refused against the config, naming both.
  v1::ModelSpec other = spec;
  other.mutable_moe()->set_every(1);
  EXPECT_EQ(CheckSpecAgainstHf(other, *c, "config.json").message(),
            "config.json: model.moe.every=1 in the spec but 2 in the "
            "Hugging Face config; leave it out to take the config's, or give "
            "the same");
  auto with = [](const std::string& key, const std::string& value) {
    return WithKey(kQwen3MoeConfig, key, value);
  };
  struct Case {
    std::string text, message;
  };
  for (const Case& k : {
           Case{with("norm_topk_prob", "false"),
                "'norm_topk_prob'=false with num_experts_per_tok=2: only the "
                "chosen scores normalised to sum 1, of 2 or more experts, are "
                "implemented"},
           Case{with("mlp_only_layers", "[0]"),
                "'mlp_only_layers'=[0]: dense blocks other than "
                "decoder_sparse_step's are not implemented"},
           Case{with("use_sliding_window", "true"),
                "'use_sliding_window'=true: sliding-window attention is not "
                "implemented"},
           Case{with("decoder_sparse_step", "5"),
                "'decoder_sparse_step'=5 is more than num_hidden_layers=4"},
           Case{with("num_experts_per_tok", "9"),
                "'num_experts_per_tok'=9 is more than num_experts=8"},
       }) {
    absl::StatusOr<HfConfig> bad = ParseHfConfig(k.text, "config.json");
    ASSERT_FALSE(bad.ok()) << k.text;
    EXPECT_EQ(bad.status().message(), "config.json: " + k.message);
  }
}

// A Mixtral's config.json (Mixtral 8x7B's fields at a small size): arch
// llama with model.moe; what ptrain's experts cannot be is refused by key;
// the config ptrain writes for such a model reads back as it.
constexpr char kMixtralConfig[] = R"({
  "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
  "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
  "num_attention_heads": 8, "num_key_value_heads": 2,
  "max_position_embeddings": 32768, "vocab_size": 300,
  "num_local_experts": 8, "num_experts_per_tok": 2,
  "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0,
  "output_router_logits": false, "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0, "sliding_window": null, "hidden_act": "silu",
  "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";

TEST(ParseHfConfig, MixtralIsLlamaWithExperts) {
  absl::StatusOr<HfConfig> c = ParseHfConfig(kMixtralConfig, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  const v1::ModelSpec& m = c->model;
  EXPECT_EQ(m.arch(), "llama");
  EXPECT_EQ(KvHeads(m), 2);
  const v1::MoeSpec moe = MoeOf(m);
  EXPECT_EQ(moe.experts(), 8);
  EXPECT_EQ(moe.top_k(), 2);
  EXPECT_EQ(moe.expert_hidden(), 96);
  EXPECT_EQ(moe.shared_experts(), 0);
  EXPECT_EQ(moe.router(), "softmax");
  EXPECT_EQ(moe.aux_loss_coef(), 0.02);
  // Written back and read again: the same model.
  v1::ModelSpec spec = m;
  spec.set_block_size(64);
  absl::StatusOr<HfConfig> back =
      ParseHfConfig(HfConfigJson(spec), "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(CheckSpecAgainstHf(spec, *back, "config.json").ok());
  EXPECT_EQ(MoeOf(back->model).experts(), 8);
  EXPECT_EQ(back->max_positions, 64);
  // A spec of other experts is refused against the config, naming both.
  v1::ModelSpec other = spec;
  other.mutable_moe()->set_experts(4);
  EXPECT_EQ(CheckSpecAgainstHf(other, *c, "config.json").message(),
            "config.json: model.moe.experts=4 in the spec but 8 in the "
            "Hugging Face config; leave it out to take the config's, or give "
            "the same");
  auto with = [](const std::string& key, const std::string& value) {
    return WithKey(kMixtralConfig, key, value);
  };
  for (const auto& [text, message] :
       std::vector<std::pair<std::string, std::string>>{
           {with("num_experts_per_tok", "1"),
            "'num_experts_per_tok'=1: one expert a token is weighted by its "
            "score here, by 1 in Mixtral"},
           {with("num_experts_per_tok", "9"),
            "'num_experts_per_tok'=9 is more than num_local_experts=8"},
           {with("router_jitter_noise", "0.1"),
            "'router_jitter_noise'=0.1: router jitter is not implemented"},
           {with("sliding_window", "4096"),
            "'sliding_window'=4096: sliding-window attention is not "
            "implemented"},
       }) {
    absl::StatusOr<HfConfig> bad = ParseHfConfig(text, "config.json");
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_EQ(bad.status().message(), "config.json: " + message) << text;
  }
}

TEST(ValidateJobSpec, TpMustDivideNHead) {
  EXPECT_EQ(OverrideError({"parallel.tp=3"}),
            "parallel.tp=3 does not divide model.n_head=4");
}

TEST(ValidateJobSpec, PpMustDivideNLayer) {
  EXPECT_EQ(OverrideError({"parallel.pp=3"}),
            "parallel.pp=3 does not divide model.n_layer=4");
}

TEST(ValidateJobSpec, NHeadMustDivideNEmbd) {
  EXPECT_EQ(OverrideError({"model.n_head=3", "parallel.tp=1"}),
            "model.n_head=3 does not divide model.n_embd=128");
}

TEST(ValidateJobSpec, GlobalBatchMustBeDivisibleByDpTimesMicrobatches) {
  EXPECT_EQ(OverrideError({"parallel.dp=4", "parallel.microbatches=2",
                           "train.global_batch=30"}),
            "train.global_batch=30 is not divisible by parallel.dp × "
            "parallel.microbatches = 4 × 2 = 8");
  MustParse(kMinimal, {"parallel.dp=4", "parallel.microbatches=2",
                       "train.global_batch=32"});
}

TEST(ValidateJobSpec, ZeroStageMustBeZeroToThree) {
  for (const char* bad : {"parallel.zero=4", "parallel.zero=-1"}) {
    EXPECT_TRUE(Contains(OverrideError({bad}), "must be between 0 and 3"))
        << bad;
  }
  for (const char* good : {"parallel.zero=0", "parallel.zero=3"}) {
    MustParse(kMinimal, {good});
  }
}

TEST(ValidateJobSpec, InterleavedScheduleRules) {
  const std::vector<std::string> base = {"parallel.pp=2",
                                         "parallel.microbatches=4"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> all = base;
    all.insert(all.end(), more.begin(), more.end());
    return OverrideError(all);
  };
  EXPECT_EQ(with({"parallel.schedule=interleaved"}),
            "parallel.schedule=interleaved requires parallel.virtual_stages "
            ">= 2 (parallel.virtual_stages=1)");
  EXPECT_EQ(with({"parallel.virtual_stages=2"}),
            "parallel.virtual_stages=2 requires parallel.schedule=interleaved "
            "(parallel.schedule=1f1b)");
  EXPECT_EQ(
      with({"parallel.schedule=interleaved", "parallel.virtual_stages=4"}),
      "parallel.virtual_stages=4 does not divide the layers per stage, "
      "model.n_layer / parallel.pp = 4 / 2 = 2");
  EXPECT_EQ(with({"parallel.schedule=interleaved", "parallel.virtual_stages=2",
                  "parallel.microbatches=3", "train.global_batch=30"}),
            "parallel.microbatches=3 is not a multiple of parallel.pp=2 "
            "(required by parallel.schedule=interleaved)");
  EXPECT_EQ(OverrideError(
                {"parallel.schedule=interleaved", "parallel.virtual_stages=2"}),
            "parallel.schedule=interleaved requires parallel.pp >= 2 "
            "(parallel.pp=1)");
  MustParse(kMinimal,
            {"parallel.pp=2", "parallel.microbatches=4",
             "parallel.schedule=interleaved", "parallel.virtual_stages=2"});
}

// parallel.cp splits every sequence into 2·cp zigzag chunks over its
// ranks, with ring attention: a cp that does not divide block_size into
// them, one that leaves SP a share of positions tp does not divide, and an
// attention path that cannot ring (the GPU's, unverified) are refused
// naming field and rule; cp multiplies the world and composes with dp,
// tp + SP, pipelines, ZeRO, recomputation and bf16 on the cpu.
TEST(ValidateJobSpec, ContextParallelRules) {
  EXPECT_EQ(DefaultJobSpec().parallel().cp(), 1);
  EXPECT_EQ(OverrideError({"parallel.cp=0"}).rfind("parallel.cp", 0), 0u)
      << OverrideError({"parallel.cp=0"});
  EXPECT_EQ(OverrideError({"model.block_size=20", "parallel.cp=4"}),
            "parallel.cp=4 needs model.block_size divisible by 2 × "
            "parallel.cp = 8 (model.block_size=20): zigzag sharding cuts each "
            "sequence into 2·cp chunks");
  EXPECT_EQ(OverrideError({"model.block_size=20", "parallel.cp=2",
                           "parallel.tp=4", "parallel.sequence_parallel=true"}),
            "parallel.tp=4 does not divide the 10 positions each parallel.cp "
            "rank holds (model.block_size=20 / parallel.cp=2; required by "
            "parallel.sequence_parallel=true)");
  EXPECT_EQ(OverrideError({"parallel.cp=2", "resources.device=cuda"}),
            "parallel.cp=2 with resources.device=cuda: the GPU's ring "
            "attention has not been verified on a GPU yet; use "
            "resources.device=cpu or parallel.cp=1");
  MustParse(kMinimal, {"parallel.cp=2", "train.precision=bf16"});
  const v1::JobSpec spec =
      MustParse(kMinimal, {"parallel.pp=2", "parallel.dp=2", "parallel.tp=2",
                           "parallel.cp=2", "parallel.sequence_parallel=true",
                           "parallel.zero=3", "parallel.microbatches=4",
                           "parallel.schedule=zb1p", "train.recompute=full"});
  EXPECT_EQ(JobWorldSize(spec), 16);
}

// parallel.offload (ZeRO-Offload): "none" by default, "optimizer" on a
// GPU job with any ZeRO stage; refused on the CPU and for another value,
// naming the field and the rule.
TEST(ValidateJobSpec, OffloadRules) {
  EXPECT_EQ(MustParse(kMinimal, {}).parallel().offload(), "none");
  EXPECT_EQ(OverrideError({"parallel.offload=optimizer"}),
            "parallel.offload=optimizer needs resources.device=cuda: it moves "
            "the optimizer's state from the GPU to host memory, where a CPU "
            "job's already is");
  EXPECT_NE(OverrideError({"parallel.offload=params"}).find("parallel.offload"),
            std::string::npos);
  for (const char* zero : {"0", "1", "3"}) {
    MustParse(kMinimal,
              {"parallel.offload=optimizer", "resources.device=cuda",
               "parallel.dp=2", std::string("parallel.zero=") + zero});
  }
}

// train.cuda_graphs: "off" by default; "auto" anywhere; "on" only where a
// job's passes can be recorded (cuda, no dp/tp/cp, not zb1p, zero 0, no
// offload),
// else refused naming the field and what stands in the way.
TEST(ValidateJobSpec, CudaGraphsRules) {
  EXPECT_EQ(MustParse(kMinimal, {}).train().cuda_graphs(), "off");
  EXPECT_EQ(CudaGraphsOf(MustParse(kMinimal, {})), CudaGraphs::kOff);
  MustParse(kMinimal, {"train.cuda_graphs=auto", "parallel.dp=2"});
  const v1::JobSpec on =
      MustParse(kMinimal, {"train.cuda_graphs=on", "resources.device=cuda"});
  EXPECT_EQ(CudaGraphsOf(on), CudaGraphs::kOn);
  EXPECT_EQ(CudaGraphsUnsupported(on), "");
  EXPECT_EQ(OverrideError({"train.cuda_graphs=on"}),
            "train.cuda_graphs=on cannot record this job's passes: "
            "resources.device=cpu: CUDA graphs record a GPU's kernels (auto "
            "records only where it can)");
  const std::string dp = OverrideError(
      {"train.cuda_graphs=on", "resources.device=cuda", "parallel.dp=2"});
  EXPECT_NE(dp.find("train.cuda_graphs=on"), std::string::npos) << dp;
  EXPECT_NE(dp.find("parallel.dp × parallel.tp × parallel.cp = 2 × 1 × 1"),
            std::string::npos)
      << dp;
  // A pipeline's stages pass activations between passes: recordable, but
  // for zb1p's split backward.
  MustParse(kMinimal, {"train.cuda_graphs=on", "resources.device=cuda",
                       "parallel.pp=2", "parallel.microbatches=4"});
  const std::string zb = OverrideError(
      {"train.cuda_graphs=on", "resources.device=cuda", "parallel.pp=2",
       "parallel.microbatches=4", "parallel.schedule=zb1p"});
  EXPECT_NE(zb.find("parallel.schedule=zb1p"), std::string::npos) << zb;
  for (const char* blocker : {"parallel.offload=optimizer"}) {
    const std::string e = OverrideError(
        {"train.cuda_graphs=on", "resources.device=cuda", blocker});
    EXPECT_NE(e.find(blocker), std::string::npos) << e;
  }
  EXPECT_NE(OverrideError({"train.cuda_graphs=yes"}).find("train.cuda_graphs"),
            std::string::npos);
}

// train.anomaly: stop on NaN by default; unknown keys, a spike factor that
// is neither 0 nor above 1, and a rollback without checkpoints are refused,
// naming the field and the rule.
TEST(ValidateJobSpec, AnomalyRules) {
  const v1::AnomalySpec a = MustParse(kMinimal, {}).train().anomaly();
  EXPECT_EQ(a.nan(), "stop");
  EXPECT_EQ(a.spike_factor(), 0.0);
  EXPECT_EQ(a.window(), 100);
  EXPECT_EQ(a.max_rollbacks(), 3);
  EXPECT_NE(OverrideError({"train.anomaly.nans=stop"})
                .find("train.anomaly.nans: unknown key"),
            std::string::npos)
      << OverrideError({"train.anomaly.nans=stop"});
  EXPECT_EQ(OverrideError({"train.anomaly.spike_factor=1"}),
            "train.anomaly.spike_factor=1 must be 0 (off) or > 1 (a multiple "
            "of the median loss)");
  EXPECT_NE(OverrideError({"train.anomaly.spike_factor=-2"})
                .find("train.anomaly.spike_factor=-2 must be 0 (off) or > 1"),
            std::string::npos);
  EXPECT_NE(
      OverrideError({"train.anomaly.nan=retry"}).find("train.anomaly.nan"),
      std::string::npos);
  EXPECT_NE(
      OverrideError({"train.anomaly.window=0"}).find("train.anomaly.window"),
      std::string::npos);
  EXPECT_EQ(OverrideError({"train.anomaly.nan=rollback"}),
            "train.anomaly.nan=rollback needs checkpoint.dir (the checkpoints "
            "it rolls back to)");
  MustParse(kMinimal, {"train.anomaly.nan=rollback", "checkpoint.dir=ck",
                       "train.anomaly.spike_factor=3"});
}

// zb1p (ZB-H1) fills a pipeline's bubble with the weight passes of one
// chunk per rank: refused without a pipeline or with virtual stages, naming
// the field and the rule; accepted composed with dp, tp + SP, ZeRO-3 and
// recomputation. Its name round-trips through ScheduleKindOf.
TEST(ValidateJobSpec, ZeroBubbleScheduleRules) {
  EXPECT_EQ(OverrideError({"parallel.schedule=zb1p"}),
            "parallel.schedule=zb1p requires parallel.pp >= 2 "
            "(parallel.pp=1): without a pipeline there is no bubble to fill");
  EXPECT_EQ(
      OverrideError({"parallel.pp=2", "parallel.microbatches=4",
                     "parallel.schedule=zb1p", "parallel.virtual_stages=2"}),
      "parallel.schedule=zb1p requires parallel.virtual_stages=1 "
      "(parallel.virtual_stages=2): ZB-H1 runs one model chunk per rank");
  MustParse(kMinimal, {"parallel.pp=2", "parallel.microbatches=4",
                       "parallel.schedule=zb1p"});
  MustParse(kMinimal, {"parallel.pp=2", "parallel.dp=2", "parallel.tp=2",
                       "parallel.sequence_parallel=true", "parallel.zero=3",
                       "parallel.microbatches=4", "parallel.schedule=zb1p",
                       "train.recompute=full"});
  for (ScheduleKind k :
       {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
        ScheduleKind::kZeroBubble}) {
    EXPECT_EQ(ScheduleKindOf(ScheduleName(k)), k) << ScheduleName(k);
  }
}

// parallel.first_stage_layers / last_stage_layers: the first and last
// stage's layers, the rest split evenly over the other stages, or an error
// naming the fields and the rule.
TEST(ValidateJobSpec, UnevenPipelineStages) {
  auto layers = [](std::vector<std::string> o) -> std::vector<int> {
    const v1::JobSpec spec = MustParse(kMinimal, o);
    absl::StatusOr<std::vector<int>> l =
        PipelineStageLayers(spec.parallel(), spec.model().n_layer());
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? *l : std::vector<int>{};
  };
  EXPECT_EQ(layers({}), (std::vector<int>{4}));
  EXPECT_EQ(layers({"parallel.pp=2"}), (std::vector<int>{2, 2}));
  EXPECT_EQ(layers({"parallel.pp=2", "parallel.first_stage_layers=3"}),
            (std::vector<int>{3, 1}));
  EXPECT_EQ(layers({"parallel.pp=2", "parallel.last_stage_layers=1"}),
            (std::vector<int>{3, 1}));
  EXPECT_EQ(layers({"parallel.pp=2", "parallel.first_stage_layers=1",
                    "parallel.last_stage_layers=3"}),
            (std::vector<int>{1, 3}));
  EXPECT_EQ(
      layers({"model.n_layer=9", "parallel.pp=4",
              "parallel.first_stage_layers=3", "parallel.last_stage_layers=2"}),
      (std::vector<int>{3, 2, 2, 2}));
  // Under interleaving the stages are the pp·v model chunks.
  EXPECT_EQ(
      layers({"model.n_layer=7", "parallel.pp=2", "parallel.microbatches=2",
              "parallel.schedule=interleaved", "parallel.virtual_stages=2",
              "parallel.last_stage_layers=1"}),
      (std::vector<int>{2, 2, 2, 1}));

  EXPECT_EQ(OverrideError({"parallel.first_stage_layers=2"}),
            "parallel.first_stage_layers=2 requires more than one pipeline "
            "stage (parallel.pp=1)");
  EXPECT_EQ(OverrideError({"parallel.pp=2", "parallel.last_stage_layers=-1"}),
            "parallel.last_stage_layers=-1 must be >= 0 (0: an even share)");
  EXPECT_EQ(OverrideError({"parallel.pp=2", "parallel.first_stage_layers=2",
                           "parallel.last_stage_layers=1"}),
            "model.n_layer - parallel.first_stage_layers - "
            "parallel.last_stage_layers = 4 - 2 - 1 = 1: with two pipeline "
            "stages the two must add up to model.n_layer");
  EXPECT_EQ(OverrideError({"parallel.pp=2", "parallel.first_stage_layers=4"}),
            "model.n_layer - parallel.first_stage_layers - "
            "parallel.last_stage_layers = 4 - 4 - 0 = 0 layers for the other "
            "1 pipeline stages (parallel.pp × parallel.virtual_stages = 2 in "
            "all): each stage needs at least one layer");
  EXPECT_EQ(OverrideError({"model.n_layer=8", "parallel.pp=4",
                           "parallel.first_stage_layers=3"}),
            "model.n_layer - parallel.first_stage_layers - "
            "parallel.last_stage_layers = 8 - 3 - 0 = 5 layers do not split "
            "evenly over the other 3 pipeline stages (parallel.pp × "
            "parallel.virtual_stages = 4 in all)");
  // Without them the old rules and messages stand.
  EXPECT_EQ(OverrideError({"parallel.pp=3"}),
            "parallel.pp=3 does not divide model.n_layer=4");
}

TEST(JobSpecWarnings, FewerMicrobatchesThanStagesIsAllowedWithAWarning) {
  EXPECT_TRUE(JobSpecWarnings(MustParse(kMinimal)).empty());
  EXPECT_TRUE(JobSpecWarnings(MustParse(kMinimal, {"parallel.pp=2",
                                                   "parallel.microbatches=2"}))
                  .empty());
  const std::vector<std::string> w = JobSpecWarnings(
      MustParse(kMinimal, {"parallel.pp=4", "parallel.microbatches=2"}));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0],
            "parallel.microbatches=2 is fewer than parallel.pp=4: the pipeline "
            "idles 60% of each step (the bubble, (pp-1)/(m+pp-1)); use at "
            "least 4 microbatches, better 4x that");
}

// checkpoint.async_save only changes periodic checkpoints: set without
// them it is pointed out, not refused.
TEST(JobSpecWarnings, BackgroundSavesWithoutPeriodicCheckpointsAreNamed) {
  EXPECT_TRUE(
      JobSpecWarnings(MustParse(kDesignExample, {"checkpoint.async_save=true"}))
          .empty());
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{"checkpoint.async_save=true"},
        std::vector<std::string>{"checkpoint.async_save=true",
                                 "checkpoint.dir=/tmp/ck"}}) {
    const std::vector<std::string> w =
        JobSpecWarnings(MustParse(kMinimal, sets));
    ASSERT_EQ(w.size(), 1u);
    EXPECT_NE(w[0].find("checkpoint.async_save has no effect without "
                        "checkpoint.dir and checkpoint.every > 0"),
              std::string::npos)
        << w[0];
  }
}

// A large vocabulary's head on the last of evenly split stages: the advice
// names the split that balances them (1 + 5 + 5 + 1 over 5 + 3 + 3 + 1,
// equal at the slowest stage: fewer layers where 1F1B keeps the most
// microbatches in flight); not for a character vocabulary, nor
// once a split is set.
TEST(JobSpecWarnings, LargeHeadOnEvenStagesSuggestsUnevenStages) {
  const std::vector<std::string> gpt2 = {
      "data.path=''",           "data.train_bin=train.bin",
      "data.val_bin=val.bin",   "model.n_layer=12",
      "model.n_head=12",        "model.n_embd=768",
      "model.block_size=1024",  "parallel.pp=4",
      "parallel.microbatches=8"};
  const std::vector<std::string> w = JobSpecWarnings(MustParse(kMinimal, gpt2));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0],
            "the LM head on the last pipeline stage costs about 4.9 blocks "
            "(model.n_embd=768 × a vocabulary of 50257), so with 3 layers on "
            "every one of the parallel.pp × parallel.virtual_stages = 4 "
            "stages the others wait for the last at every microbatch; "
            "parallel.first_stage_layers=1 and parallel.last_stage_layers=1 "
            "would make the slowest stage 5.9 blocks' worth instead of 7.9");
  // The advice is a valid split.
  std::vector<std::string> advised = gpt2;
  advised.push_back("parallel.first_stage_layers=1");
  advised.push_back("parallel.last_stage_layers=1");
  EXPECT_TRUE(JobSpecWarnings(MustParse(kMinimal, advised)).empty());
  // A character vocabulary (known only from the data) or a small one.
  EXPECT_TRUE(
      JobSpecWarnings(MustParse(kMinimal, {"model.n_layer=12", "parallel.pp=4",
                                           "parallel.microbatches=8"}))
          .empty());
  std::vector<std::string> small = gpt2;
  small.push_back("model.vocab_size=4096");
  EXPECT_TRUE(JobSpecWarnings(MustParse(kMinimal, small)).empty());
}

TEST(ValidateJobSpec, CudaTakesEveryLayout) {
  MustParse(kMinimal,
            {"resources.device=cuda", "parallel.dp=2", "parallel.tp=2",
             "parallel.pp=2", "parallel.zero=3", "parallel.microbatches=2",
             "parallel.sequence_parallel=true", "train.global_batch=4"});
}

TEST(ValidateJobSpec, SequenceParallelRequiresTensorParallel) {
  EXPECT_EQ(OverrideError({"parallel.sequence_parallel=true"}),
            "parallel.sequence_parallel=true requires parallel.tp > 1 "
            "(parallel.tp=1)");
  MustParse(kMinimal, {"parallel.sequence_parallel=true", "parallel.tp=2"});
}

TEST(ValidateJobSpec, SequenceParallelRequiresTpDividingBlockSize) {
  EXPECT_EQ(OverrideError({"parallel.sequence_parallel=true", "parallel.tp=4",
                           "model.block_size=66"}),
            "parallel.tp=4 does not divide model.block_size=66 (required by "
            "parallel.sequence_parallel=true)");
}

TEST(ValidateJobSpec, DataPathAndBinsAreExclusive) {
  EXPECT_TRUE(
      Contains(OverrideError({"data.train_bin=a.bin", "data.val_bin=b.bin"}),
               "data.path and data.train_bin/data.val_bin are "
               "mutually exclusive"));
  MustParse("name: t\ndata: {train_bin: a.bin, val_bin: b.bin}\n");
}

TEST(ValidateJobSpec, DataBinsGoTogether) {
  EXPECT_EQ(ParseError("name: t\ndata: {train_bin: a.bin}\n"),
            "data.train_bin and data.val_bin go together; data.val_bin is "
            "empty");
  EXPECT_EQ(ParseError("name: t\ndata: {val_bin: b.bin}\n"),
            "data.train_bin and data.val_bin go together; data.train_bin is "
            "empty");
}

TEST(ValidateJobSpec, DataNeedsATextFileOrTokenFiles) {
  EXPECT_TRUE(Contains(ParseError("name: t\n"),
                       "data: give either data.path (a text file) or both "
                       "data.train_bin and data.val_bin"));
}

TEST(ValidateJobSpec, CheckpointEveryRequiresDir) {
  EXPECT_EQ(OverrideError({"checkpoint.every=100"}),
            "checkpoint.every=100 requires checkpoint.dir (where step folders "
            "go)");
  MustParse(kMinimal, {"checkpoint.every=100", "checkpoint.dir=ck"});
}

TEST(ValidateJobSpec, MinLrMustNotExceedLr) {
  EXPECT_EQ(OverrideError({"train.min_lr=0.01"}),
            "train.min_lr=0.01 must be >= 0 and <= train.lr=0.001");
}

TEST(ValidateJobSpec, NonFiniteNumbersAreRefused) {
  EXPECT_EQ(OverrideError({"train.lr=.inf"}),
            "train.lr=inf must be a finite number");
  EXPECT_EQ(OverrideError({"train.weight_decay=.nan"}),
            "train.weight_decay=nan must be a finite number");
  EXPECT_EQ(OverrideError({"data.val_fraction=-.inf"}),
            "data.val_fraction=-inf must be a finite number");
}

TEST(ValidateJobSpec, FirstErrorFollowsProtoSectionOrder) {
  // Both restart and model are broken; model comes first in job.proto.
  EXPECT_EQ(OverrideError({"restart.hang_timeout_s=0", "model.n_layer=0"}),
            "model.n_layer=0 must be between 1 and 4096");
  EXPECT_EQ(OverrideError({"restart.hang_timeout_s=0", "train.steps=0"}),
            "train.steps=0 must be between 1 and 1099511627776");
}

// One override that breaks one rule, and the error it must produce.
struct RuleCase {
  const char* override_;
  const char* error;
};

TEST(SpecRules, RanksPerNodeIsAMultipleOfTp) {
  EXPECT_TRUE(Contains(
      OverrideError({"parallel.tp=2", "resources.ranks_per_node=3"}),
      "resources.ranks_per_node=3 must be a multiple of parallel.tp=2 (a "
      "tensor-parallel group stays inside one node)"));
  EXPECT_EQ(MustParse(kMinimal, {"parallel.tp=2", "resources.ranks_per_node=4"})
                .resources()
                .ranks_per_node(),
            4);
}

class SingleFieldRuleTest : public ::testing::TestWithParam<RuleCase> {};

TEST_P(SingleFieldRuleTest, OverrideBreakingTheRuleIsRefusedNamingIt) {
  EXPECT_TRUE(
      Contains(OverrideError({GetParam().override_}), GetParam().error));
}

INSTANTIATE_TEST_SUITE_P(
    AllRules, SingleFieldRuleTest,
    ::testing::Values(
        RuleCase{"name=''", "name is empty"},
        RuleCase{"name=a234567890123456789012345678901234567890123456789012345"
                 "678901234",
                 "is 64 characters long; at most 63"},
        RuleCase{"name='a b'", "contains ' '; only A-Z a-z 0-9 . _ -"},
        RuleCase{"name=a/b", "contains '/'"},
        RuleCase{"model.arch=bert", "model.arch='bert' must be one of gpt"},
        RuleCase{"model.n_layer=0",
                 "model.n_layer=0 must be between 1 and 4096"},
        RuleCase{"model.n_head=0", "model.n_head=0 must be between 1 and 4096"},
        RuleCase{"model.n_embd=0",
                 "model.n_embd=0 must be between 1 and 131072"},
        RuleCase{"model.block_size=0",
                 "model.block_size=0 must be between 1 and 1048576"},
        RuleCase{"model.vocab_size=-1",
                 "model.vocab_size=-1 must be between 0 and 16777216"},
        RuleCase{
            "model.init_from=gpt2.bin",
            "model.init_from='gpt2.bin' must be empty, 'llmc:PATH' (an llm.c "
            "checkpoint) or 'hf:DIR'"},
        RuleCase{"model.init_from='llmc:'", "names no file after 'llmc:'"},
        RuleCase{"data.tokenizer=bpe",
                 "data.tokenizer='bpe' must be one of "
                 "auto, char, gpt2, spm:MODEL_PATH, hf:TOKENIZER_JSON"},
        RuleCase{"data.tokenizer='spm:'",
                 "data.tokenizer='spm:' names no SentencePiece model"},
        RuleCase{"data.tokenizer='hf:'",
                 "data.tokenizer='hf:' names no tokenizer.json"},
        RuleCase{"data.val_fraction=0",
                 "data.val_fraction=0 must be > 0 and "
                 "< 1"},
        RuleCase{"data.val_fraction=1", "data.val_fraction=1 must be > 0"},
        RuleCase{"parallel.dp=0", "parallel.dp=0 must be between 1 and 65536"},
        RuleCase{"parallel.tp=0", "parallel.tp=0 must be between 1 and 65536"},
        RuleCase{"parallel.pp=0", "parallel.pp=0 must be between 1 and 65536"},
        RuleCase{"parallel.microbatches=0",
                 "parallel.microbatches=0 must be between 1 and 1048576"},
        RuleCase{"parallel.schedule=zb",
                 "parallel.schedule='zb' must be one "
                 "of 1f1b, gpipe, interleaved, zb1p"},
        RuleCase{"parallel.virtual_stages=0",
                 "parallel.virtual_stages=0 must be between 1 and 4096"},
        RuleCase{"parallel.bucket_bytes=0",
                 "parallel.bucket_bytes=0 must be between 1 and 1099511627776"},
        RuleCase{"train.steps=0",
                 "train.steps=0 must be between 1 and 1099511627776"},
        RuleCase{"train.global_batch=0",
                 "train.global_batch=0 must be between 1 and 16777216"},
        RuleCase{"train.lr=0", "train.lr=0 must be > 0"},
        RuleCase{"train.min_lr=-1e-5", "train.min_lr=-1e-05 must be >= 0"},
        RuleCase{"train.warmup_steps=-1", "train.warmup_steps=-1 must be >= 0"},
        RuleCase{"train.weight_decay=-0.1",
                 "train.weight_decay=-0.1 must be >= 0"},
        RuleCase{"train.grad_clip=-1", "train.grad_clip=-1 must be >= 0"},
        RuleCase{"train.eval_every=-1", "train.eval_every=-1 must be >= 0"},
        RuleCase{"train.eval_batches=0",
                 "train.eval_batches=0 must be between 1 and 1048576"},
        RuleCase{"train.sample_every=-1", "train.sample_every=-1 must be >= 0"},
        RuleCase{"train.beta1=1", "train.beta1=1 must be >= 0 and < 1"},
        RuleCase{"train.beta2=-0.5", "train.beta2=-0.5 must be >= 0 and < 1"},
        RuleCase{"train.eps=0", "train.eps=0 must be > 0"},
        RuleCase{"train.sample_tokens=-1",
                 "train.sample_tokens=-1 must be between 0 and 1048576"},
        RuleCase{"train.lr_schedule=exponential",
                 "train.lr_schedule='exponential' must be one of"},
        RuleCase{"train.decay_fraction=0",
                 "train.decay_fraction=0 must be > 0 and <= 1"},
        RuleCase{"train.decay_fraction=1.5",
                 "train.decay_fraction=1.5 must be > 0 and <= 1"},
        RuleCase{"train.sample_temperature=-0.5",
                 "train.sample_temperature=-0.5 must be >= 0"},
        RuleCase{"train.sample_top_k=-1",
                 "train.sample_top_k=-1 must be between 0 and 16777216"},
        RuleCase{"train.log_every=0", "train.log_every=0 must be >= 1"},
        RuleCase{"train.recompute=partial",
                 "train.recompute='partial' must be one of none, selective, "
                 "full"},
        RuleCase{"checkpoint.every=-1", "checkpoint.every=-1 must be >= 0"},
        RuleCase{"checkpoint.keep_last=0",
                 "checkpoint.keep_last=0 must be between 1 and 1048576"},
        RuleCase{"resources.device=tpu",
                 "resources.device='tpu' must be one of cpu, cuda"},
        RuleCase{"resources.ranks_per_node=-1",
                 "resources.ranks_per_node=-1 must be between 0 and 65536"},
        RuleCase{"resources.threads_per_rank=-1",
                 "resources.threads_per_rank=-1 must be between 0 and 4096"},
        RuleCase{"restart.max_restarts=-1",
                 "restart.max_restarts=-1 must be between 0 and 65536"},
        RuleCase{"restart.hang_timeout_s=0",
                 "restart.hang_timeout_s=0 must be between 1 and 2592000"},
        // Upper bounds: sizes that would overflow what the engine computes
        // from them, or that no machine runs.
        RuleCase{"model.n_embd=1073741824",
                 "model.n_embd=1073741824 must be between 1 and 131072"},
        RuleCase{"model.block_size=100000000",
                 "model.block_size=100000000 must be between 1 and 1048576"},
        RuleCase{"train.global_batch=2147483647",
                 "train.global_batch=2147483647 must be between 1 and "
                 "16777216"},
        RuleCase{"resources.threads_per_rank=2147483647",
                 "resources.threads_per_rank=2147483647 must be between 0 "
                 "and 4096"},
        RuleCase{"parallel.pp=715827883",
                 "parallel.pp=715827883 must be between 1 and 65536"},
        RuleCase{"train.steps=4611686018427387904",
                 "train.steps=4611686018427387904 must be between 1 and "
                 "1099511627776"},
        RuleCase{"restart.hang_timeout_s=2147483647",
                 "must be between 1 and 2592000"}));

// The world size is a 64-bit product: {dp: 2, tp: 3, pp: 715827883} once
// wrapped to 2 in 32 bits and was accepted as a 2-rank job.
TEST(ValidateJobSpec, WorldSizeIsSixtyFourBitAndBounded) {
  v1::JobSpec spec = MustParse(kMinimal);
  spec.mutable_parallel()->set_dp(2);
  spec.mutable_parallel()->set_tp(3);
  spec.mutable_parallel()->set_pp(715827883);
  EXPECT_EQ(JobWorldSize(spec), int64_t{2} * 3 * 715827883);
  spec.mutable_parallel()->set_dp(65536);
  spec.mutable_parallel()->set_tp(4096);
  spec.mutable_parallel()->set_pp(1);
  spec.mutable_model()->set_n_head(4096);
  spec.mutable_model()->set_n_embd(8192);
  const absl::Status s = ValidateJobSpec(spec);
  EXPECT_TRUE(Contains(s.message(), "= 268435456 ranks; at most 1048576")) << s;
}

TEST(ValidateJobSpec, RunTokenCountMustFitSixtyFourBits) {
  const std::string error =
      OverrideError({"train.steps=1099511627776", "train.global_batch=16384",
                     "model.block_size=1024"});
  EXPECT_TRUE(Contains(error,
                       "train.steps × train.global_batch × "
                       "model.block_size"));
}

// --- size and encoding: one rule for every entry point ---------------------

TEST(ParseJobSpec, OverridesCannotGrowTheSpecPastTheLimit) {
  // A 3.9 MB prompt through --set: the file was small, the spec is not.
  const std::string e = ParseError(
      kMinimal,
      {absl::StrCat("train.sample_prompt=", std::string(3900000, 'p'))});
  EXPECT_TRUE(Contains(e, "after overrides")) << e;
  EXPECT_TRUE(Contains(e, "1 MiB")) << e;
}

TEST(ParseJobSpec, AStringFieldIsBounded) {
  const std::string e = ParseError(
      kMinimal,
      {absl::StrCat("train.sample_prompt=", std::string(70000, 'p'))});
  EXPECT_TRUE(Contains(e, "train.sample_prompt is 70000 bytes long")) << e;
}

TEST(ParseJobSpec, TextLargerThanTheLimitIsRefusedWithoutParsing) {
  const std::string e =
      ParseError(absl::StrCat(kMinimal, "# ", std::string(1 << 20, 'x')));
  EXPECT_TRUE(Contains(e, "at most 1048576 bytes")) << e;
}

TEST(ParseJobSpec, NonUtf8TextIsRefusedNamingTheByteAndLine) {
  const std::string e = ParseError(absl::StrCat(kMinimal, "# caf\xe9\n"));
  EXPECT_TRUE(Contains(e, "not UTF-8: byte 0xe9")) << e;
  EXPECT_TRUE(Contains(e, "line 3")) << e;
  EXPECT_TRUE(Contains(e, "column 6")) << e;
}

TEST(ParseJobSpec, NonUtf8OverrideIsRefused) {
  const std::string e = ParseError(kMinimal, {"train.sample_prompt=\xff\xfe"});
  EXPECT_TRUE(Contains(e, "not UTF-8")) << e;
}

TEST(ParseJobSpec, NulInAStringFieldIsRefusedNamingTheField) {
  // YAML's "\0" escape: accepted once, the spec would not survive its own
  // YAML (ptctl to ptcoord, the checkpoint's copy), which stops at the NUL.
  const std::string e = ParseError("name: t\ndata: {path: \"a\\0b\"}\n");
  EXPECT_TRUE(Contains(e, "data.path holds a NUL character (byte 1)")) << e;
}

TEST(ParseJobSpec, Utf8TextIsAccepted) {
  v1::JobSpec spec = MustParse(
      absl::StrCat(kMinimal, "train: {sample_prompt: \"café — 東京 🚀\"}\n"));
  EXPECT_EQ(spec.train().sample_prompt(), "café — 東京 🚀");
}

TEST(FirstInvalidUtf8, FindsEveryIllFormedSequence) {
  EXPECT_EQ(FirstInvalidUtf8("plain ascii"), -1);
  EXPECT_EQ(FirstInvalidUtf8("\xc3\xa9t\xc3\xa9"), -1);
  EXPECT_EQ(FirstInvalidUtf8("\xf0\x9f\x9a\x80"), -1);  // U+1F680
  EXPECT_EQ(FirstInvalidUtf8("ab\xff"), 2);             // never a lead byte
  EXPECT_EQ(FirstInvalidUtf8("a\x80"), 1);              // lone continuation
  EXPECT_EQ(FirstInvalidUtf8("a\xc3"), 1);              // truncated
  EXPECT_EQ(FirstInvalidUtf8("\xc0\xaf"), 0);           // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("\xed\xa0\x80"), 0);       // surrogate D800
  EXPECT_EQ(FirstInvalidUtf8("\xf4\x90\x80\x80"), 0);   // past U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8(std::string_view("a\0b", 3)), -1);
}

// --- overrides --------------------------------------------------------------

TEST(ApplyOverride, SetsTheFieldNamedByThePath) {
  v1::JobSpec spec = DefaultJobSpec();
  ASSERT_TRUE(ApplyOverride(&spec, "train.steps=200").ok());
  ASSERT_TRUE(ApplyOverride(&spec, "parallel.schedule=gpipe").ok());
  ASSERT_TRUE(ApplyOverride(&spec, "train.lr=3e-4").ok());
  ASSERT_TRUE(ApplyOverride(&spec, "parallel.sequence_parallel=true").ok());
  ASSERT_TRUE(ApplyOverride(&spec, "name=run-2").ok());
  EXPECT_EQ(spec.train().steps(), 200);
  EXPECT_EQ(spec.parallel().schedule(), "gpipe");
  EXPECT_EQ(spec.train().lr(), 3e-4);
  EXPECT_TRUE(spec.parallel().sequence_parallel());
  EXPECT_EQ(spec.name(), "run-2");
}

TEST(ApplyOverride, QuotedValueKeepsColonsAndHashes) {
  v1::JobSpec spec = DefaultJobSpec();
  ASSERT_TRUE(ApplyOverride(&spec, "train.sample_prompt='a: b # c'").ok());
  EXPECT_EQ(spec.train().sample_prompt(), "a: b # c");
  ASSERT_TRUE(ApplyOverride(&spec, "model.init_from=llmc:gpt2.bin").ok());
  EXPECT_EQ(spec.model().init_from(), "llmc:gpt2.bin");
}

// model.tie_embeddings: true unless a spec says false, also in a spec
// stored before the field existed; llm.c's checkpoints tie the head, so
// init_from llmc: with an untied head is refused naming both fields.
TEST(ValidateJobSpec, TieEmbeddingsDefaultsToTiedAndAnLlmcCheckpointNeedsIt) {
  EXPECT_TRUE(TiesEmbeddings(v1::ModelSpec()));
  v1::JobSpec spec = DefaultJobSpec();
  EXPECT_TRUE(TiesEmbeddings(spec.model()));
  ASSERT_TRUE(ApplyOverride(&spec, "model.tie_embeddings=false").ok());
  EXPECT_FALSE(TiesEmbeddings(spec.model()));
  spec.set_name("untied");
  spec.mutable_data()->set_path("data/tiny.txt");
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  ASSERT_TRUE(ApplyOverride(&spec, "model.init_from=llmc:gpt2.bin").ok());
  const absl::Status s = ValidateJobSpec(spec);
  EXPECT_EQ(s.message(),
            "model.init_from='llmc:gpt2.bin' needs model.tie_embeddings=true: "
            "an llm.c checkpoint ties the head to the token embedding");
  ASSERT_TRUE(ApplyOverride(&spec, "model.tie_embeddings=true").ok());
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ApplyOverride, CanSetSeveralFieldsOfASectionAtOnce) {
  v1::JobSpec spec = DefaultJobSpec();
  ASSERT_TRUE(ApplyOverride(&spec, "parallel={dp: 2, tp: 2}").ok());
  EXPECT_EQ(spec.parallel().dp(), 2);
  EXPECT_EQ(spec.parallel().tp(), 2);
  EXPECT_EQ(spec.parallel().schedule(), "1f1b");  // untouched fields stay
}

TEST(ApplyOverride, UnknownPathComponentIsRefusedNamingIt) {
  v1::JobSpec spec = DefaultJobSpec();
  absl::Status s = ApplyOverride(&spec, "train.stepz=200");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // A slip of the keyboard is named, swapped letters too.
  EXPECT_TRUE(Contains(s.message(),
                       "train.stepz: unknown key (did you mean steps?); "
                       "expected one of steps"));
  EXPECT_TRUE(Contains(ApplyOverride(&spec, "trian.steps=200").message(),
                       "trian: unknown key (did you mean train?); expected "
                       "one of name, model"));
  EXPECT_TRUE(Contains(ApplyOverride(&spec, "train.lrr=1").message(),
                       "train.lrr: unknown key (did you mean lr?)"));
  // Nothing near: no guess.
  EXPECT_TRUE(Contains(ApplyOverride(&spec, "train.banana=1").message(),
                       "train.banana: unknown key; expected one of"));
  EXPECT_TRUE(Contains(ApplyOverride(&spec, "train.steps.x=200").message(),
                       "train.steps is not a section"));
  EXPECT_TRUE(Contains(ApplyOverride(&spec, "train..steps=200").message(),
                       "empty component"));
}

TEST(ApplyOverride, MissingEqualsIsRefused) {
  v1::JobSpec spec = DefaultJobSpec();
  absl::Status s = ApplyOverride(&spec, "train.steps");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "expected path=value"));
}

TEST(ApplyOverride, ValueIsCheckedLikeTheSameValueInYaml) {
  v1::JobSpec spec = DefaultJobSpec();
  EXPECT_TRUE(Contains(ApplyOverride(&spec, "train.steps=abc").message(),
                       "train.steps: expected an integer, got 'abc'"));
  EXPECT_TRUE(
      Contains(ApplyOverride(&spec, "model.n_layer=2147483648").message(),
               "out of range for int32"));
  EXPECT_TRUE(Contains(ApplyOverride(&spec, "train.steps=").message(),
                       "got an empty value"));
  EXPECT_TRUE(Contains(ApplyOverride(&spec, "model=gpt").message(),
                       "model: expected a map of fields"));
  EXPECT_EQ(spec.train().steps(), 1000);
}

TEST(ParseJobSpec, OverridesApplyAfterTheYamlInOrder) {
  v1::JobSpec spec =
      MustParse(absl::StrCat(kMinimal, "train: {steps: 50}\n"),
                {"train.steps=200", "train.steps=300", "name=other"});
  EXPECT_EQ(spec.train().steps(), 300);
  EXPECT_EQ(spec.name(), "other");
}

TEST(ParseJobSpec, OverrideThatBreaksARuleIsRefused) {
  EXPECT_EQ(ParseError(kDesignExample, {"parallel.tp=3"}),
            "parallel.tp=3 does not divide model.n_head=4");
}

TEST(ParseJobSpec, OverrideThatFixesARuleIsAccepted) {
  // Overrides run before validation, so they can repair the file.
  MustParse(absl::StrCat(kMinimal, "parallel: {tp: 3}\n"), {"parallel.tp=2"});
}

TEST(ParseJobSpec, OverrideWithUnknownPathIsRefused) {
  EXPECT_TRUE(Contains(ParseError(kMinimal, {"train.stepz=1"}),
                       "override 'train.stepz=1': train.stepz: unknown key"));
}

// --- round trip -------------------------------------------------------------

// A valid spec with every field away from its default.
v1::JobSpec FullyCustomSpec() {
  v1::JobSpec s = MustParse(kDesignExample);
  s.set_name("Run_2.b-c");
  v1::ModelSpec* m = s.mutable_model();
  m->set_n_layer(12);
  m->set_n_head(6);
  m->set_n_embd(384);
  m->set_block_size(256);
  m->set_vocab_size(50257);
  m->set_init_from("llmc:/models/gpt2 124M.bin");
  v1::DataSpec* d = s.mutable_data();
  d->set_path("");
  d->set_train_bin("data/train: #1.bin");
  d->set_val_bin("'data'/\"val\".bin");
  d->set_tokenizer("char");
  d->set_val_fraction(0.1 + 0.2);  // not the shortest decimal of itself
  v1::ParallelSpec* p = s.mutable_parallel();
  p->set_dp(3);
  p->set_tp(2);
  p->set_pp(3);
  p->set_zero(3);
  p->set_sequence_parallel(true);
  p->set_microbatches(6);
  p->set_schedule("interleaved");
  p->set_virtual_stages(2);
  p->set_first_stage_layers(3);  // 3, then 2 in each of 4 chunks, then 1
  p->set_last_stage_layers(1);
  p->set_bucket_bytes(int64_t{1} << 40);
  v1::TrainSpec* t = s.mutable_train();
  t->set_steps(int64_t{1} << 40);
  t->set_global_batch(36);
  t->set_lr(6e-4);
  t->set_min_lr(6e-5);
  t->set_warmup_steps(7);
  t->set_weight_decay(0);
  t->set_grad_clip(0.5);
  t->set_seed(18446744073709551615u);
  t->set_eval_every(0);
  t->set_eval_batches(1);
  t->set_sample_every(13);
  t->set_beta1(0);
  t->set_beta2(0.999);
  t->set_eps(1e-300);
  t->set_sample_prompt("First Citizen:\n  # not a comment\n\t\"q\" 'q' \\ ~");
  t->set_sample_tokens(0);
  t->set_sample_temperature(0.7);
  t->set_sample_top_k(40);
  t->set_log_every(1);
  t->set_precision("fp32");
  t->set_recompute("full");
  v1::CheckpointSpec* c = s.mutable_checkpoint();
  c->set_every(1);
  c->set_keep_last(1);
  c->set_dir(" leading and trailing ");
  v1::ResourcesSpec* r = s.mutable_resources();
  r->set_device("cpu");
  r->set_ranks_per_node(8);
  r->set_threads_per_rank(2);
  v1::RestartSpec* rs = s.mutable_restart();
  rs->set_max_restarts(0);
  rs->set_hang_timeout_s(1);
  return s;
}

void ExpectRoundTrip(const v1::JobSpec& spec) {
  const std::string yaml = JobSpecToYaml(spec);
  absl::StatusOr<v1::JobSpec> back = ParseJobSpec(yaml);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  std::string diff;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(*back, spec)) << diff << "\n" << yaml;
}

TEST(JobSpecToYaml, RoundTripPreservesEveryField) {
  const v1::JobSpec spec = FullyCustomSpec();
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  ExpectRoundTrip(spec);
  ExpectRoundTrip(MustParse(kMinimal));
}

class StringRoundTripTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StringRoundTripTest, StringFieldReadsBackUnchanged) {
  v1::JobSpec spec = MustParse(kMinimal);
  spec.mutable_train()->set_sample_prompt(GetParam());
  spec.mutable_checkpoint()->set_dir(GetParam());
  ExpectRoundTrip(spec);
}

INSTANTIATE_TEST_SUITE_P(
    Awkward, StringRoundTripTest,
    ::testing::Values("", "\n", "\n\n", "a\nb\n", "a: b", "#x", "a #b", "'",
                      "\"", "'\"'", "~", "null", "Null", "true", "false", "123",
                      "1e3", ".inf", "- x", "? x", "{a: 1}", "[1]", "&a", "*a",
                      "!tag", "|", ">", "%", "@", "`", " lead", "trail ", "\t",
                      "\r\n", "x\r", "h \r", "\x1b[0m", "tab\t",
                      std::string("\x01\x7f", 2), "\xc3\xbc\xe2\x82\xac", "---",
                      "...", "\\n"));

TEST(JobSpecToYaml, EmitsEveryFieldEvenAtItsDefault) {
  const YAML::Node root = YAML::Load(JobSpecToYaml(DefaultJobSpec()));
  const google::protobuf::Descriptor* top = v1::JobSpec::descriptor();
  for (int i = 0; i < top->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = top->field(i);
    ASSERT_TRUE(root[f->name()]) << f->name();
    if (f->message_type() == nullptr) continue;
    for (int j = 0; j < f->message_type()->field_count(); ++j) {
      const std::string& name = f->message_type()->field(j)->name();
      EXPECT_TRUE(root[f->name()][name]) << f->name() << "." << name;
    }
  }
}

// --- files
// --------------------------------------------------------------------

TEST(LoadJobSpecFile, MissingFileIsNotFoundNamingThePath) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpecFile("/nonexistent/ptrain/job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      Contains(spec.status().message(), "/nonexistent/ptrain/job.yaml"));
}

TEST(LoadJobSpecFile, ReadsAFileAndNamesItInErrors) {
  const std::string good = ::testing::TempDir() + "/spec_test_good.yaml";
  std::ofstream(good) << kMinimal;
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(good, {"train.steps=5"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "t");
  EXPECT_EQ(spec->train().steps(), 5);

  const std::string bad = ::testing::TempDir() + "/spec_test_bad.yaml";
  std::ofstream(bad) << kMinimal << "train: {steps: x}\n";
  spec = LoadJobSpecFile(bad);
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(Contains(spec.status().message(),
                       bad + ": train.steps: expected an integer"));
}

TEST(LoadJobSpecFile, FileLargerThanOneMebibyteIsRefused) {
  const std::string path = ::testing::TempDir() + "/spec_test_big.yaml";
  {
    std::ofstream out(path);
    out << kMinimal << "# " << std::string(1 << 20, 'x') << "\n";
  }
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(spec.status().message(), "larger than 1 MiB"));
}

// /dev/zero never ends: it is refused before a byte is read.
TEST(ReadJobSpecFile, AnEndlessDeviceIsRefusedAsNotARegularFile) {
  absl::StatusOr<std::string> text = ReadJobSpecFile("/dev/zero");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().message(),
            "job spec /dev/zero: is a character device, not a regular file");
}

TEST(LoadJobSpecFile, ErrorsReadingTheFileNameTheFlagThatNamedIt) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpecFile("/dev/zero", {}, "--config");
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(absl::StartsWith(spec.status().message(), "--config /dev/zero: "))
      << spec.status().message();
}

TEST(LoadJobSpecFile, DirectoryIsRefused) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(::testing::TempDir());
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(Contains(spec.status().message(), "is a directory"));
}

}  // namespace
}  // namespace ptrain
