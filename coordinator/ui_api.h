// The JSON behind ptcoord's web UI (docs/control-plane.md, "Web UI"):
// what /api/v1/jobs, /api/v1/jobs/ID, /api/v1/jobs/ID/metrics,
// /api/v1/jobs/ID/log and /api/v1/nodes answer, built from the Coordinator
// and checked query parameters. No HTTP here (ui_server.cc serves them):
// each call gives the status and the JSON body.
#ifndef PTRAIN_COORDINATOR_UI_API_H_
#define PTRAIN_COORDINATOR_UI_API_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "coordinator/coordinator.h"
#include "nlohmann/json.hpp"

namespace ptrain {

struct ApiReply {
  int status = 200;
  nlohmann::json body;
};

// The reply to a refused request: `status` and {"error": message}.
ApiReply ApiError(int status, const std::string& message);

// The query parameters of a request, decoded (name -> value).
using ApiQuery = std::map<std::string, std::string>;

// Limits on what a request may ask.
inline constexpr int64_t kUiMaxLogBytes = int64_t{1} << 20;
inline constexpr int64_t kUiDefaultLogBytes = int64_t{64} << 10;
// A query parameter's value longer than this is refused (400).
inline constexpr size_t kUiMaxParamBytes = 64;

// GET /api/v1/jobs[?state=STATE&limit=N]
ApiReply JobsApi(Coordinator& c, const ApiQuery& q);
// The newest `sample` and `experts` records (docs/run-log.md) of each run
// log the UI shows, kept by path, so that a page polling a job reads only
// what its log gained since the last poll (run logs only grow; a log that
// shrank was replaced and is read again). At most `max_logs` logs are kept, the
// least recently asked for forgotten first. Thread-safe; the logs are read
// outside its mutex (a slow file holds only the page that asked for it),
// as regular files only, links not followed (ReadFileTail).
class LatestSamples {
 public:
  explicit LatestSamples(size_t max_logs = 256) : max_logs_(max_logs) {}
  // {"step", "text"} of the newest sample in the log at `path`, looked for
  // in at most its last `max_bytes` the first time; null when there is none
  // (or the file cannot be read).
  nlohmann::json Of(const std::string& path, int64_t max_bytes);
  // {"step", "layers": [{"layer", "tokens", "dropped", "imbalance"}]} of
  // the newest `experts` record Of found in the log at `path` (a
  // Mixture-of-Experts job's expert load); null when there is none.
  nlohmann::json ExpertsOf(const std::string& path) const;
  // Bytes read from run logs so far (tests: a poll reads only what was
  // appended).
  int64_t bytes_read() const;

 private:
  struct Seen {
    int64_t scanned = 0;  // up to the end of its last whole line
    nlohmann::json sample, experts;
    uint64_t asked = 0;  // when it was last asked for (a counter)
  };
  const size_t max_logs_;
  mutable std::mutex mu_;
  std::map<std::string, Seen> seen_;
  uint64_t clock_ = 0;
  int64_t bytes_read_ = 0;
};

// GET /api/v1/jobs/ID (its sample through `samples`)
ApiReply JobApi(Coordinator& c, LatestSamples& samples, const std::string& id,
                const ApiQuery& q);
// GET /api/v1/jobs/ID/metrics[?since=C&rank_since=R]
ApiReply MetricsApi(Coordinator& c, const std::string& id, const ApiQuery& q);
// GET /api/v1/jobs/ID/log[?attempt=N&stream=stdout|stderr&bytes=B]: the
// log's tail, or "omitted" saying why a log that is no regular file is not
// shown.
ApiReply LogApi(Coordinator& c, const std::string& id, const ApiQuery& q);
// GET /api/v1/nodes
ApiReply NodesApi(Coordinator& c, const ApiQuery& q);

// An event's kind for the UI's markers, from its message: submitted,
// attempt, restart, node_lost, shrink, grow, pause, rollback, checkpoint,
// hang, cancel or other.
std::string EventKind(const std::string& message);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_UI_API_H_
