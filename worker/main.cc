// ptworker: one training rank. Standalone: `ptworker --config job.yaml
// [--set key=value]... [--log-json run.jsonl]`. Exit codes: 0 done, 1 runtime
// failure, 2 bad input (spec, data, flags) with one error line on stderr.
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "common/spec.h"
#include "spdlog/spdlog.h"
#include "worker/engine/trainer.h"

namespace {

constexpr int kExitBadInput = 2;

int IsInputError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "ptworker: error: %s\n",
               std::string(s.message()).c_str());
  return IsInputError(s) ? kExitBadInput : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ptworker: trains a GPT as one rank of a ptrain job"};
  std::string config_path, log_json, log_level = "info";
  std::vector<std::string> overrides;
  double peak_gflops = 0.0;
  app.add_option("--config", config_path, "job spec YAML file")->required();
  app.add_option("--set", overrides,
                 "override a spec field: dotted.path=value (repeatable)");
  app.add_option("--log-json", log_json,
                 "write one JSON object per step/eval/sample to this file");
  app.add_option("--peak-gflops", peak_gflops,
                 "MFU denominator in GFLOP/s (default: measure sgemm)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  }
  ptrain::SetupLogging(log_level);

  auto spec = ptrain::LoadJobSpecFile(config_path, overrides);
  if (!spec.ok()) return Fail(spec.status());
  ptrain::TrainerOptions options;
  options.log_json_path = log_json;
  options.peak_flops = peak_gflops * 1e9;
  auto trainer = ptrain::Trainer::Create(*spec, options);
  if (!trainer.ok()) return Fail(trainer.status());
  const absl::Status done = (*trainer)->Run();
  if (!done.ok()) return Fail(done);
  return 0;
}
