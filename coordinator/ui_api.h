// The JSON behind ptcoord's web UI (docs/control-plane.md, "Web UI"):
// what /api/v1/jobs, /api/v1/jobs/ID, /api/v1/jobs/ID/metrics,
// /api/v1/jobs/ID/log and /api/v1/nodes answer, built from the Coordinator
// and checked query parameters. No HTTP here (ui_server.cc serves them):
// each call gives the status and the JSON body.
#ifndef PTRAIN_COORDINATOR_UI_API_H_
#define PTRAIN_COORDINATOR_UI_API_H_

#include <cstdint>
#include <map>
#include <string>

#include "coordinator/coordinator.h"
#include "nlohmann/json.hpp"

namespace ptrain {

struct ApiReply {
  int status = 200;
  nlohmann::json body;
};

// The query parameters of a request, decoded (name -> value).
using ApiQuery = std::map<std::string, std::string>;

// Limits on what a request may ask.
inline constexpr int64_t kUiMaxLogBytes = int64_t{1} << 20;
inline constexpr int64_t kUiDefaultLogBytes = int64_t{64} << 10;
// A query parameter's value longer than this is refused (400).
inline constexpr size_t kUiMaxParamBytes = 64;

// GET /api/v1/jobs[?state=STATE&limit=N]
ApiReply JobsApi(Coordinator& c, const ApiQuery& q);
// GET /api/v1/jobs/ID
ApiReply JobApi(Coordinator& c, const std::string& id, const ApiQuery& q);
// GET /api/v1/jobs/ID/metrics[?since=C&rank_since=R]
ApiReply MetricsApi(Coordinator& c, const std::string& id, const ApiQuery& q);
// GET /api/v1/jobs/ID/log[?attempt=N&stream=stdout|stderr&bytes=B]
ApiReply LogApi(Coordinator& c, const std::string& id, const ApiQuery& q);
// GET /api/v1/nodes
ApiReply NodesApi(Coordinator& c, const ApiQuery& q);

// An event's kind for the UI's markers, from its message: submitted,
// attempt, restart, node_lost, shrink, grow, pause, rollback, checkpoint,
// hang, cancel or other.
std::string EventKind(const std::string& message);

// The newest `sample` record (docs/run-log.md) in the last `max_bytes` of
// the run log at `path`: {"step", "text"}, or null.
nlohmann::json LatestSample(const std::string& path, int64_t max_bytes);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_UI_API_H_
