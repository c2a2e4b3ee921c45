// ptcoord's web UI (`--ui-listen`, docs/control-plane.md "Web UI"): the
// pages of coordinator/ui/ (compiled in), Debian's Chart.js, and the JSON
// of ui_api.h, read-only, behind the user token (the Authorization header,
// or the cookie the login form sets). Served by bounded_http.h (cpp-httplib's
// parser behind a listener no client can exhaust), over TLS when ptcoord has
// it. Every request is checked before it is routed: its framing and body
// (at most kMaxBody, whatever the framing), its Host on a loopback listener
// (DNS rebinding), the Origin of a POST (cross-site forms), and a peer that
// guessed tokens too often is throttled (auth_throttle.h).
#ifndef PTRAIN_COORDINATOR_UI_SERVER_H_
#define PTRAIN_COORDINATOR_UI_SERVER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"
#include "coordinator/ui_api.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace ptrain {

class BoundedHttpServer;

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
    std::string host;                // the Host header; "" when not sent
    std::string origin, referer;     // the headers, "" when not sent
    std::string peer = "127.0.0.1";  // the client's address (PeerKey)
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
  static constexpr size_t kMaxPath = 2048;
  Response Handle(const Request& r) const;

  // One request over HTTP without a socket: `bytes` as a client at
  // `peer_ip` sent them, answered by the server's whole path (header scan,
  // framing checks, body limits, Handle()). The answer's bytes. Tests and
  // fuzz/ui_http_fuzzer.cc.
  std::string Exchange(std::string_view bytes,
                       const std::string& peer_ip = "127.0.0.1");

 private:
  CoordinatorUi(Coordinator* c, bool tls, bool loopback, std::string chart_js);

  Response Route(const Request& r) const;
  Response Login(const Request& r) const;
  Response Page(const std::string& name) const;
  // 429 when `r.peer` must wait before its token is checked.
  std::optional<Response> Throttled(const Request& r, bool api) const;
  // A refusal of what HTTP framing `req` announces (its body's size and
  // encoding, repeated headers, a path too long), before its body is read.
  std::optional<Response> CheckFraming(const httplib::Request& req) const;
  // Answers `req` (with `body`, read and bounded) through Handle().
  void Serve(const httplib::Request& req, std::string body,
             httplib::Response& res) const;
  // Registers on `server` the checks every request goes through and the
  // handlers that answer through Serve().
  void AddHandlers(BoundedHttpServer& server);

  Coordinator* const c_;
  const bool tls_;
  const bool loopback_;            // --ui-listen's host is loopback
  const std::string chart_js_;     // the file's bytes
  mutable LatestSamples samples_;  // each job page's sample (thread-safe)
  std::unique_ptr<BoundedHttpServer> server_;
  std::atomic<int> port_{0};  // set once listening; read by its threads
};

// The access table's name of the route that answers `path` (access.h:
// "GET /api/v1/jobs/ID"); "" for a path no route answers (404).
std::string UiRoute(const std::string& path);

// Whether `host` (of host:port) names this machine only: localhost,
// 127.0.0.0/8 or ::1.
bool IsLoopbackHost(const std::string& host);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_UI_SERVER_H_
