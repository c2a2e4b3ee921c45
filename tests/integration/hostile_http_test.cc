// Every HTTP endpoint of every binary, opened in a browser or probed by a
// scanner: a rank's /metrics (ptworker --metrics-bind) and ptcoord's
// /metrics and /sd (--metrics-listen) answer a path they do not serve with
// 404, refuse malformed requests, and go on serving their pages; the
// process lives through all of it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing/process.h"
#include "tests/testing/raw_http.h"

namespace {

namespace fs = std::filesystem;
using ptrain::testing::HostileRequests;
using ptrain::testing::HttpStatus;
using ptrain::testing::SendRaw;

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

  fs::path dir_, log_;
  pid_t pid_ = 0;
  std::string ended_;
};

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

}  // namespace
