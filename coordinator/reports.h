// What ranks tell the coordinator, checked before it is believed: the
// RankService requests and the lines of an attempt's run log. Plain
// functions over protos and strings, no state and no RPC, so they are unit
// tested and fuzzed (fuzz/coordinator_request_fuzzer.cc) on their own. Not
// authentication: the caller has checked the attempt's token already.
#ifndef PTRAIN_COORDINATOR_REPORTS_H_
#define PTRAIN_COORDINATOR_REPORTS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ptrain/v1/coordinator.pb.h"

namespace ptrain {

// The running attempt a report must belong to.
struct ReportContext {
  std::string job_id;
  int attempt = 0;          // the job's current attempt number (from 1)
  int world_size = 1;       // rank must be in [0, world_size)
  int64_t total_steps = 0;  // train.steps: step must be in [0, total_steps]
  // The newest step the attempt reported progress for (-1: none yet): a
  // progress report may not go below it (an attempt's steps only grow).
  int64_t last_step = -1;
};

// Longest strings a report may carry.
inline constexpr size_t kMaxReportIdBytes = 128;
inline constexpr size_t kMaxReportPathBytes = 4096;
inline constexpr size_t kMaxEndpointLabels = 32;
inline constexpr size_t kMaxEndpointLabelBytes = 256;

// InvalidArgument naming the first field that breaks its rule: job_id is the
// context's, attempt is the running one, rank in range, step in
// [0, train.steps] and not below ctx.last_step, every number finite; loss,
// val_loss, tok_per_s, mfu and lr not negative.
absl::Status ValidateProgress(const v1::ReportProgressRequest& r,
                              const ReportContext& ctx);

// As above for job_id, attempt and step; dir is a non-empty absolute path
// whose last component is the step's folder name (StepFolderName). Where it
// leads is ResolveCheckpointDir's business.
absl::Status ValidateCheckpoint(const v1::ReportCheckpointRequest& r,
                                const ReportContext& ctx);

// As above for job_id, attempt and rank; activity is printable ASCII of at
// most kMaxActivityBytes; times, when present, pass ValidateRankTimes.
inline constexpr size_t kMaxActivityBytes = 128;
// ReportCheckpointRequest.reason: why a rank rolled back.
inline constexpr size_t kMaxReasonBytes = 256;
absl::Status ValidateAlive(const v1::ReportAliveRequest& r,
                           const ReportContext& ctx);

// A rank's step times (ReportAliveRequest.times, checked by ValidateAlive
// when present): step in [1, train.steps], steps >= 1, every figure finite
// and not negative, at most kMaxRankTimesGroups groups, each name passing
// IsRankTimesGroupName (common/spec.h).
absl::Status ValidateRankTimes(const v1::RankTimes& t,
                               const ReportContext& ctx);

// As above for job_id, attempt and rank; address passes ValidateHostPort;
// at most kMaxEndpointLabels labels of kMaxEndpointLabelBytes each.
absl::Status ValidateEndpoint(const v1::ReportEndpointRequest& r,
                              const ReportContext& ctx);

// "host:port" that others can dial: host is a DNS name, a dotted IPv4
// address or a bracketed IPv6 literal, not a wildcard (0.0.0.0, [::]);
// port is decimal in [1, 65535]. InvalidArgument naming `field` otherwise.
absl::Status ValidateHostPort(absl::string_view field, absl::string_view value);

// "step-NNNNNNNN": the committed folder of a step, as ptworker names it
// (at least 8 digits, zero-padded).
std::string StepFolderName(int64_t step);

// The real path of a reported checkpoint folder, when it is a committed
// checkpoint of this job: `dir` resolves (symlinks followed) to a directory
// directly under `checkpoint_root` (itself resolved) named
// StepFolderName(step), which CheckCommittedCheckpoint (common/
// checkpoint_commit.h) accepts for `step` and `job_uid`: its manifest is
// read and its digest checked, its shards only looked at (their sizes).
// InvalidArgument naming `field` otherwise; nothing is created or changed.
absl::StatusOr<std::string> ResolveCheckpointDir(
    absl::string_view field, const std::string& dir, int64_t step,
    const std::string& checkpoint_root, const std::string& job_uid);

// One record of a run log (docs/run-log.md) that the coordinator uses.
struct RunLogRecord {
  // kEnd: the run finished every step (ptworker's last record).
  enum Kind { kStep, kEval, kCheckpoint, kEnd } kind = kStep;
  int64_t step = 0;
  double loss = 0, lr = 0, tok_per_s = 0, mfu = 0;   // kStep
  double val_loss = 0;                               // kEval
  std::map<std::string, double> val_loss_by_source;  // kEval of a blend
  std::string dir;                                   // kCheckpoint
};

// Parses one line of a run log. nullopt for a line of another type or one
// that is malformed or breaks the rules of ValidateProgress (a rank wrote
// it; it is no more trusted than an RPC).
std::optional<RunLogRecord> ParseRunLogLine(absl::string_view line,
                                            const ReportContext& ctx);

// What an attempt's run log says, for when its reports did not arrive
// (coordinator down, attempt over).
struct RunLogSummary {
  std::optional<RunLogRecord> last_step;  // the latest kStep record
  std::optional<RunLogRecord> last_eval;  // the latest kEval record
  std::vector<RunLogRecord> records;      // the steps and evals read, in order
  std::vector<RunLogRecord> checkpoints;  // the checkpoint records read
  bool ended = false;  // an "end" record: the run finished every step
};

// A run log's line longer than this is skipped unparsed: the records read
// back (step, eval, checkpoint, end) are short, and a sample's text well
// under it.
inline constexpr size_t kMaxRunLogLineBytes = size_t{1} << 20;

// Reads `path` (a missing file, a link or anything but a regular file is an
// empty summary: the file is a rank's to write) back from its end, the
// newest records being the ones a summary is for (a job of days writes
// hundreds of MB): the records after the newest step record whose step is
// at or before `known_step` (what the store already has; an attempt's
// steps only grow and its reports arrive in the log's order), within its
// last `max_bytes` (whole lines, each at most kMaxRunLogLineBytes).
RunLogSummary ReadRunLog(const std::string& path, const ReportContext& ctx,
                         int64_t known_step = -1,
                         size_t max_bytes = size_t{256} << 20);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_REPORTS_H_
