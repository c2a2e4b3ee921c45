// See ui_server.h.
#include "coordinator/ui_server.h"

#include <arpa/inet.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
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
#include "common/bounded_file.h"
#include "common/incbin.h"
#include "common/thread_entry.h"
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

// Serves the UI's routes: every request through Handle().
void CoordinatorUi::Serve(const httplib::Request& req,
                          httplib::Response& res) const {
  Request r;
  r.method = req.method;
  r.path = req.path;
  const size_t q = req.target.find('?');
  if (q != std::string::npos) r.query = req.target.substr(q + 1);
  r.authorization = req.get_header_value("Authorization");
  r.cookie = req.get_header_value("Cookie");
  r.body = req.body;
  Response out = Handle(r);
  res.status = out.status;
  for (const auto& [name, value] : out.headers) res.set_header(name, value);
  res.set_content(std::move(out.body), out.content_type);
}

absl::StatusOr<std::unique_ptr<CoordinatorUi>> CoordinatorUi::Start(
    const UiOptions& o, Coordinator* c) {
  const std::string field = absl::StrCat("--ui-listen ", o.listen);
  const size_t colon = o.listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be HOST:PORT"));
  }
  const std::string host = o.listen.substr(0, colon);
  if (o.tls_pem.empty() && !o.insecure && !IsLoopbackHost(host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", host,
        " is not a loopback address and ptcoord has no TLS (--tls-cert, "
        "--tls-key): the user token would cross the network in plain text; "
        "give TLS, listen on 127.0.0.1, or say --ui-insecure"));
  }
  absl::StatusOr<std::string> chart =
      ReadBoundedFile("--ui-listen: Chart.js", o.chart_js, kMaxChartJsBytes);
  if (!chart.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(chart.status().message(),
                     " (Debian's libjs-chart.js installs it: apt-get install "
                     "libjs-chart.js)"));
  }
  std::unique_ptr<CoordinatorUi> ui(
      new CoordinatorUi(c, !o.tls_pem.empty(), std::move(*chart)));
  if (o.tls_pem.empty()) {
    ui->server_ = std::make_unique<httplib::Server>();
  } else {
    // The chain and key ptcoord serves gRPC with; TLS 1.2 and newer.
    const std::string pem = o.tls_pem;
    auto tls = std::make_unique<httplib::SSLServer>([pem](SSL_CTX& ctx) {
      return SSL_CTX_use_certificate_chain_file(&ctx, pem.c_str()) == 1 &&
             SSL_CTX_use_PrivateKey_file(&ctx, pem.c_str(), SSL_FILETYPE_PEM) ==
                 1 &&
             SSL_CTX_check_private_key(&ctx) == 1 &&
             SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION) == 1;
    });
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ": TLS: the certificate and key (--tls-cert, --tls-key) "
                       "do not load"));
    }
    ui->server_ = std::move(tls);
  }
  httplib::Server& server = *ui->server_;
  // One request a connection: a page polls every 2 s, and a connection
  // kept open between its polls would hold one of the threads.
  // SO_REUSEADDR only: cpp-httplib's default SO_REUSEPORT would let two
  // servers share a port, where one in use must be refused.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server.set_keep_alive_max_count(1);
  server.set_payload_max_length(kMaxBody);
  server.set_read_timeout(10, 0);
  server.new_task_queue = [] { return new httplib::ThreadPool(16); };
  const auto handler = [ui = ui.get()](const httplib::Request& req,
                                       httplib::Response& res) {
    ui->Serve(req, res);
  };
  server.Get(".*", handler);
  server.Post(".*", handler);
  server.Put(".*", handler);
  server.Patch(".*", handler);
  server.Delete(".*", handler);
  server.Options(".*", handler);
  int port = 0;
  if (!absl::SimpleAtoi(o.listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the port must be a number in [0, 65535]"));
  }
  std::string bind = host;
  if (bind.size() >= 2 && bind.front() == '[' && bind.back() == ']') {
    bind = bind.substr(1, bind.size() - 2);
  }
  ui->port_ = port == 0 ? server.bind_to_any_port(bind)
                        : (server.bind_to_port(bind, port) ? port : -1);
  if (ui->port_ <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": cannot listen there (", std::strerror(errno),
        "): the port is in use, or the address is not this machine's"));
  }
  ui->thread_ = std::thread(
      ThreadEntry("ui-listener", [&server] { server.listen_after_bind(); }));
  // stop() ends only a loop that has begun.
  for (int i = 0; i < 5000 && !server.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return ui;
}

CoordinatorUi::CoordinatorUi(Coordinator* c, bool tls, std::string chart_js)
    : c_(c), tls_(tls), chart_js_(std::move(chart_js)) {}

CoordinatorUi::~CoordinatorUi() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

CoordinatorUi::Response CoordinatorUi::Handle(const Request& r) const {
  Response out = Route(r);
  // Read-only pages of our own: no caching of data, no framing, no other
  // origin's scripts, no guessing of types.
  out.headers.insert(
      out.headers.end(),
      {{"Cache-Control", "no-store"},
       {"X-Content-Type-Options", "nosniff"},
       {"X-Frame-Options", "DENY"},
       {"Referrer-Policy", "no-referrer"},
       {"Content-Security-Policy",
        "default-src 'self'; script-src 'self'; style-src 'self' "
        "'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; "
        "form-action 'self'"}});
  return out;
}

CoordinatorUi::Response CoordinatorUi::Page(const std::string& name) const {
  if (name == "index") {
    return Text(200, kHtml, PT_INCBIN_VIEW(ptrain_ui_index_html));
  }
  if (name == "job")
    return Text(200, kHtml, PT_INCBIN_VIEW(ptrain_ui_job_html));
  return Text(200, kHtml, PT_INCBIN_VIEW(ptrain_ui_nodes_html));
}

CoordinatorUi::Response CoordinatorUi::Login(const Request& r) const {
  if (r.method == "GET" || r.method == "HEAD") {
    return Text(200, kHtml, LoginPage(""));
  }
  // The form's body: token=VALUE, percent-encoded.
  std::optional<std::string> token;
  for (absl::string_view pair : absl::StrSplit(r.body, '&')) {
    if (absl::ConsumePrefix(&pair, "token=")) token = Decode(pair);
  }
  if (r.body.size() > kMaxBody || !token.has_value() || token->empty() ||
      token->size() > kMaxTokenBytes ||
      !c_->AuthenticateUser(absl::StrCat("Bearer ", *token)).ok()) {
    return Text(401, kHtml,
                LoginPage("That is not a user token of this ptcoord."));
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

CoordinatorUi::Response CoordinatorUi::Route(const Request& r) const {
  const std::string& p = r.path;
  if (p == "/login") {
    if (r.method != "GET" && r.method != "HEAD" && r.method != "POST") {
      return Text(405, "text/plain", "GET or POST only\n");
    }
    return Login(r);
  }
  const bool api = absl::StartsWith(p, "/api/");
  if (!c_->AuthenticateUser(Authorization(r)).ok()) {
    if (api) return Reply(ApiError(401, "a user token is needed (Bearer)"));
    return Text(401, kHtml, LoginPage(""));
  }
  if (r.method != "GET" && r.method != "HEAD") {
    Response out = Text(405, "text/plain", "read-only: GET only\n");
    out.headers.push_back({"Allow", "GET, HEAD"});
    return out;
  }
  if (p == "/logout") {
    Response out = Text(303, kHtml, "");
    out.headers.push_back({"Location", "/login"});
    out.headers.push_back(
        {"Set-Cookie", absl::StrCat(kCookie,
                                    "=; Path=/; Max-Age=0; HttpOnly; "
                                    "SameSite=Strict",
                                    tls_ ? "; Secure" : "")});
    return out;
  }
  if (p == "/") return Page("index");
  if (p == "/nodes") return Page("nodes");
  if (absl::StartsWith(p, "/jobs/") && IsJobId(p.substr(6))) {
    return Page("job");
  }
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
  if (!api) return Text(404, "text/plain", "not found\n");
  std::variant<ApiQuery, Response> q = ParseQuery(r.query);
  if (auto* bad = std::get_if<Response>(&q)) return *bad;
  const ApiQuery& query = std::get<ApiQuery>(q);
  // /api/v1/jobs[/ID[/metrics|/log]], /api/v1/nodes
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(p).substr(1), '/');
  ApiReply reply{404, nlohmann::json{{"error", "no such route"}}};
  if (parts.size() >= 3 && parts[0] == "api" && parts[1] == "v1") {
    if (parts.size() == 3 && parts[2] == "jobs") {
      reply = JobsApi(*c_, query);
    } else if (parts.size() == 3 && parts[2] == "nodes") {
      reply = NodesApi(*c_, query);
    } else if (parts[2] == "jobs" && parts.size() <= 5 && IsJobId(parts[3])) {
      const std::string id(parts[3]);
      if (parts.size() == 4) {
        reply = JobApi(*c_, samples_, id, query);
      } else if (parts[4] == "metrics") {
        reply = MetricsApi(*c_, id, query);
      } else if (parts[4] == "log") {
        reply = LogApi(*c_, id, query);
      }
    }
  }
  return Reply(reply);
}

}  // namespace ptrain
