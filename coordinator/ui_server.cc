// See ui_server.h.
#include "coordinator/ui_server.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <optional>
#include <string_view>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/bounded_file.h"
#include "common/incbin.h"
#include "coordinator/access.h"
#include "coordinator/auth_throttle.h"
#include "coordinator/bounded_http.h"
#include "coordinator/ui_api.h"
#include "httplib.h"

// The pages of coordinator/ui (PTRAIN_UI_DIR comes from
// coordinator/CMakeLists.txt, which makes this file rebuild when they
// change).
PT_INCBIN(ptrain_ui_index_html, PTRAIN_UI_DIR "/index.html");
PT_INCBIN(ptrain_ui_job_html, PTRAIN_UI_DIR "/job.html");
PT_INCBIN(ptrain_ui_nodes_html, PTRAIN_UI_DIR "/nodes.html");
PT_INCBIN(ptrain_ui_login_html, PTRAIN_UI_DIR "/login.html");
PT_INCBIN(ptrain_ui_js, PTRAIN_UI_DIR "/ui.js");
PT_INCBIN(ptrain_ui_css, PTRAIN_UI_DIR "/ui.css");
PT_INCBIN_DECLARE(ptrain_ui_index_html);
PT_INCBIN_DECLARE(ptrain_ui_job_html);
PT_INCBIN_DECLARE(ptrain_ui_nodes_html);
PT_INCBIN_DECLARE(ptrain_ui_login_html);
PT_INCBIN_DECLARE(ptrain_ui_js);
PT_INCBIN_DECLARE(ptrain_ui_css);

namespace ptrain {

namespace {

constexpr char kCookie[] = "ptrain_token";
constexpr size_t kMaxTokenBytes = 1024;
// Chart.js 3.9 is about 200 KB; a file far larger is not it.
constexpr size_t kMaxChartJsBytes = size_t{8} << 20;
constexpr char kHtml[] = "text/html; charset=utf-8";
constexpr char kJson[] = "application/json";

using Response = CoordinatorUi::Response;

Response Text(int status, std::string_view type, std::string_view body) {
  return Response{status, std::string(type), std::string(body), {}};
}

Response Json(int status, const nlohmann::json& body) {
  // Names, messages and samples come from users and ranks: bytes that are
  // not UTF-8 become U+FFFD rather than an exception.
  return Response{
      status,
      kJson,
      body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
      {}};
}

Response Reply(const ApiReply& reply) { return Json(reply.status, reply.body); }

// The percent-decoding of `s` (a '+' is a space, as forms send it);
// nullopt when a '%' is not followed by two hex digits.
std::optional<std::string> Decode(absl::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && (i + 2 >= s.size() || !absl::ascii_isxdigit(s[i + 1]) ||
                        !absl::ascii_isxdigit(s[i + 2]))) {
      return std::nullopt;
    }
  }
  return httplib::detail::decode_url(std::string(s), true);
}

// A query string's parameters; a 400 naming the first malformed one.
std::variant<ApiQuery, Response> ParseQuery(const std::string& query) {
  ApiQuery q;
  if (query.size() > CoordinatorUi::kMaxQuery) {
    return Reply(
        ApiError(400, absl::StrCat("the query string is longer than ",
                                   CoordinatorUi::kMaxQuery, " bytes")));
  }
  for (absl::string_view part : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = part.find('=');
    std::optional<std::string> name = Decode(part.substr(0, eq));
    std::optional<std::string> value =
        Decode(eq == absl::string_view::npos ? "" : part.substr(eq + 1));
    if (!name.has_value() || !value.has_value()) {
      return Reply(ApiError(
          400, absl::StrCat("query parameter '",
                            std::string(part.substr(
                                0, std::min<size_t>(eq, kUiMaxParamBytes))),
                            "' is not percent-encoded")));
    }
    if (value->size() > kUiMaxParamBytes) {
      return Reply(ApiError(
          400, absl::StrCat("query parameter '", *name, "' is longer than ",
                            kUiMaxParamBytes, " bytes")));
    }
    q[*name] = *value;
  }
  return q;
}

// A job id as ptcoord makes them: letters, digits, '-', '_', '.'.
bool IsJobId(absl::string_view id) {
  return !id.empty() && id.size() <= 128 &&
         std::all_of(id.begin(), id.end(), [](char c) {
           return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                  c == '-' || c == '_' || c == '.';
         });
}

std::string HtmlEscape(absl::string_view s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"},
                                 {"<", "&lt;"},
                                 {">", "&gt;"},
                                 {"\"", "&quot;"},
                                 {"'", "&#39;"}});
}

std::string LoginPage(absl::string_view message) {
  const std::string_view page = PT_INCBIN_VIEW(ptrain_ui_login_html);
  return absl::StrReplaceAll(absl::string_view(page.data(), page.size()),
                             {{"{{message}}", HtmlEscape(message)}});
}

// The bearer token of `r`: its Authorization header, else the cookie.
std::optional<std::string> Authorization(const CoordinatorUi::Request& r) {
  if (!r.authorization.empty()) return r.authorization;
  if (r.cookie.empty()) return std::nullopt;
  // name=value pairs separated by "; " (RFC 6265).
  std::string value;
  bool found = false;
  for (absl::string_view pair : absl::StrSplit(r.cookie, ';')) {
    pair = absl::StripAsciiWhitespace(pair);
    if (absl::ConsumePrefix(&pair, absl::StrCat(kCookie, "="))) {
      value = std::string(pair);
      found = true;
    }
  }
  if (!found || value.size() > kMaxTokenBytes * 3) return std::nullopt;
  std::optional<std::string> token = Decode(value);
  if (!token.has_value()) return std::nullopt;
  return absl::StrCat("Bearer ", *token);
}

// Read-only pages of our own: no caching of data, no framing, no other
// origin's scripts, no guessing of types, no address sent to another site.
// (Not "no-referrer": under it a browser sends "Origin: null" with the
// UI's own forms, which the check of a POST's origin refuses.)
Response WithCommonHeaders(Response out) {
  out.headers.insert(
      out.headers.end(),
      {{"Cache-Control", "no-store"},
       {"X-Content-Type-Options", "nosniff"},
       {"X-Frame-Options", "DENY"},
       {"Referrer-Policy", "same-origin"},
       {"Content-Security-Policy",
        "default-src 'self'; script-src 'self'; style-src 'self' "
        "'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; "
        "form-action 'self'"}});
  return out;
}

void ToHttplib(Response out, httplib::Response& res) {
  res.status = out.status;
  for (const auto& [name, value] : out.headers) res.set_header(name, value);
  res.set_content(std::move(out.body), out.content_type);
}

// Whether `req` announces a body: chunked, or a Content-Length above 0.
bool AnnouncesBody(const httplib::Request& req) {
  uint64_t length = 0;
  return req.has_header("Transfer-Encoding") ||
         (absl::SimpleAtoi(req.get_header_value("Content-Length"), &length) &&
          length > 0);
}

// Whether a Host header names this UI on a loopback listener: a loopback
// name or address, with the port listened on (absent: the scheme's
// default). Else a page of another site that a DNS name rebound to
// 127.0.0.1 could read. An absent Host is no browser's.
bool IsOwnLoopbackHost(const std::string& header, int port, bool tls) {
  if (header.empty()) return true;
  std::string name = absl::AsciiStrToLower(header);
  std::string port_text;
  if (name.front() == '[') {
    const size_t close = name.find(']');
    if (close == std::string::npos) return false;
    port_text = name.substr(close + 1);
    name = name.substr(0, close + 1);
    if (!port_text.empty()) {
      if (port_text.front() != ':') return false;
      port_text.erase(0, 1);
    }
  } else if (const size_t colon = name.find(':'); colon != std::string::npos) {
    port_text = name.substr(colon + 1);
    name = name.substr(0, colon);
  }
  int given = tls ? 443 : 80;
  if (!port_text.empty() &&
      (!absl::SimpleAtoi(port_text, &given) || port_text.front() == '+')) {
    return false;
  }
  return given == port && IsLoopbackHost(name);
}

// Whether a POST came from a page of this UI: its Origin (else its Referer)
// is the UI's own (the scheme, and the host and port the browser was sent
// to). A request with neither is no browser form of another site.
bool IsSameOrigin(const CoordinatorUi::Request& r, bool tls) {
  if (r.origin.empty() && r.referer.empty()) return true;
  if (r.host.empty()) return false;
  const std::string own = absl::StrCat(tls ? "https://" : "http://", r.host);
  if (!r.origin.empty()) return absl::EqualsIgnoreCase(r.origin, own);
  return absl::EqualsIgnoreCase(r.referer, own) ||
         absl::StartsWithIgnoreCase(r.referer, own + "/");
}

// The host and port of --ui-listen.
struct ListenAddress {
  std::string host;
  int port = 0;
};

// --ui-listen split into its host and port; InvalidArgument naming `field`
// when it is not HOST:PORT, or names an address that is not loopback
// without TLS or --ui-insecure.
absl::StatusOr<ListenAddress> ParseListen(const UiOptions& o,
                                          const std::string& field) {
  const size_t colon = o.listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be HOST:PORT"));
  }
  ListenAddress out;
  out.host = o.listen.substr(0, colon);
  if (o.tls_pem.empty() && !o.insecure && !IsLoopbackHost(out.host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", out.host,
        " is not a loopback address and ptcoord has no TLS (--tls-cert, "
        "--tls-key): the user token would cross the network in plain text; "
        "give TLS, listen on 127.0.0.1, or say --ui-insecure"));
  }
  if (!absl::SimpleAtoi(o.listen.substr(colon + 1), &out.port) ||
      out.port < 0 || out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the port must be a number in [0, 65535]"));
  }
  return out;
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    h = h.substr(1, h.size() - 2);
  }
  if (h == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  return inet_pton(AF_INET6, h.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

std::optional<CoordinatorUi::Response> CoordinatorUi::CheckFraming(
    const httplib::Request& req) const {
  const auto refuse = [](int status, const std::string& why) {
    return Text(status, "text/plain; charset=utf-8", why + "\n");
  };
  if (req.path.size() > kMaxPath) {
    return refuse(414,
                  absl::StrCat("the path is longer than ", kMaxPath, " bytes"));
  }
  for (const char* name : {"Host", "Content-Length", "Transfer-Encoding"}) {
    if (req.get_header_value_count(name) > 1) {
      return refuse(400, absl::StrCat("the request has ", name, " twice"));
    }
  }
  const bool chunked = req.has_header("Transfer-Encoding");
  uint64_t length = 0;
  if (req.has_header("Content-Length")) {
    const std::string value = req.get_header_value("Content-Length");
    if (chunked) {
      return refuse(400,
                    "the request has both Content-Length and "
                    "Transfer-Encoding");
    }
    if (value.empty() || value.size() > 18 ||
        !std::all_of(value.begin(), value.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(value, &length)) {
      return refuse(400, "Content-Length is not a number of bytes");
    }
  }
  if (chunked &&
      !absl::EqualsIgnoreCase(
          absl::StripAsciiWhitespace(req.get_header_value("Transfer-Encoding")),
          "chunked")) {
    return refuse(501, "of transfer encodings only chunked is understood");
  }
  // cpp-httplib would inflate a compressed body; no browser sends one.
  if (const std::string e = req.get_header_value("Content-Encoding");
      !e.empty() && !absl::EqualsIgnoreCase(e, "identity")) {
    return refuse(415, "a request body is taken uncompressed only");
  }
  if (absl::StartsWithIgnoreCase(req.get_header_value("Content-Type"),
                                 "multipart/")) {
    return refuse(415, "a request body is taken form-encoded only");
  }
  if (AnnouncesBody(req) && req.method != "POST") {
    return refuse(413, absl::StrCat("a ", req.method.substr(0, 16),
                                    " request carries no body here"));
  }
  if (length > kMaxBody) {
    return refuse(413,
                  absl::StrCat("the body is larger than ", kMaxBody, " bytes"));
  }
  return std::nullopt;
}

void CoordinatorUi::Serve(const httplib::Request& req, std::string body,
                          httplib::Response& res) const {
  Request r;
  r.method = req.method;
  r.path = req.path;
  const size_t q = req.target.find('?');
  if (q != std::string::npos) r.query = req.target.substr(q + 1);
  r.authorization = req.get_header_value("Authorization");
  r.cookie = req.get_header_value("Cookie");
  r.host = req.get_header_value("Host");
  r.origin = req.get_header_value("Origin");
  r.referer = req.get_header_value("Referer");
  r.peer = PeerKey(req.remote_addr);
  r.body = std::move(body);
  ToHttplib(Handle(r), res);
}

void CoordinatorUi::AddHandlers(BoundedHttpServer& server) {
  // Every request is checked and, unless it has a body to read, answered
  // here; cpp-httplib's own routing only reads a POST's body.
  CoordinatorUi* self = this;
  server.set_pre_routing_handler(
      [self](const httplib::Request& req, httplib::Response& res) {
        if (std::optional<Response> refused = self->CheckFraming(req)) {
          ToHttplib(WithCommonHeaders(std::move(*refused)), res);
          return httplib::Server::HandlerResponse::Handled;
        }
        if (req.method == "POST" && AnnouncesBody(req)) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        self->Serve(req, "", res);
        return httplib::Server::HandlerResponse::Handled;
      });
  // A client that waits for "100 Continue" hears the refusal instead.
  server.set_expect_100_continue_handler(
      [self](const httplib::Request& req, httplib::Response& res) {
        std::optional<Response> refused = self->CheckFraming(req);
        if (!refused.has_value()) return 100;
        const int status = refused->status;
        ToHttplib(WithCommonHeaders(std::move(*refused)), res);
        return status;
      });
  server.Post(".*", [self](const httplib::Request& req, httplib::Response& res,
                           const httplib::ContentReader& read) {
    std::string body;
    bool over = false;
    const bool ok = read([&](const char* data, size_t n) {
      over = body.size() + n > kMaxBody;
      if (!over) body.append(data, n);
      return !over;
    });
    const BoundedHttpServer::ReadEnd end =
        BoundedHttpServer::ReadEndOfThisThread();
    std::optional<Response> refused;
    if (over || end == BoundedHttpServer::ReadEnd::kTooLarge) {
      refused =
          Text(413, "text/plain; charset=utf-8",
               absl::StrCat("the body is larger than ", kMaxBody, " bytes\n"));
    } else if (end == BoundedHttpServer::ReadEnd::kTimedOut) {
      refused = Text(408, "text/plain; charset=utf-8",
                     "the body did not arrive in time\n");
    } else if (!ok) {
      refused = Text(400, "text/plain; charset=utf-8",
                     "the body ended early or its chunked framing is "
                     "malformed\n");
    }
    if (refused.has_value()) {
      ToHttplib(WithCommonHeaders(std::move(*refused)), res);
      return;
    }
    self->Serve(req, std::move(body), res);
  });
}

absl::StatusOr<std::unique_ptr<CoordinatorUi>> CoordinatorUi::Start(
    const UiOptions& o, Coordinator* c) {
  const std::string field = absl::StrCat("--ui-listen ", o.listen);
  absl::StatusOr<ListenAddress> address = ParseListen(o, field);
  if (!address.ok()) return address.status();
  const std::string& host = address->host;
  absl::StatusOr<std::string> chart =
      ReadBoundedFile("--ui-listen: Chart.js", o.chart_js, kMaxChartJsBytes);
  if (!chart.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(chart.status().message(),
                     " (Debian's libjs-chart.js installs it: apt-get install "
                     "libjs-chart.js)"));
  }
  std::unique_ptr<CoordinatorUi> ui(new CoordinatorUi(
      c, !o.tls_pem.empty(), IsLoopbackHost(host), std::move(*chart)));
  BoundedHttpServer::Limits limits;
  limits.max_prefetched_body_bytes = kMaxBody;
  ui->server_ = std::make_unique<BoundedHttpServer>(limits);
  BoundedHttpServer& server = *ui->server_;
  if (!o.tls_pem.empty() && !server.UseTls(o.tls_pem).ok()) {
    // The chain and key ptcoord serves gRPC with.
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ": TLS: the certificate and key (--tls-cert, --tls-key) "
                     "do not load"));
  }
  ui->AddHandlers(server);
  std::string bind = host;
  if (bind.size() >= 2 && bind.front() == '[' && bind.back() == ']') {
    bind = bind.substr(1, bind.size() - 2);
  }
  absl::StatusOr<int> bound = server.Listen(bind, address->port);
  if (!bound.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": cannot listen there (", bound.status().message(),
        "): the port is in use, or the address is not this machine's"));
  }
  ui->port_ = *bound;
  return ui;
}

CoordinatorUi::CoordinatorUi(Coordinator* c, bool tls, bool loopback,
                             std::string chart_js)
    : c_(c), tls_(tls), loopback_(loopback), chart_js_(std::move(chart_js)) {}

CoordinatorUi::~CoordinatorUi() {
  if (server_ != nullptr) server_->Stop();
}

std::string CoordinatorUi::Exchange(std::string_view bytes,
                                    const std::string& peer_ip) {
  return server_->Exchange(bytes, peer_ip);
}

CoordinatorUi::Response CoordinatorUi::Handle(const Request& r) const {
  return WithCommonHeaders(Route(r));
}

CoordinatorUi::Response CoordinatorUi::Page(const std::string& name) const {
  if (name == "index") {
    return Text(200, kHtml, PT_INCBIN_VIEW(ptrain_ui_index_html));
  }
  if (name == "job")
    return Text(200, kHtml, PT_INCBIN_VIEW(ptrain_ui_job_html));
  return Text(200, kHtml, PT_INCBIN_VIEW(ptrain_ui_nodes_html));
}

std::optional<CoordinatorUi::Response> CoordinatorUi::Throttled(
    const Request& r, bool api) const {
  const absl::Duration wait =
      c_->auth_throttle().Wait(r.peer, CredentialKind::kUser, absl::Now());
  if (wait <= absl::ZeroDuration()) return std::nullopt;
  const int64_t seconds = std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(wait))));
  Response out =
      api ? Reply(ApiError(429,
                           std::string(AuthThrottle::Throttled(
                                           r.peer, CredentialKind::kUser, wait)
                                           .message())))
          : Text(429, kHtml,
                 LoginPage(absl::StrCat(
                     "Too many wrong tokens came from this address: none is "
                     "checked for ",
                     seconds, " s.")));
  out.headers.push_back({"Retry-After", absl::StrCat(seconds)});
  return out;
}

CoordinatorUi::Response CoordinatorUi::Login(const Request& r) const {
  if (r.method == "GET" || r.method == "HEAD") {
    return Text(200, kHtml, LoginPage(""));
  }
  // The form's body: token=VALUE, percent-encoded. A pasted token may
  // carry blanks or a line end around it: they are not part of it (as in
  // an Authorization header), and the cookie carries the token alone.
  std::optional<std::string> token;
  for (absl::string_view pair : absl::StrSplit(r.body, '&')) {
    if (!absl::ConsumePrefix(&pair, "token=")) continue;
    token = Decode(pair);
    if (token.has_value()) absl::StripAsciiWhitespace(&*token);
  }
  const Response refused =
      Text(401, kHtml, LoginPage("That is not a user token of this ptcoord."));
  if (r.body.size() > kMaxBody || !token.has_value() || token->empty()) {
    return refused;
  }
  if (std::optional<Response> wait = Throttled(r, /*api=*/false)) return *wait;
  if (token->size() > kMaxTokenBytes ||
      !c_->AuthenticateUser(absl::StrCat("Bearer ", *token)).ok()) {
    c_->auth_throttle().Failed(r.peer, CredentialKind::kUser, absl::Now());
    return refused;
  }
  const std::string encoded = httplib::detail::encode_query_param(*token);
  Response out = Text(303, kHtml, "");
  out.headers.push_back({"Location", "/"});
  out.headers.push_back(
      {"Set-Cookie", absl::StrCat(kCookie, "=", encoded,
                                  "; Path=/; HttpOnly; SameSite=Strict",
                                  tls_ ? "; Secure" : "")});
  return out;
}

// The access table's name of the route `path` answers (access.h: "GET
// /api/v1/jobs/ID"); "" for a path no route answers.
std::string UiRoute(const std::string& path) {
  if (path == "/" || path == "/nodes") return absl::StrCat("GET ", path);
  if (absl::StartsWith(path, "/jobs/") && IsJobId(path.substr(6))) {
    return "GET /jobs/ID";
  }
  if (path == "/static/ui.js" || path == "/static/ui.css" ||
      path == "/static/chart.js") {
    return "GET /static/*";
  }
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(path).substr(1), '/');
  if (parts.size() < 3 || parts[0] != "api" || parts[1] != "v1") return "";
  if (parts.size() == 3 && (parts[2] == "jobs" || parts[2] == "nodes")) {
    return absl::StrCat("GET /api/v1/", parts[2]);
  }
  if (parts[2] != "jobs" || parts.size() > 5 || !IsJobId(parts[3])) return "";
  if (parts.size() == 4) return "GET /api/v1/jobs/ID";
  if (parts[4] == "metrics" || parts[4] == "log") {
    return absl::StrCat("GET /api/v1/jobs/ID/", parts[4]);
  }
  return "";
}

CoordinatorUi::Response CoordinatorUi::Route(const Request& r) const {
  const std::string& p = r.path;
  if (loopback_ && !IsOwnLoopbackHost(r.host, port_.load(), tls_)) {
    return Text(421, "text/plain; charset=utf-8",
                absl::StrCat("this UI answers to a loopback name or address "
                             "with port ",
                             port_.load(), " only, not to Host '",
                             r.host.substr(0, 256), "'\n"));
  }
  if (r.method != "GET" && r.method != "HEAD" && r.method != "POST") {
    Response out = Text(405, "text/plain", "GET, HEAD or POST only\n");
    out.headers.push_back({"Allow", "GET, HEAD, POST"});
    return out;
  }
  // A form another site posts here (a login with its token, a logout) is
  // refused: browsers say where a POST comes from.
  if (r.method == "POST" && !IsSameOrigin(r, tls_)) {
    return Text(403, "text/plain; charset=utf-8",
                "a form of another site may not post here\n");
  }
  if (p == "/login") return Login(r);
  if (p == "/logout") {
    if (r.method != "POST") {
      Response out = Text(405, "text/plain", "log out with POST\n");
      out.headers.push_back({"Allow", "POST"});
      return out;
    }
    Response out = Text(303, kHtml, "");
    out.headers.push_back({"Location", "/login"});
    out.headers.push_back(
        {"Set-Cookie", absl::StrCat(kCookie,
                                    "=; Path=/; Max-Age=0; HttpOnly; "
                                    "SameSite=Strict",
                                    tls_ ? "; Secure" : "")});
    return out;
  }
  const bool api = absl::StartsWith(p, "/api/");
  const std::optional<std::string> authorization = Authorization(r);
  const auto unauthenticated = [&] {
    if (api) return Reply(ApiError(401, "a user token is needed (Bearer)"));
    return Text(401, kHtml, LoginPage(""));
  };
  // No token at all is no guess; a wrong one counts against the peer.
  if (!authorization.has_value()) return unauthenticated();
  if (std::optional<Response> wait = Throttled(r, api)) return *wait;
  const absl::StatusOr<Caller> caller = c_->AuthenticateUser(authorization);
  if (!caller.ok()) {
    c_->auth_throttle().Failed(r.peer, CredentialKind::kUser, absl::Now());
    return unauthenticated();
  }
  if (r.method != "GET" && r.method != "HEAD") {
    Response out = Text(405, "text/plain", "read-only: GET only\n");
    out.headers.push_back({"Allow", "GET, HEAD"});
    return out;
  }
  const std::string route = UiRoute(p);
  if (route.empty()) {
    if (api) return Reply({404, nlohmann::json{{"error", "no such route"}}});
    return Text(404, "text/plain", "not found\n");
  }
  // The route's rule in the access table.
  const AccessRule* rule = FindAccessRule(route);
  const absl::Status allowed =
      rule == nullptr ? absl::PermissionDeniedError(absl::StrCat(
                            route, " has no rule in the access table"))
                      : Authorize(*caller, *rule);
  if (!allowed.ok()) {
    if (api) return Reply(ApiError(403, std::string(allowed.message())));
    return Text(403, "text/plain; charset=utf-8",
                absl::StrCat(allowed.message(), "\n"));
  }
  if (route == "GET /") return Page("index");
  if (route == "GET /nodes") return Page("nodes");
  if (route == "GET /jobs/ID") return Page("job");
  if (p == "/static/ui.js") {
    return Text(200, "text/javascript; charset=utf-8",
                PT_INCBIN_VIEW(ptrain_ui_js));
  }
  if (p == "/static/ui.css") {
    return Text(200, "text/css; charset=utf-8", PT_INCBIN_VIEW(ptrain_ui_css));
  }
  if (p == "/static/chart.js") {
    return Text(200, "text/javascript; charset=utf-8", chart_js_);
  }
  std::variant<ApiQuery, Response> q = ParseQuery(r.query);
  if (auto* bad = std::get_if<Response>(&q)) return *bad;
  const ApiQuery& query = std::get<ApiQuery>(q);
  if (route == "GET /api/v1/jobs") return Reply(JobsApi(*c_, query));
  if (route == "GET /api/v1/nodes") return Reply(NodesApi(*c_, query));
  // /api/v1/jobs/ID[/metrics|/log]
  const std::string id(
      std::vector<absl::string_view>(absl::StrSplit(p.substr(1), '/'))[3]);
  if (route == "GET /api/v1/jobs/ID/metrics") {
    return Reply(MetricsApi(*c_, id, query));
  }
  if (route == "GET /api/v1/jobs/ID/log") return Reply(LogApi(*c_, id, query));
  return Reply(JobApi(*c_, samples_, id, query));
}

}  // namespace ptrain
