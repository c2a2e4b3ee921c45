// A training rank's run; see train.h.
#include "worker/train.h"

#include <mpi.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "common/net.h"
#include "spdlog/spdlog.h"
#include "worker/engine/comm/comm.h"
#include "worker/exit_status.h"
#include "worker/signals.h"

namespace ptrain {
namespace {

// Logs the rank's metrics port and, under ptcoord, reports the address
// Prometheus reaches it at.
void AnnounceMetrics(const RankFlags& flags, const Rank& rank) {
  if (rank.metrics == nullptr) return;
  // Information, not a warning, yet said by every rank (where each serves
  // its metrics), though ranks but 0 log only warnings: their level is
  // lowered for this line unless a stricter one was asked for.
  const std::shared_ptr<spdlog::logger> log = spdlog::default_logger();
  const spdlog::level::level_enum level = log->level();
  if (level > spdlog::level::info && level <= spdlog::level::warn) {
    log->set_level(spdlog::level::info);
  }
  log->info("rank {} serves metrics on port {}", rank.dims->world_rank(),
            rank.metrics->port());
  log->set_level(level);
  if (rank.reporter != nullptr) {
    // Others must reach the address: see AdvertiseHost for the rule.
    const std::string at =
        AdvertiseHost(flags.metrics_bind, flags.advertise_host,
                      rank.reporter->coordinator_address(), rank.host);
    rank.reporter->ReportEndpoint(
        JoinHostPort(at, std::to_string(rank.metrics->port())));
  }
}

}  // namespace

int TrainRank(const RankFlags& flags, Rank* rank) {
  spdlog::info("layout: {}", rank->dims->ToString());
  AnnounceMetrics(flags, *rank);
  // Who this rank is (pid, host, groups), should it never answer later.
  if (!flags.log_json.empty()) DumpFlightRecorder("start");
  absl::Status done;
  SetTraining(true);
  try {
    done = rank->trainer->Run();
  } catch (const std::bad_alloc&) {
    done = absl::ResourceExhaustedError("memory: out of memory while training");
  } catch (const std::exception& e) {
    done = absl::InternalError(absl::StrCat("training failed: ", e.what()));
  }
  SetTraining(false);
  if (!done.ok()) {
    const int code = IsInputError(done) ? kExitBadInput : 1;
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    // Alone, or every rank ended here alike (an anomaly stop, a save that
    // failed): one error line from rank 0, and each rank finalizes and
    // exits with the code.
    if (world == 1 || AgreedBy(done) == world) {
      // The lowest rank whose error is its own says it (the others only
      // echo "another rank failed"); every rank is here, so they can ask.
      const int mine = IsAgreedEcho(done) ? world : WorldRank();
      int first = 0;
      MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      if (first == WorldRank() || (first == world && WorldRank() == 0)) {
        std::fprintf(stderr, "ptworker: error: %s\n",
                     std::string(done.message()).c_str());
      }
      return code;
    }
    // Other ranks may be inside a collective: take the whole job down.
    std::fprintf(stderr, "ptworker: error on rank %d: %s\n", WorldRank(),
                 std::string(done.message()).c_str());
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  return rank->trainer->stopped() ? kExitStopped : 0;
}

}  // namespace ptrain
