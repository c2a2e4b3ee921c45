// ptworker: one training rank. Standalone: `ptworker --config job.yaml
// [--set key=value]... [--log-json run.jsonl] [--resume-from latest|DIR]`,
// alone or under `mpirun -n N`; `ptworker export --checkpoint DIR --llmc
// OUT.bin` writes a checkpoint's weights in llm.c's format; `ptworker sample
// --checkpoint DIR [--prompt TEXT] [--tokens N]...` prints text its model
// generates; `ptworker prepare --tokenizer
// gpt2|spm:MODEL|hf:TOKENIZER_JSON|spm-train:VOCAB --input 'corpus/*.txt' --out
// data/NAME` turns text files into llm.c token shards (docs/data.md);
// `ptworker profile [--device cpu|cuda] --out PROFILE.json [--quick]`,
// alone or under mpirun, measures this machine's kernels and links for a
// layout planner (worker/profile.h). Exit
// codes: 0 done, 1 runtime failure, 2 bad input (spec, data, flags, layout, a
// damaged or foreign checkpoint, a path outside the data roots, a model that
// does not fit in memory) with one error line on stderr from the lowest failing
// rank; every rank exits, none waits for another, none aborts. 3: stopped as
// asked at the end of a step, after that step's checkpoint, to be resumed as
// after a preemption: by SIGUSR1 (which mpirun forwards to every rank) or by a
// first SIGINT or SIGTERM while training; a second SIGINT or SIGTERM (or the
// first outside training) exits at once with 128 + the signal (130, 143).
//
// Threads: resources.threads_per_rank, else OMP_NUM_THREADS, else this
// rank's share of the cores of its machine (the cores any of its ranks may
// run on, divided by those ranks); a count that puts more threads on the
// machine than it has cores is warned about at start.
//
// Environment (set by ptcoord's launcher): PTRAIN_DATA_ROOTS confines every
// file ptworker opens (common/confined_fs.h); PTRAIN_JOB_UID is recorded in
// checkpoints and checked on `--resume-from latest`. Test hooks, read only
// when set: PTRAIN_TEST_CHECKPOINT_PAUSE_S, PTRAIN_TEST_HANG_AT_STEP,
// PTRAIN_TEST_PREPARE_STOP_AFTER_SHARDS (prepare exits 1 at once, as a
// crash would, after writing that many shards).
//
// This file is wiring: flags, then the unit that runs them: setup.h and
// train.h (a training rank), checkpoint_tools.h (export, sample),
// prepare.h (prepare), profile.h (profile), signals.h (stop signals),
// threads.h, exit_status.h.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "CLI/CLI.hpp"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "worker/checkpoint_tools.h"
#include "worker/dry_run.h"
#include "worker/exit_status.h"
#include "worker/prepare.h"
#include "worker/profile.h"
#include "worker/setup.h"
#include "worker/signals.h"
#include "worker/threads.h"
#include "worker/train.h"

namespace {

using ptrain::kExitBadInput;

void AddRankFlags(CLI::App& app, ptrain::RankFlags* f) {
  app.add_option("--config", f->config_path, "job spec YAML file");
  app.add_option("--resume-from", f->resume_from,
                 "latest (newest intact checkpoint under checkpoint.dir, or "
                 "a fresh start) or a checkpoint folder");
  app.add_option("--fork-from", f->fork_from,
                 "with --resume-from latest: the checkpoint folder (another "
                 "job's) to go on from while checkpoint.dir holds none of "
                 "this run's");
  app.add_option("--set", f->overrides,
                 "override a spec field: dotted.path=value (repeatable)");
  app.add_option("--log-json", f->log_json,
                 "write one JSON object per step/eval/sample to this file");
  app.add_option("--peak-gflops", f->peak_gflops,
                 "MFU denominator per rank in GFLOP/s (default: measure)");
  app.add_option("--log-level", f->log_level, "trace|debug|info|warn|error");
  app.add_option("--metrics-bind", f->metrics_bind,
                 "serve Prometheus /metrics on ADDR:PORT (port 0: any free "
                 "port); default $PTRAIN_METRICS_BIND, else off")
      ->envname("PTRAIN_METRICS_BIND");
  app.add_option("--advertise-host", f->advertise_host,
                 "host or address under which a wildcard --metrics-bind is "
                 "advertised to the coordinator (default: the address of "
                 "the interface that reaches the coordinator); default "
                 "$PTRAIN_ADVERTISE_HOST")
      ->envname("PTRAIN_ADVERTISE_HOST");
  app.add_flag("--dry-run", f->dry_run,
               "print the effective spec, the layout and each rank's memory, "
               "and whether they fit here; start and write nothing");
}

struct ExportCommand {
  CLI::App* app = nullptr;
  std::string checkpoint, out, tokenizer_out, hf_out, hf_dtype = "fp32";
};

void AddExportCommand(CLI::App& app, ExportCommand* e) {
  e->app = app.add_subcommand(
      "export",
      "write a checkpoint's weights as an llm.c GPT-2 file (--llmc) or a "
      "Hugging Face model folder (--hf)");
  e->app->add_option("--checkpoint", e->checkpoint, "checkpoint folder")
      ->required();
  CLI::Option* llmc = e->app->add_option("--llmc", e->out, "output .bin");
  CLI::Option* hf = e->app->add_option(
      "--hf", e->hf_out,
      "output folder: a Hugging Face model (config.json, safetensors, the "
      "job's tokenizer: tokenizer.json for gpt2 and hf:, tokenizer.model "
      "for spm:, none for char)");
  llmc->excludes(hf);
  e->app
      ->add_option("--hf-dtype", e->hf_dtype,
                   "the Hugging Face weights' type: fp32 (default; export "
                   "then import is bit-exact) or bf16 (rounded to nearest "
                   "even)")
      ->needs(hf);
  e->app->require_option(1, 0);
  e->app->add_option("--llmc-tokenizer", e->tokenizer_out,
                     "also write the job's tokenizer as llm.c's tokenizer "
                     "file (gpt2_tokenizer.bin's format)");
}

// `ptworker sample`'s flags as CLI11 fills them; Given() keeps those given.
struct SampleCommand {
  CLI::App* app = nullptr;
  std::string checkpoint, prompt;
  int tokens = 0, top_k = 0;
  double temperature = 1.0;
  uint64_t seed = 0;
  CLI::Option *prompt_opt = nullptr, *tokens_opt = nullptr,
              *temperature_opt = nullptr, *top_k_opt = nullptr,
              *seed_opt = nullptr;

  ptrain::SampleFlags Given() const {
    ptrain::SampleFlags f;
    f.checkpoint = checkpoint;
    if (*prompt_opt) f.prompt = prompt;
    if (*tokens_opt) f.tokens = tokens;
    if (*temperature_opt) f.temperature = temperature;
    if (*top_k_opt) f.top_k = top_k;
    if (*seed_opt) f.seed = seed;
    return f;
  }
};

void AddSampleCommand(CLI::App& app, SampleCommand* s) {
  s->app = app.add_subcommand(
      "sample", "print text generated by a checkpoint's model (stdout)");
  s->app->add_option("--checkpoint", s->checkpoint, "checkpoint folder")
      ->required();
  s->prompt_opt = s->app->add_option(
      "--prompt", s->prompt,
      "text the sample continues (default: the job's train.sample_prompt)");
  s->tokens_opt =
      s->app
          ->add_option("--tokens", s->tokens,
                       "tokens to generate (default: train.sample_tokens)")
          ->check(CLI::Range(0, 1 << 20));
  s->temperature_opt =
      s->app
          ->add_option(
              "--temperature", s->temperature,
              "softmax temperature, 0: greedy (the likeliest token each "
              "time) (default: train.sample_temperature)")
          ->check(CLI::NonNegativeNumber);
  s->top_k_opt =
      s->app
          ->add_option("--top-k", s->top_k,
                       "sample from the K likeliest tokens, 0: all (default: "
                       "train.sample_top_k)")
          ->check(CLI::Range(0, 1 << 24));
  s->seed_opt = s->app->add_option(
      "--seed", s->seed,
      "seed of the draw (default: train.seed; with every default the text "
      "is the run's own sample at the checkpoint's step)");
}

struct PrepareCommand {
  CLI::App* app = nullptr;
  ptrain::PrepareFlags flags;
};

void AddPrepareCommand(CLI::App& app, PrepareCommand* p) {
  ptrain::PrepareFlags& f = p->flags;
  p->app = app.add_subcommand(
      "prepare",
      "turn text files into llm.c token shards, the tokenizer file beside "
      "them (docs/data.md)");
  p->app
      ->add_option("--tokenizer", f.tokenizer,
                   "gpt2, spm:MODEL (a SentencePiece model), "
                   "hf:TOKENIZER_JSON (a Hugging Face tokenizer.json or its "
                   "folder) or spm-train:VOCAB (train one of VOCAB pieces on "
                   "the input)")
      ->required();
  p->app->add_option("--spm-type", f.spm_type,
                     "spm-train's model: bpe (default) or unigram");
  p->app
      ->add_option("--input", f.inputs,
                   "a file, a folder or a glob pattern ('corpus/*.txt'), "
                   "repeatable: .txt files are one document each, .jsonl "
                   "and .json files one a line (--field); each may be .gz "
                   "or .zst")
      ->required();
  p->app->add_option("--field", f.field,
                     "JSON lines: the field that holds a document's text, a "
                     "dotted path for nested ones (default: text)");
  p->app->add_flag("--skip-bad-lines", f.skip_bad_lines,
                   "JSON lines: leave out (and count) a line that is not "
                   "JSON or lacks the field, instead of refusing it");
  p->app
      ->add_option("--out", f.out,
                   "output folder (created; its parent must exist); its "
                   "name prefixes the files")
      ->required();
  p->app->add_option("--val-fraction", f.val_fraction,
                     "share of the input bytes, from the start, for the "
                     "validation shards; 0 to 0.5 (default 0.005)");
  p->app->add_option("--shard-tokens", f.shard_tokens,
                     "tokens per shard at most (default 100000000)");
  p->app->add_option("--threads", f.threads,
                     "encoding threads (default: the cores this process may "
                     "use)");
}

struct ProfileCommand {
  CLI::App* app = nullptr;
  ptrain::ProfileFlags flags;
};

void AddProfileCommand(CLI::App& app, ProfileCommand* p) {
  ptrain::ProfileFlags& f = p->flags;
  p->app = app.add_subcommand(
      "profile",
      "measure this machine's matmuls, attention, memory bandwidth, "
      "optimizer and (under mpirun) links; write them as a hardware profile "
      "(JSON)");
  p->app->add_option("--device", f.device,
                     "cpu (default) or cuda (this rank's GPU)");
  p->app
      ->add_option("--out", f.out,
                   "the profile's path (its folder must exist; replaced "
                   "atomically)")
      ->required();
  p->app->add_flag("--quick", f.quick,
                   "smaller grids and fewer repetitions (seconds, for CI)");
}

// ptworker without a subcommand: one rank of a training run.
int Train(const ptrain::RankFlags& flags, const ptrain::NodeShare& node) {
  if (flags.config_path.empty()) {
    if (ptrain::WorldRank() == 0) {
      std::fprintf(stderr, "ptworker: error: --config is required\n");
    }
    return kExitBadInput;
  }
  if (flags.dry_run) return ptrain::DryRun(flags);
  // Only rank 0 narrates; the others speak up for warnings and errors.
  ptrain::SetupLogging(ptrain::WorldRank() == 0 ? flags.log_level : "warn");
  ptrain::Rank rank;
  const int rc = ptrain::AgreeOnSetup(ptrain::SetUpRank(flags, node, &rank));
  if (rc != 0) return rc;
  return ptrain::TrainRank(flags, &rank);
}

int Run(int argc, char** argv) {
  CLI::App app{"ptworker: trains a GPT as one rank of a ptrain job"};
  ptrain::RankFlags flags;
  AddRankFlags(app, &flags);
  ExportCommand export_command;
  AddExportCommand(app, &export_command);
  SampleCommand sample_command;
  AddSampleCommand(app, &sample_command);
  PrepareCommand prepare_command;
  AddPrepareCommand(app, &prepare_command);
  ProfileCommand profile_command;
  AddProfileCommand(app, &profile_command);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      return ptrain::WorldRank() == 0 ? app.exit(e) : 0;
    }
    if (ptrain::WorldRank() == 0) {
      std::fprintf(stderr, "ptworker: error: %s\n", e.what());
    }
    return kExitBadInput;
  }
  ptrain::SetSignalRank(ptrain::WorldRank());
  // The machine's cores as its ranks share them (a collective: every rank,
  // before anything can fail).
  const ptrain::NodeShare node = ptrain::ShareOfNode();
  // export, sample and prepare run on one process, rank 0 of however many
  // started.
  if (export_command.app->parsed()) {
    if (ptrain::WorldRank() != 0) return 0;
    if (!export_command.hf_out.empty()) {
      return ptrain::RunExportHf(export_command.checkpoint,
                                 export_command.hf_out,
                                 export_command.hf_dtype);
    }
    return ptrain::RunExport(export_command.checkpoint, export_command.out,
                             export_command.tokenizer_out);
  }
  if (sample_command.app->parsed()) {
    if (ptrain::WorldRank() != 0) return 0;
    return ptrain::RunSample(sample_command.Given(), node);
  }
  if (prepare_command.app->parsed()) {
    if (ptrain::WorldRank() != 0) return 0;
    return ptrain::RunPrepare(prepare_command.flags, node);
  }
  // profile runs on every rank (its links are between them).
  if (profile_command.app->parsed()) {
    return ptrain::RunProfile(profile_command.flags, node);
  }
  return Train(flags, node);
}

}  // namespace

int main(int argc, char** argv) {
  ptrain::HandleStopSignals();
  // prepare is one process that needs no MPI (whose start takes a good
  // part of a second); under mpirun the first rank runs it.
  const bool mpi = !(argc > 1 && std::strcmp(argv[1], "prepare") == 0);
  if (mpi) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  }
  int rc = 0;
  try {
    rc = Run(argc, argv);
  } catch (const std::exception& e) {
    // Nothing may end in an abort: one error line, exit 2, and the other
    // ranks taken down with it.
    std::fprintf(stderr, "ptworker: error: %s\n", e.what());
    int size = 1;
    if (mpi) MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, kExitBadInput);
    rc = kExitBadInput;
  }
  if (mpi) MPI_Finalize();
  return rc;
}
