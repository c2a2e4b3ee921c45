// ptworker: one training rank. Standalone: `ptworker --config job.yaml
// [--set key=value]... [--log-json run.jsonl] [--resume-from latest|DIR]`,
// alone or under `mpirun -n N`; `ptworker export --checkpoint DIR --llmc
// OUT.bin` writes a checkpoint's weights in llm.c's format. Exit codes: 0 done,
// 1 runtime failure, 2 bad input (spec, data, flags, layout) with one error
// line on stderr from the lowest failing rank; every rank exits, none waits for
// another.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "common/net.h"
#include "common/spec.h"
#include "spdlog/spdlog.h"
#include "worker/engine/parallel_dims.h"
#include "worker/engine/trainer.h"
#include "worker/progress_reporter.h"

namespace {

constexpr int kExitBadInput = 2;

bool IsInputError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kFailedPrecondition:  // checkpoint does not fit
    case absl::StatusCode::kDataLoss:            // checkpoint is damaged
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

double EnvDouble(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atof(v) : 0.0;
}

// `ptworker export`: one process, no training.
int Export(const std::string& checkpoint, const std::string& out) {
  auto reader = ptrain::CheckpointReader::Open(checkpoint);
  absl::Status s =
      reader.ok() ? ptrain::ExportLlmc(**reader, (*reader)->meta().model, out)
                  : reader.status();
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
  const absl::Status setup = [&]() -> absl::Status {
    // Under ptcoord every rank reports to the coordinator (rank 0 its
    // progress, each rank its metrics endpoint); standalone, nobody.
    auto r = ptrain::ProgressReporter::FromEnvironment();
    if (!r.ok()) return r.status();
    reporter = std::move(*r);
    auto spec = ptrain::LoadJobSpecFile(config_path, overrides);
    if (!spec.ok()) return spec.status();
    auto d = ptrain::ParallelDims::Create(spec->parallel(), MPI_COMM_WORLD);
    if (!d.ok()) return d.status();
    dims = std::move(*d);
    ptrain::TrainerOptions options;
    options.log_json_path = log_json;
    options.peak_flops = peak_gflops * 1e9;
    options.resume_from = resume_from;
    // Test hooks (tests/): pause mid checkpoint write; stop progressing.
    options.save.pause_mid_write_s =
        EnvDouble("PTRAIN_TEST_CHECKPOINT_PAUSE_S");
    options.hang_at_step =
        static_cast<int64_t>(EnvDouble("PTRAIN_TEST_HANG_AT_STEP"));
    if (reporter != nullptr) {
      options.on_record = [r = reporter.get()](const nlohmann::json& rec) {
        r->OnRecord(rec);
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
  }();
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
  const absl::Status done = trainer->Run();
  if (!done.ok()) {
    // Other ranks may be inside a collective: take the whole job down.
    std::fprintf(stderr, "ptworker: error on rank %d: %s\n", WorldRank(),
                 std::string(done.message()).c_str());
    MPI_Abort(MPI_COMM_WORLD, IsInputError(done) ? kExitBadInput : 1);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  const int rc = Run(argc, argv);
  MPI_Finalize();
  return rc;
}
