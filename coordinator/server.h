// ptcoord's servers over its Coordinator: gRPC (JobService, RankService,
// NodeService; service.h) on --listen and, with --metrics-listen, the HTTP
// side for Prometheus (http.h). Where each listens is printed and written
// into the state dir. Part of the ptcoord binary (main.cc wires it).
#ifndef PTRAIN_COORDINATOR_SERVER_H_
#define PTRAIN_COORDINATOR_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"
#include "coordinator/http.h"
#include "coordinator/service.h"
#include "coordinator/ui_server.h"

namespace ptrain {

struct RpcServer {
  RunningServer running;
  // HOST:PORT that ranks and ptctl dial: the port bound (the one the OS
  // chose for port 0) on --listen's host, a wildcard host as 127.0.0.1.
  std::string address;
};

// Serves the gRPC services of `c` (not owned; outlives the server) on
// `listen` with `tls`.
absl::StatusOr<RpcServer> ServeRpc(const std::string& listen, Coordinator* c,
                                   const ServerTls& tls);

// Serves /metrics and /sd of `c` on `listen`, writes the address it bound
// to STATE/metrics_address and prints it.
absl::StatusOr<std::unique_ptr<CoordinatorHttp>> ServeMetrics(
    const std::string& listen, Coordinator* c, const std::string& state_dir);

// The web UI on `listen` (--ui-listen), over TLS when `tls` has a
// certificate (its chain and key written to STATE_DIR/ui-tls.pem, 0600,
// for the UI's OpenSSL); plain text elsewhere than loopback only with
// `insecure`. Writes its URL (the host as --ui-listen gives it, a wildcard
// included, and the port bound) to STATE_DIR/ui_address and prints it.
absl::StatusOr<std::unique_ptr<CoordinatorUi>> ServeUi(
    const std::string& listen, bool insecure, Coordinator* c,
    const std::string& state_dir, const ServerTls& tls);

// Writes `address` to STATE/address and prints "ptcoord: listening on
// ADDRESS (plain text | TLS | TLS, client certificates)".
void AnnounceAddress(const std::string& state_dir, const std::string& address,
                     const ServerTls& tls);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_SERVER_H_
