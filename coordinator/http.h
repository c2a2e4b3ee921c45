// ptcoord's HTTP side for Prometheus: /metrics (ptrain_jobs{state},
// ptrain_job_restarts_total, ptrain_nodes{state}) and /sd, an HTTP service
// discovery (http_sd_configs) list of every live rank's /metrics endpoint
// with its job and rank labels. Read-only; no token (metrics only).
#ifndef PTRAIN_COORDINATOR_HTTP_H_
#define PTRAIN_COORDINATOR_HTTP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"

class CivetServer;

namespace ptrain {

class CoordinatorHttp {
 public:
  // Listens on `listen` (host:port; port 0 takes a free one). `c` is not
  // owned and must outlive the server.
  static absl::StatusOr<std::unique_ptr<CoordinatorHttp>> Start(
      const std::string& listen, Coordinator* c);
  ~CoordinatorHttp();
  CoordinatorHttp(const CoordinatorHttp&) = delete;
  CoordinatorHttp& operator=(const CoordinatorHttp&) = delete;

  int port() const { return port_; }

  // The bodies the two pages serve (testable without HTTP).
  static std::string MetricsText(const Coordinator& c);
  static std::string ServiceDiscoveryJson(const Coordinator& c);

 private:
  class Handler;
  CoordinatorHttp() = default;
  std::unique_ptr<CivetServer> server_;
  std::unique_ptr<Handler> metrics_, sd_;
  int port_ = 0;
};

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_HTTP_H_
