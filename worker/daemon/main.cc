// ptworkerd: the daemon of one node of a ptrain cluster (daemon.h says what
// it does). This file is its wiring: flags, the channel to ptcoord, the
// server ptrsh calls, signals. A refused join token or a refused
// registration (bad flags) ends it with exit code 2 (kExitBadInput).
#include <signal.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/auth_token.h"
#include "common/exit_codes.h"
#include "common/gpu_inventory.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/pem.h"
#include "common/thread_entry.h"
#include "common/tls_probe.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"
#include "worker/daemon/daemon.h"
#include "worker/daemon/node_secret.h"

namespace {

using ptrain::kExitBadInput;

struct Flags {
  std::string coordinator, name = ptrain::HostName("node"), token_file,
                           advertise, tls_ca, listen = "0.0.0.0:7071",
                           log_level = "info";
  int slots =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int orphan_timeout_s = 60;
  int gpus = -1;
  std::string state_dir = "/var/lib/ptworkerd";
};

// Parses the command line into `f`; an exit code when ptworkerd ends here
// (--help, a bad flag).
std::optional<int> ParseFlags(int argc, char** argv, Flags& f) {
  CLI::App app{"ptworkerd: the node daemon of a ptrain cluster"};
  app.add_option("--state-dir", f.state_dir,
                 "where the node secret that binds this node's name is kept "
                 "(default /var/lib/ptworkerd)");
  app.add_option("--coordinator", f.coordinator, "ptcoord's HOST:PORT")
      ->required();
  app.add_option("--name", f.name, "this node's name (default: the host name)");
  app.add_option("--slots", f.slots,
                 "ranks this node runs at once (default: "
                 "its cores)");
  app.add_option("--gpus", f.gpus,
                 "CUDA devices this node offers to jobs on resources.device="
                 "cuda, one per rank (default: those the NVIDIA driver shows)")
      ->check(CLI::Range(0, ptrain::kMaxGpus));
  app.add_option("--join-token-file", f.token_file,
                 "the cluster's join token (first token line of the file)")
      ->required();
  app.add_option("--listen", f.listen,
                 "HOST:PORT to serve ptrsh on (default 0.0.0.0:7071)");
  app.add_option("--advertise", f.advertise,
                 "HOST:PORT where ptrsh reaches this daemon (default: "
                 "NAME and the --listen port)");
  app.add_option("--orphan-timeout-s", f.orphan_timeout_s,
                 "kill every attempt process after this long without the "
                 "coordinator (default 60)")
      ->check(CLI::Range(1, 86400));
  app.add_option("--tls-ca", f.tls_ca,
                 "CA that signed ptcoord's certificate (default: plain text)");
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "ptworkerd: error: %s\n",
               std::string(s.message()).c_str());
  return kExitBadInput;
}

// The channel's credentials: TLS trusting `ca_pem` (--tls-ca), else plain
// text.
std::shared_ptr<grpc::ChannelCredentials> Credentials(
    const std::string& ca_pem) {
  if (ca_pem.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ca_pem;
  return grpc::SslCredentials(ssl);
}

// Why ptcoord at `f.coordinator` cannot be reached over TLS, or plain text
// to a TLS port: a handshake of the daemon's own (tls_probe.h).
std::function<std::string()> TlsExplainer(const Flags& f,
                                          const std::string& ca_pem) {
  ptrain::TlsProbeRequest probe;
  probe.address = f.coordinator;
  probe.ca_pem = ca_pem;
  ptrain::TlsClientNames names;
  names.client = "ptworkerd";
  names.plain_hint = "--tls-ca";
  names.ca_flag = "--tls-ca";
  names.ca = "--tls-ca " + f.tls_ca;
  return [probe, names] { return ptrain::ExplainTlsFailure(probe, names); };
}

void OnSignal(int) { ptrain::RequestStop(); }

int Run(int argc, char** argv) {
  Flags f;
  if (std::optional<int> rc = ParseFlags(argc, argv, f)) return *rc;
  ptrain::SetupLogging(f.log_level);
  absl::StatusOr<std::vector<std::string>> tokens =
      ptrain::LoadTokenFile(f.token_file, "--join-token-file");
  if (!tokens.ok()) return Fail(tokens.status());
  ptrain::v1::NodeSpec spec = ptrain::DescribeNode(f.name, f.slots, f.gpus);
  std::string ca_pem;
  if (!f.tls_ca.empty()) {
    absl::StatusOr<std::string> ca =
        ptrain::ReadCertificateFile("--tls-ca", f.tls_ca);
    if (!ca.ok()) return Fail(ca.status());
    ca_pem = std::move(*ca);
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);
  // Processes an Exec child leaves behind come back to this daemon when
  // their parent dies, so none escapes to init unnoticed.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Reconnect within a second or two of ptcoord coming back.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);

  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(f.listen, grpc::InsecureServerCredentials(), &port);
  // Before serving anything: a secret ptcoord issues must have a home.
  absl::StatusOr<ptrain::NodeSecretFile> secret_file =
      ptrain::NodeSecretFile::Open(f.state_dir, f.name);
  if (!secret_file.ok()) return Fail(secret_file.status());
  ptrain::Daemon daemon(
      grpc::CreateCustomChannel(f.coordinator, Credentials(ca_pem), args),
      tokens->front(), spec, std::chrono::seconds(f.orphan_timeout_s),
      *secret_file);
  daemon.SetExplainer(TlsExplainer(f, ca_pem));
  builder.RegisterService(&daemon);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "ptworkerd: error: --listen %s: cannot bind\n",
                 f.listen.c_str());
    return kExitBadInput;
  }
  // Where ptcoord's ptrsh dials this daemon: --advertise, else the --listen
  // host when it names one interface, else this node's address toward
  // ptcoord (the interface the kernel would use to reach it), else NAME;
  // with the bound port.
  spec.set_address(
      f.advertise.empty()
          ? ptrain::JoinHostPort(
                ptrain::AdvertiseHost(f.listen, "", f.coordinator, f.name),
                std::to_string(port))
          : f.advertise);
  if (absl::Status s = ptrain::CheckResolves(spec.address()); !s.ok()) {
    std::fprintf(
        stderr,
        "ptworkerd: error: %s %s: %s; ptcoord's ptrsh dials it to "
        "start ranks here: give --advertise HOST:PORT, an address "
        "of this node that ptcoord and the other nodes reach\n",
        f.advertise.empty() ? "the address to advertise" : "--advertise",
        spec.address().c_str(), std::string(s.message()).c_str());
    return kExitBadInput;
  }
  daemon.SetAddress(spec.address());
  spdlog::info("serving ptrsh on port {} (advertised as {})", port,
               spec.address());
  const int rc = daemon.Run();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  return ptrain::MainEntry([&] { return Run(argc, argv); });
}
