// ptctl's connection to ptcoord: the options every command shares (server,
// token, output, TLS), the channel they make, the client that calls
// JobService with the token, and how a failed call is told to the user.
#ifndef PTRAIN_PTCTL_CONNECTION_H_
#define PTRAIN_PTCTL_CONNECTION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "ptrain/v1/coordinator.grpc.pb.h"

namespace ptrain::ptctl {

inline constexpr char kDefaultServer[] = "127.0.0.1:7070";

struct Options {
  std::string server = kDefaultServer;
  std::string token;
  std::string output = "table";
  // TLS: the CA that signed ptcoord's certificate (turns TLS on), and this
  // client's certificate and key when ptcoord asks for one.
  std::string tls_ca, tls_cert, tls_key;
  // Where each came from, for messages: the flag, or the environment
  // variable when the flag was not given.
  std::string server_from;  // "" when the default
  std::string token_from = "--token", tls_ca_from = "--tls-ca",
              tls_cert_from = "--tls-cert", tls_key_from = "--tls-key";
};

// The channel to ptcoord: TLS when a CA is given, else plain text. Every
// setting is checked first, so that a wrong one is an error naming it
// (exit 2) rather than a failed call. Reconnecting is capped at a couple
// of seconds, so `watch` picks a restarted coordinator up at once (gRPC's
// own backoff grows to 120 s).
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const Options& o);

// The JobService of one ptcoord, called with the token of `o`.
class Client {
 public:
  Client(const Options& o, std::shared_ptr<grpc::Channel> channel)
      : o_(o), stub_(v1::JobService::NewStub(std::move(channel))) {}

  // A context carrying the token; unary calls get a deadline.
  std::unique_ptr<grpc::ClientContext> Context(bool unary = true) const;
  v1::JobService::Stub& stub() { return *stub_; }
  const Options& options() const { return o_; }

 private:
  const Options o_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

// Prints a failed call and returns ptctl's exit code for it: 2 when ptcoord
// refused the request as bad input (INVALID_ARGUMENT: a path outside the
// data roots, more ranks than slots), as for bad input found here; else 1.
int RpcError(const Options& o, const grpc::Status& s);

}  // namespace ptrain::ptctl

#endif  // PTRAIN_PTCTL_CONNECTION_H_
