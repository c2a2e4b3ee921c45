// Builds a training rank; see setup.h.
#include "worker/setup.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/confined_fs.h"
#include "common/mesh.h"
#include "common/net.h"
#include "common/spec.h"
#include "spdlog/spdlog.h"
#include "worker/checkpoint_folder.h"
#include "worker/engine/comm/comm.h"
#include "worker/engine/comm/flight_recorder.h"
#include "worker/signals.h"

namespace ptrain {
namespace {

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

absl::Status EnvInteger(const char* name, std::optional<int64_t>* out,
                        int64_t min = 1) {
  const char* v = std::getenv(name);
  if (v == nullptr) return absl::OkStatus();
  int64_t i = 0;
  if (!absl::SimpleAtoi(v, &i) || i < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", v, "' is not an integer >= ", min));
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

// The trainer's options from the flags and the environment.
absl::Status FillTrainerOptions(const RankFlags& flags, const NodeShare& node,
                                ProgressReporter* reporter,
                                TrainerOptions* options) {
  options->log_json_path = flags.log_json;
  options->peak_flops = flags.peak_gflops * 1e9;
  options->resume_from = flags.resume_from;
  options->fork_from = flags.fork_from;
  // Refused now rather than failing at its first clashing save.
  options->refuse_other_runs_steps = true;
  auto fs = ConfinedFs::FromEnvironment();
  if (!fs.ok()) return fs.status();
  options->fs = *fs;
  auto uid = JobUid();
  if (!uid.ok()) return uid.status();
  options->job_uid = *uid;
  options->ranks_on_node = node.ranks;
  // Test hooks (tests/): pause mid checkpoint write; stop progressing.
  if (auto s = EnvNumber("PTRAIN_TEST_CHECKPOINT_PAUSE_S",
                         &options->save.pause_mid_write_s);
      !s.ok()) {
    return s;
  }
  options->stop_requested = StopRequested();
  if (auto s = EnvInteger("PTRAIN_TEST_HANG_AT_STEP", &options->hang_at_step);
      !s.ok()) {
    return s;
  }
  if (auto s = EnvInteger("PTRAIN_TEST_HANG_RANK", &options->hang_rank, 0);
      !s.ok()) {
    return s;
  }
  if (auto s = EnvInteger("PTRAIN_TEST_NAN_AT_STEP", &options->nan_at_step);
      !s.ok()) {
    return s;
  }
  if (reporter != nullptr) {
    options->on_record = [reporter](const nlohmann::json& rec) {
      reporter->OnRecord(rec);
    };
    options->on_activity = [reporter](const std::string& what) {
      reporter->SetActivity(what);
    };
    options->on_rank_step = [reporter](const RankStep& step) {
      reporter->OnRankStep(step);
    };
  }
  return absl::OkStatus();
}

// A standalone run holds its checkpoint.dir for as long as it runs, so a
// second run there is refused before it trains (under ptcoord each job has
// a folder of its own, and one attempt at a time); started without
// --resume-from beside an earlier run's checkpoints (a rerun after Ctrl-C,
// say), it says so and how to go on from them. Collective, after the
// trainer is built (a run refused for anything else touches nothing):
// every rank learns rank 0's answer.
absl::Status HoldCheckpointDir(const v1::JobSpec& spec, const RankFlags& flags,
                               const TrainerOptions& options,
                               const ParallelDims& dims, Rank* rank) {
  const std::string& dir = spec.checkpoint().dir();
  if (dir.empty() || !options.job_uid.empty()) return absl::OkStatus();
  absl::Status held = absl::OkStatus();
  if (dims.world_rank() == 0) {
    absl::StatusOr<UniqueFd> fd = HoldCheckpointFolder(dir, options.fs);
    if (fd.ok()) {
      rank->checkpoint_dir_lock = std::move(*fd);
      if (flags.resume_from.empty()) {
        const std::string notice = EarlierCheckpointsNotice(dir, options.fs);
        if (!notice.empty()) spdlog::warn("{}", notice);
      }
    } else {
      held = fd.status();
    }
  }
  return AgreeOnStatus(dims.world_comm(), held,
                       "checkpoint.dir is in use by another run (see rank 0's "
                       "error)");
}

// SIGUSR2 and SIGTERM dump the rank's flight recorder beside the run log
// (docs/diagnose.md). Its size: PTRAIN_FLIGHT_RECORDER_ENTRIES (0: off).
absl::Status ArmFlightDump(const RankFlags& flags, const ParallelDims& dims) {
  std::shared_ptr<FlightRecorder> recorder = dims.shared_flight_recorder();
  std::optional<int64_t> entries;
  if (auto s = EnvInteger("PTRAIN_FLIGHT_RECORDER_ENTRIES", &entries, 0);
      !s.ok()) {
    return s;
  }
  if (entries.has_value()) {
    if (*entries > (1 << 24)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PTRAIN_FLIGHT_RECORDER_ENTRIES=", *entries,
                       " must be in [0, 16777216] (0: no flight recorder)"));
    }
    recorder->SetCapacity(static_cast<int>(*entries));
  }
  const std::string path = FlightDumpPath(flags.log_json, dims.world_rank());
  auto dump = [recorder, path](const char* reason) {
    if (absl::Status s = recorder->DumpTo(path, reason); !s.ok()) {
      spdlog::warn("flight recorder: {}", std::string(s.message()));
    }
  };
  SetFlightDump(dump);
  return absl::OkStatus();
}

absl::Status BuildRank(const RankFlags& flags, const NodeShare& node,
                       Rank* rank) {
  auto r = ProgressReporter::FromEnvironment();
  if (!r.ok()) return r.status();
  rank->reporter = std::move(*r);
  auto spec_fs = ConfinedFs::FromEnvironment();
  if (!spec_fs.ok()) return spec_fs.status();
  auto spec = LoadJobSpecFile(flags.config_path, flags.overrides, "--config",
                              spec_fs->Reader("model.init_from", 1 << 20));
  if (!spec.ok()) return spec.status();
  if (absl::Status s = CheckLayoutResolved(*spec); !s.ok()) return s;
  if (rank->reporter != nullptr) {
    // Loading data, weights and a checkpoint ends no step: without signs
    // of life a large file would look like a hang.
    rank->reporter->SetAliveInterval(
        ProgressReporter::AliveInterval(spec->restart().hang_timeout_s()));
    rank->reporter->SetActivity("setting up: data, model and checkpoint");
    // A rank whose coordinator is gone stops at a checkpoint rather than
    // train on unreported (every rank agrees on the step, as for SIGUSR1).
    rank->reporter->OnCoordinatorLost([] { RequestStop(); });
  }
  auto d = ParallelDims::Create(JobLayout(*spec), MPI_COMM_WORLD);
  if (!d.ok()) return d.status();
  rank->dims = std::move(*d);
  const ParallelDims& dims = *rank->dims;
  if (absl::Status s = ArmFlightDump(flags, dims); !s.ok()) return s;
  if (rank->reporter != nullptr) {
    // Heartbeats with the rank's progress: a long step is not a hang.
    std::shared_ptr<FlightRecorder> recorder = dims.shared_flight_recorder();
    rank->reporter->SetProgressProbe(
        [recorder] { return recorder->ProgressAgeMillis(); });
  }
  if (dims.world_rank() == 0) {
    for (const std::string& w : JobSpecWarnings(*spec)) {
      spdlog::warn("{}", w);
    }
  }
  SetThreads(spec->resources().threads_per_rank(), node);
  TrainerOptions options;
  if (auto s = FillTrainerOptions(flags, node, rank->reporter.get(), &options);
      !s.ok()) {
    return s;
  }
  auto t = Trainer::Create(*spec, options, rank->dims.get());
  if (!t.ok()) return t.status();
  if (auto s = HoldCheckpointDir(*spec, flags, options, dims, rank); !s.ok()) {
    return s;
  }
  rank->trainer = std::move(*t);
  if (!flags.metrics_bind.empty()) {
    auto m = RankMetrics::Start(
        flags.metrics_bind,
        {spec->name(), rank->host, dims.world_rank(), dims.NamedCoordinates()});
    if (!m.ok()) return m.status();
    rank->metrics = std::move(*m);
    rank->trainer->set_metrics(rank->metrics.get());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SetUpRank(const RankFlags& flags, const NodeShare& node,
                       Rank* rank) {
  rank->host = HostName("");
  absl::Status setup;
  try {
    setup = BuildRank(flags, node, rank);
  } catch (const std::bad_alloc&) {
    setup = absl::ResourceExhaustedError(
        "memory: out of memory while setting up (see the model.*, "
        "train.global_batch and parallel.* settings)");
  } catch (const std::exception& e) {
    setup = absl::InternalError(absl::StrCat("setup failed: ", e.what()));
  }
  if (rank->reporter != nullptr) rank->reporter->SetActivity("");
  return setup;
}

}  // namespace ptrain
