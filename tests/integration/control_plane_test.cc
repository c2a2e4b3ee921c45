// End-to-end tests of the control plane: a real ptcoord (free port, temp
// state dir) running real ptworker jobs under mpirun, driven by ptctl and by
// raw RPCs, in plain text and over TLS with certificates openssl makes at
// test time. Waits are generous deadlines, never timings.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "coordinator/launcher.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "ptrain/v1/coordinator.grpc.pb.h"
#include "ptrain/v1/node.grpc.pb.h"
#include "tests/testing/cpu_profile.h"
#include "tests/testing/process.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kToken = "integration-token";

// Small and quick: one layer, 32 channels.
const std::vector<std::string> kSmall = {
    "model.n_layer=1",     "model.n_embd=32",      "model.n_head=2",
    "train.eval_every=20", "train.sample_every=0", "train.log_every=10"};

struct Result {
  int rc = -1;
  std::string out;
};

// The web UI's JSON at PATH (ui: its address as ptcoord writes it to
// state/ui_address, "http://HOST:PORT/"), asked with the user token; a
// discarded value when it does not answer with JSON within 10 s.
json UiGet(const std::string& ui, const std::string& path) {
  httplib::Client client(std::string(absl::StripSuffix(ui, "/")));
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  httplib::Result r =
      client.Get(path, {{"Authorization", absl::StrCat("Bearer ", kToken)}});
  if (!r) return json(json::value_t::discarded);
  return json::parse(r->body, nullptr, false);
}

// Runs a shell command, capturing stdout and stderr together.
Result Sh(const std::string& cmd) {
  Result r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// proto3 JSON writes 64-bit integers as strings.
int64_t Int(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return 0;
  const json& v = j[key];
  if (v.is_string()) return std::stoll(v.get<std::string>());
  return v.is_number() ? v.get<int64_t>() : 0;
}

// Starts `cmd` under /bin/sh, which execs its last command (so the pid is
// that command's), its output going to `out`.
pid_t Spawn(const std::string& cmd, const fs::path& out) {
  const std::string line =
      absl::StrCat("exec ", cmd, " > ", out.string(), " 2>&1 < /dev/null");
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

using ptrain::testing::WaitFor;

class ControlPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat(
               "control_plane_", getpid(), "_",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "ckpt");
    std::ofstream(dir_ / "tokens") << kToken << "\n";
    StartCoordinator("127.0.0.1:0");
  }
  void TearDown() override {
    // Cancel what is left so no rank outlives the test.
    Ptctl("list -o json");
    for (const auto& j : ListJobs())
      Ptctl("cancel " + j["id"].get<std::string>());
    WaitFor(
        [&] {
          return ptrain::ProcessesWithEnv({"PTRAIN_COORDINATOR=" + address_})
              .empty();
        },
        30);
    StopCoordinator(SIGTERM);
    fs::remove_all(dir_);
  }

  void StartCoordinator(const std::string& listen,
                        const std::vector<std::string>& extra = {}) {
    fs::remove(dir_ / "state" / "address");
    std::vector<std::string> argv = {PT_PTCOORD,
                                     "--listen",
                                     listen,
                                     "--state-dir",
                                     (dir_ / "state").string(),
                                     "--local-slots",
                                     "4",
                                     "--token-file",
                                     (dir_ / "tokens").string(),
                                     "--data-root",
                                     std::string(PT_SOURCE_DIR) + "/data",
                                     "--data-root",
                                     (dir_ / "ckpt").string(),
                                     "--cancel-grace-s",
                                     "5",
                                     "--log-level",
                                     "warn"};
    // A ptworker other than the one built beside ptcoord (while the progress
    // reporter is wired into worker/main.cc).
    if (const char* w = std::getenv("PT_TEST_PTWORKER")) {
      argv.push_back("--ptworker");
      argv.push_back(w);
    }
    // `extra` may name the slots instead.
    if (std::find(extra.begin(), extra.end(), "--local-slots") != extra.end()) {
      auto slots = std::find(argv.begin(), argv.end(), "--local-slots");
      argv.erase(slots, slots + 2);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    coordinator_ = fork();
    if (coordinator_ == 0) {
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      const std::string log = (dir_ / "ptcoord.log").string();
      freopen(log.c_str(), "a", stdout);
      freopen(log.c_str(), "a", stderr);
      execv(args[0], args.data());
      _exit(127);
    }
    ASSERT_TRUE(
        WaitFor([&] { return fs::exists(dir_ / "state" / "address"); }, 30))
        << Sh("cat " + (dir_ / "ptcoord.log").string()).out;
    std::ifstream(dir_ / "state" / "address") >> address_;
    channel_ = grpc::CreateChannel(address_, credentials_);
  }
  void StopCoordinator(int sig) {
    if (coordinator_ <= 0) return;
    kill(coordinator_, sig);
    int status = 0;
    waitpid(coordinator_, &status, 0);
    coordinator_ = 0;
  }

  // ptctl with this test's server, token and TLS flags, and `args`.
  std::string PtctlCommand(const std::string& args,
                           const std::string& token = kToken) {
    return absl::StrCat(PT_PTCTL, " --server ", address_,
                        token.empty() ? "" : absl::StrCat(" --token ", token),
                        ptctl_tls_, " ", args);
  }
  Result Ptctl(const std::string& args, const std::string& token = kToken) {
    return Sh(
        absl::StrCat("cd ", PT_SOURCE_DIR, " && ", PtctlCommand(args, token)));
  }
  // `ptctl watch ID`, stopped after 2 minutes should it hang (only so
  // that a hang fails the test rather than the suite: rc 124).
  Result WatchJob(const std::string& id) {
    return Sh("timeout 120 " + PtctlCommand("watch " + id));
  }
  std::string Submit(
      const std::vector<std::string>& sets,
      const std::string& file = "examples/shakespeare-char.yaml") {
    std::string cmd = "submit " + file;
    std::vector<std::string> all = kSmall;
    all.insert(all.end(), sets.begin(), sets.end());
    // The test's checkpoint folder unless `sets` names one.
    if (std::none_of(sets.begin(), sets.end(), [](const std::string& s) {
          return s.starts_with("checkpoint.dir=");
        })) {
      all.push_back("checkpoint.dir=" + (dir_ / "ckpt").string());
    }
    for (const std::string& s : all) cmd += " --set " + s;
    Result r = Ptctl(cmd);
    EXPECT_EQ(r.rc, 0) << r.out;
    std::string id = r.out.substr(0, r.out.find('\n'));
    return id;
  }
  json Get(const std::string& id) {
    Result r = Ptctl("-o json get " + id);
    if (r.rc != 0) return json::object();
    return json::parse(r.out, nullptr, false);
  }
  std::vector<json> ListJobs() {
    Result r = Ptctl("-o json list");
    json j = json::parse(r.out, nullptr, false);
    if (j.is_discarded() || !j.contains("jobs")) return {};
    return j["jobs"].get<std::vector<json>>();
  }
  std::string State(const std::string& id) {
    json j = Get(id);
    return j.contains("job") ? j["job"].value("state", "") : "";
  }
  int64_t Step(const std::string& id) {
    json j = Get(id);
    if (!j.contains("job")) return -1;
    return Int(j["job"]["progress"], "step");
  }
  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(30));
    return ctx;
  }

  // A CA, a server certificate for 127.0.0.1 and localhost, and a client
  // certificate, in dir_/tls/, made by the openssl command line.
  void MakeCertificates() {
    const fs::path t = dir_ / "tls";
    fs::create_directories(t);
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1";
    const std::string script = absl::StrCat(
        "exec 2>&1; set -e; cd ", t.string(), "; ", "openssl req -x509 ", key,
        " -nodes -keyout ca.key -out ca.pem ",
        "-days 2 -subj /CN=ptrain-test-ca; ", "openssl req ", key,
        " -nodes -keyout server.key -out server.csr ", "-subj /CN=localhost; ",
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        "extendedKeyUsage=serverAuth\n' > server.ext; ",
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key ",
        "-CAcreateserial -out server.pem -days 2 -extfile server.ext; ",
        "openssl req ", key, " -nodes -keyout client.key -out client.csr ",
        "-subj /CN=ptctl-user; ",
        "printf 'extendedKeyUsage=clientAuth\n' > client.ext; ",
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key ",
        "-CAcreateserial -out client.pem -days 2 -extfile client.ext");
    Result r = Sh(script);
    ASSERT_EQ(r.rc, 0) << r.out;
  }
  // Beside MakeCertificates' files: another CA (CN=other-ca) and a client
  // certificate it signed, a client certificate of the test CA that has
  // expired, and a server certificate naming only DNS:localhost.
  void MakeOtherCertificates() {
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1";
    const std::string script = absl::StrCat(
        "exec 2>&1; set -e; cd ", (dir_ / "tls").string(), "; ",
        "openssl req -x509 ", key,
        " -nodes -keyout other-ca.key -out other-ca.pem -days 2 "
        "-subj /CN=other-ca; ",
        "openssl req ", key,
        " -nodes -keyout stranger.key -out stranger.csr -subj /CN=stranger; ",
        "openssl x509 -req -in stranger.csr -CA other-ca.pem -CAkey "
        "other-ca.key -CAcreateserial -out stranger.pem -days 2 -extfile "
        "client.ext; ",
        "openssl req ", key,
        " -nodes -keyout expired.key -out expired.csr -subj /CN=expired; ",
        // 0 days: valid until the second it was made.
        "openssl x509 -req -in expired.csr -CA ca.pem -CAkey ca.key "
        "-CAcreateserial -out expired.pem -days 0 -extfile client.ext; ",
        "openssl req ", key,
        " -nodes -keyout dns-only.key -out dns-only.csr -subj /CN=localhost; ",
        "printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' "
        "> dns-only.ext; ",
        "openssl x509 -req -in dns-only.csr -CA ca.pem -CAkey ca.key "
        "-CAcreateserial -out dns-only.pem -days 2 -extfile dns-only.ext");
    Result r = Sh(script);
    ASSERT_EQ(r.rc, 0) << r.out;
    // expired.pem was valid until the second it was made.
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::string ReadFile(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // The running attempt's token, read from a rank's environment.
  // The processes of job `id` of this test's coordinator: job ids repeat
  // across coordinators (every test's first job is job-0001), and tests run
  // side by side.
  std::vector<pid_t> JobProcesses(const std::string& id) {
    return ptrain::ProcessesWithEnv(
        {"PTRAIN_COORDINATOR=" + address_, "PTRAIN_JOB_ID=" + id});
  }

  std::string RankToken(const std::string& id) {
    for (pid_t p : JobProcesses(id)) {
      const std::string env =
          ReadFile(fs::path("/proc") / std::to_string(p) / "environ");
      for (absl::string_view v : absl::StrSplit(env, '\0')) {
        if (absl::StartsWith(v, "PTRAIN_JOB_TOKEN=")) {
          return std::string(v.substr(17));
        }
      }
    }
    return "";
  }

  fs::path dir_;
  pid_t coordinator_ = 0;
  std::string address_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_ =
      grpc::InsecureChannelCredentials();
  std::string ptctl_tls_;  // TLS flags every Ptctl call carries
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ControlPlaneTest, SubmitSucceedsWithDecreasingLossHistory) {
  Result r =
      Ptctl(absl::StrCat("submit examples/shakespeare-char.yaml --watch --set "
                         "model.n_layer=1 --set "
                         "model.n_embd=32 --set model.n_head=2 --set "
                         "train.steps=40 --set parallel.dp=2 "
                         "--set train.sample_every=0 --set checkpoint.dir=",
                         (dir_ / "ckpt").string()));
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string id = r.out.substr(0, r.out.find('\n'));
  json j = Get(id);
  EXPECT_EQ(j["job"]["state"], "JOB_STATE_SUCCEEDED");
  EXPECT_EQ(j["job"]["attempts"], 1);
  std::vector<double> losses;
  for (const json& p : j["loss_history"]) {
    if (p.value("loss", 0.0) > 0) losses.push_back(p["loss"].get<double>());
  }
  ASSERT_GE(losses.size(), 40u) << j.dump();
  double head = 0, tail = 0;
  for (int i = 0; i < 5; ++i) {
    head += losses[i];
    tail += losses[losses.size() - 1 - i];
  }
  EXPECT_LT(tail, head)
      << "mean loss of the last 5 steps is not below the first 5";
}

// Then `ptctl delete` forgets it (refused while it ran), its checkpoints
// kept.
TEST_F(ControlPlaneTest, CancelRunningJobLeavesNoRankProcess) {
  const std::string id = Submit({"train.steps=100000", "parallel.dp=2"});
  ASSERT_TRUE(WaitFor([&] { return Step(id) > 0; }, 120)) << Get(id).dump();
  Result running = Ptctl("delete " + id);
  EXPECT_EQ(running.rc, 2) << running.out;
  EXPECT_NE(running.out.find("is RUNNING: only an ended job"),
            std::string::npos)
      << running.out;
  Result c1 = Ptctl("cancel " + id);
  Result c2 = Ptctl("cancel " + id);
  EXPECT_EQ(c1.rc, 0) << c1.out;
  EXPECT_EQ(c2.rc, 0) << c2.out;  // idempotent
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_CANCELLED"; }, 60));
  EXPECT_TRUE(JobProcesses(id).empty());
  // `ptctl events`: its story, oldest first, a line each.
  Result events = Ptctl("events " + id);
  EXPECT_EQ(events.rc, 0) << events.out;
  // --token-file tokens are admins named token-N.
  const size_t submitted =
      events.out.find("  submitted by token-1 (2 slots)\n");
  const size_t started = events.out.find("  attempt 1 started");
  const size_t cancelled = events.out.find("  cancelled (attempt 1 ended)");
  EXPECT_NE(submitted, std::string::npos) << events.out;
  EXPECT_LT(submitted, started) << events.out;
  EXPECT_LT(started, cancelled) << events.out;
  EXPECT_NE(cancelled, std::string::npos) << events.out;
  const std::string ckpt =
      Get(id)["job"]["spec"]["checkpoint"].value("dir", "");
  Result deleted = Ptctl("delete " + id);
  EXPECT_EQ(deleted.rc, 0) << deleted.out;
  EXPECT_EQ(deleted.out, id + " deleted; its checkpoints stay in " + ckpt +
                             " (--purge removes them)\n");
  EXPECT_NE(Ptctl("get " + id).out.find("NOT_FOUND"), std::string::npos);
  EXPECT_NE(Ptctl("events " + id).out.find("NOT_FOUND"), std::string::npos);
  EXPECT_TRUE(ListJobs().empty());
}

// `ptctl list --state S` keeps the jobs in state S, `--limit N` the newest
// N, oldest first; a state or limit out of range is refused before anything
// is sent.
TEST_F(ControlPlaneTest, ListFiltersByStateAndKeepsTheNewest) {
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(Submit({"train.steps=100000"}));
  ASSERT_EQ(Ptctl("cancel " + ids[0]).rc, 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        return State(ids[0]) == "JOB_STATE_CANCELLED" &&
               State(ids[1]) == "JOB_STATE_RUNNING" &&
               State(ids[2]) == "JOB_STATE_RUNNING";
      },
      120))
      << Ptctl("list").out;
  auto listed = [&](const std::string& args) {
    Result r = Ptctl("-o json list " + args);
    EXPECT_EQ(r.rc, 0) << r.out;
    std::vector<std::string> out;
    json j = json::parse(r.out, nullptr, false);
    if (j.is_discarded() || !j.contains("jobs")) return out;
    for (const json& job : j["jobs"]) out.push_back(job["id"]);
    return out;
  };
  EXPECT_EQ(listed(""), ids);
  EXPECT_EQ(listed("--state cancelled"), std::vector<std::string>{ids[0]});
  EXPECT_EQ(listed("--state RUNNING"),
            (std::vector<std::string>{ids[1], ids[2]}));
  EXPECT_EQ(listed("--limit 2"), (std::vector<std::string>{ids[1], ids[2]}));
  EXPECT_EQ(listed("--limit 1 --state cancelled"),
            std::vector<std::string>{ids[0]});
  EXPECT_TRUE(listed("--state succeeded").empty());
  Result bad_state = Ptctl("list --state done");
  EXPECT_EQ(bad_state.rc, 2) << bad_state.out;
  EXPECT_NE(bad_state.out.find("--state"), std::string::npos) << bad_state.out;
  Result bad_limit = Ptctl("list --limit 10001");
  EXPECT_EQ(bad_limit.rc, 2) << bad_limit.out;
  EXPECT_NE(bad_limit.out.find("--limit"), std::string::npos) << bad_limit.out;
}

TEST_F(ControlPlaneTest, BadInputIsRefusedAndChangesNothing) {
  auto stub = ptrain::v1::JobService::NewStub(channel_);
  // A data path outside the roots: INVALID_ARGUMENT naming the field.
  Result outside = Ptctl(
      "submit examples/shakespeare-char.yaml --set data.path=/etc/passwd");
  EXPECT_EQ(outside.rc, 2) << outside.out;
  EXPECT_NE(outside.out.find("INVALID_ARGUMENT"), std::string::npos)
      << outside.out;
  EXPECT_NE(outside.out.find("data.path"), std::string::npos) << outside.out;
  // Malformed YAML sent raw: line and column in the message.
  ptrain::v1::SubmitJobRequest req;
  req.set_spec_yaml("name: x\nmodel: {n_layer: [1,\n");
  ptrain::v1::SubmitJobResponse resp;
  grpc::Status s = stub->SubmitJob(Ctx(kToken).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("line"), std::string::npos)
      << s.error_message();
  // Text that is not UTF-8: the same rule and message as ptctl and
  // ptworker give, never an empty UNIMPLEMENTED.
  req.set_spec_yaml("name: caf\xe9\n");
  s = stub->SubmitJob(Ctx(kToken).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("not UTF-8: byte 0xe9"), std::string::npos)
      << s.error_message();
  req.set_spec_yaml("name: x\ndata: {path: data/tinyshakespeare.txt}\n");
  req.add_overrides("train.sample_prompt=\xff");
  s = stub->SubmitJob(Ctx(kToken).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("not UTF-8"), std::string::npos)
      << s.error_message();
  req.clear_overrides();
  // A 10 MB spec is refused by size.
  req.set_spec_yaml(std::string(10 << 20, '#'));
  s = stub->SubmitJob(Ctx(kToken).get(), req, &resp);
  EXPECT_TRUE(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
              s.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_code();
  // Unknown ids and out-of-range fields.
  ptrain::v1::GetJobRequest get;
  get.set_job_id("job-9999");
  ptrain::v1::GetJobResponse got;
  EXPECT_EQ(stub->GetJob(Ctx(kToken).get(), get, &got).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ptrain::v1::ListJobsRequest list;
  list.set_limit(-5);
  ptrain::v1::ListJobsResponse listed;
  EXPECT_EQ(stub->ListJobs(Ctx(kToken).get(), list, &listed).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  Result missing = Ptctl("cancel job-9999");
  EXPECT_NE(missing.out.find("NOT_FOUND"), std::string::npos) << missing.out;
  EXPECT_TRUE(ListJobs().empty());
}

// ptctl exits 2 for bad input whoever finds it: ptctl itself, or ptcoord
// refusing the request with INVALID_ARGUMENT (a path outside the data
// roots, more ranks than slots, a data file that is not there, which is
// refused at submit rather than failing the job at launch); any other
// error is 1.
TEST_F(ControlPlaneTest, BadInputRefusedByPtcoordExitsTwoOtherErrorsOne) {
  const std::string submit =
      "submit examples/shakespeare-char.yaml --set checkpoint.dir=" +
      (dir_ / "ckpt").string() + " --set ";
  const Result wide = Ptctl(submit + "parallel.dp=8");
  EXPECT_EQ(wide.rc, 2) << wide.out;
  EXPECT_NE(
      wide.out.find("ptctl: error: INVALID_ARGUMENT: parallel.dp*tp*pp*cp=8 "
                    "slots exceeds the pool of 4"),
      std::string::npos)
      << wide.out;
  const Result no_data = Ptctl(submit + "data.path=data/no-such-file.txt");
  EXPECT_EQ(no_data.rc, 2) << no_data.out;
  EXPECT_NE(no_data.out.find("ptctl: error: INVALID_ARGUMENT: data.path: " +
                             std::string(PT_SOURCE_DIR) +
                             "/data/no-such-file.txt does not exist"),
            std::string::npos)
      << no_data.out;
  const Result no_shards =
      Ptctl(submit +
            "\"data.path=''\" --set data.tokenizer=gpt2 --set "
            "'data.train_bin=data/none_*.bin' --set "
            "data.val_bin=data/none_val.bin");
  EXPECT_EQ(no_shards.rc, 2) << no_shards.out;
  EXPECT_NE(no_shards.out.find("data.train_bin: no file matches"),
            std::string::npos)
      << no_shards.out;
  EXPECT_TRUE(ListJobs().empty());
  const Result unknown = Ptctl("get job-9999");
  EXPECT_EQ(unknown.rc, 1) << unknown.out;
  const Result resume = Ptctl("resume job-9999");
  EXPECT_EQ(resume.rc, 1) << resume.out;
  const Result unauthenticated = Ptctl("list", "wrong");
  EXPECT_EQ(unauthenticated.rc, 1) << unauthenticated.out;
}

// Tensor- and pipeline-parallel layouts that cannot work are refused with
// the fields and the rule: by ptctl before anything is sent (it names the rule
// even with no coordinator to talk to), and by ptcoord again for any other
// client.
TEST_F(ControlPlaneTest, ImpossibleParallelLayoutsAreRefusedTwice) {
  struct Case {
    std::vector<std::string> sets;
    std::string rule;
  };
  const std::vector<Case> cases = {
      {{"parallel.tp=3"}, "parallel.tp=3 does not divide model.n_head=4"},
      {{"parallel.tp=2", "parallel.sequence_parallel=true",
        "model.block_size=63"},
       "parallel.tp=2 does not divide model.block_size=63 (required by "
       "parallel.sequence_parallel=true)"},
      {{"parallel.sequence_parallel=true"},
       "parallel.sequence_parallel=true requires parallel.tp > 1"},
      {{"parallel.pp=3"}, "parallel.pp=3 does not divide model.n_layer=4"},
      {{"parallel.pp=2", "parallel.microbatches=2",
        "parallel.schedule=interleaved", "parallel.virtual_stages=4"},
       "parallel.virtual_stages=4 does not divide the layers per stage, "
       "model.n_layer / parallel.pp = 4 / 2 = 2"},
      {{"parallel.pp=2", "parallel.first_stage_layers=4"},
       "each stage needs at least one layer"},
      {{"parallel.schedule=zb1p"},
       "parallel.schedule=zb1p requires parallel.pp >= 2 (parallel.pp=1)"},
      {{"parallel.pp=2", "parallel.microbatches=2", "parallel.schedule=zb1p",
        "parallel.virtual_stages=2"},
       "parallel.schedule=zb1p requires parallel.virtual_stages=1"},
      {{"parallel.cp=3"},
       "parallel.cp=3 needs model.block_size divisible by 2 × parallel.cp = "
       "6"},
      {{"parallel.cp=2", "resources.device=cuda"},
       "parallel.cp=2 with resources.device=cuda: the GPU's ring attention "
       "has not been verified"},
      {{"parallel.offload=optimizer"},
       "parallel.offload=optimizer needs resources.device=cuda"},
      // Wider than the pool of 4 slots: only ptcoord knows the pool.
      {{"parallel.tp=4", "parallel.dp=2"}, ""},
  };
  auto stub = ptrain::v1::JobService::NewStub(channel_);
  for (const Case& c : cases) {
    std::string sets;
    for (const std::string& set : c.sets) sets += " --set " + set;
    if (!c.rule.empty()) {
      const Result local =
          Sh(absl::StrCat("cd ", PT_SOURCE_DIR, " && ", PT_PTCTL,
                          " --server 127.0.0.1:1 --token x submit "
                          "examples/shakespeare-char.yaml",
                          sets));
      EXPECT_NE(local.rc, 0);
      EXPECT_NE(local.out.find(c.rule), std::string::npos) << local.out;
      EXPECT_EQ(local.out.find("UNAVAILABLE"), std::string::npos)
          << "ptctl sent an invalid spec: " << local.out;
    }
    ptrain::v1::SubmitJobRequest req;
    req.set_spec_yaml(
        ReadFile(fs::path(PT_SOURCE_DIR) / "examples/shakespeare-char.yaml"));
    for (const std::string& set : c.sets) req.add_overrides(set);
    ptrain::v1::SubmitJobResponse resp;
    const grpc::Status s = stub->SubmitJob(Ctx(kToken).get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << sets;
    const std::string rule =
        c.rule.empty() ? "parallel.dp*tp*pp*cp=8 slots exceeds the pool of 4"
                       : c.rule;
    EXPECT_NE(s.error_message().find(rule), std::string::npos)
        << s.error_message();
  }
  EXPECT_TRUE(ListJobs().empty());
}

// A valid spec with an idle pipeline is sent, after a warning that says
// how much of each step the bubble takes.
TEST_F(ControlPlaneTest, PtctlWarnsOfAPipelineBubbleAndSendsAnyway) {
  const Result r = Ptctl(
      "submit examples/shakespeare-char.yaml --set parallel.pp=4 "
      "--set parallel.microbatches=2 --set checkpoint.dir=" +
      (dir_ / "ckpt").string());
  EXPECT_NE(r.out.find("ptctl: warning: parallel.microbatches=2 is fewer "
                       "than parallel.pp=4"),
            std::string::npos)
      << r.out;
  // Four slots: the job is accepted (the warning refuses nothing).
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(ListJobs().size(), 1u);
  Ptctl("cancel " + r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1));
}

// Without a token, or with a wrong one, every call is UNAUTHENTICATED, and
// ptctl says where a token comes from.
TEST_F(ControlPlaneTest, MissingOrWrongTokenIsUnauthenticated) {
  for (const std::string& token : {std::string(), std::string("wrong")}) {
    Result list = Ptctl("list", token);
    EXPECT_NE(list.rc, 0);
    EXPECT_NE(list.out.find("UNAUTHENTICATED"), std::string::npos) << list.out;
    Result submit = Ptctl("submit examples/shakespeare-char.yaml", token);
    EXPECT_NE(submit.out.find("UNAUTHENTICATED"), std::string::npos)
        << submit.out;
    for (const char* where : {"--token-file", "STATE_DIR/user-token"}) {
      EXPECT_NE(list.out.find(where), std::string::npos) << list.out;
    }
    EXPECT_EQ(std::count(list.out.begin(), list.out.end(), '\n'), 1)
        << list.out;
  }
  const Result none = Ptctl("list", "");
  EXPECT_NE(none.out.find("ptctl sent no token; give one with --token or "
                          "PTCTL_TOKEN"),
            std::string::npos)
      << none.out;
  const Result wrong = Ptctl("list", "wrong");
  EXPECT_NE(wrong.out.find("the token of --token is not one of ptcoord's"),
            std::string::npos)
      << wrong.out;
  // A rank token that is not the job's cannot report progress either.
  auto ranks = ptrain::v1::RankService::NewStub(channel_);
  ptrain::v1::ReportProgressRequest p;
  p.set_job_id("job-0001");
  p.set_attempt(1);
  p.set_step(5);
  ptrain::v1::ReportProgressResponse pr;
  EXPECT_EQ(ranks->ReportProgress(Ctx(kToken).get(), p, &pr).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(ListJobs().empty());
}

// Guessing tokens over gRPC is throttled per peer address: after its burst
// of refused user tokens a peer gets RESOURCE_EXHAUSTED saying why, its
// right token included, while another address's right token works; rank
// and join tokens count apart. Refusals are logged at a bounded rate.
TEST_F(ControlPlaneTest, FailedAuthenticationIsThrottledPerPeer) {
  {
    // 127.0.0.1 and ::1 are two peers of a ptcoord listening on [::].
    const int probe = socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 loopback{};
    loopback.sin6_family = AF_INET6;
    loopback.sin6_addr = in6addr_loopback;
    const bool v6 =
        probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&loopback),
                           sizeof(loopback)) == 0;
    if (probe >= 0) close(probe);
    if (!v6) GTEST_SKIP() << "no IPv6 loopback here";
  }
  StopCoordinator(SIGTERM);
  StartCoordinator("[::]:0");
  auto jobs = ptrain::v1::JobService::NewStub(channel_);  // from 127.0.0.1
  ptrain::v1::ListJobsRequest list;
  ptrain::v1::ListJobsResponse listed;
  int refused = 0;
  grpc::Status s;
  for (int i = 0; i < 40; ++i) {
    s = jobs->ListJobs(Ctx("wrong").get(), list, &listed);
    if (s.error_code() != grpc::StatusCode::UNAUTHENTICATED) break;
    ++refused;
  }
  EXPECT_EQ(refused, 20);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("too many refused user tokens from "
                                   "127.0.0.1"),
            std::string::npos)
      << s.error_message();
  EXPECT_EQ(jobs->ListJobs(Ctx(kToken).get(), list, &listed).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  const Result ptctl = Ptctl("list");
  EXPECT_NE(ptctl.rc, 0);
  EXPECT_NE(ptctl.out.find("too many refused user tokens"), std::string::npos)
      << ptctl.out;
  const std::string port = address_.substr(address_.rfind(':'));
  auto other = ptrain::v1::JobService::NewStub(
      grpc::CreateChannel("[::1]" + port, credentials_));
  EXPECT_TRUE(other->ListJobs(Ctx(kToken).get(), list, &listed).ok());

  // Rank tokens: a burst of their own (ranks of an ended attempt may still
  // report with its token).
  auto ranks = ptrain::v1::RankService::NewStub(channel_);
  ptrain::v1::ReportProgressRequest p;
  p.set_job_id("job-0001");
  p.set_attempt(1);
  ptrain::v1::ReportProgressResponse pr;
  refused = 0;
  for (int i = 0; i < 400; ++i) {
    s = ranks->ReportProgress(Ctx("stale").get(), p, &pr);
    if (s.error_code() != grpc::StatusCode::UNAUTHENTICATED) break;
    ++refused;
  }
  EXPECT_GE(refused, 200);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  // Join tokens (this ptcoord takes no node at all).
  auto nodes = ptrain::v1::NodeService::NewStub(channel_);
  ptrain::v1::NodeHeartbeatRequest beat;
  ptrain::v1::NodeHeartbeatResponse beaten;
  refused = 0;
  for (int i = 0; i < 40; ++i) {
    s = nodes->Heartbeat(Ctx("guess").get(), beat, &beaten);
    if (s.error_code() != grpc::StatusCode::UNAUTHENTICATED) break;
    ++refused;
  }
  EXPECT_EQ(refused, 20);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("join token"), std::string::npos)
      << s.error_message();
  const std::string log = Sh("cat " + (dir_ / "ptcoord.log").string()).out;
  size_t lines = 0;
  for (size_t at = 0;
       (at = log.find("authentication: ", at)) != std::string::npos; ++at) {
    ++lines;
  }
  EXPECT_GE(lines, 1u) << log;
  EXPECT_LE(lines, 4u) << log;
}

// With no ptcoord listening, ptctl says where it looked, where that address
// came from, and exits 1.
TEST_F(ControlPlaneTest, PtctlWithNoCoordinatorSaysWhereItLooked) {
  StopCoordinator(SIGTERM);
  const std::string gone = address_;
  const Result by_env =
      Sh(absl::StrCat("cd ", PT_SOURCE_DIR, " && PTCTL_SERVER=", gone,
                      " PTCTL_TOKEN=t ", PT_PTCTL, " list"));
  EXPECT_EQ(by_env.rc, 1) << by_env.out;
  EXPECT_EQ(by_env.out, "ptctl: error: UNAVAILABLE: no ptcoord at " + gone +
                            " (connection refused) — is it running? "
                            "(PTCTL_SERVER)\n");
  const Result by_flag = Ptctl("list");
  EXPECT_EQ(by_flag.rc, 1) << by_flag.out;
  EXPECT_NE(by_flag.out.find("no ptcoord at " + gone +
                             " (connection refused) — is it running? "
                             "(--server)"),
            std::string::npos)
      << by_flag.out;
  const Result help = Sh(absl::StrCat(PT_PTCTL, " --help"));
  EXPECT_NE(help.out.find("default 127.0.0.1:7070"), std::string::npos)
      << help.out;
  // An HTTP/1 server there (ptcoord's web UI, say): said so, with the fix.
  httplib::Server http;
  const int port = http.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { http.listen_after_bind(); });
  const std::string ui = absl::StrCat("127.0.0.1:", port);
  const Result at_ui =
      Sh(absl::StrCat(PT_PTCTL, " --server ", ui, " --token t list"));
  http.stop();
  serving.join();
  EXPECT_EQ(at_ui.rc, 1) << at_ui.out;
  EXPECT_NE(at_ui.out.find(ui + " answers HTTP/1, not ptcoord's gRPC "
                                "(--server): is it ptcoord's web UI"),
            std::string::npos)
      << at_ui.out;
}

// ptcoord killed while a job runs: the job goes on and finishes, and a
// `ptctl watch` of it started before follows it across the restart to its
// end.
TEST_F(ControlPlaneTest, CoordinatorKilledMidJobRestartsAndJobAndWatchFinish) {
  const std::string a = Submit({"train.steps=1000", "parallel.dp=2"});
  const std::string b =
      Submit({"train.steps=20", "parallel.dp=2", "name=second"});
  ASSERT_TRUE(WaitFor([&] { return Step(a) > 0; }, 120)) << Get(a).dump();
  const std::vector<json> before = ListJobs();
  ASSERT_EQ(before.size(), 2u);
  const fs::path watched = dir_ / "watch.out";
  const pid_t watch =
      Spawn("timeout 600 " + PtctlCommand("watch " + a), watched);
  ASSERT_TRUE(WaitFor(
      [&] { return ReadFile(watched).find(a + " [") != std::string::npos; },
      60))
      << ReadFile(watched);
  const std::string port = address_.substr(address_.rfind(':'));
  StopCoordinator(SIGKILL);
  // Ranks report to this address: the new ptcoord must take the same port.
  StartCoordinator("127.0.0.1" + port);
  ASSERT_TRUE(WaitFor([&] { return State(a) == "JOB_STATE_SUCCEEDED"; }, 240))
      << Get(a).dump() << Sh("cat " + (dir_ / "ptcoord.log").string()).out;
  ASSERT_TRUE(WaitFor([&] { return State(b) == "JOB_STATE_SUCCEEDED"; }, 240))
      << Get(b).dump();
  const std::vector<json> after = ListJobs();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i]["id"], before[i]["id"]);
    EXPECT_EQ(after[i]["name"], before[i]["name"]);
  }
  EXPECT_EQ(Get(a)["job"]["attempts"], 1);  // re-adopted, not restarted
  int status = 0;
  ASSERT_EQ(waitpid(watch, &status, 0), watch);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << status << ": " << ReadFile(watched);
  EXPECT_NE(ReadFile(watched).find("\n" + a + " SUCCEEDED\n"),
            std::string::npos)
      << ReadFile(watched);
}

// `ptctl watch` of a job that had ended when ptcoord restarted prints the
// job's final state and exits with its code: nothing will change the job
// again, so there is nothing to wait for.
TEST_F(ControlPlaneTest, WatchOfAJobThatEndedBeforeACoordinatorRestartExits) {
  const std::string done = Submit({"train.steps=20"});
  const std::string cancelled = Submit({"train.steps=1000000"});
  ASSERT_EQ(Ptctl("cancel " + cancelled).rc, 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        return State(done) == "JOB_STATE_SUCCEEDED" &&
               State(cancelled) == "JOB_STATE_CANCELLED";
      },
      180))
      << Ptctl("list").out;
  StopCoordinator(SIGTERM);
  StartCoordinator("127.0.0.1:0");
  const Result succeeded = WatchJob(done);
  EXPECT_EQ(succeeded.rc, 0) << succeeded.out;
  EXPECT_NE(succeeded.out.find(done + " SUCCEEDED\n"), std::string::npos)
      << succeeded.out;
  const Result ended = WatchJob(cancelled);
  EXPECT_EQ(ended.rc, 3) << ended.out;
  EXPECT_NE(ended.out.find(cancelled + " CANCELLED\n"), std::string::npos)
      << ended.out;
}

// Ctrl-C on `ptctl submit --watch` stops the watching, not the job: ptctl
// says that the job keeps running and how to cancel it, and exits 130.
TEST_F(ControlPlaneTest, InterruptedWatchSaysTheJobKeepsRunning) {
  std::string sets;
  for (const std::string& set : kSmall) sets += " --set " + set;
  const fs::path out = dir_ / "submit.out";
  const pid_t ptctl = Spawn(
      PtctlCommand(absl::StrCat(
          "submit ", PT_SOURCE_DIR, "/examples/shakespeare-char.yaml --watch",
          sets, " --set train.steps=1000000 --set checkpoint.dir=",
          (dir_ / "ckpt").string())),
      out);
  // Watching once the first line of progress is out.
  ASSERT_TRUE(WaitFor(
      [&] { return ReadFile(out).find(" [") != std::string::npos; }, 120))
      << ReadFile(out);
  const std::string text = ReadFile(out);
  const std::string id = text.substr(0, text.find('\n'));
  ASSERT_EQ(kill(ptctl, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(waitpid(ptctl, &status, 0), ptctl);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_NE(ReadFile(out).find("ptctl: stopped watching; " + id +
                               " keeps running on ptcoord: `ptctl cancel " +
                               id + "` cancels it"),
            std::string::npos)
      << ReadFile(out);
  const std::string state = State(id);
  EXPECT_TRUE(state == "JOB_STATE_RUNNING" || state == "JOB_STATE_QUEUED")
      << state;
}

// `ptctl get` tells a pause and a cancel from a failure, and a value never
// measured from a 0: the attempt `pause` stopped shows "paused" (exit 3),
// the one `cancel` ended "cancelled", val_loss before any evaluation "—".
TEST_F(ControlPlaneTest, GetShowsPausedCancelledAndNeverMeasured) {
  const std::string id = Submit(
      {"train.steps=1000000", "train.eval_every=0", "checkpoint.every=0"});
  ASSERT_TRUE(WaitFor([&] { return Step(id) >= 5; }, 180)) << Get(id).dump();
  const Result running = Ptctl("get " + id);
  EXPECT_NE(running.out.find("val_loss:  —\n"), std::string::npos)
      << running.out;
  EXPECT_NE(running.out.find(": exit — (running)"), std::string::npos)
      << running.out;
  ASSERT_EQ(Ptctl("pause " + id).rc, 0);
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_PAUSED"; }, 120))
      << Get(id).dump();
  const int paused = Get(id)["job"]["attempts"].get<int>();
  ASSERT_EQ(Ptctl("resume " + id).rc, 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        const json j = Get(id);
        return j.contains("job") && j["job"]["attempts"] > paused &&
               j["job"]["state"] == "JOB_STATE_RUNNING";
      },
      120))
      << Get(id).dump();
  ASSERT_EQ(Ptctl("cancel " + id).rc, 0);
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_CANCELLED"; }, 120))
      << Get(id).dump();
  const int cancelled = Get(id)["job"]["attempts"].get<int>();
  const Result ended = Ptctl("get " + id);
  const auto line = [&](int attempt) {
    const size_t at = ended.out.find(absl::StrCat("attempt ", attempt, ": "));
    return at == std::string::npos
               ? std::string()
               : ended.out.substr(at, ended.out.find('\n', at) - at);
  };
  EXPECT_NE(line(paused).find(": exit 3 (paused)"), std::string::npos)
      << ended.out;
  EXPECT_NE(line(cancelled).find(" (cancelled)"), std::string::npos)
      << ended.out;
  EXPECT_NE(ended.out.find("val_loss:  —\n"), std::string::npos) << ended.out;
}

// Needs checkpoints and --resume-from in ptworker.
TEST_F(ControlPlaneTest, KilledRankResumesFromCheckpointBitIdentical) {
  // Steps enough that the rank is still there to kill once step 25 is
  // reported: the tiny model runs hundreds of steps a second.
  const std::vector<std::string> sets = {"train.steps=600", "parallel.dp=2",
                                         "checkpoint.every=10",
                                         "restart.max_restarts=2"};
  const std::string id = Submit(sets);
  ASSERT_TRUE(WaitFor([&] { return Step(id) >= 25; }, 180)) << Get(id).dump();
  std::vector<pid_t> ranks = JobProcesses(id);
  // Kill a rank, not mpirun or the wrapper shell: the one named ptworker.
  pid_t victim = 0;
  for (pid_t p : ranks) {
    std::ifstream comm(absl::StrCat("/proc/", p, "/comm"));
    std::string name;
    comm >> name;
    if (name == "ptworker") victim = p;
  }
  ASSERT_NE(victim, 0);
  kill(victim, SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_SUCCEEDED"; }, 240))
      << Get(id).dump();
  json resumed = Get(id);
  EXPECT_EQ(resumed["job"]["attempts"], 2);
  // The same spec uninterrupted (its own checkpoint folder).
  const std::string ref = Submit(sets);
  ASSERT_TRUE(
      WaitFor([&] { return State(ref) == "JOB_STATE_SUCCEEDED"; }, 240));
  auto final_loss = [](const json& j) {
    double loss = 0;
    int64_t step = -1;
    for (const json& p : j["loss_history"]) {
      const int64_t s = Int(p, "step");
      if (p.value("loss", 0.0) > 0 && s >= step) {
        step = s;
        loss = p["loss"].get<double>();
      }
    }
    return loss;
  };
  EXPECT_EQ(final_loss(resumed), final_loss(Get(ref)));
}

// The first and the last training step attempt `attempt` reported.
std::pair<int64_t, int64_t> StepsOfAttempt(const json& j, int attempt) {
  int64_t first = std::numeric_limits<int64_t>::max(), last = -1;
  for (const json& p : j["loss_history"]) {
    if (p.value("loss", 0.0) <= 0 || p.value("attempt", 0) != attempt) continue;
    first = std::min(first, Int(p, "step"));
    last = std::max(last, Int(p, "step"));
  }
  return {first, last};
}

// SIGUSR1 to the attempt's mpirun (a preemption notice), which forwards it
// to every rank: the ranks save a checkpoint of the step they are in, stop
// with exit code 3, and the job is requeued from it without using up a
// restart (max_restarts=0 here), its second attempt going on from the very
// next step: no step is lost or repeated. (Steps enough that the job is
// still running when signalled, however slow the machine; it is cancelled
// once the second attempt is seen going on.)
TEST_F(ControlPlaneTest, SignalledJobSavesStopsAndResumesWithoutARestart) {
  const std::string id =
      Submit({"train.steps=1000000", "parallel.dp=2", "checkpoint.every=0",
              "restart.max_restarts=0"});
  ASSERT_TRUE(WaitFor([&] { return Step(id) >= 25; }, 180)) << Get(id).dump();
  pid_t launcher = 0;
  for (pid_t p : JobProcesses(id)) {
    std::ifstream comm(absl::StrCat("/proc/", p, "/comm"));
    std::string name;
    comm >> name;
    if (name == "mpirun" || name == "orterun") launcher = p;
  }
  ASSERT_NE(launcher, 0);
  kill(launcher, SIGUSR1);
  ASSERT_TRUE(WaitFor(
      [&] {
        const json j = Get(id);
        return j.contains("job") && j["job"]["attempts"] == 2 &&
               StepsOfAttempt(j, 2).second >= StepsOfAttempt(j, 1).second + 5;
      },
      240))
      << Get(id).dump();
  const json j = Get(id);
  EXPECT_EQ(j["job"]["state"], "JOB_STATE_RUNNING") << j.dump();
  ASSERT_EQ(j["attempts"].size(), 2u) << j.dump();
  EXPECT_EQ(Int(j["attempts"][0], "exit_code"), 3) << j.dump();
  const int64_t stopped = StepsOfAttempt(j, 1).second;
  EXPECT_GE(stopped, 25);
  EXPECT_EQ(StepsOfAttempt(j, 2).first, stopped + 1) << j.dump();
  ASSERT_EQ(Ptctl("cancel " + id).rc, 0);
  EXPECT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_CANCELLED"; }, 120));
}

// The CPUs of "Cpus_allowed_list:\t0-2,5" in /proc/PID/status.
std::set<int> AllowedCpusOf(pid_t pid) {
  std::set<int> out;
  for (absl::string_view line : absl::StrSplit(
           ptrain::ReadWholeFile(absl::StrCat("/proc/", pid, "/status")),
           '\n')) {
    if (!absl::ConsumePrefix(&line, "Cpus_allowed_list:")) continue;
    for (absl::string_view range :
         absl::StrSplit(absl::StripAsciiWhitespace(line), ',')) {
      std::pair<std::string, std::string> ends = absl::StrSplit(range, '-');
      int lo = -1, hi = -1;
      if (!absl::SimpleAtoi(ends.first, &lo)) continue;
      if (ends.second.empty() || !absl::SimpleAtoi(ends.second, &hi)) hi = lo;
      for (int c = lo; c <= hi; ++c) out.insert(c);
    }
  }
  return out;
}

// Two one-rank jobs at once on a host of as many slots as CPUs: each rank
// is bound to CPUs of its own, which the job's placement names, and runs
// as many threads as it has CPUs (not one core for both, each running two
// threads on it).
TEST_F(ControlPlaneTest, ConcurrentJobsRunOnCpusOfTheirOwn) {
  const std::vector<int> cpus = ptrain::AllowedCpus();
  if (cpus.size() < 2)
    GTEST_SKIP() << "needs 2 CPUs, this test has " << cpus.size();
  StopCoordinator(SIGTERM);
  StartCoordinator("127.0.0.1:0", {"--local-slots", "2"});
  const std::string a =
      Submit({"train.steps=100000",
              "checkpoint.dir=" + (dir_ / "ckpt" / "a").string()});
  const std::string b =
      Submit({"train.steps=100000",
              "checkpoint.dir=" + (dir_ / "ckpt" / "b").string()});
  ASSERT_TRUE(WaitFor([&] { return Step(a) >= 1 && Step(b) >= 1; }, 120))
      << Get(a).dump() << Get(b).dump();
  std::vector<std::set<int>> bound;
  for (const std::string& id : {a, b}) {
    const std::vector<pid_t> rank = ptrain::ProcessesWithEnv(
        {"PTRAIN_JOB_ID=" + id, "OMPI_COMM_WORLD_RANK=0"});
    ASSERT_EQ(rank.size(), 1u) << id;
    const std::set<int> mine = AllowedCpusOf(rank[0]);
    EXPECT_EQ(mine.size(), cpus.size() / 2) << id;
    EXPECT_EQ(ptrain::ProcessEnv(rank[0], "OMP_NUM_THREADS"),
              absl::StrCat(mine.size()))
        << id;
    // ptctl get names them.
    const json placement = Get(id)["job"].value("placement", json::array());
    ASSERT_EQ(placement.size(), 1u) << placement.dump();
    std::set<int> shown;
    for (const json& c : placement[0].value("cpus", json::array())) {
      shown.insert(c.get<int>());
    }
    EXPECT_EQ(shown, mine) << placement.dump();
    bound.push_back(mine);
  }
  for (int c : bound[0]) EXPECT_FALSE(bound[1].contains(c)) << "CPU " << c;
  for (const std::string& id : {a, b}) {
    EXPECT_EQ(Ptctl("cancel " + id).rc, 0);
  }
}

// `ptctl submit --dry-run`: the effective spec, the layout, the memory of
// the rank that needs the most and where the job would start or why it
// would wait; nothing is stored or started, and bad input is refused as the
// submission would be (exit 2).
TEST_F(ControlPlaneTest, DryRunSaysWhatAJobWouldBeAndSubmitsNothing) {
  const std::string sets =
      " --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2"
      " --set checkpoint.dir=" +
      (dir_ / "ckpt").string();
  const Result free = Ptctl(
      "submit examples/shakespeare-char.yaml --dry-run --set "
      "parallel.dp=2 --set train.lr=0.004" +
      sets);
  ASSERT_EQ(free.rc, 0) << free.out;
  // The overrides applied, in the effective spec.
  EXPECT_TRUE(absl::StrContains(free.out, "lr: 0.004")) << free.out;
  EXPECT_TRUE(absl::StrContains(free.out, "# layout: 2 ranks")) << free.out;
  EXPECT_TRUE(
      absl::StrContains(free.out, "# memory of the rank that needs the most"))
      << free.out;
  EXPECT_TRUE(absl::StrContains(free.out, "its 2 ranks would start at once"))
      << free.out;
  EXPECT_TRUE(ListJobs().empty());
  // Bad input: refused, nothing stored.
  const Result bad = Ptctl(
      "submit examples/shakespeare-char.yaml --dry-run --set "
      "data.path=data/no-such-file.txt" +
      sets);
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_TRUE(absl::StrContains(bad.out, "data.path")) << bad.out;
  EXPECT_TRUE(ListJobs().empty());
  // The pool's 4 slots held by a running job: a dry run says it would wait.
  const std::string id = Submit({"train.steps=100000", "parallel.dp=4"});
  ASSERT_EQ(id, "job-0001");  // no dry run used an id
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_RUNNING"; }, 60));
  const Result waits =
      Ptctl("submit examples/shakespeare-char.yaml --dry-run" + sets);
  ASSERT_EQ(waits.rc, 0) << waits.out;
  EXPECT_TRUE(absl::StrContains(
      waits.out, "it would wait: its 1 ranks need more slots than the 0 of 4"))
      << waits.out;
  EXPECT_EQ(ListJobs().size(), 1u);
  EXPECT_EQ(Ptctl("cancel " + id).rc, 0);
}

// `parallel: auto`: refused by a ptcoord without --planner-profile, naming
// it; with one, the job runs (to the end) the layout `ptctl plan` proposes
// first for ptcoord's 4 slots, and `ptctl get` holds the measured step
// against the prediction.
TEST_F(ControlPlaneTest, AutoLayoutRunsWhatThePlannerProposes) {
  const std::string sets =
      " --set parallel=auto --set model.vocab_size=65 --set model.n_layer=2"
      " --set model.n_embd=32 --set model.n_head=2 --set train.steps=20"
      " --set train.sample_every=0 --set checkpoint.dir=" +
      (dir_ / "ckpt").string();
  const Result refused = Ptctl("submit examples/shakespeare-char.yaml" + sets);
  EXPECT_EQ(refused.rc, 2) << refused.out;
  EXPECT_TRUE(absl::StrContains(refused.out, "--planner-profile"))
      << refused.out;
  EXPECT_TRUE(ListJobs().empty());

  const std::string profile = (dir_ / "cpu-profile.json").string();
  std::ofstream(profile) << ptrain::testing::kCpuProfile;
  StopCoordinator(SIGTERM);
  StartCoordinator("127.0.0.1:0", {"--planner-profile", profile});
  const Result plan =
      Ptctl("-o json plan examples/shakespeare-char.yaml" + sets +
            " --nodes 1 --gpus-per-node 4 --profile " + profile);
  ASSERT_EQ(plan.rc, 0) << plan.out;
  const json proposed = json::parse(plan.out, nullptr, false);
  ASSERT_FALSE(proposed.is_discarded()) << plan.out;
  const std::string best = proposed["best"][0].value("layout", "");
  ASSERT_FALSE(best.empty()) << plan.out;

  const Result submitted =
      Ptctl("submit examples/shakespeare-char.yaml --watch" + sets);
  ASSERT_EQ(submitted.rc, 0) << submitted.out;
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  const json job = Get(id)["job"];
  EXPECT_EQ(job.value("state", ""), "JOB_STATE_SUCCEEDED") << job.dump();
  EXPECT_EQ(job["plan"].value("layout", ""), best) << job.dump();
  EXPECT_EQ(job["plan"].value("profile", ""), "test-cpu");
  EXPECT_EQ(job["spec"]["parallel"].value("layout", "?"), "") << job.dump();
  const Result get = Ptctl("get " + id);
  EXPECT_TRUE(absl::StrContains(get.out, "planned:   " + best)) << get.out;
  EXPECT_TRUE(absl::StrContains(get.out, "measured:  ")) << get.out;
}

// `ptctl extend JOB --steps N`: a SUCCEEDED job runs on from its last
// step's checkpoint (not from step 0) to N steps, and its lineage says so;
// a job that has not succeeded, or N not above train.steps, is refused
// (exit 2) and nothing changes.
TEST_F(ControlPlaneTest, ExtendedJobGoesOnFromItsLastStep) {
  const std::string id = Submit({"train.steps=20", "checkpoint.every=0"});
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_SUCCEEDED"; }, 120))
      << Get(id).dump();
  const Result few = Ptctl("extend " + id + " --steps 20");
  EXPECT_EQ(few.rc, 2) << few.out;
  EXPECT_TRUE(absl::StrContains(few.out, "must be more than")) << few.out;
  const Result more = Ptctl("extend " + id + " --steps 40");
  ASSERT_EQ(more.rc, 0) << more.out;
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_SUCCEEDED"; }, 120))
      << Get(id).dump();
  const json job = Get(id)["job"];
  EXPECT_EQ(Int(job["progress"], "step"), 40) << job.dump();
  EXPECT_EQ(job["attempts"], 2) << job.dump();
  // Attempt 2 resumed from step 20's checkpoint and trained 21..40 only.
  const std::string log =
      ReadFile(dir_ / "state" / "jobs" / id / "attempt-2" / "run.jsonl");
  EXPECT_TRUE(absl::StrContains(log, "\"step\":20,\"type\":\"resume\""))
      << log.substr(0, 600);
  EXPECT_TRUE(absl::StrContains(log, "\"step\":21,\"tok_per_s\""))
      << log.substr(0, 600);
  EXPECT_FALSE(absl::StrContains(log, "\"step\":1,\"tok_per_s\""))
      << log.substr(0, 600);
  EXPECT_TRUE(absl::StrContains(Ptctl("get " + id).out,
                                "lineage:   extended: 20 → 40 steps"));
  // A running job cannot be extended.
  const std::string running = Submit({"train.steps=100000"});
  ASSERT_TRUE(WaitFor([&] { return Step(running) >= 1; }, 120));
  const Result busy = Ptctl("extend " + running + " --steps 200000");
  EXPECT_EQ(busy.rc, 2) << busy.out;
  EXPECT_TRUE(absl::StrContains(busy.out, "only a SUCCEEDED job")) << busy.out;
  EXPECT_EQ(Int(Get(running)["job"]["progress"], "total_steps"), 100000);
  EXPECT_EQ(Ptctl("cancel " + running).rc, 0);
}

// `ptctl submit --from JOB@STEP`: a new job starts from another job's
// checkpoint (its weights, optimizer and step) with its own steps and
// learning rate, and keeps the lineage; another model, a step without a
// checkpoint, or a malformed --from is refused (exit 2) and nothing is
// stored.
TEST_F(ControlPlaneTest, ForkedJobStartsFromAnotherJobsCheckpoint) {
  const std::string source = Submit({"train.steps=20", "checkpoint.every=10"});
  ASSERT_TRUE(
      WaitFor([&] { return State(source) == "JOB_STATE_SUCCEEDED"; }, 120))
      << Get(source).dump();
  std::string sets;
  for (const std::string& s : kSmall) sets += " --set " + s;
  sets += " --set checkpoint.dir=" + (dir_ / "ckpt").string();
  const std::string submit = "submit examples/shakespeare-char.yaml" + sets;
  const Result other =
      Ptctl(submit + " --set model.n_embd=64 --from " + source);
  EXPECT_EQ(other.rc, 2) << other.out;
  EXPECT_TRUE(absl::StrContains(other.out, "model.n_embd")) << other.out;
  const Result no_step = Ptctl(submit + " --from " + source + "@15");
  EXPECT_EQ(no_step.rc, 2) << no_step.out;
  EXPECT_TRUE(absl::StrContains(no_step.out, "steps 10, 20")) << no_step.out;
  EXPECT_EQ(Ptctl(submit + " --from " + source + "@x").rc, 2);
  EXPECT_EQ(ListJobs().size(), 1u);

  const Result forked = Ptctl(submit +
                              " --set train.steps=30 --set "
                              "train.lr=0.002 --from " +
                              source + "@10");
  ASSERT_EQ(forked.rc, 0) << forked.out;
  const std::string id = forked.out.substr(0, forked.out.find('\n'));
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_SUCCEEDED"; }, 120))
      << Get(id).dump();
  const std::string log =
      ReadFile(dir_ / "state" / "jobs" / id / "attempt-1" / "run.jsonl");
  EXPECT_TRUE(absl::StrContains(log,
                                "step-00000010\",\"step\":10,"
                                "\"type\":\"resume\""))
      << log.substr(0, 600);
  EXPECT_TRUE(absl::StrContains(log, "\"step\":11,\"tok_per_s\""))
      << log.substr(0, 600);
  EXPECT_FALSE(absl::StrContains(log, "\"step\":1,\"tok_per_s\""))
      << log.substr(0, 600);
  const json job = Get(id)["job"];
  EXPECT_EQ(job["lineage"].value("from_job", ""), source) << job.dump();
  EXPECT_EQ(Int(job["lineage"], "from_step"), 10) << job.dump();
  EXPECT_EQ(Int(job["progress"], "step"), 30) << job.dump();
  EXPECT_TRUE(absl::StrContains(Ptctl("get " + id).out,
                                "lineage:   from " + source + " at step 10"));
}

// `ptctl pause`: the running job's ranks save the step they are in and
// stop, the job is PAUSED (no attempt runs, nothing is lost); `ptctl
// resume` queues it and the next attempt goes on from the next step.
// The spec names no checkpoint.dir (examples/names.yaml has none): ptcoord
// gives the job a folder of its own under its checkpoint root
// (STATE_DIR/checkpoints by default), so the pause loses nothing.
TEST_F(ControlPlaneTest, PausedJobSavesWaitsAndResumesWhereItStopped) {
  const std::string id =
      Submit({"train.steps=1000000", "parallel.dp=2", "checkpoint.every=0",
              "checkpoint.dir=\"''\""});
  const json submitted = Get(id);
  EXPECT_EQ(submitted["job"]["spec"]["checkpoint"]["dir"],
            (fs::weakly_canonical(dir_ / "state" / "checkpoints") /
             submitted["job"].value("uid", "?"))
                .string())
      << submitted.dump();
  ASSERT_TRUE(WaitFor([&] { return Step(id) >= 25; }, 180)) << Get(id).dump();
  Result r = Ptctl("pause " + id);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find(id + " pausing"), std::string::npos) << r.out;
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_PAUSED"; }, 120))
      << Get(id).dump();
  EXPECT_TRUE(WaitFor([&] { return JobProcesses(id).empty(); }, 30));
  const int64_t stopped = Step(id);
  EXPECT_EQ(StepsOfAttempt(Get(id), 1).second, stopped);
  sleep(1);
  EXPECT_EQ(State(id), "JOB_STATE_PAUSED");
  EXPECT_EQ(Get(id)["job"]["attempts"], 1);
  r = Ptctl("checkpoints " + id);
  EXPECT_NE(r.out.find(absl::StrFormat("step-%08d", stopped)),
            std::string::npos)
      << "no checkpoint of step " << stopped << ": " << r.out;
  r = Ptctl("resume " + id);
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_TRUE(WaitFor(
      [&] {
        const json j = Get(id);
        return j.contains("job") && j["job"]["attempts"] == 2 &&
               StepsOfAttempt(j, 2).second >= stopped + 5;
      },
      240))
      << Get(id).dump();
  EXPECT_EQ(StepsOfAttempt(Get(id), 2).first, stopped + 1);
  r = Ptctl("resume " + id);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("is RUNNING: only a PAUSED job can be resumed"),
            std::string::npos)
      << r.out;
  ASSERT_EQ(Ptctl("cancel " + id).rc, 0);
  EXPECT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_CANCELLED"; }, 120));
}

// Needs ptworker's PTRAIN_TEST_HANG_AT_STEP hook.
TEST_F(ControlPlaneTest, StalledRankIsKilledAsHangAndRestarted) {
  StopCoordinator(SIGTERM);
  setenv("PTRAIN_TEST_HANG_AT_STEP", "5", 1);
  StartCoordinator("127.0.0.1:0");
  unsetenv("PTRAIN_TEST_HANG_AT_STEP");
  const std::string id = Submit(
      {"train.steps=40", "restart.hang_timeout_s=3", "restart.max_restarts=1"});
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_FAILED"; }, 180))
      << Get(id).dump();
  json j = Get(id);
  EXPECT_EQ(j["job"]["attempts"], 2);
  EXPECT_NE(j["job"]["error"].get<std::string>().find("hang at step"),
            std::string::npos)
      << j.dump();
}

// ptctl diagnose (docs/diagnose.md): a 4-rank tp2·pp2 job whose rank
// stops (SIGSTOP), is stuck in a loop, or dies; the analysis of the
// ranks' flight recorder dumps names that rank and how.
class DiagnoseTest : public ControlPlaneTest {
 protected:
  // tp2·pp2 over 4 ranks, as small as the fixture's jobs.
  std::string SubmitFourRanks(const std::vector<std::string>& sets) {
    std::vector<std::string> all = {
        "model.n_layer=2",         "parallel.tp=2",      "parallel.pp=2",
        "parallel.microbatches=2", "train.steps=100000", "train.eval_every=0",
        "restart.max_restarts=0"};
    all.insert(all.end(), sets.begin(), sets.end());
    const std::string id = Submit(all);
    EXPECT_TRUE(WaitFor([&] { return Step(id) >= 3; }, 120)) << Get(id).dump();
    return id;
  }
  // The pid of world rank `rank` of the running attempt.
  pid_t RankPid(int rank) {
    const std::vector<pid_t> pids =
        ptrain::ProcessesWithEnv({"PTRAIN_COORDINATOR=" + address_,
                                  absl::StrCat("OMPI_COMM_WORLD_RANK=", rank)});
    return pids.size() == 1 ? pids[0] : 0;
  }
  json Diagnosis(const std::string& id, const std::string& flags = "") {
    Result r = Ptctl(absl::StrCat("-o json diagnose ", id, " ", flags));
    EXPECT_EQ(r.rc, 0) << r.out;
    json j = json::parse(r.out, nullptr, false);
    return j.is_discarded() ? json::object() : j;
  }
  // The state the analysis gives rank `rank`.
  static std::string RankState(const json& d, int rank) {
    if (!d.contains("ranks")) return "";
    for (const json& r : d["ranks"]) {
      if (r.value("rank", -1) == rank) return r.value("state", "");
    }
    return "";
  }
};

TEST_F(DiagnoseTest, StoppedRankIsNamedLiveAndWhenTheHangEndsTheAttempt) {
  // The web UI shows when rank 3 has reported a step (its step times).
  StopCoordinator(SIGTERM);
  StartCoordinator("127.0.0.1:0", {"--ui-listen", "127.0.0.1:0"});
  const std::string id = SubmitFourRanks({"restart.hang_timeout_s=20"});
  std::string ui;
  std::ifstream(dir_ / "state" / "ui_address") >> ui;
  int64_t reported = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        const json m = UiGet(ui, "/api/v1/jobs/" + id + "/metrics");
        if (!m.is_object() || !m.contains("ranks")) return false;
        for (const json& p : m["ranks"].value("points", json::array())) {
          if (p.value("rank", -1) == 3) reported = p.value("step", int64_t{0});
        }
        return reported > 0;
      },
      120));
  const pid_t victim = RankPid(3);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  // Live: the running attempt's ranks are asked for dumps; rank 3 cannot
  // answer, its process is in state T. The others may complete a call or
  // two before they block on it: the analysis is taken once two in a row
  // find them in the same calls (ptctl's text below must show those).
  json live;
  std::string seen;
  ASSERT_TRUE(WaitFor(
      [&] {
        live = Diagnosis(id);
        std::string where;
        for (int r : {0, 1, 2}) {
          if (live.contains("ranks") && live["ranks"].size() > 3) {
            where += live["ranks"][r].value("where", "") + "\n";
          }
        }
        const bool settled = !where.empty() && where == seen;
        seen = where;
        return settled;
      },
      60));
  EXPECT_EQ(live.value("culprits", json::array()), json::array({3}))
      << live.dump(1);
  EXPECT_EQ(RankState(live, 3), "stopped") << live.dump(1);
  for (int r : {0, 1, 2}) EXPECT_EQ(RankState(live, r), "waiting") << r;
  // Its node and pid, and the call rank 2 (its tensor-parallel partner)
  // waits in for it, by group, op and number.
  const json& three = live["ranks"][3];
  EXPECT_EQ(three.value("pid", 0), victim) << three.dump();
  // Its newest dump is from its start; its reports say where it stopped,
  // at or past the step the web UI saw.
  int64_t past = 0;
  EXPECT_TRUE(absl::SimpleAtoi(
      absl::StripPrefix(absl::string_view(three.value("where", ""))
                            .substr(0, three.value("where", "").find(' ', 10)),
                        "past step "),
      &past))
      << three.dump();
  EXPECT_GE(past, reported) << three.dump();
  EXPECT_FALSE(three.value("host", "").empty()) << three.dump();
  const std::string waits = live["ranks"][2].value("where", "");
  EXPECT_TRUE(absl::StrContains(waits, " #")) << waits;
  Result text = Ptctl("diagnose " + id);
  EXPECT_EQ(text.rc, 0);
  EXPECT_NE(text.out.find(absl::StrCat("rank 3 (node ", three.value("host", ""),
                                       ", pid ", victim, ") is stopped")),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find(waits.substr(0, waits.find(" in "))),
            std::string::npos)
      << text.out;
  // The hang timeout ends it: the analysis is the job's event and error.
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_FAILED"; }, 120))
      << Get(id).dump();
  const std::string error = Get(id)["job"].value("error", "");
  EXPECT_NE(error.find("hang at step"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 3"), std::string::npos) << error;
  EXPECT_NE(error.find("stopped"), std::string::npos) << error;
  // Once the processes are gone, ptctl diagnose gives what was seen then.
  EXPECT_EQ(RankState(Diagnosis(id, "--attempt 1"), 3), "stopped");
}

TEST_F(DiagnoseTest, RankStuckInComputeIsNamedWithItsPhase) {
  StopCoordinator(SIGTERM);
  setenv("PTRAIN_TEST_HANG_AT_STEP", "5", 1);
  setenv("PTRAIN_TEST_HANG_RANK", "1", 1);
  StartCoordinator("127.0.0.1:0");
  unsetenv("PTRAIN_TEST_HANG_AT_STEP");
  unsetenv("PTRAIN_TEST_HANG_RANK");
  const std::string id = SubmitFourRanks({"restart.hang_timeout_s=600"});
  // The others wait for rank 1 once it has stopped making progress.
  json d;
  ASSERT_TRUE(WaitFor(
      [&] {
        d = Diagnosis(id);
        return RankState(d, 1) == "compute";
      },
      60))
      << d.dump(1);
  EXPECT_EQ(d["culprits"], json::array({1})) << d.dump(1);
  EXPECT_EQ(RankState(d, 0), "waiting") << d.dump(1);
}

TEST_F(DiagnoseTest, KilledRankIsNamedAsDeadFromTheSurvivorsDumps) {
  const std::string id = SubmitFourRanks({"restart.hang_timeout_s=600"});
  // Healthy, its ranks wait for each other only for moments: no culprit.
  const json healthy = Diagnosis(id);
  EXPECT_EQ(healthy.value("culprits", json()), json::array())
      << healthy.dump(1);
  const pid_t victim = RankPid(2);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_FAILED"; }, 120))
      << Get(id).dump();
  const json d = Diagnosis(id);
  EXPECT_EQ(d.value("culprits", json::array()), json::array({2})) << d.dump(1);
  EXPECT_EQ(RankState(d, 2), "died") << d.dump(1);
}

TEST_F(DiagnoseTest, AJobWithoutDumpsSaysWhyForEachAttempt) {
  const std::string id = Submit({"train.steps=3"});
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_SUCCEEDED"; }, 120))
      << Get(id).dump();
  Result r = Ptctl("diagnose " + id);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("attempt 1 finished cleanly"), std::string::npos)
      << r.out;
  // Asked for by number: it ended, and how; its ranks were never asked.
  Result ended = Ptctl("diagnose " + id + " --attempt 1");
  EXPECT_EQ(ended.rc, 0) << ended.out;
  EXPECT_EQ(ended.out.rfind("attempt 1 ended (succeeded): ", 0), 0u)
      << ended.out;
  EXPECT_EQ(ended.out.find("setup"), std::string::npos) << ended.out;
  Result missing = Ptctl("diagnose " + id + " --attempt 2");
  EXPECT_EQ(missing.rc, 1) << missing.out;
  EXPECT_NE(missing.out.find("no attempt 2"), std::string::npos) << missing.out;
}

// An attempt's folder is its ranks' to write (and with --launcher nodes
// every node's). FIFOs and links to /dev/zero where ptcoord reads dumps,
// the stored analysis, logs and the run log stop nothing: while ptctl
// diagnose runs, of the running attempt and of the ended one, ptctl list
// answers; the web UI's job routes answer; ptctl logs and diagnose name
// each file they skipped. (The bounds below are for an answer that never
// comes: each answers in well under a second.)
TEST_F(ControlPlaneTest, HostileFilesInAnAttemptFolderHoldNothingUp) {
  StopCoordinator(SIGTERM);
  StartCoordinator("127.0.0.1:0", {"--ui-listen", "127.0.0.1:0"});
  const std::string id =
      Submit({"train.steps=100000", "restart.hang_timeout_s=600"});
  ASSERT_TRUE(WaitFor([&] { return Step(id) >= 2; }, 120)) << Get(id).dump();
  const fs::path a = dir_ / "state" / "jobs" / id / "attempt-1";
  // Ranks 1 and 2 are not of this one-rank world: no rank rewrites theirs.
  const std::vector<fs::path> fifos = {a / "flight" / "rank-00001.jsonl",
                                       a / "stderr.log", a / "run.jsonl"};
  for (const fs::path& f : fifos) {
    fs::remove(f);
    ASSERT_EQ(mkfifo(f.c_str(), 0600), 0) << f;
  }
  for (const fs::path& f : {a / "flight" / "rank-00002.jsonl",
                            a / "flight" / "analysis.txt", a / "stdout.log"}) {
    fs::remove(f);
    fs::create_symlink("/dev/zero", f);
  }
  // Writers that open and close end any read blocked on the FIFOs.
  const auto unblock = [&] {
    for (const fs::path& f : fifos)
      close(open(f.c_str(), O_WRONLY | O_NONBLOCK));
  };
  // ptctl diagnose, while ptctl list must answer; its output.
  const auto diagnose_while_listing = [&](const std::string& name) {
    const pid_t diagnose = Spawn(PtctlCommand("diagnose " + id), dir_ / name);
    for (int i = 0; i < 5; ++i) {
      Result list = Sh("timeout 10 " + PtctlCommand("list"));
      EXPECT_EQ(list.rc, 0) << "ptctl list did not answer: " << list.out;
    }
    int status = -1;
    const auto done = [&] {
      return waitpid(diagnose, &status, WNOHANG) == diagnose;
    };
    if (!WaitFor(done, 60)) {
      ADD_FAILURE() << "ptctl diagnose did not answer";
      WaitFor(
          [&] {
            unblock();
            return done();
          },
          60);
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    return Sh("cat " + (dir_ / name).string()).out;
  };

  // The running attempt.
  const std::string live = diagnose_while_listing("live.out");
  for (const char* skipped :
       {"skipped: rank-00001.jsonl: is a FIFO, not a regular file",
        "skipped: rank-00002.jsonl: is a symbolic link, not a regular file",
        "skipped: stderr.log: is a FIFO, not a regular file"}) {
    EXPECT_NE(live.find(skipped), std::string::npos) << skipped << "\n" << live;
  }
  std::string ui;
  std::ifstream(dir_ / "state" / "ui_address") >> ui;
  ASSERT_FALSE(ui.empty());
  const std::string job = "/api/v1/jobs/" + id;
  const json page = UiGet(ui, job);
  EXPECT_TRUE(page.is_object() && page.contains("job") &&
              page["job"].value("id", "") == id)
      << "the job's page did not answer: " << page.dump();
  for (const auto& [stream, why] :
       std::vector<std::pair<std::string, std::string>>{
           {"stderr", "is a FIFO, not a regular file"},
           {"stdout", "is a symbolic link, not a regular file"}}) {
    const json log = UiGet(ui, job + "/log?stream=" + stream);
    EXPECT_TRUE(log.is_object() &&
                log.value("omitted", json()).dump().find(why) !=
                    std::string::npos)
        << "the " << stream << " log did not answer why: " << log.dump();
  }
  // ptctl logs ends saying why, rather than waiting on the FIFO.
  Result logs = Sh("timeout 10 " + PtctlCommand("logs " + id));
  EXPECT_NE(logs.rc, 0) << logs.out;
  EXPECT_NE(logs.out.find("stdout.log: is a symbolic link, not a regular file"),
            std::string::npos)
      << logs.out;

  // The ended attempt: its logs are regular files again (the end is
  // decided from them), the dumps and the stored analysis are not.
  for (int i = 0; i < 20; ++i) unblock();
  for (const fs::path& f : {a / "stderr.log", a / "run.jsonl"}) {
    fs::remove(f);
    std::ofstream(f) << "";
  }
  ASSERT_EQ(Sh("timeout 60 " + PtctlCommand("cancel " + id)).rc, 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        return Sh("timeout 10 " + PtctlCommand("-o json get " + id))
                   .out.find("JOB_STATE_CANCELLED") != std::string::npos;
      },
      120));
  const std::string ended = diagnose_while_listing("ended.out");
  for (const char* part :
       {"attempt 1 ended (cancelled",
        "skipped: rank-00001.jsonl: is a FIFO, not a regular file",
        "skipped: analysis.txt: is a symbolic link, not a regular file"}) {
    EXPECT_NE(ended.find(part), std::string::npos) << part << "\n" << ended;
  }
}

TEST_F(ControlPlaneTest, StateDirIsPrivateAndHeldByOneCoordinator) {
  struct stat st;
  ASSERT_EQ(stat((dir_ / "state").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((dir_ / "state" / "ptcoord.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A second ptcoord on the same state dir refuses to start, saying why
  // (one that started anyway is stopped by `timeout` and fails the test).
  Result second = Sh(absl::StrCat(
      "timeout 20 ", PT_PTCOORD, " --listen 127.0.0.1:0 --state-dir ",
      (dir_ / "state").string(), " --token-file ", (dir_ / "tokens").string()));
  EXPECT_NE(second.rc, 0) << second.out;
  EXPECT_NE(second.out.find("state dir " + (dir_ / "state").string() +
                            " is in use by another ptcoord (pid " +
                            std::to_string(coordinator_) + ")"),
            std::string::npos)
      << second.out;
  // One that others may write is refused too.
  fs::create_directories(dir_ / "open");
  chmod((dir_ / "open").c_str(), 0777);
  Result open = Sh(absl::StrCat(
      "timeout 20 ", PT_PTCOORD, " --listen 127.0.0.1:0 --state-dir ",
      (dir_ / "open").string(), " --token-file ", (dir_ / "tokens").string()));
  EXPECT_NE(open.rc, 0);
  EXPECT_NE(open.out.find("writable by group or others"), std::string::npos)
      << open.out;
  EXPECT_EQ(Ptctl("list").rc, 0);  // the first one is unharmed
}

TEST_F(ControlPlaneTest, BadInputExitCodeFailsTheJobWithoutRestarts) {
  // A data file too short for one sequence: there at submit, refused by the
  // ranks (exit 2); every attempt would fail the same way.
  std::ofstream(dir_ / "ckpt" / "too-short.txt") << "ab\n";
  const std::string id =
      Submit({"train.steps=20", "restart.max_restarts=3",
              "data.path=" + (dir_ / "ckpt" / "too-short.txt").string()});
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_FAILED"; }, 120))
      << Get(id).dump();
  json j = Get(id);
  EXPECT_EQ(j["job"]["attempts"], 1) << j.dump();
  EXPECT_NE(j["job"]["error"].get<std::string>().find("code 2"),
            std::string::npos)
      << j.dump();
}

// The job finishes while ptcoord is down: the next ptcoord reads its end
// from the run log, and the rank token of the ended attempt is worthless.
TEST_F(ControlPlaneTest, JobThatEndedWhileCoordinatorWasDownIsCompleted) {
  // Steps enough that the ranks still run when their token is read: the
  // tiny model runs hundreds of steps a second.
  constexpr int kSteps = 400;
  const std::string id = Submit({absl::StrCat("train.steps=", kSteps),
                                 "parallel.dp=2", "checkpoint.every=20"});
  ASSERT_TRUE(WaitFor([&] { return Step(id) > 0; }, 120)) << Get(id).dump();
  const std::string token = RankToken(id);
  ASSERT_EQ(token.size(), 64u);
  // Reports are checked field by field at the RPC edge too.
  auto ranks = ptrain::v1::RankService::NewStub(channel_);
  ptrain::v1::ReportProgressRequest nan;
  nan.set_job_id(id);
  nan.set_attempt(1);
  nan.set_step(5);
  nan.set_loss(std::nan(""));
  ptrain::v1::ReportProgressResponse pr;
  grpc::Status s = ranks->ReportProgress(Ctx(token).get(), nan, &pr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_NE(s.error_message().find("loss"), std::string::npos);

  const std::string port = address_.substr(address_.rfind(':'));
  StopCoordinator(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return JobProcesses(id).empty(); }, 240));
  StartCoordinator("127.0.0.1" + port);
  json j = Get(id);
  EXPECT_EQ(j["job"]["state"], "JOB_STATE_SUCCEEDED") << j.dump();
  EXPECT_EQ(Int(j["job"]["progress"], "step"), kSteps) << j.dump();
  EXPECT_GT(j["job"]["progress"].value("loss", 0.0), 0.0) << j.dump();
  int64_t last = 0;
  for (const json& p : j["loss_history"]) last = std::max(last, Int(p, "step"));
  EXPECT_EQ(last, kSteps);
  Result cps = Ptctl("-o json checkpoints " + id);
  ASSERT_EQ(cps.rc, 0) << cps.out;
  json listed = json::parse(cps.out);
  ASSERT_FALSE(listed["checkpoints"].empty()) << cps.out;
  EXPECT_EQ(Int(listed["checkpoints"].back(), "step"), kSteps) << cps.out;

  // The ended attempt's token forges nothing (seen: a checkpoint at step
  // 123456 in /etc/forged listed by `ptctl checkpoints`).
  ranks = ptrain::v1::RankService::NewStub(channel_);  // the new ptcoord
  ptrain::v1::ReportCheckpointRequest forged;
  forged.set_job_id(id);
  forged.set_attempt(1);
  forged.set_step(123456);
  forged.set_dir("/etc/forged");
  ptrain::v1::ReportCheckpointResponse cr;
  s = ranks->ReportCheckpoint(Ctx(token).get(), forged, &cr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << s.error_message();
  ptrain::v1::ReportProgressRequest late = nan;
  late.set_loss(1.0);
  s = ranks->ReportProgress(Ctx(token).get(), late, &pr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Ptctl("-o json checkpoints " + id).out, cps.out);
  EXPECT_EQ(Int(Get(id)["job"]["progress"], "step"), kSteps);
}

// Fixture for a healthy job whose ptcoord goes away for a while: the job
// must not be killed as hung for the time nobody could hear it.
class CoordinatorAbsenceTest : public ControlPlaneTest {
 protected:
  // Restarts ptcoord so that every step of its jobs saves a checkpoint and
  // pauses in it (at least 0.25 s a step, so the job outlives the absence
  // whatever the machine's speed), submits `steps` steps and waits for the
  // first report.
  std::string SubmitSlowJob(int steps, int hang_timeout_s) {
    StopCoordinator(SIGTERM);
    setenv("PTRAIN_TEST_CHECKPOINT_PAUSE_S", "0.25", 1);
    StartCoordinator("127.0.0.1:0");
    unsetenv("PTRAIN_TEST_CHECKPOINT_PAUSE_S");
    steps_ = steps;
    const std::string id =
        Submit({absl::StrCat("train.steps=", steps), "checkpoint.every=1",
                "checkpoint.keep_last=2",
                absl::StrCat("restart.hang_timeout_s=", hang_timeout_s),
                "restart.max_restarts=0"});
    EXPECT_TRUE(WaitFor([&] { return Step(id) > 0; }, 120))
        << Get(id)["job"].dump();
    return id;
  }
  // Once ptcoord is back: the job ends as it would have without the
  // absence, in its first attempt, and had not ended before.
  void ExpectFinishesUnharmed(const std::string& id) {
    const int64_t at_return = Step(id);
    ASSERT_TRUE(WaitFor([&] { return State(id) != "JOB_STATE_RUNNING"; }, 300))
        << Get(id)["job"].dump();
    json j = Get(id);
    EXPECT_EQ(j["job"]["state"], "JOB_STATE_SUCCEEDED") << j["job"].dump();
    EXPECT_EQ(j["job"]["attempts"], 1) << j["job"].dump();
    EXPECT_EQ(j["job"]["error"], "") << j["job"].dump();
    EXPECT_LT(at_return, steps_) << "finished before ptcoord was back";
  }

  int steps_ = 0;
};

// Longer than gRPC's default reconnect backoff would wait: the ranks'
// reporters (backoff capped at 2 s) are back before the hang timeout that
// starts with the new ptcoord, so the re-adopted attempt is not killed.
TEST_F(CoordinatorAbsenceTest,
       LongCoordinatorOutageDoesNotKillHealthyJobAsHung) {
  const std::string id = SubmitSlowJob(300, 6);
  const std::string port = address_.substr(address_.rfind(':'));
  StopCoordinator(SIGKILL);
  // gRPC's default backoff (1 s, x1.6, up to 120 s) tries at about 26 s and
  // 43 s, then not before 70 s: far past the 6 s hang timeout.
  std::this_thread::sleep_for(std::chrono::seconds(45));
  ASSERT_FALSE(JobProcesses(id).empty())
      << "the job ended during the outage; the test proves nothing";
  StartCoordinator("127.0.0.1" + port);
  ExpectFinishesUnharmed(id);
}

// A ptcoord that cannot run for longer than the hang timeout (stopped here;
// in life a disk write stalled under its lock or an overloaded host) heard
// no report in that time because it was not listening, not because the
// ranks were silent: the healthy job lives on.
TEST_F(CoordinatorAbsenceTest, PausedCoordinatorDoesNotKillHealthyJobAsHung) {
  const std::string id = SubmitSlowJob(120, 4);
  ASSERT_EQ(kill(coordinator_, SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::seconds(8));
  const bool job_alive = !JobProcesses(id).empty();
  ASSERT_EQ(kill(coordinator_, SIGCONT), 0);
  ASSERT_TRUE(job_alive) << "the job ended during the pause; the test proves "
                            "nothing";
  ExpectFinishesUnharmed(id);
}

// A ptcoord that is gone for good (killed, its host lost) leaves no rank
// training unreported: past --orphan-grace-s the ranks stop together at the
// end of a step, after its checkpoint (exit 3), and the next ptcoord goes
// on from that step.
TEST_F(CoordinatorAbsenceTest, RanksOfAGoneCoordinatorStopAtACheckpoint) {
  StopCoordinator(SIGTERM);
  const std::vector<std::string> grace = {"--orphan-grace-s", "3"};
  StartCoordinator("127.0.0.1:0", grace);
  const std::string id =
      Submit({"train.steps=1000000", "parallel.dp=2", "checkpoint.every=0",
              "restart.max_restarts=0"});
  ASSERT_TRUE(WaitFor([&] { return Step(id) >= 5; }, 120)) << Get(id).dump();
  const std::string port = address_.substr(address_.rfind(':'));
  StopCoordinator(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return JobProcesses(id).empty(); }, 90))
      << "the ranks train on without a coordinator";
  StartCoordinator("127.0.0.1" + port, grace);
  ASSERT_TRUE(WaitFor(
      [&] {
        const json j = Get(id);
        const auto [first, last] = StepsOfAttempt(j, 2);
        return j.contains("job") && j["job"]["attempts"] == 2 && last >= 0 &&
               last >= first + 3;
      },
      180))
      << Get(id)["job"].dump();
  const json j = Get(id);
  EXPECT_EQ(Int(j["attempts"][0], "exit_code"), 3) << j["attempts"].dump();
  EXPECT_EQ(j["job"]["requeues"].value("stopped", 0), 1) << j["job"].dump();
  // Attempt 2 goes on from the step attempt 1 saved as it stopped.
  Result cps = Ptctl("-o json checkpoints " + id);
  ASSERT_EQ(cps.rc, 0) << cps.out;
  const json listed = json::parse(cps.out);
  ASSERT_FALSE(listed["checkpoints"].empty()) << cps.out;
  const int64_t saved = Int(listed["checkpoints"].front(), "step");
  EXPECT_GE(saved, 5) << cps.out;
  EXPECT_EQ(StepsOfAttempt(j, 2).first, saved + 1) << j["job"].dump();
  ASSERT_EQ(Ptctl("cancel " + id).rc, 0);
  EXPECT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_CANCELLED"; }, 120));
}

// TLS with client certificates: the ranks report over TLS (trusting the CA
// ptcoord hands them), ptctl needs the CA and a client certificate, and a
// plain-text client gets nowhere.
TEST_F(ControlPlaneTest, TlsJobSucceedsWithRanksReporting) {
  StopCoordinator(SIGTERM);
  MakeCertificates();
  const fs::path t = dir_ / "tls";
  credentials_ =
      grpc::SslCredentials({ReadFile(t / "ca.pem"), ReadFile(t / "client.key"),
                            ReadFile(t / "client.pem")});
  ptctl_tls_ = absl::StrCat(" --tls-ca ", (t / "ca.pem").string(),
                            " --tls-cert ", (t / "client.pem").string(),
                            " --tls-key ", (t / "client.key").string());
  StartCoordinator("127.0.0.1:0", {"--tls-cert", (t / "server.pem").string(),
                                   "--tls-key", (t / "server.key").string(),
                                   "--tls-ca", (t / "ca.pem").string(),
                                   "--tls-client-ca", (t / "ca.pem").string()});
  const std::string id = Submit({"train.steps=30", "parallel.dp=2"});
  ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_SUCCEEDED"; }, 180))
      << Get(id).dump() << Sh("cat " + (dir_ / "ptcoord.log").string()).out;
  json j = Get(id);
  EXPECT_EQ(Int(j["job"]["progress"], "step"), 30);
  EXPECT_GE(j["loss_history"].size(), 30u) << "the ranks' reports arrived";
  const std::string stderr_log =
      ReadFile(dir_ / "state" / "jobs" / id / "attempt-1" / "stderr.log");
  EXPECT_EQ(stderr_log.find("progress report to the coordinator failed"),
            std::string::npos)
      << stderr_log;

  const std::string tls = ptctl_tls_;
  ptctl_tls_ = "";  // no CA: plain text against a TLS port
  Result plain = Ptctl("list");
  EXPECT_EQ(plain.rc, 1) << plain.out;
  EXPECT_NE(plain.out.find("ptctl: error: UNAVAILABLE"), std::string::npos)
      << plain.out;
  ptctl_tls_ = " --tls-ca " + (t / "ca.pem").string();  // no client cert
  Result anonymous = Ptctl("list");
  EXPECT_EQ(anonymous.rc, 1);
  EXPECT_NE(anonymous.out.find("UNAUTHENTICATED"), std::string::npos)
      << anonymous.out;
  ptctl_tls_ = tls;
  EXPECT_EQ(Ptctl("list").rc, 0);

  auto insecure = ptrain::v1::JobService::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  ptrain::v1::ListJobsRequest list;
  ptrain::v1::ListJobsResponse listed;
  EXPECT_EQ(insecure->ListJobs(Ctx(kToken).get(), list, &listed).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A rank without the CA cannot report either.
  auto ranks = ptrain::v1::RankService::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  ptrain::v1::ReportProgressRequest p;
  p.set_job_id(id);
  ptrain::v1::ReportProgressResponse pr;
  EXPECT_EQ(ranks->ReportProgress(Ctx(kToken).get(), p, &pr).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

// TLS on one side only fails the call; ptctl says which side talks what
// and which flag to give or drop, in one line.
TEST_F(ControlPlaneTest, PtctlSaysWhenOnlyOneSideTalksTls) {
  MakeCertificates();
  const fs::path t = dir_ / "tls";
  ptctl_tls_ = " --tls-ca " + (t / "ca.pem").string();
  const Result to_plain = Ptctl("list");
  EXPECT_EQ(to_plain.rc, 1) << to_plain.out;
  EXPECT_EQ(to_plain.out, "ptctl: error: UNAVAILABLE: ptcoord at " + address_ +
                              " talks plain text, not TLS: drop --tls-ca\n");
  StopCoordinator(SIGTERM);
  credentials_ = grpc::SslCredentials({ReadFile(t / "ca.pem"), "", ""});
  StartCoordinator("127.0.0.1:0", {"--tls-cert", (t / "server.pem").string(),
                                   "--tls-key", (t / "server.key").string()});
  ptctl_tls_ = "";
  const Result to_tls = Ptctl("list");
  EXPECT_EQ(to_tls.rc, 1) << to_tls.out;
  EXPECT_EQ(to_tls.out,
            "ptctl: error: UNAVAILABLE: ptcoord at " + address_ +
                " serves TLS and ptctl talked plain text: give the CA that "
                "signed its certificate with --tls-ca (or PTCTL_TLS_CA)\n");
  ptctl_tls_ = " --tls-ca " + (t / "ca.pem").string();  // for TearDown
}

// TLS without client certificates: the CA alone is enough for ptctl.
TEST_F(ControlPlaneTest, TlsServerNeedsOnlyTheCaFromPtctl) {
  StopCoordinator(SIGTERM);
  MakeCertificates();
  const fs::path t = dir_ / "tls";
  credentials_ = grpc::SslCredentials({ReadFile(t / "ca.pem"), "", ""});
  StartCoordinator("127.0.0.1:0", {"--tls-cert", (t / "server.pem").string(),
                                   "--tls-key", (t / "server.key").string()});
  Result plain = Ptctl("list");
  EXPECT_EQ(plain.rc, 1);
  EXPECT_NE(plain.out.find("UNAVAILABLE"), std::string::npos) << plain.out;
  ptctl_tls_ = " --tls-ca " + (t / "ca.pem").string();
  Result ok = Ptctl("list");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  setenv("PTCTL_TLS_CA", (t / "ca.pem").c_str(), 1);
  ptctl_tls_ = "";
  ok = Ptctl("list");
  unsetenv("PTCTL_TLS_CA");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  ptctl_tls_ = " --tls-ca " + (t / "ca.pem").string();
}

// A client certificate ptcoord's --tls-client-ca did not sign ends the
// handshake, which gRPC reports as "Socket closed". ptctl says that ptcoord
// refused the certificate, who issued it, and which CA ptcoord wants (the
// names its certificate request carries); and, as siblings, an expired
// certificate, a --tls-ca that did not sign ptcoord's certificate, and a
// certificate that does not name the host dialed.
TEST_F(ControlPlaneTest, PtctlSaysPtcoordRefusedItsClientCertificateAndWhy) {
  StopCoordinator(SIGTERM);
  MakeCertificates();
  MakeOtherCertificates();
  const fs::path t = dir_ / "tls";
  credentials_ =
      grpc::SslCredentials({ReadFile(t / "ca.pem"), ReadFile(t / "client.key"),
                            ReadFile(t / "client.pem")});
  StartCoordinator("127.0.0.1:0", {"--tls-cert", (t / "server.pem").string(),
                                   "--tls-key", (t / "server.key").string(),
                                   "--tls-client-ca", (t / "ca.pem").string()});
  const std::string ca = " --tls-ca " + (t / "ca.pem").string();
  const auto one_line = [](const Result& r) {
    return std::count(r.out.begin(), r.out.end(), '\n') == 1;
  };
  ptctl_tls_ = ca + " --tls-cert " + (t / "stranger.pem").string() +
               " --tls-key " + (t / "stranger.key").string();
  const Result stranger = Ptctl("list");
  EXPECT_EQ(stranger.rc, 1) << stranger.out;
  EXPECT_TRUE(one_line(stranger)) << stranger.out;
  for (const std::string& part :
       {absl::StrCat("ptctl: error: UNAVAILABLE: ptcoord at ", address_,
                     " refused the client certificate of --tls-cert ",
                     (t / "stranger.pem").string()),
        std::string("(CN=stranger, issued by CN=other-ca; it ended the TLS "
                    "handshake)"),
        std::string("it expects one issued by the CA of its --tls-client-ca "
                    "(CN=ptrain-test-ca)")}) {
    EXPECT_TRUE(absl::StrContains(stranger.out, part))
        << "no '" << part << "' in " << stranger.out;
  }
  // From the environment, the variable is named.
  ptctl_tls_ = ca;
  setenv("PTCTL_TLS_CERT", (t / "stranger.pem").c_str(), 1);
  setenv("PTCTL_TLS_KEY", (t / "stranger.key").c_str(), 1);
  const Result from_env = Ptctl("list");
  unsetenv("PTCTL_TLS_CERT");
  unsetenv("PTCTL_TLS_KEY");
  EXPECT_TRUE(absl::StrContains(
      from_env.out, "refused the client certificate of PTCTL_TLS_CERT " +
                        (t / "stranger.pem").string()))
      << from_env.out;
  // The right CA's certificate, expired.
  ptctl_tls_ = ca + " --tls-cert " + (t / "expired.pem").string() +
               " --tls-key " + (t / "expired.key").string();
  const Result expired = Ptctl("list");
  EXPECT_EQ(expired.rc, 1) << expired.out;
  EXPECT_TRUE(absl::StrContains(expired.out, "issued by CN=ptrain-test-ca"))
      << expired.out;
  EXPECT_TRUE(absl::StrContains(expired.out, "this certificate expired on"))
      << expired.out;
  // A --tls-ca that did not sign ptcoord's certificate.
  const std::string mine = " --tls-cert " + (t / "client.pem").string() +
                           " --tls-key " + (t / "client.key").string();
  ptctl_tls_ = " --tls-ca " + (t / "other-ca.pem").string() + mine;
  const Result untrusted = Ptctl("list");
  EXPECT_EQ(untrusted.rc, 1) << untrusted.out;
  EXPECT_TRUE(one_line(untrusted)) << untrusted.out;
  EXPECT_TRUE(absl::StrContains(
      untrusted.out,
      absl::StrCat("ptcoord at ", address_,
                   " presented a certificate (CN=localhost, issued by "
                   "CN=ptrain-test-ca) that the CA of --tls-ca ",
                   (t / "other-ca.pem").string(), " does not verify")))
      << untrusted.out;
  ptctl_tls_ = ca + mine;
  const Result right = Ptctl("list");
  EXPECT_EQ(right.rc, 0) << right.out;
  // A certificate that names localhost only, dialed as 127.0.0.1.
  StopCoordinator(SIGTERM);
  StartCoordinator("127.0.0.1:0", {"--tls-cert", (t / "dns-only.pem").string(),
                                   "--tls-key", (t / "dns-only.key").string()});
  ptctl_tls_ = ca;
  const Result mismatch = Ptctl("list");
  EXPECT_EQ(mismatch.rc, 1) << mismatch.out;
  EXPECT_TRUE(absl::StrContains(
      mismatch.out, absl::StrCat("ptcoord's certificate (CN=localhost) does "
                                 "not name the host of ",
                                 address_)))
      << mismatch.out;
}

// Client input comes back in refusals bounded (common/echo.h): a 100 KB job
// id is a NOT_FOUND of a few hundred bytes, never a status too large for
// gRPC's headers, in every RPC that takes one, and so are a spec's long
// keys and paths.
TEST_F(ControlPlaneTest, ClientInputComesBackBoundedInEveryRefusal) {
  auto stub = ptrain::v1::JobService::NewStub(channel_);
  const std::string huge(100 * 1024, 'j');
  const auto bounded = [](const grpc::Status& s, grpc::StatusCode code,
                          const std::string& what) {
    EXPECT_EQ(s.error_code(), code)
        << what << ": " << s.error_message().substr(0, 300);
    EXPECT_LT(s.error_message().size(), 1000u) << what;
    EXPECT_TRUE(absl::StrContains(s.error_message(), " bytes)"))
        << what << ": " << s.error_message().substr(0, 300);
  };
  using grpc::StatusCode;
  using Stub = ptrain::v1::JobService::Stub;
  // `rpc` with the request's job id (or node name) the huge value.
  const auto call = [&](auto rpc, auto request, auto response,
                        const char* what) {
    if constexpr (requires { request.set_job_id(huge); }) {
      request.set_job_id(huge);
    } else {
      request.set_name(huge);
    }
    bounded((stub.get()->*rpc)(Ctx(kToken).get(), request, &response),
            StatusCode::NOT_FOUND, what);
  };
  namespace v1 = ptrain::v1;
  call(&Stub::GetJob, v1::GetJobRequest(), v1::GetJobResponse(), "GetJob");
  call(&Stub::CancelJob, v1::CancelJobRequest(), v1::CancelJobResponse(),
       "CancelJob");
  call(&Stub::PauseJob, v1::PauseJobRequest(), v1::PauseJobResponse(),
       "PauseJob");
  call(&Stub::ResumeJob, v1::ResumeJobRequest(), v1::ResumeJobResponse(),
       "ResumeJob");
  call(&Stub::ListCheckpoints, v1::ListCheckpointsRequest(),
       v1::ListCheckpointsResponse(), "ListCheckpoints");
  call(&Stub::DiagnoseJob, v1::DiagnoseJobRequest(), v1::DiagnoseJobResponse(),
       "DiagnoseJob");
  call(&Stub::DrainNode, v1::DrainNodeRequest(), v1::DrainNodeResponse(),
       "DrainNode");
  call(&Stub::ForgetNode, v1::ForgetNodeRequest(), v1::ForgetNodeResponse(),
       "ForgetNode");
  call(&Stub::ApproveNode, v1::ApproveNodeRequest(), v1::ApproveNodeResponse(),
       "ApproveNode");
  call(&Stub::DeleteJob, v1::DeleteJobRequest(), v1::DeleteJobResponse(),
       "DeleteJob");
  call(&Stub::ListEvents, v1::ListEventsRequest(), v1::ListEventsResponse(),
       "ListEvents");
  {
    ptrain::v1::WatchJobRequest r;
    r.set_job_id(huge);
    auto ctx = Ctx(kToken);
    auto reader = stub->WatchJob(ctx.get(), r);
    ptrain::v1::JobEvent ev;
    while (reader->Read(&ev)) {
    }
    bounded(reader->Finish(), StatusCode::NOT_FOUND, "WatchJob");
  }
  {
    ptrain::v1::StreamLogsRequest r;
    r.set_job_id(huge);
    auto ctx = Ctx(kToken);
    auto reader = stub->StreamLogs(ctx.get(), r);
    ptrain::v1::LogChunk chunk;
    while (reader->Read(&chunk)) {
    }
    bounded(reader->Finish(), StatusCode::NOT_FOUND, "StreamLogs");
  }
  const std::string spec =
      ReadFile(fs::path(PT_SOURCE_DIR) / "examples/shakespeare-char.yaml");
  const auto submit = [&](const std::string& override_text) {
    ptrain::v1::SubmitJobRequest r;
    r.set_spec_yaml(spec);
    r.add_overrides(override_text);
    ptrain::v1::SubmitJobResponse out;
    return stub->SubmitJob(Ctx(kToken).get(), r, &out);
  };
  bounded(submit(std::string(100 * 1024, 'k') + "=1"),
          StatusCode::INVALID_ARGUMENT, "an override's unknown key");
  bounded(submit("train." + std::string(100 * 1024, 'k') + "=1"),
          StatusCode::INVALID_ARGUMENT, "an override's unknown field");
  bounded(submit("data.path=/" + std::string(60 * 1024, 'p')),
          StatusCode::INVALID_ARGUMENT, "a path outside the data roots");
  EXPECT_TRUE(ListJobs().empty());
  // As ptctl shows it: one short line.
  const Result get = Ptctl("get " + huge);
  EXPECT_EQ(get.rc, 1) << get.out.substr(0, 300);
  EXPECT_LT(get.out.size(), 1000u);
  EXPECT_TRUE(absl::StartsWith(get.out, "ptctl: error: NOT_FOUND: no job 'jjj"))
      << get.out.substr(0, 300);
}

// Nodes: ptworkerd registers with the cluster's join token, heartbeats,
// is DOWN once its heartbeats stop, and registers again after a ptcoord
// restart; a wrong token or a bad registration changes nothing.
class NodesTest : public ControlPlaneTest {
 protected:
  static constexpr const char* kJoinToken = "join-token-for-tests";

  void SetUp() override {
    ControlPlaneTest::SetUp();
    std::ofstream(dir_ / "join-tokens") << kJoinToken << "\n";
    std::ofstream(dir_ / "wrong-token") << "not-the-join-token\n";
    port_ = address_.substr(address_.rfind(':'));
    StopCoordinator(SIGTERM);
    StartCoordinator("127.0.0.1" + port_, NodeFlags());
  }
  void TearDown() override {
    for (auto& [name, pid] : daemons_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    ControlPlaneTest::TearDown();
  }
  std::vector<std::string> NodeFlags() {
    return {"--join-token-file", (dir_ / "join-tokens").string(),
            "--node-timeout-s", "2"};
  }
  // Starts ptworkerd as node `name` (unless `extra` names another with
  // --name), its output in dir_/NAME.log.
  // `advertise` "": the daemon advertises its --listen host and bound port
  // (127.0.0.1:PORT), which ptcoord checks it can reach.
  pid_t StartDaemon(const std::string& name,
                    const std::string& token_file = "join-tokens",
                    const std::string& advertise = "",
                    const std::vector<std::string>& extra = {}) {
    const auto given = [&](const char* flag) {
      return std::find(extra.begin(), extra.end(), flag) != extra.end();
    };
    std::vector<std::string> argv = {PT_PTWORKERD,
                                     "--coordinator",
                                     address_,
                                     "--slots",
                                     "3",
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--join-token-file",
                                     (dir_ / token_file).string()};
    if (!given("--name")) argv.insert(argv.end(), {"--name", name});
    if (!advertise.empty()) {
      argv.insert(argv.end(), {"--advertise", advertise});
    }
    // The daemons' node secrets stay in the test's folder unless a test
    // gives one of its own.
    if (!given("--state-dir")) {
      argv.insert(argv.end(), {"--state-dir", (dir_ / "ptworkerd").string()});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      const std::string log = (dir_ / (name + ".log")).string();
      freopen(log.c_str(), "a", stdout);
      freopen(log.c_str(), "a", stderr);
      execv(args[0], args.data());
      _exit(127);
    }
    daemons_[name] = pid;
    return pid;
  }
  // Starts ptworkerd as node `name` (join-tokens, advertising
  // 127.0.0.1:PORT), waits until ptcoord lists it up and returns a stub of
  // its DaemonService at the bound port; null, with a failure naming its
  // log, when it never comes up.
  std::unique_ptr<ptrain::v1::DaemonService::Stub> UpDaemon(
      const std::string& name) {
    StartDaemon(name);
    if (!WaitFor([&] { return NodeState(name) == "NODE_STATE_UP"; }, 30)) {
      ADD_FAILURE() << ReadFile(dir_ / (name + ".log"));
      return nullptr;
    }
    const std::string address = Nodes()[name]["spec"].value("address", "");
    const std::string port = address.substr(address.rfind(':') + 1);
    return ptrain::v1::DaemonService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + port, grpc::InsecureChannelCredentials()));
  }
  // The nodes ptctl lists, by name.
  std::map<std::string, json> Nodes() {
    Result r = Ptctl("-o json nodes");
    json j = json::parse(r.out, nullptr, false);
    std::map<std::string, json> out;
    if (j.is_discarded() || !j.contains("nodes")) return out;
    for (const json& n : j["nodes"]) out[n["spec"].value("name", "")] = n;
    return out;
  }
  std::string NodeState(const std::string& name) {
    auto nodes = Nodes();
    auto it = nodes.find(name);
    return it == nodes.end() ? "" : it->second.value("state", "");
  }

  std::string port_;
  std::map<std::string, pid_t> daemons_;
};

TEST_F(NodesTest, NodeJoinsHeartbeatsAndIsDownOnceItsDaemonDies) {
  StartDaemon("node-a");
  ASSERT_TRUE(
      WaitFor([&] { return NodeState("node-a") == "NODE_STATE_UP"; }, 30))
      << ReadFile(dir_ / "node-a.log");
  const json n = Nodes()["node-a"];
  EXPECT_EQ(n["spec"]["slots"], 3) << n.dump();
  // Without --advertise: its --listen host and the port it bound.
  EXPECT_TRUE(absl::StartsWith(n["spec"].value("address", ""), "127.0.0.1:"))
      << n.dump();
  EXPECT_GT(Int(n["spec"], "memory_bytes"), 0) << n.dump();
  // Still up after several timeouts: it heartbeats.
  std::this_thread::sleep_for(std::chrono::seconds(5));
  EXPECT_EQ(NodeState("node-a"), "NODE_STATE_UP");
  const Result table = Ptctl("nodes");
  EXPECT_NE(table.out.find("node-a"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("UP"), std::string::npos) << table.out;

  kill(daemons_["node-a"], SIGKILL);
  waitpid(daemons_["node-a"], nullptr, 0);
  daemons_.erase("node-a");
  EXPECT_TRUE(
      WaitFor([&] { return NodeState("node-a") == "NODE_STATE_DOWN"; }, 30));
}

TEST_F(NodesTest, WrongJoinTokenOrBadRegistrationChangesNothing) {
  const pid_t pid = StartDaemon("node-b", "wrong-token");
  int status = 0;
  ASSERT_TRUE(
      WaitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, 30));
  daemons_.erase("node-b");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  EXPECT_NE(ReadFile(dir_ / "node-b.log").find("join token refused"),
            std::string::npos)
      << ReadFile(dir_ / "node-b.log");
  EXPECT_TRUE(Nodes().empty());

  // The join token right, the registration wrong: the field is named.
  auto stub = ptrain::v1::NodeService::NewStub(channel_);
  ptrain::v1::RegisterNodeRequest req;
  req.mutable_node()->set_name("Bad_Name");
  req.mutable_node()->set_address("10.0.0.1:7071");
  req.mutable_node()->set_slots(2);
  req.mutable_node()->set_cores(2);
  ptrain::v1::RegisterNodeResponse resp;
  grpc::Status s = stub->Register(Ctx(kJoinToken).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("node.name"), std::string::npos)
      << s.error_message();
  req.mutable_node()->set_name("node-c");
  req.mutable_node()->set_slots(0);
  s = stub->Register(Ctx(kJoinToken).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("node.slots"), std::string::npos)
      << s.error_message();
  // A user token is not a join token.
  req.mutable_node()->set_slots(2);
  s = stub->Register(Ctx(kToken).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // A heartbeat of a session nobody registered.
  ptrain::v1::NodeHeartbeatRequest beat;
  beat.set_name("node-c");
  beat.set_session("made-up");
  ptrain::v1::NodeHeartbeatResponse none;
  s = stub->Heartbeat(Ctx(kJoinToken).get(), beat, &none);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Nodes().empty());
}

// An address ptrsh could not dial is refused where it is given, with the
// fix: ptworkerd will not advertise a name that does not resolve, and
// ptcoord takes no registration whose address it cannot resolve or reach
// (rather than every attempt placed there failing in mpirun).
TEST_F(NodesTest, AnAddressPtcoordCannotReachIsRefusedWithTheFix) {
  const pid_t pid =
      StartDaemon("node-x", "join-tokens", "no-such-node.invalid:7071");
  int status = 0;
  ASSERT_TRUE(
      WaitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, 30));
  daemons_.erase("node-x");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  const std::string log = ReadFile(dir_ / "node-x.log");
  EXPECT_NE(log.find("--advertise no-such-node.invalid:7071: 'no-such-node."
                     "invalid' does not resolve"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("give --advertise HOST:PORT"), std::string::npos) << log;

  auto stub = ptrain::v1::NodeService::NewStub(channel_);
  ptrain::v1::RegisterNodeRequest req;
  req.mutable_node()->set_name("node-c");
  req.mutable_node()->set_address("no-such-node.invalid:7071");
  req.mutable_node()->set_slots(2);
  req.mutable_node()->set_cores(2);
  ptrain::v1::RegisterNodeResponse resp;
  grpc::Status s = stub->Register(Ctx(kJoinToken).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("node node-c advertises "
                                   "no-such-node.invalid:7071, which ptcoord "
                                   "cannot resolve"),
            std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("--advertise HOST:PORT"), std::string::npos)
      << s.error_message();
  // Resolves, but nothing listens there (port 1: refused at once).
  req.mutable_node()->set_address("127.0.0.1:1");
  s = stub->Register(Ctx(kJoinToken).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("which ptcoord cannot reach (cannot "
                                   "connect to 127.0.0.1:1"),
            std::string::npos)
      << s.error_message();
  EXPECT_TRUE(Nodes().empty());
}

TEST_F(NodesTest, NodesRegisterAgainAfterACoordinatorRestart) {
  StartDaemon("node-a");
  ASSERT_TRUE(
      WaitFor([&] { return NodeState("node-a") == "NODE_STATE_UP"; }, 30))
      << ReadFile(dir_ / "node-a.log");
  const int64_t first = Int(Nodes()["node-a"], "registered_unix_ms");
  StopCoordinator(SIGKILL);
  StartCoordinator("127.0.0.1" + port_, NodeFlags());
  // Known from the store at once, and up again once the daemon learns that
  // its session is gone and registers anew.
  EXPECT_EQ(Nodes().count("node-a"), 1u);
  ASSERT_TRUE(WaitFor(
      [&] {
        const json n = Nodes()["node-a"];
        return n.value("state", "") == "NODE_STATE_UP" &&
               Int(n, "registered_unix_ms") > first;
      },
      30))
      << ReadFile(dir_ / "node-a.log");
}

// The probe: with the join token alone, a registration of a live node's
// name with a new address was taken, and the next job's token went to the
// impostor. Now a name is bound to the daemon that registered it first: an
// impostor is refused and seen, the real daemon comes back with its secret
// (across a ptcoord restart too), and a reinstalled node without it joins
// only once an operator has forgotten the node.
TEST_F(NodesTest, ANodeNameIsBoundToItsDaemonAndForgottenOnlyByAnOperator) {
  const pid_t real = StartDaemon("node-a");
  ASSERT_TRUE(
      WaitFor([&] { return NodeState("node-a") == "NODE_STATE_UP"; }, 30))
      << ReadFile(dir_ / "node-a.log");
  auto stub = ptrain::v1::NodeService::NewStub(channel_);
  const std::string address = Nodes()["node-a"]["spec"].value("address", "");
  ptrain::v1::RegisterNodeRequest impostor;
  impostor.mutable_node()->set_name("node-a");
  // An address ptcoord reaches (the real daemon's): the name is what fails.
  impostor.mutable_node()->set_address(address);
  impostor.mutable_node()->set_slots(3);
  impostor.mutable_node()->set_cores(2);
  ptrain::v1::RegisterNodeResponse resp;
  grpc::Status s = stub->Register(Ctx(kJoinToken).get(), impostor, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << s.error_message();
  EXPECT_NE(s.error_message().find("ptctl forget-node node-a"),
            std::string::npos)
      << s.error_message();
  const json after = Nodes()["node-a"];
  EXPECT_EQ(after["spec"]["address"], address) << after.dump();
  EXPECT_EQ(after.value("state", ""), "NODE_STATE_UP") << after.dump();
  EXPECT_EQ(after.value("refused_registrations", 0), 1) << after.dump();
  EXPECT_NE(Ptctl("nodes").out.find("1 registration(s) refused"),
            std::string::npos);
  EXPECT_NE(
      ReadFile(dir_ / "ptcoord.log").find("node node-a: registration refused"),
      std::string::npos);
  // The real daemon restarts, after ptcoord did: it proves the name.
  kill(real, SIGKILL);
  waitpid(real, nullptr, 0);
  daemons_.erase("node-a");
  StopCoordinator(SIGKILL);
  StartCoordinator("127.0.0.1" + port_, NodeFlags());
  const int64_t before = Int(Nodes()["node-a"], "registered_unix_ms");
  StartDaemon("node-a");
  ASSERT_TRUE(WaitFor(
      [&] {
        const json n = Nodes()["node-a"];
        return n.value("state", "") == "NODE_STATE_UP" &&
               Int(n, "registered_unix_ms") > before;
      },
      30))
      << ReadFile(dir_ / "node-a.log");
  // A reinstalled node-a (no secret: another state dir) is refused and
  // told what to do; the node and its daemon are unharmed.
  const std::vector<std::string> reinstalled = {
      "--name", "node-a", "--state-dir", (dir_ / "reinstalled").string()};
  const pid_t fresh =
      StartDaemon("node-a-reinstalled", "join-tokens", "", reinstalled);
  int status = 0;
  ASSERT_TRUE(
      WaitFor([&] { return waitpid(fresh, &status, WNOHANG) == fresh; }, 30));
  daemons_.erase("node-a-reinstalled");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  EXPECT_NE(ReadFile(dir_ / "node-a-reinstalled.log")
                .find("ptctl forget-node node-a"),
            std::string::npos)
      << ReadFile(dir_ / "node-a-reinstalled.log");
  EXPECT_EQ(NodeState("node-a"), "NODE_STATE_UP");
  // Forgetting needs the node down; then the reinstalled one joins.
  Result up = Ptctl("forget-node node-a");
  EXPECT_EQ(up.rc, 1) << up.out;
  EXPECT_NE(up.out.find("FAILED_PRECONDITION"), std::string::npos) << up.out;
  kill(daemons_["node-a"], SIGKILL);
  waitpid(daemons_["node-a"], nullptr, 0);
  daemons_.erase("node-a");
  ASSERT_TRUE(
      WaitFor([&] { return NodeState("node-a") == "NODE_STATE_DOWN"; }, 30));
  Result forgot = Ptctl("forget-node node-a");
  EXPECT_EQ(forgot.rc, 0) << forgot.out;
  EXPECT_TRUE(Nodes().empty());
  StartDaemon("node-a-reinstalled", "join-tokens", "", reinstalled);
  EXPECT_TRUE(
      WaitFor([&] { return NodeState("node-a") == "NODE_STATE_UP"; }, 30))
      << ReadFile(dir_ / "node-a-reinstalled.log");
}

// A process that carries an attempt's uid, as ranks do; its pid.
pid_t StartAttemptProcess(const std::string& uid) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string env = "PTRAIN_ATTEMPT_UID=" + uid;
    char* const argv[] = {const_cast<char*>("/bin/sleep"),
                          const_cast<char*>("600"), nullptr};
    char* const envp[] = {const_cast<char*>(env.c_str()), nullptr};
    execve(argv[0], argv, envp);
    _exit(127);
  }
  return pid;
}

bool Ended(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, WNOHANG) == pid;
}

TEST_F(NodesTest, KillAttemptNeedsTheJoinTokenAndKillsOnlyThatAttempt) {
  auto stub = UpDaemon("node-k");
  ASSERT_NE(stub, nullptr);
  const pid_t mine = StartAttemptProcess("job-1.1.aaaa");
  const pid_t other = StartAttemptProcess("job-2.1.bbbb");
  auto call = [&](const std::string& token, const std::string& uid) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    ptrain::v1::KillAttemptRequest req;
    req.set_attempt_uid(uid);
    ptrain::v1::KillAttemptResponse resp;
    grpc::Status s = stub->KillAttempt(&ctx, req, &resp);
    return std::make_pair(s, resp.processes());
  };
  auto [refused, n0] = call("not-the-join-token", "job-1.1.aaaa");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(n0, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(Ended(mine));
  auto [ok, n1] = call(kJoinToken, "job-1.1.aaaa");
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(n1, 1);
  EXPECT_TRUE(WaitFor([&] { return Ended(mine); }, 10));
  EXPECT_FALSE(Ended(other));
  kill(other, SIGKILL);
  waitpid(other, nullptr, 0);
}

TEST_F(NodesTest, DrainIsStoredAndShownUntilUncordon) {
  StartDaemon("node-d");
  ASSERT_TRUE(
      WaitFor([&] { return NodeState("node-d") == "NODE_STATE_UP"; }, 30));
  EXPECT_EQ(Ptctl("drain node-d").rc, 0);
  EXPECT_TRUE(Nodes()["node-d"].value("draining", false));
  Result unknown = Ptctl("drain no-such-node");
  EXPECT_NE(unknown.rc, 0);
  EXPECT_TRUE(absl::StrContains(unknown.out, "no node 'no-such-node'"))
      << unknown.out;
  // Kept across a restart, and re-registering does not clear it.
  StopCoordinator(SIGKILL);
  StartCoordinator("127.0.0.1" + port_, NodeFlags());
  EXPECT_TRUE(Nodes()["node-d"].value("draining", false));
  ASSERT_TRUE(
      WaitFor([&] { return NodeState("node-d") == "NODE_STATE_UP"; }, 30));
  EXPECT_TRUE(Nodes()["node-d"].value("draining", false));
  EXPECT_EQ(Ptctl("uncordon node-d").rc, 0);
  EXPECT_FALSE(Nodes()["node-d"].value("draining", false));
}

// ptworkerd checks who asks before it reads the command: without a running
// attempt's token nothing of the command comes back (a 10 KB one made the
// refusal too large for gRPC: RESOURCE_EXHAUSTED), and the shell's words
// get the same refusal as anything else. NodeService's refusals quote a
// node name bounded.
TEST_F(NodesTest, DaemonExecAuthenticatesBeforeItReadsTheCommand) {
  auto daemon = UpDaemon("node-e");
  ASSERT_NE(daemon, nullptr);
  const auto exec = [&](const std::string& token, const std::string& command) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    ptrain::v1::ExecRequest req;
    req.set_command(command);
    auto reader = daemon->Exec(&ctx, req);
    ptrain::v1::ExecOutput out;
    while (reader->Read(&out)) {
    }
    return reader->Finish();
  };
  const std::string long_program(10 * 1024, 'A');
  for (const std::string& command : {long_program, std::string("/bin/sh -c id"),
                                     "orted " + std::string(10 * 1024, 'x')}) {
    SCOPED_TRACE(command.substr(0, 20));
    const grpc::Status none = exec("", command);
    EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << none.error_message().substr(0, 300);
    const grpc::Status wrong = exec("not-an-attempt-token", command);
    EXPECT_EQ(wrong.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << wrong.error_message().substr(0, 300);
    EXPECT_TRUE(absl::StrContains(wrong.error_message(),
                                  "is not that of a running attempt placed "
                                  "on node 'node-e'"))
        << wrong.error_message().substr(0, 300);
    for (const grpc::Status& s : {none, wrong}) {
      EXPECT_LT(s.error_message().size(), 1000u);
      EXPECT_FALSE(absl::StrContains(s.error_message(), "AAAA"));
      EXPECT_FALSE(absl::StrContains(s.error_message(), "/bin/sh"));
    }
  }
  // NodeService, with the join token: a name nobody registered, 100 KB.
  auto nodes = ptrain::v1::NodeService::NewStub(channel_);
  const std::string huge(100 * 1024, 'n');
  ptrain::v1::NodeHeartbeatRequest beat;
  beat.set_name(huge);
  beat.set_session("made-up");
  ptrain::v1::NodeHeartbeatResponse beat_out;
  const grpc::Status b =
      nodes->Heartbeat(Ctx(kJoinToken).get(), beat, &beat_out);
  ptrain::v1::AuthorizeExecRequest authorize;
  authorize.set_name(huge);
  authorize.set_session("made-up");
  ptrain::v1::AuthorizeExecResponse authorize_out;
  const grpc::Status a =
      nodes->AuthorizeExec(Ctx(kJoinToken).get(), authorize, &authorize_out);
  for (const grpc::Status& s : {b, a}) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND)
        << s.error_message().substr(0, 300);
    EXPECT_LT(s.error_message().size(), 1000u);
    EXPECT_TRUE(absl::StrContains(s.error_message(), "… (102400 bytes)"))
        << s.error_message().substr(0, 300);
  }
}

// The join token lets its holder add a node of a new name. With
// --require-node-approval such a node registers and heartbeats but takes
// no job until `ptctl nodes approve`, shown in `ptctl nodes` and by its
// daemon, and the wait and the approval are kept across ptcoord restarts.
TEST_F(NodesTest, ANewNodeTakesNoJobUntilAnOperatorApprovesIt) {
  std::vector<std::string> flags = NodeFlags();
  flags.push_back("--require-node-approval");
  StopCoordinator(SIGTERM);
  StartCoordinator("127.0.0.1" + port_, flags);
  StartDaemon("node-a");
  ASSERT_TRUE(
      WaitFor([&] { return NodeState("node-a") == "NODE_STATE_UP"; }, 30))
      << ReadFile(dir_ / "node-a.log");
  EXPECT_TRUE(Nodes()["node-a"].value("pending_approval", false));
  const Result table = Ptctl("nodes");
  EXPECT_TRUE(absl::StrContains(table.out, "UP,UNAPPROVED")) << table.out;
  EXPECT_TRUE(absl::StrContains(
      table.out,
      "note: node-a waits for approval (ptcoord "
      "--require-node-approval): no job runs on it until 'ptctl "
      "nodes approve node-a'"))
      << table.out;
  EXPECT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(ReadFile(dir_ / "node-a.log"),
                                 "'ptctl nodes approve node-a'");
      },
      30))
      << ReadFile(dir_ / "node-a.log");
  // A job that fits it stays queued: nothing is placed on the node.
  const std::string id = Submit({"train.steps=5"});
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_EQ(State(id), "JOB_STATE_QUEUED");
  EXPECT_EQ(Get(id)["job"].value("attempts", 0), 0);
  // Kept across a restart; the daemon comes back still waiting. Its
  // registration time is read before the restart: the daemon may register
  // again before the restarted coordinator is first asked.
  const int64_t before = Int(Nodes()["node-a"], "registered_unix_ms");
  StopCoordinator(SIGKILL);
  StartCoordinator("127.0.0.1" + port_, flags);
  EXPECT_TRUE(Nodes()["node-a"].value("pending_approval", false));
  ASSERT_TRUE(WaitFor(
      [&] {
        const json n = Nodes()["node-a"];
        return n.value("state", "") == "NODE_STATE_UP" &&
               Int(n, "registered_unix_ms") > before;
      },
      30))
      << ReadFile(dir_ / "node-a.log");
  EXPECT_TRUE(Nodes()["node-a"].value("pending_approval", false));
  // Approval: an unknown name is refused naming it, changing nothing.
  const Result unknown = Ptctl("nodes approve no-such-node");
  EXPECT_EQ(unknown.rc, 1) << unknown.out;
  EXPECT_EQ(unknown.out, "ptctl: error: NOT_FOUND: no node 'no-such-node'\n");
  EXPECT_TRUE(Nodes()["node-a"].value("pending_approval", false));
  const Result approved = Ptctl("nodes approve node-a");
  EXPECT_EQ(approved.rc, 0) << approved.out;
  EXPECT_EQ(approved.out, "node-a approved: jobs may run on it\n");
  EXPECT_FALSE(Nodes()["node-a"].value("pending_approval", false));
  EXPECT_FALSE(absl::StrContains(Ptctl("nodes").out, "UNAPPROVED"));
  EXPECT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(ReadFile(dir_ / "node-a.log"),
                                 "approved: jobs may now be placed");
      },
      30))
      << ReadFile(dir_ / "node-a.log");
  // The job is placed on it now (its launch through the node's made-up
  // address is not this test's matter).
  EXPECT_TRUE(
      WaitFor([&] { return Get(id)["job"].value("attempts", 0) >= 1; }, 60))
      << Get(id).dump();
  Ptctl("cancel " + id);
  StopCoordinator(SIGKILL);
  StartCoordinator("127.0.0.1" + port_, flags);
  EXPECT_FALSE(Nodes()["node-a"].value("pending_approval", false));
}

// ptworkerd says which side talks TLS when only one does, as ptctl does.
TEST_F(NodesTest, PtworkerdSaysWhenOnlyOneSideTalksTls) {
  MakeCertificates();
  const fs::path t = dir_ / "tls";
  StartDaemon("node-t", "join-tokens", "",
              {"--tls-ca", (t / "ca.pem").string()});
  EXPECT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(
            ReadFile(dir_ / "node-t.log"),
            absl::StrCat("ptcoord at ", address_,
                         " talks plain text, not TLS: drop --tls-ca"));
      },
      30))
      << ReadFile(dir_ / "node-t.log");
  kill(daemons_["node-t"], SIGKILL);
  waitpid(daemons_["node-t"], nullptr, 0);
  daemons_.erase("node-t");
  StopCoordinator(SIGTERM);
  std::vector<std::string> flags = NodeFlags();
  flags.insert(flags.end(), {"--tls-cert", (t / "server.pem").string(),
                             "--tls-key", (t / "server.key").string()});
  credentials_ = grpc::SslCredentials({ReadFile(t / "ca.pem"), "", ""});
  ptctl_tls_ = " --tls-ca " + (t / "ca.pem").string();
  StartCoordinator("127.0.0.1" + port_, flags);
  StartDaemon("node-p");
  EXPECT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(
            ReadFile(dir_ / "node-p.log"),
            absl::StrCat("ptcoord at ", address_,
                         " serves TLS and ptworkerd talked plain text: give "
                         "the CA that signed its certificate with --tls-ca"));
      },
      30))
      << ReadFile(dir_ / "node-p.log");
  EXPECT_TRUE(Nodes().empty());
}

}  // namespace
