// Fuzzes ptcoord's web UI over HTTP: the input is the bytes a client sends
// (request line, headers, a chunked or sized body, query parameters), taken
// through CoordinatorUi::Exchange, the server's whole path without a socket
// (the header scan and caps of bounded_http.h, cpp-httplib's parser, the
// framing checks, the routes and the JSON of ui_api.h) against a real
// Coordinator holding one queued job. Not the sockets, deadlines or TLS.
// Whatever the bytes: the answer is nothing or one status line of 1xx-5xx;
// without the user token no job is shown and no cookie is set; a cookie,
// when set, is the token; the job is left as it was (the UI is read-only).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/ui_server.h"
#include "httplib.h"

namespace {

namespace fs = std::filesystem;

constexpr char kToken[] = "fuzz-user-token-0123456789";

void Require(bool property) {
  if (!property) std::abort();
}

// One Coordinator and its UI for the whole run, in a folder of its own.
struct Ui {
  Ui() {
    dir = fs::temp_directory_path() /
          absl::StrCat("ptrain_ui_http_fuzzer_", getpid());
    fs::remove_all(dir);
    fs::create_directories(dir / "data");
    std::ofstream(dir / "data" / "x.txt") << "some text to train on\n";
    std::ofstream(dir / "chart.js") << "/* Chart.js */";
    ptrain::CoordinatorOptions o;
    o.state_dir = (dir / "state").string();
    o.local_slots = 2;
    o.user_tokens = {kToken};
    o.data_roots = {(dir / "data").string()};
    o.work_root = dir.string();
    o.ptworker = "/bin/true";
    o.mpirun = "/bin/false";
    o.advertise_address = "127.0.0.1:1";
    auto c = ptrain::Coordinator::Create(o);
    Require(c.ok());
    coordinator = std::move(*c);
    // Queued, never launched: nothing ticks.
    auto job = coordinator->Submit(
        "name: fuzzjobname\ndata: {path: data/x.txt}\n"
        "train: {steps: 10, global_batch: 4}\n"
        "model: {block_size: 8, n_layer: 1, n_head: 1, n_embd: 8}\n",
        {});
    Require(job.ok());
    job_id = job->id();
    ptrain::UiOptions u;
    u.listen = "127.0.0.1:0";
    u.chart_js = (dir / "chart.js").string();
    auto ui = ptrain::CoordinatorUi::Start(u, coordinator.get());
    Require(ui.ok());
    server = std::move(*ui);
  }
  ~Ui() {
    server.reset();
    coordinator.reset();
    fs::remove_all(dir);
  }
  fs::path dir;
  std::unique_ptr<ptrain::Coordinator> coordinator;
  std::unique_ptr<ptrain::CoordinatorUi> server;
  std::string job_id;
};

int StatusOf(std::string_view reply) {
  if (reply.size() < 12 || reply.substr(0, 9) != "HTTP/1.1 ") return 0;
  int status = 0;
  for (char c : reply.substr(9, 3)) {
    if (c < '0' || c > '9') return 0;
    status = status * 10 + (c - '0');
  }
  return reply[12] == ' ' ? status : 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Ui ui;
  // Each input from an address of its own: the throttle on guesses would
  // otherwise make an input's answer depend on the ones before it.
  static uint32_t n = 0;
  ++n;
  const std::string peer =
      absl::StrCat("10.", (n >> 16) & 255, ".", (n >> 8) & 255, ".", n & 255);
  const std::string_view request(reinterpret_cast<const char*>(data), size);
  const std::string reply = ui.server->Exchange(request, peer);
  if (reply.empty()) return 0;
  const int status = StatusOf(reply);
  Require(status >= 100 && status <= 599);
  const std::string_view head =
      std::string_view(reply).substr(0, reply.find("\r\n\r\n"));
  const size_t cookie = head.find("Set-Cookie: ptrain_token=");
  const bool clears =
      cookie != std::string_view::npos &&
      head.substr(cookie).rfind("Set-Cookie: ptrain_token=;", 0) == 0;
  // The token as the UI may read it: a header's as sent, a form's or a
  // cookie's percent-decoded. A chunked form may carry it in pieces (and
  // cpp-httplib 0.11.4 ends a chunked body, without an error, where a
  // chunk is not followed by its line end), so there only a cookie's value
  // is checked.
  const bool has_token =
      request.find(kToken) != std::string_view::npos ||
      httplib::detail::decode_url(std::string(request), true).find(kToken) !=
          std::string::npos;
  const bool chunked =
      absl::StrContains(absl::AsciiStrToLower(std::string(request)), "chunked");
  if (!has_token) {
    // An answer may echo what was sent (a refused Host, a method), no more.
    for (const std::string& secret : {ui.job_id, std::string("fuzzjobname")}) {
      Require(request.find(secret) != std::string_view::npos ||
              reply.find(secret) == std::string::npos);
    }
    Require(chunked || cookie == std::string_view::npos || clears);
  }
  if (cookie != std::string_view::npos && !clears) {
    Require(head.substr(cookie).rfind(
                absl::StrCat("Set-Cookie: ptrain_token=", kToken, ";"), 0) ==
            0);
  }
  auto job = ui.coordinator->Get(ui.job_id, false);
  Require(job.ok() && job->job().state() == ptrain::v1::JOB_STATE_QUEUED &&
          !job->job().cancel_requested() && !job->job().pause_requested());
  return 0;
}
