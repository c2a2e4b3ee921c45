// The binaries as processes, given flags and environment variables that name
// the wrong thing: a token with a control byte, a device or FIFO for a file,
// a TLS key of another certificate. Each must end at once with its bad-input
// exit code and one error line naming the flag or variable, never hang,
// abort or start serving, and ptcoord must leave its state folder untouched.
// Every process is killed after kTimeout, so a regression fails, not hangs.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;

constexpr auto kTimeout = std::chrono::seconds(20);

struct Outcome {
  bool timed_out = false;
  int signal = 0;      // the signal that ended it, 0 when it exited
  int code = -1;       // exit code
  std::string output;  // stdout and stderr together
};

std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return os << "timed_out=" << o.timed_out << " signal=" << o.signal
            << " code=" << o.code << " output:\n"
            << o.output;
}

// Runs `argv` with this process's environment less every PTCTL_* and
// PTRAIN_* variable, plus `env` ("NAME=value"), stdin from /dev/null. Killed
// after kTimeout; sent SIGTERM once its output contains `stop_at` (when
// not empty).
Outcome RunProcess(const std::vector<std::string>& argv,
                   const std::vector<std::string>& env = {},
                   const std::string& stop_at = "") {
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    if (!absl::StartsWith(entry, "PTCTL_") &&
        !absl::StartsWith(entry, "PTRAIN_")) {
      environment.emplace_back(entry);
    }
  }
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> envp, args;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);

  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_RDONLY);
    ::dup2(null, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(out[1]);
  Outcome o;
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  bool open = true, stopped = false;
  int status = 0;
  while (true) {
    if (open) {
      pollfd p{out[0], POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) {
        char buf[4096];
        const ssize_t n = ::read(out[0], buf, sizeof(buf));
        if (n > 0) o.output.append(buf, static_cast<size_t>(n));
        if (n == 0) open = false;
      }
    } else {
      ::usleep(100 * 1000);
    }
    if (!stop_at.empty() && !stopped && absl::StrContains(o.output, stop_at)) {
      ::kill(pid, SIGTERM);
      stopped = true;
    }
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      o.timed_out = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
  }
  // What it wrote just before it ended; a child of its own may hold the
  // pipe open, so only what is there now.
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof(buf))) > 0) {
    o.output.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
  if (WIFEXITED(status)) o.code = WEXITSTATUS(status);
  return o;
}

// It exited with `code` on its own, and its output is the single line
// "`prefix`..." holding every one of `parts`.
void ExpectOneErrorLine(const Outcome& o, int code, const std::string& prefix,
                        const std::vector<std::string>& parts) {
  EXPECT_FALSE(o.timed_out) << o;
  EXPECT_EQ(o.signal, 0) << o;
  EXPECT_EQ(o.code, code) << o;
  EXPECT_TRUE(absl::StartsWith(o.output, prefix)) << o;
  EXPECT_EQ(std::count(o.output.begin(), o.output.end(), '\n'), 1) << o;
  for (const std::string& p : parts) {
    EXPECT_TRUE(absl::StrContains(o.output, p)) << "no '" << p << "' in " << o;
  }
}

// Like ExpectOneErrorLine for processes that may log before they refuse
// (MPI, spdlog): one of the lines is the error line.
void ExpectErrorLine(const Outcome& o, int code, const std::string& prefix,
                     const std::vector<std::string>& parts) {
  EXPECT_FALSE(o.timed_out) << o;
  EXPECT_EQ(o.signal, 0) << o;
  EXPECT_EQ(o.code, code) << o;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(o.output, '\n')) {
    if (!absl::StartsWith(line, prefix)) continue;
    found = true;
    for (const std::string& p : parts) {
      EXPECT_TRUE(absl::StrContains(line, p)) << "no '" << p << "' in " << o;
    }
  }
  EXPECT_TRUE(found) << "no line '" << prefix << "...' in " << o;
}

class BadFlagsTest : public ::testing::Test {
 protected:
  // Two self-signed certificates and their keys, a.* and b.*, by the
  // openssl command line (as control_plane_test makes its own).
  static void SetUpTestSuite() {
    tls_ = fs::path(::testing::TempDir()) /
           ("bad_flags_tls_" + std::to_string(::getpid()));
    fs::remove_all(tls_);
    fs::create_directories(tls_);
    for (const char* name : {"a", "b"}) {
      const std::string cmd =
          absl::StrCat("cd ", tls_.string(),
                       " && openssl req -x509 -newkey ec -pkeyopt "
                       "ec_paramgen_curve:prime256v1 -nodes -keyout ",
                       name, ".key -out ", name,
                       ".pem -days 2 -subj /CN=localhost "
                       "-addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1");
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(tls_); }

  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("bad_flags_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string Tls(const std::string& name) {
    return (tls_ / name).string();
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // ptcoord's arguments with the folder it must not create.
  std::vector<std::string> Ptcoord(std::vector<std::string> more) {
    std::vector<std::string> argv = {PT_PTCOORD, "--listen", "127.0.0.1:0",
                                     "--state-dir", state_dir()};
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
  }
  std::string state_dir() const { return (dir_ / "state").string(); }

  static fs::path tls_;
  fs::path dir_;
};

fs::path BadFlagsTest::tls_;

// --- ptctl: header values ---------------------------------------------------

TEST_F(BadFlagsTest, PtctlTokenFlagWithALineBreakIsRefusedNamingTheFlag) {
  const Outcome o = RunProcess(
      {PT_PTCTL, "--server", "127.0.0.1:1", "--token", "secret\nX: y", "list"});
  ExpectOneErrorLine(o, 2, "ptctl: error: --token: ", {"byte 7 is 0x0a"});
  EXPECT_FALSE(absl::StrContains(o.output, "secret")) << o;
}

TEST_F(BadFlagsTest, PtctlTokenVariableWithAControlByteIsRefusedNamingIt) {
  const Outcome o = RunProcess({PT_PTCTL, "--server", "127.0.0.1:1", "list"},
                               {"PTCTL_TOKEN=abc\x01"});
  ExpectOneErrorLine(o, 2, "ptctl: error: PTCTL_TOKEN: ",
                     {"byte 4 is 0x01", "printable ASCII"});
}

// --- ptctl: files -----------------------------------------------------------

TEST_F(BadFlagsTest, PtctlTlsFlagNamingADeviceIsRefusedNamingTheFlag) {
  for (const std::string flag : {"--tls-ca", "--tls-cert", "--tls-key"}) {
    std::vector<std::string> argv = {PT_PTCTL, "--server", "127.0.0.1:1"};
    const std::vector<std::pair<std::string, std::string>> files = {
        {"--tls-ca", "a.pem"}, {"--tls-cert", "a.pem"}, {"--tls-key", "a.key"}};
    for (const auto& [f, file] : files) {
      argv.push_back(f);
      argv.push_back(f == flag ? "/dev/zero" : Tls(file));
    }
    argv.push_back("list");
    SCOPED_TRACE(flag);
    ExpectOneErrorLine(
        RunProcess(argv), 2,
        "ptctl: error: " + flag + " /dev/zero: ", {"not a regular file"});
  }
  ExpectOneErrorLine(RunProcess({PT_PTCTL, "--server", "127.0.0.1:1", "list"},
                                {"PTCTL_TLS_CA=" + dir_.string()}),
                     2, "ptctl: error: PTCTL_TLS_CA " + dir_.string() + ": ",
                     {"is a directory, not a regular file"});
}

TEST_F(BadFlagsTest, PtctlSpecNamingADeviceIsRefused) {
  ExpectOneErrorLine(
      RunProcess({PT_PTCTL, "--server", "127.0.0.1:1", "submit", "/dev/zero"}),
      2, "ptctl: error: job spec /dev/zero: ", {"not a regular file"});
}

// --- ptctl: TLS pairs -------------------------------------------------------

TEST_F(BadFlagsTest, PtctlClientKeyOfAnotherPairIsRefusedNamingBothFiles) {
  const Outcome o = RunProcess({PT_PTCTL, "--server", "127.0.0.1:1", "--tls-ca",
                                Tls("a.pem"), "--tls-cert", Tls("a.pem"),
                                "--tls-key", Tls("b.key"), "list"});
  ExpectOneErrorLine(
      o, 2, "ptctl: error: ",
      {"--tls-key " + Tls("b.key") +
       " does not match the certificate of --tls-cert " + Tls("a.pem")});
}

// The check passes a good pair: the call is made, and fails only for want
// of a server (exit 1, not 2).
TEST_F(BadFlagsTest, PtctlMatchingClientPairGetsAsFarAsTheCall) {
  const Outcome o = RunProcess({PT_PTCTL, "--server", "127.0.0.1:1", "--tls-ca",
                                Tls("a.pem"), "--tls-cert", Tls("a.pem"),
                                "--tls-key", Tls("a.key"), "list"});
  ExpectOneErrorLine(o, 1, "ptctl: error: UNAVAILABLE: ", {});
}

// --- ptcoord ----------------------------------------------------------------

TEST_F(BadFlagsTest, PtcoordTlsCertNamingADeviceIsRefusedLeavingNoStateDir) {
  const Outcome o = RunProcess(
      Ptcoord({"--tls-cert", "/dev/zero", "--tls-key", Tls("a.key")}));
  ExpectOneErrorLine(
      o, 2, "ptcoord: error: --tls-cert /dev/zero: ", {"not a regular file"});
  EXPECT_FALSE(fs::exists(state_dir()));
}

TEST_F(BadFlagsTest, PtcoordKeyOfAnotherPairIsRefusedLeavingNoStateDir) {
  const Outcome o = RunProcess(
      Ptcoord({"--tls-cert", Tls("a.pem"), "--tls-key", Tls("b.key")}));
  ExpectOneErrorLine(
      o, 2, "ptcoord: error: ",
      {"--tls-key " + Tls("b.key") +
       " does not match the certificate of --tls-cert " + Tls("a.pem")});
  EXPECT_FALSE(fs::exists(state_dir()));
}

TEST_F(BadFlagsTest, PtcoordCaThatIsAKeyIsRefusedLeavingNoStateDir) {
  const Outcome o =
      RunProcess(Ptcoord({"--tls-cert", Tls("a.pem"), "--tls-key", Tls("a.key"),
                          "--tls-client-ca", Tls("b.key")}));
  ExpectOneErrorLine(o, 2,
                     "ptcoord: error: --tls-client-ca " + Tls("b.key") +
                         ": not a PEM certificate",
                     {});
  EXPECT_FALSE(fs::exists(state_dir()));
}

TEST_F(BadFlagsTest,
       PtcoordTokenFileWithAControlByteIsRefusedLeavingNoStateDir) {
  const std::string tokens = Write("tokens", "good\nsecret\x02\n");
  const Outcome o = RunProcess(Ptcoord({"--token-file", tokens}));
  ExpectOneErrorLine(o, 2,
                     "ptcoord: error: --token-file " + tokens +
                         ": line 2: token: byte 7 is 0x02",
                     {});
  EXPECT_FALSE(absl::StrContains(o.output, "secret")) << o;
  EXPECT_FALSE(fs::exists(state_dir()));
}

TEST_F(BadFlagsTest, PtcoordJoinTokenFileThatIsAFifoIsRefusedAtOnce) {
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Outcome o = RunProcess(Ptcoord({"--join-token-file", fifo}));
  ExpectOneErrorLine(o, 2, "ptcoord: error: --join-token-file " + fifo + ": ",
                     {"is a FIFO, not a regular file"});
  EXPECT_FALSE(fs::exists(state_dir()));
}

// Approval holds the nodes that join with a join token: without one there
// is nothing to approve, and the flag is a mistake.
TEST_F(BadFlagsTest, PtcoordNodeApprovalWithoutAJoinTokenIsRefusedAtOnce) {
  const Outcome o = RunProcess(Ptcoord({"--require-node-approval"}));
  ExpectOneErrorLine(o, 2, "ptcoord: error: --require-node-approval needs ",
                     {"--join-token-file"});
  EXPECT_FALSE(fs::exists(state_dir()));
}

// The checks pass what openssl makes: ptcoord serves TLS with the pair.
TEST_F(BadFlagsTest, PtcoordMatchingPairServesTls) {
  const Outcome o = RunProcess(
      Ptcoord({"--tls-cert", Tls("a.pem"), "--tls-key", Tls("a.key")}), {},
      "ptcoord: listening on");
  EXPECT_FALSE(o.timed_out) << o;
  EXPECT_TRUE(absl::StrContains(o.output, "(TLS)")) << o;
  EXPECT_EQ(o.code, 0) << o;
}

// --- ptrsh (OpenMPI's launch agent: 255 on failure, as ssh) -----------------

TEST_F(BadFlagsTest, PtrshTokenWithAControlByteExits255NamingTheVariable) {
  const std::string nodes = Write("nodes", "n1 127.0.0.1:1\n");
  const Outcome o = RunProcess(
      {PT_PTRSH, "n1", "true"},
      {"PTRAIN_NODES_FILE=" + nodes, "PTRAIN_JOB_TOKEN=secret\r\nX: y"});
  ExpectOneErrorLine(o, 255, "ptrsh: PTRAIN_JOB_TOKEN: ", {"byte 7 is 0x0d"});
  EXPECT_FALSE(absl::StrContains(o.output, "secret")) << o;
}

TEST_F(BadFlagsTest, PtrshNodesFileThatIsADeviceExits255NamingTheVariable) {
  const Outcome o =
      RunProcess({PT_PTRSH, "n1", "true"},
                 {"PTRAIN_NODES_FILE=/dev/zero", "PTRAIN_JOB_TOKEN=t"});
  ExpectOneErrorLine(
      o, 255, "ptrsh: PTRAIN_NODES_FILE /dev/zero: ", {"not a regular file"});
}

// --- ptworker and ptworkerd -------------------------------------------------

TEST_F(BadFlagsTest, PtworkerConfigNamingADeviceIsRefusedNamingTheFlag) {
  ExpectErrorLine(
      RunProcess({PT_PTWORKER, "--config", "/dev/zero"}), 2,
      "ptworker: error: --config /dev/zero: ", {"not a regular file"});
}

TEST_F(BadFlagsTest, PtworkerJobTokenWithAControlByteIsRefusedNamingIt) {
  const Outcome o = RunProcess(
      {PT_PTWORKER, "--config",
       std::string(PT_SOURCE_DIR) + "/examples/shakespeare-char.yaml"},
      {"PTRAIN_COORDINATOR=127.0.0.1:1", "PTRAIN_JOB_ID=job-0001",
       "PTRAIN_JOB_TOKEN=secret\x7f", "PTRAIN_ATTEMPT=1"});
  ExpectErrorLine(o, 2,
                  "ptworker: error: PTRAIN_JOB_TOKEN: ", {"byte 7 is 0x7f"});
  EXPECT_FALSE(absl::StrContains(o.output, "secret")) << o;
}

TEST_F(BadFlagsTest, PtworkerdJoinTokenWithAControlByteIsRefusedNamingTheLine) {
  const std::string tokens = Write("join", "# cluster\nsecret\x1b[0m\n");
  const Outcome o =
      RunProcess({PT_PTWORKERD, "--coordinator", "127.0.0.1:1", "--listen",
                  "127.0.0.1:0", "--join-token-file", tokens});
  ExpectErrorLine(o, 2,
                  "ptworkerd: error: --join-token-file " + tokens +
                      ": line 2: token: byte 7 is 0x1b",
                  {});
  EXPECT_FALSE(absl::StrContains(o.output, "secret")) << o;
}

}  // namespace
