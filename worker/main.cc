// ptworker: one training rank. Standalone: `ptworker --config job.yaml
// [--set key=value]... [--log-json run.jsonl] [--resume-from latest|DIR]`,
// alone or under `mpirun -n N`; `ptworker export --checkpoint DIR --llmc
// OUT.bin` writes a checkpoint's weights in llm.c's format. Exit codes: 0 done,
// 1 runtime failure, 2 bad input (spec, data, flags, layout, a damaged or
// foreign checkpoint, a path outside the data roots, a model that does not fit
// in memory) with one error line on stderr from the lowest failing rank; every
// rank exits, none waits for another, none aborts. 3: stopped as asked by
// SIGUSR1 (which mpirun forwards to every rank) at the end of a step, after
// that step's checkpoint: to be resumed, as after a preemption.
//
// Environment (set by ptcoord's launcher): PTRAIN_DATA_ROOTS confines every
// file ptworker opens (common/confined_fs.h); PTRAIN_JOB_UID is recorded in
// checkpoints and checked on `--resume-from latest`. Test hooks, read only
// when set: PTRAIN_TEST_CHECKPOINT_PAUSE_S, PTRAIN_TEST_HANG_AT_STEP.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
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
#include "common/logging.h"
#include "common/net.h"
#include "common/spec.h"
#include "spdlog/spdlog.h"
#include "worker/engine/parallel_dims.h"
#include "worker/engine/trainer.h"
#include "worker/progress_reporter.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitStopped = 3;

// Set by SIGUSR1: save at the end of this step and stop.
std::atomic<bool> g_stop_requested{false};

// SIGUSR1 is blocked in every thread (set before any is created, so all
// inherit it) and taken by this one alone with sigwait: no thread of MPI,
// OpenMP or the allocator is ever interrupted by it.
void WaitForStopSignals(sigset_t signals) {
  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) == 0) g_stop_requested.store(true);
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

// Ranks of MPI_COMM_WORLD on this machine: they share its memory.
int RanksOnNode() {
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0,
                          MPI_INFO_NULL, &node) != MPI_SUCCESS) {
    return 1;
  }
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
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

// `ptworker export`: one process, no training.
int Export(const std::string& checkpoint, const std::string& out) {
  absl::Status s;
  try {
    s = ExportStatus(checkpoint, out);
  } catch (const std::bad_alloc&) {
    s = absl::ResourceExhaustedError(
        "export: out of memory reading the checkpoint");
  } catch (const std::exception& e) {
    s = absl::InternalError(absl::StrCat("export: ", e.what()));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "ptworker: error: %s\n",
                 std::string(s.message()).c_str());
    return IsInputError(s) ? kExitBadInput : 1;
  }
  std::printf("wrote %s (llm.c GPT-2 fp32) from %s\n", out.c_str(),
              checkpoint.c_str());
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
    const int rc = WorldRank() == 0 ? app.exit(e) : (e.get_exit_code() != 0);
    return rc == 0 ? 0 : kExitBadInput;
  }
  if (exp->parsed())
    return WorldRank() == 0 ? Export(export_ckpt, export_out) : 0;
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
  const int ranks_on_node = RanksOnNode();
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
    ptrain::TrainerOptions options;
    options.log_json_path = log_json;
    options.peak_flops = peak_gflops * 1e9;
    options.resume_from = resume_from;
    auto fs = ptrain::ConfinedFs::FromEnvironment();
    if (!fs.ok()) return fs.status();
    options.fs = *fs;
    auto uid = JobUid();
    if (!uid.ok()) return uid.status();
    options.job_uid = *uid;
    options.ranks_on_node = ranks_on_node;
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
  try {
    done = trainer->Run();
  } catch (const std::bad_alloc&) {
    done = absl::ResourceExhaustedError("memory: out of memory while training");
  } catch (const std::exception& e) {
    done = absl::InternalError(absl::StrCat("training failed: ", e.what()));
  }
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
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGUSR1);
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
