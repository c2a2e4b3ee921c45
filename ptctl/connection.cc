// See connection.h.
#include "ptctl/connection.h"

#include <chrono>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "common/header_value.h"
#include "common/pem.h"
#include "common/tls_probe.h"

namespace ptrain::ptctl {

namespace {

// Everything given that goes into a header, checked before any call: gRPC
// aborts the process on a header value it refuses.
absl::Status CheckHeaderValues(const Options& o) {
  if (o.token.empty()) return absl::OkStatus();  // no authorization header
  return CheckHeaderValue(o.token_from, o.token);
}

const char* CodeName(grpc::StatusCode c) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const int i = static_cast<int>(c);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

// The PEM text of a flag's file, "" when it cannot be read (the channel
// was made from it, so it could a moment ago).
std::string PemOf(const std::string& path) {
  if (path.empty()) return "";
  absl::StatusOr<std::string> pem = ReadPemFile("", path);
  return pem.ok() ? *pem : "";
}

// Why a call failed at the TLS layer, from a handshake of ptctl's own with
// ptcoord's port; "" when that finds nothing wrong.
std::string ExplainTls(const Options& o) {
  TlsProbeRequest probe;
  probe.address = o.server;
  probe.ca_pem = PemOf(o.tls_ca);
  probe.cert_pem = PemOf(o.tls_cert);
  probe.key_pem = PemOf(o.tls_key);
  TlsClientNames names;
  names.client = "ptctl";
  names.plain_hint = "--tls-ca (or PTCTL_TLS_CA)";
  names.ca = absl::StrCat(o.tls_ca_from, " ", o.tls_ca);
  names.ca_flag = o.tls_ca_from;
  names.cert = absl::StrCat(o.tls_cert_from, " ", o.tls_cert);
  return ExplainTlsFailure(probe, names);
}

// A failed call's message, with what to do about the failures a new user
// meets first: no ptcoord there, TLS on one side only, no or a wrong token.
std::string Explained(const Options& o, const grpc::Status& s) {
  const std::string& m = s.error_message();
  const std::string where =
      o.server_from.empty()
          ? "the default; --server or PTCTL_SERVER names another"
          : o.server_from;
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      if (absl::StrContains(m, "Connection refused")) {
        return absl::StrCat("no ptcoord at ", o.server,
                            " (connection refused) — is it running? (", where,
                            ")");
      }
      if (absl::StrContains(m, "DNS resolution failed")) {
        return absl::StrCat("cannot resolve the host of ", o.server, " (",
                            where, "): ", m);
      }
      if (absl::StrContains(m, "http1.x server")) {
        return absl::StrCat(
            o.server, " answers HTTP/1, not ptcoord's gRPC (", where,
            "): is it ptcoord's web UI (--ui-listen) or its metrics "
            "(--metrics-listen)? Give the address of ptcoord's --listen, "
            "which ptcoord writes to STATE_DIR/address");
      }
      if (!o.tls_ca.empty() && absl::StrContains(m, "wrong version number")) {
        return absl::StrCat("ptcoord at ", o.server,
                            " talks plain text, not TLS: drop ", o.tls_ca_from);
      }
      if (!absl::StrContains(m, "Timeout")) {
        if (std::string tls = ExplainTls(o); !tls.empty()) return tls;
      }
      return m;
    case grpc::StatusCode::UNAUTHENTICATED:
      if (absl::StrContains(m, "client certificate")) return m;
      if (o.token.empty()) {
        return absl::StrCat(
            m,
            ": ptctl sent no token; give one with --token or PTCTL_TOKEN: a "
            "line of ptcoord's --token-file, or, for a ptcoord started "
            "without one, its STATE_DIR/user-token");
      }
      return absl::StrCat(m, ": the token of ", o.token_from,
                          " is not one of ptcoord's (a line of its "
                          "--token-file, or its STATE_DIR/user-token)");
    default:
      return m;
  }
}

}  // namespace

std::unique_ptr<grpc::ClientContext> Client::Context(bool unary) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!o_.token.empty())
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", o_.token));
  if (unary)
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(30));
  return ctx;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const Options& o) {
  if (absl::Status s = CheckHeaderValues(o); !s.ok()) return s;
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (o.tls_ca.empty() && (!o.tls_cert.empty() || !o.tls_key.empty())) {
    return absl::InvalidArgumentError(
        "--tls-cert/--tls-key need --tls-ca (or PTCTL_TLS_CA)");
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!o.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca =
        ReadCertificateFile(o.tls_ca_from, o.tls_ca);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!o.tls_cert.empty()) {
      absl::StatusOr<std::string> cert =
          ReadCertificateFile(o.tls_cert_from, o.tls_cert);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadPemFile(o.tls_key_from, o.tls_key);
      if (!key.ok()) return key.status();
      // gRPC would only fail the handshake, as "empty address list".
      if (absl::Status s = CheckKeyPair(o.tls_cert_from, o.tls_cert, *cert,
                                        o.tls_key_from, o.tls_key, *key);
          !s.ok()) {
        return s;
      }
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // A cluster's whole job list outgrows gRPC's default 4 MiB after a few
  // thousand jobs (a failed job carries its last stderr lines).
  args.SetMaxReceiveMessageSize(256 << 20);
  return grpc::CreateCustomChannel(o.server, credentials, args);
}

int RpcError(const Options& o, const grpc::Status& s) {
  std::fprintf(stderr, "ptctl: error: %s: %s\n", CodeName(s.error_code()),
               Explained(o, s).c_str());
  return s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? kExitBadInput
                                                              : kExitFailed;
}

}  // namespace ptrain::ptctl
