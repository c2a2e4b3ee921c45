// The gRPC edge of ptcoord: JobService, RankService and NodeService
// (callback API) over a
// Coordinator, and the one function that starts the server. Translation
// only: auth header in, absl::Status -> grpc::Status out.
#ifndef PTRAIN_COORDINATOR_SERVICE_H_
#define PTRAIN_COORDINATOR_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/service_type.h"

namespace ptrain {

grpc::Status ToGrpc(const absl::Status& s);

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<grpc::Service> jobs;
  std::unique_ptr<grpc::Service> ranks;
  std::unique_ptr<grpc::Service> nodes;
  int port = 0;  // the bound port (useful with ":0")
};

// Transport security of the server. Both PEMs empty: plain text.
struct ServerTls {
  std::string cert_pem;  // certificate chain, leaf first
  std::string key_pem;
  // Not empty: clients may present a certificate, verified against this CA;
  // JobService then answers only clients that did (ranks authenticate by
  // their attempt token and need none).
  std::string client_ca_pem;
};

// Binds `listen` (host:port; port 0 picks a free one), with TLS when `tls`
// has a certificate, and serves both services over `coordinator` (not
// owned; must outlive the server).
absl::StatusOr<RunningServer> StartServer(const std::string& listen,
                                          Coordinator* coordinator,
                                          const ServerTls& tls = {});

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_SERVICE_H_
