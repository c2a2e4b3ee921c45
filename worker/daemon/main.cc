// ptworkerd: the daemon of one node. Registers the node with ptcoord
// (NodeService, with the cluster's join token), then heartbeats at the
// interval ptcoord asks for, reporting its load; registers again when
// ptcoord no longer knows its session (ptcoord restarted) and keeps trying
// while ptcoord is unreachable. Stops on SIGINT/SIGTERM. A refused join
// token or a refused registration (bad flags) ends it with exit code 2.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/pem.h"
#include "coordinator/auth.h"
#include "grpcpp/grpcpp.h"
#include "ptrain/v1/node.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace {

constexpr const char* kVersion = "0.1.0";

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "node";
  return buf;
}

// MemTotal of /proc/meminfo in bytes (0 when unreadable).
int64_t MemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

double Load1() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  in >> load;
  return in ? load : 0.0;
}

// Set by SIGINT/SIGTERM; the loops below look at it between waits.
volatile sig_atomic_t stop = 0;
void OnSignal(int) { stop = 1; }

// Sleeps up to `d`, waking early on a stop request.
void Sleep(std::chrono::milliseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (!stop && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

class Daemon {
 public:
  Daemon(std::shared_ptr<grpc::Channel> channel, std::string token,
         ptrain::v1::NodeSpec spec)
      : stub_(ptrain::v1::NodeService::NewStub(channel)),
        token_(std::move(token)),
        spec_(std::move(spec)) {}

  // Registers and heartbeats until a stop request (0) or a refusal (2).
  int Run() {
    while (!stop) {
      grpc::Status s = Register();
      if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
          s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
        std::fprintf(stderr, "ptworkerd: error: registration refused: %s\n",
                     s.error_message().c_str());
        return 2;
      }
      if (!s.ok()) {
        spdlog::warn("cannot register with the coordinator ({}); retrying",
                     s.error_message());
        Sleep(std::chrono::seconds(1));
        continue;
      }
      spdlog::info("registered as {} ({} slots), heartbeat every {} ms",
                   spec_.name(), spec_.slots(), interval_.count());
      HeartbeatUntilLost();
    }
    return 0;
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", "Bearer " + token_);
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    return ctx;
  }

  grpc::Status Register() {
    ptrain::v1::RegisterNodeRequest req;
    *req.mutable_node() = spec_;
    ptrain::v1::RegisterNodeResponse resp;
    grpc::Status s = stub_->Register(Context().get(), req, &resp);
    if (s.ok()) {
      session_ = resp.session();
      interval_ = std::chrono::milliseconds(
          std::max(100, resp.heartbeat_interval_ms()));
    }
    return s;
  }

  // Returns when ptcoord no longer knows the session (or on stop).
  void HeartbeatUntilLost() {
    while (!stop) {
      Sleep(interval_);
      if (stop) return;
      ptrain::v1::NodeHeartbeatRequest req;
      req.set_name(spec_.name());
      req.set_session(session_);
      req.set_load1(Load1());
      req.set_processes(0);  // this daemon runs no attempt processes yet
      ptrain::v1::NodeHeartbeatResponse resp;
      grpc::Status s = stub_->Heartbeat(Context().get(), req, &resp);
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
        spdlog::info(
            "the coordinator does not know this session: registering "
            "again");
        return;
      }
      if (!s.ok()) {
        spdlog::warn("heartbeat failed ({}); retrying", s.error_message());
      }
    }
  }

  std::unique_ptr<ptrain::v1::NodeService::Stub> stub_;
  const std::string token_;
  const ptrain::v1::NodeSpec spec_;
  std::string session_;
  std::chrono::milliseconds interval_{3000};
};

int Run(int argc, char** argv) {
  CLI::App app{"ptworkerd: the node daemon of a ptrain cluster"};
  std::string coordinator, name = HostName(), token_file, advertise, tls_ca,
                           log_level = "info";
  int slots =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("--coordinator", coordinator, "ptcoord's HOST:PORT")
      ->required();
  app.add_option("--name", name, "this node's name (default: the host name)");
  app.add_option("--slots", slots,
                 "ranks this node runs at once (default: "
                 "its cores)");
  app.add_option("--join-token-file", token_file,
                 "the cluster's join token (first token line of the file)")
      ->required();
  app.add_option("--advertise", advertise,
                 "HOST:PORT where this daemon serves (default: NAME:7071)");
  app.add_option("--tls-ca", tls_ca,
                 "CA that signed ptcoord's certificate (default: plain text)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  CLI11_PARSE(app, argc, argv);
  ptrain::SetupLogging(log_level);

  absl::StatusOr<std::vector<std::string>> tokens =
      ptrain::LoadTokenFile(token_file);
  if (!tokens.ok()) {
    std::fprintf(stderr, "ptworkerd: error: --join-token-file: %s\n",
                 std::string(tokens.status().message()).c_str());
    return 2;
  }
  ptrain::v1::NodeSpec spec;
  spec.set_name(name);
  spec.set_address(advertise.empty() ? absl::StrCat(name, ":7071") : advertise);
  spec.set_slots(slots);
  spec.set_cores(
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  spec.set_memory_bytes(MemoryBytes());
  spec.set_version(kVersion);

  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (!tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ptrain::ReadPemFile("--tls-ca", tls_ca);
    if (!ca.ok()) {
      std::fprintf(stderr, "ptworkerd: error: %s\n",
                   std::string(ca.status().message()).c_str());
      return 2;
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *ca;
    credentials = grpc::SslCredentials(ssl);
  }
  // Reconnect within a second or two of ptcoord coming back.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  Daemon daemon(grpc::CreateCustomChannel(coordinator, credentials, args),
                tokens->front(), spec);
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  return daemon.Run();
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
