// ptworker: one training rank. Standalone: `ptworker --config job.yaml
// [--set key=value]... [--log-json run.jsonl] [--resume-from latest|DIR]`,
// alone or under `mpirun -n N`; `ptworker export --checkpoint DIR --llmc
// OUT.bin` writes a checkpoint's weights in llm.c's format; `ptworker sample
// --checkpoint DIR [--prompt TEXT] [--tokens N]...` prints text its model
// generates. Exit codes: 0 done, 1 runtime failure, 2 bad input (spec, data,
// flags, layout, a damaged or foreign checkpoint, a path outside the data
// roots, a model that does not fit in memory) with one error line on stderr
// from the lowest failing rank; every rank exits, none waits for another,
// none aborts. 3: stopped as asked at the end of a step, after that step's
// checkpoint, to be resumed as after a preemption: by SIGUSR1 (which mpirun
// forwards to every rank) or by a first SIGINT or SIGTERM while training; a
// second SIGINT or SIGTERM (or the first outside training) exits at once
// with 128 + the signal (130, 143).
//
// Threads: resources.threads_per_rank, else OMP_NUM_THREADS, else this
// rank's share of the cores of its machine (the cores any of its ranks may
// run on, divided by those ranks); a count that puts more threads on the
// machine than it has cores is warned about at start.
//
// Environment (set by ptcoord's launcher): PTRAIN_DATA_ROOTS confines every
// file ptworker opens (common/confined_fs.h); PTRAIN_JOB_UID is recorded in
// checkpoints and checked on `--resume-from latest`. Test hooks, read only
// when set: PTRAIN_TEST_CHECKPOINT_PAUSE_S, PTRAIN_TEST_HANG_AT_STEP.
#include <mpi.h>
#include <omp.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/confined_fs.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/spec.h"
#include "spdlog/spdlog.h"
#include "worker/engine/parallel_dims.h"
#include "worker/engine/trainer.h"
#include "worker/progress_reporter.h"

namespace {

using ptrain::kExitBadInput;
using ptrain::kExitStopped;

// Set by SIGUSR1, or a first SIGINT/SIGTERM while training: save at the
// end of this step and stop.
std::atomic<bool> g_stop_requested{false};
// True while the training loop runs: only then can a stop save anything,
// so outside it (setup, export, sample) SIGINT and SIGTERM end at once.
std::atomic<bool> g_training{false};
// Only rank 0 says what it does about a signal (mpirun passes one to all).
std::atomic<int> g_world_rank{0};

// SIGUSR1, SIGINT and SIGTERM are blocked in every thread (set before any
// is created, so all inherit it) and taken by this one alone with sigwait:
// no thread of MPI, OpenMP or the allocator is ever interrupted by them.
// Ctrl-C then saves the step being trained, like SIGUSR1; a second Ctrl-C
// (or ptcoord's cancel reaching a rank both directly and through mpirun)
// does not wait for that save.
void WaitForStopSignals(sigset_t signals) {
  bool interrupted = false;
  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGUSR1) {
      g_stop_requested.store(true);
      continue;
    }
    if (interrupted || !g_training.load()) std::_Exit(128 + sig);
    interrupted = true;
    g_stop_requested.store(true);
    if (g_world_rank.load() == 0) {
      const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
      spdlog::warn(
          "{}: stopping after this step and its checkpoint (exit 3); {} "
          "again exits at once",
          name, name);
    }
  }
}

bool IsInputError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kFailedPrecondition:  // checkpoint does not fit
    case absl::StatusCode::kDataLoss:            // checkpoint is damaged
    case absl::StatusCode::kResourceExhausted:   // does not fit in memory
      return true;
    default:
      return false;
  }
}

int WorldRank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Every rank learns whether any rank failed setup, so that all leave
// together; the lowest failing rank prints its error. Returns the exit code.
int AgreeOnSetup(const absl::Status& status) {
  const int mine = status.ok() ? 1 << 30 : WorldRank();
  int first_failed = 0;
  MPI_Allreduce(&mine, &first_failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first_failed == 1 << 30) return 0;
  if (first_failed == WorldRank()) {
    std::fprintf(stderr, "ptworker: error: %s\n",
                 std::string(status.message()).c_str());
  }
  return status.ok() || IsInputError(status) ? kExitBadInput : 1;
}

// A test hook's value: unset unless the variable is present; a value that
// is not a number is an error, never a silent 0.
absl::Status EnvNumber(const char* name, std::optional<double>* out) {
  const char* v = std::getenv(name);
  if (v == nullptr) return absl::OkStatus();
  double d = 0;
  if (!absl::SimpleAtod(v, &d) || !(d >= 0 && d <= 86400)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "='", v, "' is not a number of seconds in [0, 86400]"));
  }
  *out = d;
  return absl::OkStatus();
}

absl::Status EnvInteger(const char* name, std::optional<int64_t>* out) {
  const char* v = std::getenv(name);
  if (v == nullptr) return absl::OkStatus();
  int64_t i = 0;
  if (!absl::SimpleAtoi(v, &i) || i < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", v, "' is not an integer >= 1"));
  }
  *out = i;
  return absl::OkStatus();
}

// $PTRAIN_JOB_UID: "" when unset; else a short token.
absl::StatusOr<std::string> JobUid() {
  const char* v = std::getenv("PTRAIN_JOB_UID");
  if (v == nullptr) return std::string();
  const std::string uid = v;
  bool ok = uid.size() <= 128;
  for (char c : uid) {
    ok = ok && (absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                c == '-' || c == '_' || c == '.');
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("PTRAIN_JOB_UID='", uid.substr(0, 140),
                     "' must be at most 128 characters of A-Z a-z 0-9 . _ -"));
  }
  return uid;
}

// This rank's machine as its ranks share it (collective over the world).
struct NodeShare {
  int ranks = 1;       // ranks of MPI_COMM_WORLD on it: they share its memory
  int local_rank = 0;  // this rank's index among them
  int cores = 1;       // CPUs any of them may run on
  int rank_cores = 1;  // CPUs this rank may run on (mpirun may bind it)
};

NodeShare ShareOfNode() {
  NodeShare share;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) {
    for (long c = 0; c < sysconf(_SC_NPROCESSORS_ONLN) && c < CPU_SETSIZE;
         ++c) {
      CPU_SET(c, &mine);
    }
  }
  share.rank_cores = share.cores = std::max(1, CPU_COUNT(&mine));
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0,
                          MPI_INFO_NULL, &node) != MPI_SUCCESS) {
    return share;
  }
  MPI_Comm_size(node, &share.ranks);
  MPI_Comm_rank(node, &share.local_rank);
  // The union of the ranks' CPU sets: bound one core each, two ranks still
  // have two cores between them.
  cpu_set_t all;
  CPU_ZERO(&all);
  MPI_Allreduce(&mine, &all, sizeof(cpu_set_t), MPI_BYTE, MPI_BOR, node);
  share.cores = std::max(1, CPU_COUNT(&all));
  MPI_Comm_free(&node);
  return share;
}

struct ThreadChoice {
  int threads = 1;
  std::string warning;  // "" unless the machine gets more threads than cores
};

// OpenMP threads per rank: `per_rank` (resources.threads_per_rank) when set,
// else OMP_NUM_THREADS when set, else the rank's share of the cores. More
// threads than cores make OpenMP's threads wait for each other in every
// parallel region: the run is then often 10 to 100 times slower, so such a
// count is named in a warning.
ThreadChoice ChooseThreads(int per_rank, const NodeShare& node) {
  const char* env = std::getenv("OMP_NUM_THREADS");
  const bool from_env = per_rank <= 0 && env != nullptr && *env != '\0';
  ThreadChoice c;
  const int fair = std::max(1, node.cores / node.ranks);
  c.threads = per_rank > 0 ? per_rank
              : from_env   ? omp_get_max_threads()
                           : std::min(node.rank_cores, fair);
  const std::string given = per_rank > 0
                                ? "resources.threads_per_rank"
                                : (from_env ? "OMP_NUM_THREADS" : "default");
  const int64_t total = int64_t{c.threads} * node.ranks;
  if (c.threads == 1 && node.ranks > node.cores) {
    // No thread count helps: there are more ranks than cores, and ranks
    // that busy-wait for messages starve the one they wait for.
    const char* yield = std::getenv("OMPI_MCA_mpi_yield_when_idle");
    if (yield == nullptr || std::string(yield) != "1") {
      c.warning = absl::StrCat(
          "threads: ", node.ranks, " ranks on this machine's ", node.cores,
          " cores: set OMPI_MCA_mpi_yield_when_idle=1, so that ranks waiting "
          "for a message yield their core");
    }
  } else if (total > node.cores) {
    c.warning = absl::StrCat(
        "threads: ", node.ranks, " rank(s) on this machine x ", c.threads,
        " threads each (", given, ") = ", total, " threads on ", node.cores,
        " cores: oversubscribed, often 10-100x slower; set OMP_NUM_THREADS=",
        fair, " (or resources.threads_per_rank: ", fair, ")");
  } else if (c.threads > node.rank_cores) {
    c.warning = absl::StrCat(
        "threads: ", c.threads, " threads (", given, ") on the ",
        node.rank_cores,
        " cores this rank is bound to: oversubscribed, often 10-100x slower; "
        "set OMP_NUM_THREADS=",
        node.rank_cores, " or bind the ranks to more cores");
  }
  return c;
}

// Applies ChooseThreads; the first rank of each machine warns for it.
void SetThreads(int per_rank, const NodeShare& node) {
  const ThreadChoice c = ChooseThreads(per_rank, node);
  omp_set_num_threads(c.threads);
  if (!c.warning.empty() && node.local_rank == 0) spdlog::warn("{}", c.warning);
}

absl::Status ExportStatus(const std::string& checkpoint,
                          const std::string& out) {
  auto fs = ptrain::ConfinedFs::FromEnvironment();
  if (!fs.ok()) return fs.status();
  auto reader = ptrain::CheckpointReader::Open(checkpoint, *fs, "--checkpoint");
  if (!reader.ok()) return reader.status();
  // Open checked that the tensors are those of the manifest's model, so
  // the export allocates no more than the checkpoint holds.
  const ptrain::GptConfig& model = (*reader)->meta().model;
  return ptrain::ExportLlmc(**reader, model, out, *fs, "--llmc");
}

// `ptworker sample`'s flags; unset ones take the job's train.sample_*.
struct SampleFlags {
  std::string checkpoint;
  std::optional<std::string> prompt;
  std::optional<int> tokens, top_k;
  std::optional<double> temperature;
  std::optional<uint64_t> seed;
};

// The checkpoint's model on one rank (whatever layout trained it) on the
// CPU in fp32, with the checkpoint's own vocabulary: no data file is read,
// nothing is written.
absl::StatusOr<std::string> SampleStatus(const SampleFlags& f,
                                         const NodeShare& node) {
  auto fs = ptrain::ConfinedFs::FromEnvironment();
  if (!fs.ok()) return fs.status();
  std::error_code ec;
  if (!std::filesystem::exists(f.checkpoint, ec)) {
    return absl::NotFoundError(
        absl::StrCat("--checkpoint ", f.checkpoint, ": no such folder"));
  }
  auto reader =
      ptrain::CheckpointReader::Open(f.checkpoint, *fs, "--checkpoint");
  if (!reader.ok()) return reader.status();
  const ptrain::CheckpointMeta meta = (*reader)->meta();
  reader->reset();
  auto parsed = ptrain::ParseJobSpec(
      meta.spec_yaml, {},
      absl::StrCat("--checkpoint ", f.checkpoint, ": spec"));
  if (!parsed.ok()) return parsed.status();
  ptrain::v1::JobSpec spec = *parsed;
  *spec.mutable_parallel() = ptrain::DefaultJobSpec().parallel();
  spec.mutable_resources()->set_device("cpu");
  *spec.mutable_checkpoint() = ptrain::DefaultJobSpec().checkpoint();
  spec.mutable_model()->set_init_from("");
  ptrain::v1::TrainSpec& train = *spec.mutable_train();
  train.set_precision("fp32");
  train.set_steps(std::max(train.steps(), meta.step));
  if (f.prompt.has_value()) {
    if (meta.vocab.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prompt: checkpoint ", f.checkpoint,
          " is of a model trained on token files, which has no tokenizer to "
          "read a prompt with"));
    }
    train.set_sample_prompt(*f.prompt);
  }
  if (f.tokens.has_value()) train.set_sample_tokens(*f.tokens);
  if (f.temperature.has_value()) train.set_sample_temperature(*f.temperature);
  if (f.top_k.has_value()) train.set_sample_top_k(*f.top_k);
  if (f.seed.has_value()) train.set_seed(*f.seed);
  if (auto s = ptrain::ValidateJobSpec(spec); !s.ok()) return s;
  SetThreads(spec.resources().threads_per_rank(), node);

  ptrain::TokenData data;
  data.vocab_size = meta.model.vocab_size;
  if (!meta.vocab.empty()) {
    data.has_tokenizer = true;
    data.tokenizer = ptrain::CharTokenizer(meta.vocab);
    const std::string& prompt = train.sample_prompt();
    if (data.tokenizer.Decode(data.tokenizer.Encode(prompt)) != prompt) {
      spdlog::warn(
          "--prompt: characters the model never saw in training are left "
          "out");
    }
  }
  // A trainer's batch samplers need one sequence to draw from; sampling
  // draws none.
  const size_t sequence = static_cast<size_t>(spec.model().block_size()) + 1;
  data.train.emplace_back(std::vector<uint16_t>(sequence, 0));
  data.val.emplace_back(std::vector<uint16_t>(sequence, 0));
  ptrain::TrainerOptions options;
  options.fs = *fs;
  options.resume_from = f.checkpoint;
  options.quiet = true;
  auto trainer =
      ptrain::Trainer::CreateWithData(spec, options, std::move(data));
  if (!trainer.ok()) return trainer.status();
  // The salt of the run's own sample at this step: with the job's settings
  // the text is the one its run log holds for this step.
  return (*trainer)->Sample(static_cast<uint64_t>(meta.step));
}

// Runs `body` (one process, no training) and turns its failure into one
// error line and an exit code.
int RunTool(const char* what, const std::function<absl::Status()>& body) {
  absl::Status s;
  try {
    s = body();
  } catch (const std::bad_alloc&) {
    s = absl::ResourceExhaustedError(
        absl::StrCat(what, ": out of memory reading the checkpoint"));
  } catch (const std::exception& e) {
    s = absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "ptworker: error: %s\n",
                 std::string(s.message()).c_str());
    return IsInputError(s) ? kExitBadInput : 1;
  }
  return 0;
}

int Run(int argc, char** argv) {
  CLI::App app{"ptworker: trains a GPT as one rank of a ptrain job"};
  std::string config_path, log_json, log_level = "info", resume_from;
  std::vector<std::string> overrides;
  double peak_gflops = 0.0;
  app.add_option("--config", config_path, "job spec YAML file");
  app.add_option("--resume-from", resume_from,
                 "latest (newest intact checkpoint under checkpoint.dir, or "
                 "a fresh start) or a checkpoint folder");
  std::string export_ckpt, export_out;
  CLI::App* exp = app.add_subcommand(
      "export", "write a checkpoint's weights as an llm.c GPT-2 file");
  exp->add_option("--checkpoint", export_ckpt, "checkpoint folder")->required();
  exp->add_option("--llmc", export_out, "output .bin")->required();
  SampleFlags sample;
  std::string prompt;
  int tokens = 0, top_k = 0;
  double temperature = 1.0;
  uint64_t seed = 0;
  CLI::App* smp = app.add_subcommand(
      "sample", "print text generated by a checkpoint's model (stdout)");
  smp->add_option("--checkpoint", sample.checkpoint, "checkpoint folder")
      ->required();
  CLI::Option* prompt_opt = smp->add_option(
      "--prompt", prompt,
      "text the sample continues (default: the job's train.sample_prompt)");
  CLI::Option* tokens_opt =
      smp->add_option("--tokens", tokens,
                      "tokens to generate (default: train.sample_tokens)")
          ->check(CLI::Range(0, 1 << 20));
  CLI::Option* temperature_opt =
      smp->add_option("--temperature", temperature,
                      "softmax temperature (default: train.sample_temperature)")
          ->check(CLI::PositiveNumber);
  CLI::Option* top_k_opt =
      smp->add_option("--top-k", top_k,
                      "sample from the K likeliest tokens, 0: all (default: "
                      "train.sample_top_k)")
          ->check(CLI::Range(0, 1 << 24));
  CLI::Option* seed_opt = smp->add_option(
      "--seed", seed,
      "seed of the draw (default: train.seed; with every default the text "
      "is the run's own sample at the checkpoint's step)");
  app.add_option("--set", overrides,
                 "override a spec field: dotted.path=value (repeatable)");
  app.add_option("--log-json", log_json,
                 "write one JSON object per step/eval/sample to this file");
  app.add_option("--peak-gflops", peak_gflops,
                 "MFU denominator per rank in GFLOP/s (default: measure)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  std::string metrics_bind;
  app.add_option("--metrics-bind", metrics_bind,
                 "serve Prometheus /metrics on ADDR:PORT (port 0: any free "
                 "port); default $PTRAIN_METRICS_BIND, else off")
      ->envname("PTRAIN_METRICS_BIND");
  std::string advertise_host;
  app.add_option("--advertise-host", advertise_host,
                 "host or address under which a wildcard --metrics-bind is "
                 "advertised to the coordinator (default: the address of "
                 "the interface that reaches the coordinator); default "
                 "$PTRAIN_ADVERTISE_HOST")
      ->envname("PTRAIN_ADVERTISE_HOST");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return WorldRank() == 0 ? app.exit(e) : 0;
    if (WorldRank() == 0)
      std::fprintf(stderr, "ptworker: error: %s\n", e.what());
    return kExitBadInput;
  }
  g_world_rank.store(WorldRank());
  // The machine's cores as its ranks share them (a collective: every rank,
  // before anything can fail).
  const NodeShare node = ShareOfNode();
  if (exp->parsed()) {
    if (WorldRank() != 0) return 0;
    return RunTool("export", [&] {
      absl::Status s = ExportStatus(export_ckpt, export_out);
      if (s.ok()) {
        std::printf("wrote %s (llm.c GPT-2 fp32) from %s\n", export_out.c_str(),
                    export_ckpt.c_str());
      }
      return s;
    });
  }
  if (smp->parsed()) {
    if (WorldRank() != 0) return 0;
    ptrain::SetupLogging("warn");
    if (*prompt_opt) sample.prompt = prompt;
    if (*tokens_opt) sample.tokens = tokens;
    if (*temperature_opt) sample.temperature = temperature;
    if (*top_k_opt) sample.top_k = top_k;
    if (*seed_opt) sample.seed = seed;
    return RunTool("sample", [&]() -> absl::Status {
      auto text = SampleStatus(sample, node);
      if (!text.ok()) return text.status();
      text->push_back('\n');
      std::fwrite(text->data(), 1, text->size(), stdout);
      return absl::OkStatus();
    });
  }
  if (config_path.empty()) {
    if (WorldRank() == 0) {
      std::fprintf(stderr, "ptworker: error: --config is required\n");
    }
    return kExitBadInput;
  }
  // Only rank 0 narrates; the others speak up for warnings and errors.
  ptrain::SetupLogging(WorldRank() == 0 ? log_level : "warn");

  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  std::unique_ptr<ptrain::ProgressReporter> reporter;
  std::unique_ptr<ptrain::ParallelDims> dims;
  std::unique_ptr<ptrain::Trainer> trainer;
  std::unique_ptr<ptrain::RankMetrics> metrics;
  const auto set_up = [&]() -> absl::Status {
    // Under ptcoord every rank reports to the coordinator (rank 0 its
    // progress, each rank its metrics endpoint); standalone, nobody.
    auto r = ptrain::ProgressReporter::FromEnvironment();
    if (!r.ok()) return r.status();
    reporter = std::move(*r);
    auto spec = ptrain::LoadJobSpecFile(config_path, overrides, "--config");
    if (!spec.ok()) return spec.status();
    if (reporter != nullptr) {
      // Loading data, weights and a checkpoint ends no step: without signs
      // of life a large file would look like a hang.
      reporter->SetAliveInterval(ptrain::ProgressReporter::AliveInterval(
          spec->restart().hang_timeout_s()));
      reporter->SetActivity("setting up: data, model and checkpoint");
    }
    auto d = ptrain::ParallelDims::Create(spec->parallel(), MPI_COMM_WORLD);
    if (!d.ok()) return d.status();
    dims = std::move(*d);
    if (dims->world_rank() == 0) {
      for (const std::string& w : ptrain::JobSpecWarnings(*spec)) {
        spdlog::warn("{}", w);
      }
    }
    SetThreads(spec->resources().threads_per_rank(), node);
    ptrain::TrainerOptions options;
    options.log_json_path = log_json;
    options.peak_flops = peak_gflops * 1e9;
    options.resume_from = resume_from;
    // Refused now rather than failing at its first clashing save.
    options.refuse_other_runs_steps = true;
    auto fs = ptrain::ConfinedFs::FromEnvironment();
    if (!fs.ok()) return fs.status();
    options.fs = *fs;
    auto uid = JobUid();
    if (!uid.ok()) return uid.status();
    options.job_uid = *uid;
    options.ranks_on_node = node.ranks;
    // Test hooks (tests/): pause mid checkpoint write; stop progressing.
    if (auto s = EnvNumber("PTRAIN_TEST_CHECKPOINT_PAUSE_S",
                           &options.save.pause_mid_write_s);
        !s.ok()) {
      return s;
    }
    options.stop_requested = &g_stop_requested;
    if (auto s = EnvInteger("PTRAIN_TEST_HANG_AT_STEP", &options.hang_at_step);
        !s.ok()) {
      return s;
    }
    if (reporter != nullptr) {
      options.on_record = [r = reporter.get()](const nlohmann::json& rec) {
        r->OnRecord(rec);
      };
      options.on_activity = [r = reporter.get()](const std::string& what) {
        r->SetActivity(what);
      };
    }
    auto t = ptrain::Trainer::Create(*spec, options, dims.get());
    if (!t.ok()) return t.status();
    trainer = std::move(*t);
    if (!metrics_bind.empty()) {
      auto m = ptrain::RankMetrics::Start(
          metrics_bind, {spec->name(), host, dims->world_rank(),
                         dims->dp_rank(), dims->tp_rank(), dims->pp_rank()});
      if (!m.ok()) return m.status();
      metrics = std::move(*m);
      trainer->set_metrics(metrics.get());
    }
    return absl::OkStatus();
  };
  // A failed allocation (or any exception) is an error like the others:
  // every rank still reaches AgreeOnSetup.
  absl::Status setup;
  try {
    setup = set_up();
  } catch (const std::bad_alloc&) {
    setup = absl::ResourceExhaustedError(
        "memory: out of memory while setting up (see the model.*, "
        "train.global_batch and parallel.* settings)");
  } catch (const std::exception& e) {
    setup = absl::InternalError(absl::StrCat("setup failed: ", e.what()));
  }
  if (reporter != nullptr) reporter->SetActivity("");
  if (const int rc = AgreeOnSetup(setup); rc != 0) return rc;
  spdlog::info("layout: {}", dims->ToString());
  if (metrics != nullptr) {
    spdlog::warn("rank {} serves metrics on port {}", dims->world_rank(),
                 metrics->port());
    if (reporter != nullptr) {
      // Others must reach the address: see AdvertiseHost for the rule.
      const std::string at = ptrain::AdvertiseHost(
          metrics_bind, advertise_host, reporter->coordinator_address(), host);
      reporter->ReportEndpoint(
          ptrain::JoinHostPort(at, std::to_string(metrics->port())));
    }
  }
  absl::Status done;
  g_training.store(true);
  try {
    done = trainer->Run();
  } catch (const std::bad_alloc&) {
    done = absl::ResourceExhaustedError("memory: out of memory while training");
  } catch (const std::exception& e) {
    done = absl::InternalError(absl::StrCat("training failed: ", e.what()));
  }
  g_training.store(false);
  if (!done.ok()) {
    // Other ranks may be inside a collective: take the whole job down.
    std::fprintf(stderr, "ptworker: error on rank %d: %s\n", WorldRank(),
                 std::string(done.message()).c_str());
    MPI_Abort(MPI_COMM_WORLD, IsInputError(done) ? kExitBadInput : 1);
  }
  return trainer->stopped() ? kExitStopped : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // SIGUSR1 asks for a checkpoint and a stop (the trainer looks at the flag
  // after every step); from the start, as it would end the rank otherwise.
  // SIGINT and SIGTERM too, while training (WaitForStopSignals).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGUSR1);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::thread(WaitForStopSignals, stop_signals).detach();
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  try {
    rc = Run(argc, argv);
  } catch (const std::exception& e) {
    // Nothing may end in an abort: one error line, exit 2, and the other
    // ranks taken down with it.
    std::fprintf(stderr, "ptworker: error: %s\n", e.what());
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, kExitBadInput);
    rc = kExitBadInput;
  }
  MPI_Finalize();
  return rc;
}
