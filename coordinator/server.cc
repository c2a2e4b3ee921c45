// ptcoord's servers; see server.h.
#include "coordinator/server.h"

#include <cstdio>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/private_file.h"
#include "coordinator/launcher.h"

namespace ptrain {

namespace fs = std::filesystem;

absl::StatusOr<RpcServer> ServeRpc(const std::string& listen, Coordinator* c,
                                   const ServerTls& tls) {
  absl::StatusOr<RunningServer> server = StartServer(listen, c, tls);
  if (!server.ok()) return server.status();
  // With port 0 the port is known only now; ranks need it.
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  RpcServer out{std::move(*server), ""};
  out.address = absl::StrCat(host, ":", out.running.port);
  return out;
}

absl::StatusOr<std::unique_ptr<CoordinatorHttp>> ServeMetrics(
    const std::string& listen, Coordinator* c, const std::string& state_dir) {
  absl::StatusOr<std::unique_ptr<CoordinatorHttp>> http =
      CoordinatorHttp::Start(listen, c);
  if (!http.ok()) return http.status();
  const std::string host = listen.substr(0, listen.rfind(':'));
  const std::string at = absl::StrCat(host, ":", (*http)->port());
  ReplacePrivateFile((fs::path(state_dir) / "metrics_address").string(),
                     at + "\n")
      .IgnoreError();
  std::printf(
      "ptcoord: metrics and rank discovery on http://%s/metrics, "
      "/sd\n",
      at.c_str());
  return http;
}

absl::StatusOr<std::unique_ptr<CoordinatorUi>> ServeUi(
    const std::string& listen, bool insecure, Coordinator* c,
    const std::string& state_dir, const ServerTls& tls) {
  UiOptions o;
  o.listen = listen;
  o.insecure = insecure;
  if (!tls.cert_pem.empty()) {
    o.tls_pem = (fs::path(state_dir) / "ui-tls.pem").string();
    if (absl::Status s = ReplacePrivateFile(
            o.tls_pem, absl::StrCat(tls.cert_pem, "\n", tls.key_pem));
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<std::unique_ptr<CoordinatorUi>> ui =
      CoordinatorUi::Start(o, c);
  if (!ui.ok()) return ui.status();
  // Where it listens, as given: a wildcard is every address of this host,
  // which a user must know (not the 127.0.0.1 one would dial).
  const std::string host = listen.substr(0, listen.rfind(':'));
  const bool every = host == "0.0.0.0" || host == "[::]";
  const std::string url = absl::StrCat(o.tls_pem.empty() ? "http" : "https",
                                       "://", host, ":", (*ui)->port(), "/");
  ReplacePrivateFile((fs::path(state_dir) / "ui_address").string(), url + "\n")
      .IgnoreError();
  std::printf("ptcoord: web UI on %s (user token: %s%s)\n", url.c_str(),
              o.tls_pem.empty() ? "plain text" : "TLS",
              every ? "; every address of this host" : "");
  std::fflush(stdout);
  return ui;
}

void AnnounceAddress(const std::string& state_dir, const std::string& address,
                     const ServerTls& tls) {
  ReplacePrivateFile((fs::path(state_dir) / "address").string(), address + "\n")
      .IgnoreError();
  std::printf("ptcoord: listening on %s (%s)\n", address.c_str(),
              tls.cert_pem.empty()        ? "plain text"
              : tls.client_ca_pem.empty() ? "TLS"
                                          : "TLS, client certificates");
  std::fflush(stdout);
}

}  // namespace ptrain
