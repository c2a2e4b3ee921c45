// One training rank of ptworker built from its flags, its job spec and its
// environment: the reporter to ptcoord, the mesh, the trainer and the
// metrics endpoint.
#ifndef PTRAIN_WORKER_SETUP_H_
#define PTRAIN_WORKER_SETUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/confined_fs.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/report/metrics.h"
#include "worker/engine/train/trainer.h"
#include "worker/progress_reporter.h"
#include "worker/threads.h"

namespace ptrain {

// ptworker's flags for a training run (no subcommand).
struct RankFlags {
  std::string config_path;             // --config
  std::vector<std::string> overrides;  // --set
  std::string log_json;                // --log-json
  std::string log_level = "info";      // --log-level
  std::string resume_from;             // --resume-from
  std::string fork_from;               // --fork-from
  double peak_gflops = 0.0;            // --peak-gflops; 0: measure
  std::string metrics_bind;            // --metrics-bind; "": off
  std::string advertise_host;          // --advertise-host
  bool dry_run = false;                // --dry-run
};

// What a training rank is made of. Destroyed in reverse order: the metrics
// endpoint and the trainer before the mesh they use.
struct Rank {
  std::string host;  // this machine's name, in metrics labels
  // A standalone run's rank 0 holds a lock on its checkpoint.dir while it
  // runs (HoldCheckpointFolder); invalid otherwise.
  UniqueFd checkpoint_dir_lock;
  // Under ptcoord every rank reports to the coordinator (rank 0 its
  // progress, each rank its metrics endpoint); standalone, null.
  std::unique_ptr<ProgressReporter> reporter;
  std::unique_ptr<ParallelDims> dims;
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<RankMetrics> metrics;  // null without --metrics-bind
};

// Builds `rank`: the spec from --config and --set, the mesh over
// MPI_COMM_WORLD, the threads, the trainer (data, model and checkpoint)
// and the metrics endpoint. A failed allocation or any exception is
// returned as an error like the others, so that every rank still reaches
// AgreeOnSetup.
absl::Status SetUpRank(const RankFlags& flags, const NodeShare& node,
                       Rank* rank);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_SETUP_H_
