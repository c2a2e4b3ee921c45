// See dry_run.h.
#include "worker/dry_run.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/confined_fs.h"
#include "common/exit_codes.h"
#include "common/mesh.h"
#include "common/spec.h"
#include "worker/engine/data/data.h"
#include "worker/engine/parallel/memory_estimate.h"
#include "worker/exit_status.h"

namespace ptrain {

namespace {

int Refuse(const absl::Status& s) {
  std::fprintf(stderr, "ptworker: error: %s\n",
               std::string(s.message()).c_str());
  return IsInputError(s) ? kExitBadInput : 1;
}

}  // namespace

int DryRun(const RankFlags& flags) {
  // Under mpirun, rank 0 alone reads and says it: the others have nothing
  // to add.
  if (WorldRank() != 0) return 0;
  absl::StatusOr<ConfinedFs> fs = ConfinedFs::FromEnvironment();
  if (!fs.ok()) return Refuse(fs.status());
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpecFile(flags.config_path, flags.overrides, "--config",
                      fs->Reader("model.init_from", 1 << 20));
  if (!spec.ok()) return Refuse(spec.status());
  if (absl::Status s = CheckLayoutResolved(*spec); !s.ok()) return Refuse(s);
  absl::StatusOr<TokenData> data =
      LoadTokenData(spec->data(), spec->model().vocab_size(),
                    spec->model().block_size(), *fs);
  if (!data.ok()) return Refuse(data.status());
  const ParallelLayout p = JobLayout(*spec);
  const int64_t world = p.world_size();
  const MemoryEstimate e = EstimateRankMemory(*spec, data->vocab_size);
  std::printf("# the effective spec (--config, --set and the defaults)\n%s",
              JobSpecToYaml(*spec).c_str());
  std::printf(
      "# layout: %lld ranks (%s); parallel.zero=%d, %d microbatch(es) a "
      "step, schedule %s\n",
      static_cast<long long>(world), p.Factors().c_str(), p.zero,
      p.microbatches, p.schedule.c_str());
  std::printf(
      "# data: %lld training tokens, %lld validation tokens, "
      "vocabulary %d\n",
      static_cast<long long>(TokenCount(data->train)),
      static_cast<long long>(TokenCount(data->val)), data->vocab_size);
  std::printf("# memory of the rank that needs the most: %s\n",
              DescribeMemory(e).c_str());
  // Each rank's: the ranks of a pipeline stage need the same.
  const int pp = p.degree("pp");
  for (int stage = 0; pp > 1 && stage < pp; ++stage) {
    std::printf(
        "#   a rank of pipeline stage %d: %s\n", stage,
        DescribeMemory(EstimateStageMemory(*spec, data->vocab_size, stage))
            .c_str());
  }
  const absl::Status fits = CheckMemoryFits(
      *spec, data->vocab_size, static_cast<int>(world), AvailableMemoryBytes());
  std::printf("# on this machine alone (%lld ranks): %s\n",
              static_cast<long long>(world),
              fits.ok() ? "fits in its available memory"
                        : std::string(fits.message()).c_str());
  std::printf("# nothing was started or written\n");
  return 0;
}

}  // namespace ptrain
