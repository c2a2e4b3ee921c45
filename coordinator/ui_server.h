// ptcoord's web UI (`--ui-listen`, docs/control-plane.md "Web UI"): the
// pages of coordinator/ui/ (compiled in), Debian's Chart.js, and the JSON
// of ui_api.h, read-only, behind the user token (the Authorization header,
// or the cookie the login form sets). Served by cpp-httplib (Debian's
// libcpp-httplib-dev), over TLS when ptcoord has it.
#ifndef PTRAIN_COORDINATOR_UI_SERVER_H_
#define PTRAIN_COORDINATOR_UI_SERVER_H_

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"
#include "coordinator/ui_api.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace ptrain {

struct UiOptions {
  std::string listen;     // host:port (port 0: a free one)
  bool insecure = false;  // plain text on an address that is not loopback
  // A PEM file holding the certificate chain and then its key: serve
  // HTTPS. Empty: plain text.
  std::string tls_pem;
  // Chart.js as Debian installs it (libjs-chart.js).
  std::string chart_js = "/usr/share/javascript/chart.js/chart.min.js";
};

class CoordinatorUi {
 public:
  // Checks `options` (an address that is not loopback needs TLS or
  // `insecure`; Chart.js must be installed), then listens. `c` is not
  // owned and must outlive the server. InvalidArgument naming --ui-listen
  // (or the file) and the reason otherwise.
  static absl::StatusOr<std::unique_ptr<CoordinatorUi>> Start(
      const UiOptions& options, Coordinator* c);
  ~CoordinatorUi();
  CoordinatorUi(const CoordinatorUi&) = delete;
  CoordinatorUi& operator=(const CoordinatorUi&) = delete;

  int port() const { return port_; }

  // One request, without HTTP (tests; the server calls it).
  struct Request {
    std::string method = "GET";
    std::string path;   // decoded, without the query
    std::string query;  // as sent (still percent-encoded)
    std::string authorization, cookie;
    std::string body;  // a POST's (the login form), at most kMaxBody
  };
  struct Response {
    int status = 200;
    std::string content_type;
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;
  };
  static constexpr size_t kMaxBody = 4096;
  static constexpr size_t kMaxQuery = 1024;
  Response Handle(const Request& r) const;

 private:
  CoordinatorUi(Coordinator* c, bool tls, std::string chart_js);

  Response Route(const Request& r) const;
  Response Login(const Request& r) const;
  Response Page(const std::string& name) const;
  void Serve(const httplib::Request& req, httplib::Response& res) const;

  Coordinator* const c_;
  const bool tls_;
  const std::string chart_js_;     // the file's bytes
  mutable LatestSamples samples_;  // each job page's sample (thread-safe)
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;  // the server's accept loop
  int port_ = 0;
};

// Whether `host` (of host:port) names this machine only: localhost,
// 127.0.0.0/8 or ::1.
bool IsLoopbackHost(const std::string& host);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_UI_SERVER_H_
