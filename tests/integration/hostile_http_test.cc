// Every HTTP endpoint of every binary, opened in a browser or probed by a
// scanner: a rank's /metrics (ptworker --metrics-bind) and ptcoord's
// /metrics and /sd (--metrics-listen) answer a path they do not serve with
// 404, refuse malformed requests, and go on serving their pages; the
// process lives through all of it. ptcoord's web UI (--ui-listen) besides:
// a body far over its limit, in any framing, is refused before the client
// has sent it and ptcoord's memory stays small; idle, slow-header and
// slow-body clients (plain and TLS) do not keep another client out, nor
// gRPC; a foreign Host, a cross-site form and a guessing peer are refused.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "httplib.h"
#include "tests/testing/process.h"
#include "tests/testing/raw_http.h"

namespace {

namespace fs = std::filesystem;
using ptrain::testing::ConnectTo;
using ptrain::testing::HostileRequests;
using ptrain::testing::HttpStatus;
using ptrain::testing::RunCapturing;
using ptrain::testing::SendRaw;

constexpr char kToken[] = "hostile-http-test-token-0123456789";

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class HostileHttp : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hostile_http_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    log_ = dir_ / "server.log";
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  void Start(std::vector<std::string> argv) {
    pid_ = ptrain::testing::StartLogged(std::move(argv), log_.string());
  }

  // Waits (a bounded while: the process may fail to start) for `ready`
  // to return a port; 0 when it never did or the process ended.
  int WaitForPort(const std::function<int()>& ready) {
    for (int i = 0; i < 1200; ++i) {
      if (const int port = ready(); port > 0) return port;
      if (!Alive()) return 0;
      usleep(100000);
    }
    return 0;
  }

  // The process has not ended; else says how it ended.
  bool Alive() {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == 0) return true;
    ended_ = WIFSIGNALED(status)
                 ? "killed by signal " + std::to_string(WTERMSIG(status))
                 : "exited " + std::to_string(WEXITSTATUS(status));
    pid_ = 0;
    return false;
  }

  // Sends every hostile request for `pages` (the first is the one the
  // list probes around); after each the process lives and every page
  // answers 200.
  void SurvivesHostileRequests(int port,
                               const std::vector<std::string>& pages) {
    for (const auto& r : HostileRequests(pages.front())) {
      SCOPED_TRACE(r.name);
      const std::string reply = SendRaw(port, r.bytes, r.read_reply);
      if (r.want != 0) {
        EXPECT_EQ(HttpStatus(reply), r.want) << reply.substr(0, 200);
      }
      if (r.read_reply && !reply.empty()) {
        EXPECT_NE(HttpStatus(reply), 200)
            << "a hostile request was served: " << reply.substr(0, 200);
      }
      ASSERT_TRUE(Alive()) << "the server " << ended_ << "\n" << ReadAll(log_);
      for (const std::string& page : pages) {
        const std::string ok =
            SendRaw(port, "GET " + page + " HTTP/1.1\r\nHost: x\r\n\r\n");
        EXPECT_EQ(HttpStatus(ok), 200) << page << ": " << ok.substr(0, 200);
      }
    }
    ASSERT_TRUE(Alive()) << "the server " << ended_ << "\n" << ReadAll(log_);
  }

  // ptcoord with its web UI (on 127.0.0.1:0 unless `extra` says where) and
  // `token` in its token file: the UI's port, 0 when it did not start.
  int StartUi(const std::vector<std::string>& extra = {},
              const std::string& token = kToken) {
    std::ofstream(dir_ / "tokens") << token << "\n";
    std::vector<std::string> argv = {PT_PTCOORD,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--state-dir",
                                     (dir_ / "state").string(),
                                     "--local-slots",
                                     "1",
                                     "--token-file",
                                     (dir_ / "tokens").string(),
                                     "--log-level",
                                     "warn"};
    if (std::find(extra.begin(), extra.end(), "--ui-listen") == extra.end()) {
      argv.insert(argv.end(), {"--ui-listen", "127.0.0.1:0"});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    Start(argv);
    return WaitForPort([&] {
      // http(s)://HOST:PORT/, written once the UI listens.
      const std::string at = ReadAll(dir_ / "state" / "ui_address");
      const size_t colon = at.rfind(':');
      return colon == std::string::npos || at.back() != '\n'
                 ? 0
                 : std::atoi(at.c_str() + colon + 1);
    });
  }

  // ptcoord's resident memory in KiB (VmRSS in /proc/PID/status).
  long RssKiB() const {
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
    }
    return -1;
  }

  // `ptctl list` against ptcoord's gRPC: its exit code and output.
  std::pair<int, std::string> PtctlList() {
    std::string address = ReadAll(dir_ / "state" / "address");
    while (!address.empty() && address.back() == '\n') address.pop_back();
    return RunCapturing(std::string(PT_PTCTL) + " --server " + address +
                        " --token " + kToken + " list");
  }

  fs::path dir_, log_;
  pid_t pid_ = 0;
  std::string ended_;
};

std::string HostHeader(int port) {
  return "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
}

// A chunk of `n` bytes in chunked framing.
std::string Chunk(size_t n) {
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", n);
  return size + std::string(n, 'a') + "\r\n";
}

struct Sent {
  std::string reply;
  size_t bytes = 0;  // sent before the answer came
};

// Sends `head`, then `unit` again and again until `total` bytes are sent or
// the server answers (or stops reading): the answer, and how much was sent
// by then.
Sent SendUntilAnswered(int port, const std::string& head,
                       const std::string& unit, size_t total) {
  Sent out;
  const int fd = ConnectTo(port);
  if (fd < 0) return out;
  std::string_view pending = head;
  while (out.bytes < total) {
    pollfd p{fd, POLLIN | POLLOUT, 0};
    if (poll(&p, 1, 60000) <= 0 || (p.revents & ~POLLOUT) != 0) break;
    if (pending.empty()) pending = unit;
    const ssize_t n =
        send(fd, pending.data(), pending.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EAGAIN) continue;
    if (n <= 0) break;
    pending.remove_prefix(static_cast<size_t>(n));
    out.bytes += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) {
    out.reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

// Whether the server closed `fd` (after any answer, kept in `*reply`) by
// `deadline`.
bool ClosedBy(int fd, std::chrono::steady_clock::time_point deadline,
              std::string* reply) {
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
    if (n > 0) reply->append(buf, static_cast<size_t>(n));
  }
}

// Room for the thousand and more sockets of a test.
void RaiseDescriptorLimit() {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = std::min<rlim_t>(r.rlim_max, 8192);
  setrlimit(RLIMIT_NOFILE, &r);
}

TEST_F(HostileHttp, RankMetricsAnswerUnknownPathsWith404AndSurviveGarbage) {
  Start({PTWORKER_PATH, "--config",
         std::string(PT_SOURCE_DIR) + "/examples/shakespeare-char.yaml",
         "--peak-gflops", "100", "--metrics-bind", "127.0.0.1:0", "--set",
         "model.n_layer=1", "--set", "model.n_embd=32", "--set",
         "train.steps=1000000", "--set", "train.eval_every=0"});
  const std::regex serving("serves metrics on port ([0-9]+)");
  const int port = WaitForPort([&] {
    std::smatch m;
    const std::string log = ReadAll(log_);
    return std::regex_search(log, m, serving) ? std::stoi(m[1]) : 0;
  });
  ASSERT_GT(port, 0) << ended_ << "\n" << ReadAll(log_);
  SurvivesHostileRequests(port, {"/metrics"});
  // Another method on the page is refused by name.
  EXPECT_EQ(HttpStatus(SendRaw(port, "POST /metrics HTTP/1.1\r\n\r\n")), 405);
  const std::string page =
      SendRaw(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(page.find("ptrain_step{"), std::string::npos) << page;
}

TEST_F(HostileHttp, CoordinatorMetricsAndDiscoveryAnswer404AndSurviveGarbage) {
  const fs::path state = dir_ / "state";
  Start({PT_PTCOORD, "--listen", "127.0.0.1:0", "--state-dir", state.string(),
         "--local-slots", "1", "--metrics-listen", "127.0.0.1:0", "--log-level",
         "warn"});
  const int port = WaitForPort([&] {
    // host:port, written once the server listens.
    const std::string at = ReadAll(state / "metrics_address");
    const size_t colon = at.rfind(':');
    return colon == std::string::npos || at.back() != '\n'
               ? 0
               : std::atoi(at.c_str() + colon + 1);
  });
  ASSERT_GT(port, 0) << ended_ << "\n" << ReadAll(log_);
  SurvivesHostileRequests(port, {"/metrics", "/sd"});
  SurvivesHostileRequests(port, {"/sd", "/metrics"});
}

// One unauthenticated 300 MB body took ptcoord from 22 MB to 418 MB when
// it was chunked. Now any body over the limit, in any framing, method or
// route, is refused with 413 before the client has sent it, and memory
// stays where it was.
TEST_F(HostileHttp, UiRefusesABodyOverItsLimitBeforeTheClientHasSentIt) {
  const int port = StartUi();
  ASSERT_GT(port, 0) << ended_ << "\n" << ReadAll(log_);
  const long before = RssKiB();
  const size_t mib = size_t{1} << 20;
  const size_t total = 300 * mib;
  const std::string chunked = "Transfer-Encoding: chunked\r\n\r\n";
  const std::string chunk = Chunk(mib);
  const std::string plain(mib, 'a');
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"chunked POST /login",
       "POST /login HTTP/1.1\r\n" + HostHeader(port) + chunked, chunk},
      {"Content-Length POST /login",
       "POST /login HTTP/1.1\r\n" + HostHeader(port) +
           "Content-Length: " + std::to_string(total) + "\r\n\r\n",
       plain},
      {"chunked GET /", "GET / HTTP/1.1\r\n" + HostHeader(port) + chunked,
       chunk},
      {"chunked POST /api/v1/jobs",
       "POST /api/v1/jobs HTTP/1.1\r\n" + HostHeader(port) + chunked, chunk},
      {"chunked PUT /", "PUT / HTTP/1.1\r\n" + HostHeader(port) + chunked,
       chunk}};
  for (const auto& [name, head, unit] : cases) {
    SCOPED_TRACE(name);
    const Sent sent = SendUntilAnswered(port, head, unit, total);
    EXPECT_EQ(HttpStatus(sent.reply), 413) << sent.reply.substr(0, 300);
    EXPECT_LT(sent.bytes, total / 2) << "answered only once the body was sent";
    ASSERT_TRUE(Alive()) << "ptcoord " << ended_ << "\n" << ReadAll(log_);
  }
  const long after = RssKiB();
  EXPECT_LT(after - before, 64 << 10)
      << "VmRSS went from " << before << " KiB to " << after << " KiB";
  EXPECT_EQ(HttpStatus(SendRaw(
                port, "GET /login HTTP/1.1\r\n" + HostHeader(port) + "\r\n")),
            200);
}

// 1000 idle sockets and 100 clients sending a header line a second used to
// keep the UI from everyone. Now they hold no worker, and another client
// (of another address, and of theirs) is answered; gRPC answers too; the
// header deadline ends every slow client.
TEST_F(HostileHttp, IdleAndSlowHeaderClientsDoNotKeepOthersOut) {
  RaiseDescriptorLimit();
  const int port = StartUi();
  ASSERT_GT(port, 0) << ended_ << "\n" << ReadAll(log_);
  std::vector<int> idle;
  for (int i = 0; i < 1000; ++i) {
    if (const int fd = ConnectTo(port); fd >= 0) idle.push_back(fd);
  }
  EXPECT_EQ(idle.size(), 1000u);
  std::vector<int> slow;
  for (int i = 0; i < 100; ++i) {
    const int fd = ConnectTo(port);
    if (fd < 0) continue;
    send(fd, "GET /login HTTP/1.1\r\n", 21, MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    while (!stop) {
      for (const int fd : slow) {
        send(fd, "X-Slow: 1\r\n", 11, MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      for (int i = 0; i < 10 && !stop; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
  const std::string get = "GET /login HTTP/1.1\r\n" + HostHeader(port) + "\r\n";
  EXPECT_EQ(HttpStatus(SendRaw(port, get, true, "127.0.0.2")), 200);
  EXPECT_EQ(HttpStatus(SendRaw(port, get, true, "127.0.0.1")), 200);
  const auto [rc, out] = PtctlList();
  EXPECT_EQ(rc, 0) << out;
  // Every slow client is closed by its header deadline (10 s).
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int closed = 0;
  for (const int fd : slow) {
    std::string reply;
    closed += ClosedBy(fd, deadline, &reply);
    EXPECT_TRUE(reply.empty() || HttpStatus(reply) == 408) << reply;
  }
  EXPECT_EQ(closed, static_cast<int>(slow.size()));
  stop = true;
  drip.join();
  for (const int fd : idle) close(fd);
  for (const int fd : slow) close(fd);
  ASSERT_TRUE(Alive()) << "ptcoord " << ended_ << "\n" << ReadAll(log_);
  EXPECT_EQ(HttpStatus(SendRaw(port, get)), 200);
}

// Clients that send a body a byte a second hold at most a few workers:
// another client is answered meanwhile, and each slow one ends, with 408
// (or 503 while it waited for a worker), at its deadline.
TEST_F(HostileHttp, SlowBodiesHoldFewWorkersAndEndAtTheirDeadline) {
  const int port = StartUi();
  ASSERT_GT(port, 0) << ended_ << "\n" << ReadAll(log_);
  std::vector<int> slow;
  for (int i = 0; i < 24; ++i) {
    const int fd = ConnectTo(port);
    if (fd < 0) continue;
    const std::string head = "POST /login HTTP/1.1\r\n" + HostHeader(port) +
                             "Transfer-Encoding: chunked\r\n\r\n1\r\nt\r\n";
    send(fd, head.data(), head.size(), MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    while (!stop) {
      for (const int fd : slow) {
        send(fd, "1\r\no\r\n", 6, MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      for (int i = 0; i < 10 && !stop; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
  // Answered well before the slow ones' deadline (10 s) frees a worker.
  EXPECT_EQ(HttpStatus(SendRaw(
                port, "GET /login HTTP/1.1\r\n" + HostHeader(port) + "\r\n",
                true, "127.0.0.2", /*wait_s=*/5)),
            200);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(40);
  int timed_out = 0;
  for (const int fd : slow) {
    std::string reply;
    EXPECT_TRUE(ClosedBy(fd, deadline, &reply));
    const int status = HttpStatus(reply);
    EXPECT_TRUE(status == 408 || status == 503) << reply;
    timed_out += status == 408;
  }
  EXPECT_GT(timed_out, 0);
  stop = true;
  drip.join();
  for (const int fd : slow) close(fd);
  ASSERT_TRUE(Alive()) << "ptcoord " << ended_ << "\n" << ReadAll(log_);
}

// Under TLS the handshake is not a worker's either: TCP connections that
// never start one, and some that send no TLS at all, do not keep an HTTPS
// client out; a body over the limit is 413 there too.
TEST_F(HostileHttp, OverTlsHandshakesThatNeverComeHoldNoWorker) {
  RaiseDescriptorLimit();
  const auto [rc, out] = RunCapturing(
      "cd " + dir_.string() +
      " && openssl req -x509 -newkey ec -pkeyopt "
      "ec_paramgen_curve:prime256v1 -nodes -keyout ui.key -out ui.pem -days 2 "
      "-subj /CN=localhost -addext subjectAltName=IP:127.0.0.1");
  ASSERT_EQ(rc, 0) << out;
  const int port = StartUi({"--tls-cert", (dir_ / "ui.pem").string(),
                            "--tls-key", (dir_ / "ui.key").string()});
  ASSERT_GT(port, 0) << ended_ << "\n" << ReadAll(log_);
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    const int fd = ConnectTo(port);
    if (fd < 0) continue;
    if (i % 10 == 0) send(fd, "GET / HTTP/1.1\r\n", 16, MSG_NOSIGNAL);
    idle.push_back(fd);
  }
  // A bounded wait: held by a worker each, the idle connections would keep
  // the client out for minutes (10 s each, 16 at a time).
  httplib::SSLClient client("127.0.0.1", port);
  client.enable_server_certificate_verification(false);
  client.set_connection_timeout(10, 0);
  client.set_read_timeout(10, 0);
  client.set_write_timeout(10, 0);
  httplib::Result r = client.Get("/login");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  r = client.Post("/login", std::string(1 << 20, 'a'),
                  "application/x-www-form-urlencoded");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 413);
  for (const int fd : idle) close(fd);
  ASSERT_TRUE(Alive()) << "ptcoord " << ended_ << "\n" << ReadAll(log_);
}

// DNS rebinding, login CSRF, logout by <img>, and token guessing, over
// HTTP: the peer the throttle counts is the connection's address.
TEST_F(HostileHttp, UiRefusesForeignHostsCrossSiteFormsAndGuessers) {
  const int port = StartUi();
  ASSERT_GT(port, 0) << ended_ << "\n" << ReadAll(log_);
  EXPECT_EQ(HttpStatus(SendRaw(port,
                               "GET /login HTTP/1.1\r\nHost: "
                               "rebound.example:" +
                                   std::to_string(port) + "\r\n\r\n")),
            421);
  const auto login = [&](const std::string& token, const std::string& extra,
                         const std::string& from) {
    const std::string body = "token=" + token;
    return SendRaw(port,
                   "POST /login HTTP/1.1\r\n" + HostHeader(port) + extra +
                       "Content-Type: application/x-www-form-urlencoded\r\n"
                       "Content-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body,
                   true, from);
  };
  const std::string csrf =
      login(kToken, "Origin: http://127.0.0.1:1\r\n", "127.0.0.3");
  EXPECT_EQ(HttpStatus(csrf), 403) << csrf;
  EXPECT_EQ(csrf.find("Set-Cookie"), std::string::npos) << csrf;
  EXPECT_EQ(
      HttpStatus(SendRaw(port, "GET /logout HTTP/1.1\r\n" + HostHeader(port) +
                                   "Cookie: ptrain_token=x\r\n\r\n")),
      405);
  int refused = 0;
  std::string last;
  for (int i = 0; i < 40 && HttpStatus(last) != 429; ++i) {
    last = login("wrong", "", "127.0.0.1");
    refused += HttpStatus(last) == 401;
  }
  EXPECT_EQ(HttpStatus(last), 429) << last;
  EXPECT_NE(last.find("Retry-After: "), std::string::npos) << last;
  EXPECT_EQ(refused, 20);
  EXPECT_EQ(HttpStatus(login(kToken, "", "127.0.0.1")), 429);
  const std::string ok =
      login(kToken, "Origin: http://127.0.0.1:" + std::to_string(port) + "\r\n",
            "127.0.0.2");
  EXPECT_EQ(HttpStatus(ok), 303) << ok;
  EXPECT_NE(ok.find("Set-Cookie: ptrain_token="), std::string::npos) << ok;
  // Logged at a bounded rate: a line, not one a guess.
  const std::string log = ReadAll(log_);
  size_t lines = 0;
  for (size_t at = 0;
       (at = log.find("authentication: ", at)) != std::string::npos; ++at) {
    ++lines;
  }
  EXPECT_GE(lines, 1u) << log;
  EXPECT_LE(lines, 3u) << log;
}

// --ui-insecure off loopback: the address printed is the one listened on,
// with a warning as loud as for gRPC; a token short enough to guess is
// warned of too.
TEST_F(HostileHttp, PlainTextUiOffLoopbackIsAnnouncedWhereItListens) {
  const int port = StartUi({"--ui-listen", "0.0.0.0:0", "--ui-insecure"}, "x");
  ASSERT_GT(port, 0) << ended_ << "\n" << ReadAll(log_);
  const std::string url = "http://0.0.0.0:" + std::to_string(port) + "/";
  EXPECT_EQ(ReadAll(dir_ / "state" / "ui_address"), url + "\n");
  const std::string log = ReadAll(log_);
  EXPECT_NE(log.find("web UI on " + url), std::string::npos) << log;
  EXPECT_NE(log.find("ptcoord: WARNING: the web UI serves plain text on "
                     "0.0.0.0:0, which is not loopback"),
            std::string::npos)
      << log;
  EXPECT_NE(
      log.find("ptcoord: WARNING: --token-file " + (dir_ / "tokens").string() +
               ": line 1: the token has 1 characters"),
      std::string::npos)
      << log;
  EXPECT_EQ(log.find("http://127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << log;
  // Not loopback: any Host is this UI's.
  EXPECT_EQ(HttpStatus(SendRaw(port,
                               "GET /login HTTP/1.1\r\nHost: "
                               "ptcoord.example\r\n\r\n")),
            200);
}

}  // namespace
