// A ptcoord a team shares, tested against the real process: users of each
// role from a --users-file made by `ptcoord users add`, the access table
// walked over every JobService RPC of the proto with every role, owners,
// SIGHUP reloads, the audit log, and a users file ptcoord refuses.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/process.h"
#include "coordinator/access.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "ptrain/v1/coordinator.grpc.pb.h"
#include "tests/testing/files.h"
#include "tests/testing/process.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ptrain::testing::RunCapturing;
using ptrain::testing::WaitFor;

std::string ReadFile(const fs::path& p) {
  return ptrain::testing::ReadAll(p.string());
}

// A job of a few quick steps.
const char* const kSmall =
    " --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2"
    " --set train.eval_every=0 --set train.sample_every=0"
    " --set train.log_every=1 --set train.steps=4";

class MultiUserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat(
               "multi_user_", getpid(), "_",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "ckpt");
    users_ = (dir_ / "users.yaml").string();
    for (const auto& [name, role] :
         std::vector<std::pair<std::string, std::string>>{{"root", "admin"},
                                                          {"alice", "member"},
                                                          {"bob", "member"},
                                                          {"carol", "member"},
                                                          {"vera", "viewer"}}) {
      tokens_[name] = AddUser(name, role);
      ASSERT_FALSE(tokens_[name].empty());
    }
  }
  void TearDown() override {
    if (coordinator_ > 0) {
      for (const json& j : List("root")) {
        Ptctl("root", "cancel " + j["id"].get<std::string>());
      }
      WaitFor([&] { return Unfinished() == 0; }, 60);
      kill(coordinator_, SIGTERM);
      waitpid(coordinator_, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  // `ptcoord users add NAME --role ROLE`: the token it printed.
  std::string AddUser(const std::string& name, const std::string& role,
                      const std::string& extra = "") {
    const auto [rc, out] =
        RunCapturing(absl::StrCat(PT_PTCOORD, " users add ", name, " --role ",
                                  role, " --users-file ", users_, " ", extra));
    EXPECT_EQ(rc, 0) << out;
    // The token is its stdout's one line, before what it says on stderr.
    return out.substr(0, out.find('\n'));
  }

  void Start(const std::vector<std::string>& extra = {}, int slots = 4) {
    std::vector<std::string> argv = {PT_PTCOORD,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--state-dir",
                                     (dir_ / "state").string(),
                                     "--local-slots",
                                     std::to_string(slots),
                                     "--users-file",
                                     users_,
                                     "--data-root",
                                     std::string(PT_SOURCE_DIR) + "/data",
                                     "--data-root",
                                     (dir_ / "ckpt").string(),
                                     "--cancel-grace-s",
                                     "5",
                                     "--ui-listen",
                                     "127.0.0.1:0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    coordinator_ =
        ptrain::testing::StartLogged(argv, (dir_ / "ptcoord.log").string());
    ASSERT_TRUE(WaitFor(
        [&] {
          return fs::exists(dir_ / "state" / "address") &&
                 fs::exists(dir_ / "state" / "ui_address");
        },
        30))
        << ReadFile(dir_ / "ptcoord.log");
    std::ifstream(dir_ / "state" / "address") >> address_;
    std::ifstream(dir_ / "state" / "ui_address") >> ui_;
    channel_ =
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    stub_ = ptrain::v1::JobService::NewStub(channel_);
  }

  std::pair<int, std::string> Ptctl(const std::string& user,
                                    const std::string& args) {
    return RunCapturing(absl::StrCat("cd ", PT_SOURCE_DIR, " && ", PT_PTCTL,
                                     " --server ", address_, " --token ",
                                     tokens_[user], " ", args));
  }
  // Submits the small job as `user`; its id.
  std::string Submit(const std::string& user, const std::string& sets = "") {
    const auto [rc, out] = Ptctl(
        user,
        absl::StrCat("submit examples/shakespeare-char.yaml", kSmall,
                     " --set checkpoint.dir=", (dir_ / "ckpt").string(), sets));
    EXPECT_EQ(rc, 0) << out;
    return out.substr(0, out.find('\n'));
  }
  std::vector<json> List(const std::string& user,
                         const std::string& args = "") {
    const auto [rc, out] = Ptctl(user, "-o json list " + args);
    json j = json::parse(out, nullptr, false);
    if (rc != 0 || j.is_discarded() || !j.contains("jobs")) return {};
    return j["jobs"].get<std::vector<json>>();
  }
  int Unfinished() {
    int n = 0;
    for (const json& j : List("root")) {
      const std::string s = j.value("state", "");
      if (s != "JOB_STATE_SUCCEEDED" && s != "JOB_STATE_FAILED" &&
          s != "JOB_STATE_CANCELLED") {
        ++n;
      }
    }
    return n;
  }
  json Job(const std::string& id) {
    const auto [rc, out] = Ptctl("root", "-o json get " + id);
    json j = json::parse(out, nullptr, false);
    if (rc != 0 || j.is_discarded() || !j.contains("job"))
      return json::object();
    return j["job"];
  }
  std::string State(const std::string& id) {
    return Job(id).value("state", "");
  }
  int64_t Step(const std::string& id) {
    const json p = Job(id).value("progress", json::object());
    return p.contains("step") ? std::stoll(p["step"].get<std::string>()) : 0;
  }
  // The final training loss, exactly as stored (JSON's shortest text of the
  // double that round-trips).
  std::string FinalLoss(const std::string& id) {
    return Job(id)
        .value("progress", json::object())
        .value("loss", json())
        .dump();
  }
  std::string Events(const std::string& id) {
    return Ptctl("vera", "events " + id).second;
  }
  bool WaitState(const std::string& id, const std::string& state, int s = 300) {
    return WaitFor([&] { return State(id) == "JOB_STATE_" + state; }, s);
  }
  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& user) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!user.empty()) {
      ctx->AddMetadata("authorization", "Bearer " + tokens_[user]);
    }
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(20));
    return ctx;
  }
  std::vector<json> Audit() {
    std::vector<json> out;
    for (absl::string_view line :
         absl::StrSplit(ReadFile(dir_ / "state" / "audit.jsonl"), '\n',
                        absl::SkipEmpty())) {
      out.push_back(json::parse(line, nullptr, false));
    }
    return out;
  }

  fs::path dir_;
  std::string users_, address_, ui_;
  std::map<std::string, std::string> tokens_;
  pid_t coordinator_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ptrain::v1::JobService::Stub> stub_;
};

// Every JobService RPC in the proto has a rule in the access table, and
// each role gets exactly what its rule says: PERMISSION_DENIED from the
// real server when the role (or, for a job's RPC, the ownership) does not
// allow it, anything else when it does. An RPC added to the proto without
// a rule, or a rule the server does not enforce, fails here.
TEST_F(MultiUserTest, EveryRpcHasOneRuleAndEveryRoleGetsWhatItSays) {
  Start();
  // alice's jobs, paused. `job` is acted on (cancelled, then deleted by
  // its owner); the UI reads `kept`.
  const std::string job = Submit("alice", " --set train.steps=5000");
  const std::string kept = Submit("alice", " --set train.steps=5000");
  ASSERT_EQ(Ptctl("alice", "pause " + job).first, 0);
  ASSERT_EQ(Ptctl("alice", "pause " + kept).first, 0);
  for (const std::string& id : {job, kept}) {
    ASSERT_TRUE(WaitFor([&] { return State(id) == "JOB_STATE_PAUSED"; }, 120))
        << State(id);
  }
  namespace v1 = ptrain::v1;
  using Call = std::function<grpc::Status(const std::string& user)>;
  auto& stub = *stub_;
  const std::string spec = absl::StrCat(
      ReadFile(fs::path(PT_SOURCE_DIR) / "examples/shakespeare-char.yaml"));
  std::map<std::string, Call> calls = {
      {"SubmitJob",
       [&](const std::string& u) {
         v1::SubmitJobRequest req;
         req.set_spec_yaml(spec);
         req.set_dry_run(true);  // checked as a submission, nothing stored
         v1::SubmitJobResponse resp;
         return stub.SubmitJob(Ctx(u).get(), req, &resp);
       }},
      {"GetJob",
       [&](const std::string& u) {
         v1::GetJobRequest req;
         req.set_job_id(job);
         v1::GetJobResponse resp;
         return stub.GetJob(Ctx(u).get(), req, &resp);
       }},
      {"ListJobs",
       [&](const std::string& u) {
         v1::ListJobsResponse resp;
         return stub.ListJobs(Ctx(u).get(), v1::ListJobsRequest(), &resp);
       }},
      {"CancelJob",
       [&](const std::string& u) {
         v1::CancelJobRequest req;
         req.set_job_id(job);
         v1::CancelJobResponse resp;
         return stub.CancelJob(Ctx(u).get(), req, &resp);
       }},
      {"PauseJob",
       [&](const std::string& u) {
         v1::PauseJobRequest req;
         req.set_job_id(job);
         v1::PauseJobResponse resp;
         return stub.PauseJob(Ctx(u).get(), req, &resp);
       }},
      {"ResumeJob",
       [&](const std::string& u) {
         v1::ResumeJobRequest req;
         req.set_job_id(job);
         v1::ResumeJobResponse resp;
         return stub.ResumeJob(Ctx(u).get(), req, &resp);
       }},
      {"ExtendJob",
       [&](const std::string& u) {
         v1::ExtendJobRequest req;
         req.set_job_id(job);
         req.set_steps(100);
         v1::ExtendJobResponse resp;
         return stub.ExtendJob(Ctx(u).get(), req, &resp);
       }},
      {"WatchJob",
       [&](const std::string& u) {
         v1::WatchJobRequest req;
         req.set_job_id(job);
         auto ctx = Ctx(u);
         auto reader = stub.WatchJob(ctx.get(), req);
         v1::JobEvent ev;
         if (reader->Read(&ev)) {
           ctx->TryCancel();
           reader->Finish();
           return grpc::Status::OK;
         }
         return reader->Finish();
       }},
      {"StreamLogs",
       [&](const std::string& u) {
         v1::StreamLogsRequest req;
         req.set_job_id(job);
         auto ctx = Ctx(u);
         auto reader = stub.StreamLogs(ctx.get(), req);
         v1::LogChunk chunk;
         while (reader->Read(&chunk)) {
         }
         return reader->Finish();
       }},
      {"ListCheckpoints",
       [&](const std::string& u) {
         v1::ListCheckpointsRequest req;
         req.set_job_id(job);
         v1::ListCheckpointsResponse resp;
         return stub.ListCheckpoints(Ctx(u).get(), req, &resp);
       }},
      {"DiagnoseJob",
       [&](const std::string& u) {
         v1::DiagnoseJobRequest req;
         req.set_job_id(job);
         v1::DiagnoseJobResponse resp;
         return stub.DiagnoseJob(Ctx(u).get(), req, &resp);
       }},
      {"ListNodes",
       [&](const std::string& u) {
         v1::ListNodesResponse resp;
         return stub.ListNodes(Ctx(u).get(), v1::ListNodesRequest(), &resp);
       }},
      {"DrainNode",
       [&](const std::string& u) {
         v1::DrainNodeRequest req;
         req.set_name("no-such-node");
         v1::DrainNodeResponse resp;
         return stub.DrainNode(Ctx(u).get(), req, &resp);
       }},
      {"ForgetNode",
       [&](const std::string& u) {
         v1::ForgetNodeRequest req;
         req.set_name("no-such-node");
         v1::ForgetNodeResponse resp;
         return stub.ForgetNode(Ctx(u).get(), req, &resp);
       }},
      {"ApproveNode",
       [&](const std::string& u) {
         v1::ApproveNodeRequest req;
         req.set_name("no-such-node");
         v1::ApproveNodeResponse resp;
         return stub.ApproveNode(Ctx(u).get(), req, &resp);
       }},
      {"DeleteJob",
       [&](const std::string& u) {
         v1::DeleteJobRequest req;
         req.set_job_id(job);
         v1::DeleteJobResponse resp;
         return stub.DeleteJob(Ctx(u).get(), req, &resp);
       }},
      {"ListEvents",
       [&](const std::string& u) {
         v1::ListEventsRequest req;
         req.set_job_id(job);
         v1::ListEventsResponse resp;
         return stub.ListEvents(Ctx(u).get(), req, &resp);
       }},
      {"WhoAmI",
       [&](const std::string& u) {
         v1::WhoAmIResponse resp;
         return stub.WhoAmI(Ctx(u).get(), v1::WhoAmIRequest(), &resp);
       }},
      {"SetJobPriority",
       [&](const std::string& u) {
         v1::SetJobPriorityRequest req;
         req.set_job_id(job);
         req.set_priority("low");
         v1::SetJobPriorityResponse resp;
         return stub.SetJobPriority(Ctx(u).get(), req, &resp);
       }},
      {"ListQueue",
       [&](const std::string& u) {
         v1::ListQueueResponse resp;
         return stub.ListQueue(Ctx(u).get(), v1::ListQueueRequest(), &resp);
       }},
  };
  // Denied roles first, so that an allowed action (a cancel) comes after
  // every refusal of it. bob is a member who does not own the job.
  const std::vector<std::pair<std::string, std::string>> roles = {
      {"vera", "viewer"},
      {"bob", "other member"},
      {"alice", "owner"},
      {"root", "admin"}};
  const google::protobuf::ServiceDescriptor* service =
      v1::SubmitJobRequest::descriptor()->file()->FindServiceByName(
          "JobService");
  ASSERT_NE(service, nullptr);
  ASSERT_GT(service->method_count(), 15);
  // In the proto's order, DeleteJob last: once the owner has deleted the
  // job, another member's call on it is NOT_FOUND, no longer a refusal.
  std::vector<std::string> order;
  for (int i = 0; i < service->method_count(); ++i) {
    if (service->method(i)->name() != "DeleteJob") {
      order.push_back(service->method(i)->name());
    }
  }
  order.push_back("DeleteJob");
  for (const std::string& rpc : order) {
    const ptrain::AccessRule* rule = ptrain::FindAccessRule(rpc);
    ASSERT_NE(rule, nullptr) << rpc << " has no rule in the access table";
    ASSERT_TRUE(calls.count(rpc)) << rpc << " is not called by this test";
    for (const auto& [user, who] : roles) {
      bool allowed = false;
      switch (rule->access) {
        case ptrain::Access::kRead:
          allowed = true;
          break;
        case ptrain::Access::kSubmit:
          allowed = user != "vera";
          break;
        case ptrain::Access::kOwnJob:
          allowed = user == "alice" || user == "root";
          break;
        case ptrain::Access::kAdmin:
          allowed = user == "root";
          break;
      }
      const grpc::Status s = calls[rpc](user);
      if (allowed) {
        EXPECT_NE(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << rpc << " by " << who << ": " << s.error_message();
      } else {
        EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << rpc << " by " << who;
        // The refusal names the role it needs; for another user's job,
        // its owner.
        EXPECT_TRUE(absl::StrContains(s.error_message(), "needs role"))
            << s.error_message();
        if (who == "other member" && rule->access == ptrain::Access::kOwnJob) {
          EXPECT_TRUE(absl::StrContains(s.error_message(), "belongs to alice"))
              << s.error_message();
        }
      }
    }
  }
  // The web UI's routes: every role reads, a wrong token does not.
  httplib::Client ui(std::string(absl::StripSuffix(ui_, "/")));
  for (const std::string& path :
       {std::string("/"), std::string("/nodes"), "/jobs/" + kept,
        std::string("/api/v1/jobs"), "/api/v1/jobs/" + kept,
        "/api/v1/jobs/" + kept + "/metrics", "/api/v1/jobs/" + kept + "/log",
        std::string("/api/v1/nodes"), std::string("/static/ui.js")}) {
    for (const std::string user : {"vera", "bob", "alice", "root"}) {
      httplib::Result r =
          ui.Get(path, {{"Authorization", "Bearer " + tokens_[user]}});
      ASSERT_TRUE(r) << path;
      EXPECT_EQ(r->status, 200) << path << " as " << user << ": " << r->body;
    }
  }
  // The job list names owners, there and in the UI's JSON.
  httplib::Result jobs =
      ui.Get("/api/v1/jobs", {{"Authorization", "Bearer " + tokens_["vera"]}});
  ASSERT_TRUE(jobs);
  EXPECT_EQ(json::parse(jobs->body)["jobs"][0].value("owner", ""), "alice");

  // No token is UNAUTHENTICATED, whatever it asks; so is an unknown one
  // (last, and on fewer RPCs than the throttle's 20 refusals at once: each
  // counts against this peer).
  tokens_["mallory"] = std::string(64, 'a');
  int guesses = 0;
  for (const auto& [rpc, call] : calls) {
    EXPECT_EQ(call("").error_code(), grpc::StatusCode::UNAUTHENTICATED) << rpc;
    if (++guesses < 18) {
      EXPECT_EQ(call("mallory").error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << rpc;
    }
  }
  httplib::Result wrong = ui.Get(
      "/api/v1/jobs", {{"Authorization", "Bearer " + tokens_["mallory"]}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
}

// Three users submit at once: each job's owner is the user whose token
// submitted it (not anything the request says), `list --mine` shows a
// user's own jobs only, and every job trains to the end.
TEST_F(MultiUserTest, ThreeUsersSubmittingAtOnceEachOwnTheirJobs) {
  Start();
  std::map<std::string, std::string> ids;
  std::vector<std::thread> threads;
  std::mutex mu;
  for (const std::string user : {"alice", "bob", "carol"}) {
    threads.emplace_back([&, user] {
      const std::string id = Submit(user);
      std::lock_guard<std::mutex> lock(mu);
      ids[user] = id;
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(ids.size(), 3u);
  for (const auto& [user, id] : ids) {
    const std::vector<json> mine = List(user, "--mine");
    ASSERT_EQ(mine.size(), 1u) << user;
    EXPECT_EQ(mine[0].value("id", ""), id);
    EXPECT_EQ(mine[0].value("owner", ""), user);
    EXPECT_EQ(List("vera", "--owner " + user).size(), 1u);
    const auto [rc, out] = Ptctl("vera", "whoami");
    EXPECT_TRUE(absl::StrContains(out, "role:      viewer")) << out;
  }
  for (const auto& [user, id] : ids) {
    ASSERT_TRUE(
        WaitFor([&] { return State(id) == "JOB_STATE_SUCCEEDED"; }, 240))
        << id << " of " << user << ": " << State(id);
    const auto [rc, events] = Ptctl("vera", "events " + id);
    EXPECT_TRUE(absl::StrContains(events, "submitted by " + user)) << events;
  }
  // The table's OWNER column.
  const auto [rc, table] = Ptctl("vera", "list");
  EXPECT_TRUE(absl::StrContains(table, "OWNER")) << table;
  for (const auto& [user, id] : ids) {
    EXPECT_TRUE(absl::StrContains(table, user)) << table;
  }
}

// A member's action on someone else's job is refused and changes nothing;
// the owner's and an admin's go through, and the job's events name who
// acted. The audit log has every state-changing request, refused ones
// included: time, user, peer, RPC, job, result.
TEST_F(MultiUserTest, ActionsOnAnotherUsersJobAreRefusedAndAudited) {
  Start();
  const std::string job = Submit("alice", " --set train.steps=5000");
  ASSERT_EQ(Ptctl("alice", "pause " + job).first, 0);
  ASSERT_TRUE(WaitFor([&] { return State(job) == "JOB_STATE_PAUSED"; }, 120))
      << State(job);
  const auto [rc, out] = Ptctl("bob", "resume " + job);
  EXPECT_NE(rc, 0);
  EXPECT_TRUE(absl::StrContains(out, "PERMISSION_DENIED")) << out;
  EXPECT_TRUE(absl::StrContains(out, "belongs to alice")) << out;
  EXPECT_TRUE(absl::StrContains(out, "needs role admin")) << out;
  EXPECT_EQ(State(job), "JOB_STATE_PAUSED");  // unchanged
  EXPECT_EQ(Ptctl("root", "resume " + job).first, 0);
  EXPECT_EQ(Ptctl("alice", "cancel " + job).first, 0);
  const auto [erc, events] = Ptctl("vera", "events " + job);
  EXPECT_TRUE(absl::StrContains(events, "pause requested by alice")) << events;
  EXPECT_TRUE(absl::StrContains(events, "resumed by root")) << events;
  EXPECT_TRUE(absl::StrContains(events, "by alice")) << events;

  std::vector<std::tuple<std::string, std::string, std::string>> seen;
  for (const json& a : Audit()) {
    ASSERT_FALSE(a.is_discarded());
    EXPECT_FALSE(a.value("time", "").empty());
    EXPECT_TRUE(absl::StartsWith(a.value("peer", ""), "ipv4:127.0.0.1:"))
        << a.dump();
    if (a.value("target", "") == job) {
      seen.emplace_back(a.value("user", ""), a.value("rpc", ""),
                        a.value("result", ""));
    }
  }
  const std::vector<std::tuple<std::string, std::string, std::string>> want = {
      {"alice", "SubmitJob", "OK"},
      {"alice", "PauseJob", "OK"},
      {"bob", "ResumeJob", "PERMISSION_DENIED"},
      {"root", "ResumeJob", "OK"},
      {"alice", "CancelJob", "OK"}};
  EXPECT_EQ(seen, want);
  // Reads are not audited.
  for (const json& a : Audit()) EXPECT_NE(a.value("rpc", ""), "ListEvents");
}

// SIGHUP rereads the users file: a user added since may log in from then
// on, a user removed gets UNAUTHENTICATED from then on, and a file broken
// since leaves the users as they were (logged, ptcoord serving on).
TEST_F(MultiUserTest, SighupReloadsTheUsersAndKeepsThemWhenTheFileIsBroken) {
  Start();
  const std::string dave = AddUser("dave", "member");
  tokens_["dave"] = dave;
  EXPECT_NE(Ptctl("dave", "whoami").first, 0);  // not loaded yet
  kill(coordinator_, SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return Ptctl("dave", "whoami").first == 0; }, 20))
      << ReadFile(dir_ / "ptcoord.log");

  // bob removed from the file.
  std::string text = ReadFile(users_);
  const size_t bob = text.find("  - name: bob");
  const size_t next = text.find("  - name:", bob + 1);
  ASSERT_NE(bob, std::string::npos);
  text.erase(bob, next - bob);
  std::ofstream(users_, std::ios::trunc) << text;
  EXPECT_EQ(Ptctl("bob", "whoami").first, 0);
  kill(coordinator_, SIGHUP);
  ASSERT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(Ptctl("bob", "whoami").second,
                                 "UNAUTHENTICATED");
      },
      20));

  // A broken file: the old users stay.
  std::ofstream(users_, std::ios::app) << "  - name: eve\n    role: boss\n";
  kill(coordinator_, SIGHUP);
  ASSERT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(ReadFile(dir_ / "ptcoord.log"),
                                 "users not reloaded");
      },
      20));
  const std::string log = ReadFile(dir_ / "ptcoord.log");
  EXPECT_TRUE(absl::StrContains(log, "is not one of admin, member, viewer"))
      << log;
  EXPECT_TRUE(absl::StrContains(log, "line ")) << log;
  EXPECT_EQ(Ptctl("dave", "whoami").first, 0);
  EXPECT_EQ(Ptctl("alice", "whoami").first, 0);
  EXPECT_NE(Ptctl("bob", "whoami").first, 0);
}

// A users file ptcoord cannot use stops it at start, naming the file, the
// line and the rule, before it serves anything.
TEST_F(MultiUserTest, ABadUsersFileIsRefusedAtStartNamingTheLine) {
  const std::string hash(64, 'c');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"users:\n  - name: a\n    role: boss\n    token_sha256: [" + hash +
           "]\n",
       "line 3: role 'boss' is not one of admin, member, viewer"},
      {"users:\n  - name: a\n    role: admin\n    token_sha256: [" + hash +
           "]\n  - name: b\n    role: member\n    token_sha256: [" + hash +
           "]\n",
       "also the user's on line 2"},
      {"users:\n  - name: a\n    role: admin\n    token_sha256: [xyz]\n",
       "line 4: a token_sha256 entry must be 64 hex characters"},
      {"users:\n  - name: a\n    role: admin\n    colour: red\n",
       "line 4: unknown key 'colour'"},
      {"users: [\n", "not YAML"},
  };
  for (const auto& [text, want] : cases) {
    std::ofstream(users_, std::ios::trunc) << text;
    const auto [rc, out] = RunCapturing(
        absl::StrCat(PT_PTCOORD, " --listen 127.0.0.1:0 --state-dir ",
                     (dir_ / "state").string(), " --users-file ", users_));
    EXPECT_EQ(rc, 2) << out;
    EXPECT_TRUE(absl::StrContains(out, "--users-file")) << out;
    EXPECT_TRUE(absl::StrContains(out, want)) << out;
  }
  const auto [rc, out] = RunCapturing(
      absl::StrCat(PT_PTCOORD, " --listen 127.0.0.1:0 --state-dir ",
                   (dir_ / "state").string(), " --users-file ", users_,
                   " --token-file ", users_));
  EXPECT_EQ(rc, 2);
  EXPECT_TRUE(absl::StrContains(out, "give one")) << out;
}

// A job of high priority that cannot be placed preempts the fewest running
// jobs of lower priority that make room: two low jobs, each asked to save
// the step it is in and stop. They go PREEMPTED, then QUEUED, and once the
// high job is done resume from that checkpoint; every job ends SUCCEEDED,
// no restart is used, and each preempted job's final loss is bit-identical
// to the same job's uninterrupted run.
TEST_F(MultiUserTest, AHighPriorityJobPreemptsTwoLowOnesThatLoseNothing) {
  Start({"--preempt-grace-s", "120"});
  const std::string low = " --set parallel.dp=2 --set train.steps=300";
  const std::string a = Submit("alice", low + " --set priority=low");
  const std::string b = Submit("bob", low + " --set priority=low");
  ASSERT_TRUE(WaitFor([&] { return Step(a) >= 20 && Step(b) >= 20; }, 300))
      << Events(a) << Events(b);
  const std::string high = Submit(
      "carol", " --set parallel.dp=4 --set train.steps=40 --set priority=high");
  for (const std::string& id : {a, b}) {
    ASSERT_TRUE(WaitFor(
        [&] {
          return absl::StrContains(Events(id),
                                   "queued again after its preemption");
        },
        300))
        << Events(id);
    EXPECT_TRUE(absl::StrContains(Events(id), "preempted for " + high))
        << Events(id);
  }
  ASSERT_TRUE(WaitState(high, "SUCCEEDED")) << Events(high);
  for (const std::string& id : {a, b}) {
    ASSERT_TRUE(WaitState(id, "SUCCEEDED")) << Events(id);
    const json j = Job(id);
    EXPECT_EQ(j["requeues"].value("preempted", 0), 1) << j.dump();
    EXPECT_EQ(j.value("attempts", 0), 2) << j.dump();
    // The second attempt resumed where the first stopped, not from 0.
    EXPECT_TRUE(absl::StrContains(Events(id), "not counted as a restart"))
        << Events(id);
    const std::string events = Events(id);
    const size_t at =
        events.find("attempt 2 resumed from the checkpoint at step ");
    ASSERT_NE(at, std::string::npos) << events;
    const int64_t resumed = std::stoll(events.substr(
        at +
        std::string("attempt 2 resumed from the checkpoint at step ").size()));
    EXPECT_GE(resumed, 20) << events;
    EXPECT_LT(resumed, 300) << events;
  }
  // The high job started only once both had stopped.
  EXPECT_TRUE(absl::StrContains(Events(high), "submitted by carol"));
  // The same jobs, uninterrupted.
  const std::string ra = Submit("alice", low + " --set priority=low");
  const std::string rb = Submit("bob", low + " --set priority=low");
  for (const std::string& id : {ra, rb}) {
    ASSERT_TRUE(WaitState(id, "SUCCEEDED")) << Events(id);
    EXPECT_EQ(Job(id)["requeues"].value("preempted", 0), 0);
  }
  EXPECT_EQ(FinalLoss(a), FinalLoss(ra));
  EXPECT_EQ(FinalLoss(b), FinalLoss(rb));
  EXPECT_NE(FinalLoss(a), "null");
}

// A victim that cannot save in time (its ranks stopped) is killed once the
// preemption's grace has passed and goes on from its newest checkpoint:
// still no restart used, still the uninterrupted run's final loss.
TEST_F(MultiUserTest, AVictimPastThePreemptionsGraceIsKilledAndLosesNothing) {
  Start({"--preempt-grace-s", "3"});
  const std::string sets =
      " --set parallel.dp=4 --set train.steps=200 --set checkpoint.every=10";
  const std::string low = Submit("alice", sets + " --set priority=low");
  ASSERT_TRUE(WaitFor([&] { return Step(low) >= 30; }, 300)) << Events(low);
  const std::string uid = Job(low).value("uid", "");
  const std::vector<pid_t> ranks =
      ptrain::ProcessesWithEnv({"PTRAIN_JOB_UID=" + uid});
  ASSERT_FALSE(ranks.empty());
  for (pid_t p : ranks) kill(p, SIGSTOP);
  const std::string high =
      Submit("carol",
             " --set parallel.dp=4 --set train.steps=20 --set "
             "priority=high");
  ASSERT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(Events(low),
                                 "queued again after its preemption");
      },
      120))
      << Events(low);
  for (pid_t p : ranks) kill(p, SIGCONT);  // gone already: killed
  EXPECT_TRUE(absl::StrContains(Events(low),
                                "did not stop within the preemption's grace"))
      << Events(low);
  ASSERT_TRUE(WaitState(high, "SUCCEEDED")) << Events(high);
  ASSERT_TRUE(WaitState(low, "SUCCEEDED")) << Events(low);
  const json j = Job(low);
  EXPECT_EQ(j["requeues"].value("preempted", 0), 1) << j.dump();
  EXPECT_EQ(j.value("attempts", 0), 2) << j.dump();
  EXPECT_TRUE(absl::StrContains(Events(low),
                                "attempt 2 resumed from the "
                                "checkpoint at step"))
      << Events(low);
  const std::string ref = Submit("alice", sets + " --set priority=low");
  ASSERT_TRUE(WaitState(ref, "SUCCEEDED")) << Events(ref);
  EXPECT_EQ(FinalLoss(low), FinalLoss(ref));
}

// A job over its owner's quota waits, saying why, without holding up the
// queue: another user's job behind it starts. One that could never fit the
// quota is refused at submit. `ptctl queue` lists the waiting jobs in the
// order they would start, each with its reason, and the web UI's list says
// the same.
TEST_F(MultiUserTest, QuotaWaitsSayWhyAndTheQueueListsThemInOrder) {
  tokens_["quinn"] = AddUser("quinn", "member", "--quota-slots 2");
  Start();
  const std::string runs = " --set parallel.dp=2 --set train.steps=100000";
  const std::string first = Submit("quinn", runs);
  ASSERT_TRUE(WaitState(first, "RUNNING"));
  const std::string second = Submit("quinn", runs);
  const std::string other = Submit("bob", " --set train.steps=100000");
  ASSERT_TRUE(WaitState(other, "RUNNING")) << Events(other);
  EXPECT_EQ(State(second), "JOB_STATE_QUEUED");
  const auto [rc, queue] = Ptctl("vera", "queue");
  EXPECT_EQ(rc, 0) << queue;
  EXPECT_TRUE(absl::StrContains(queue, second)) << queue;
  EXPECT_TRUE(absl::StrContains(queue, "user quinn at quota: 2/2 slots"))
      << queue;
  EXPECT_EQ(Job(second).value("waiting", ""), "user quinn at quota: 2/2 slots");
  // One more slot-taking job of bob's: needs 2, 1 free.
  const std::string big = Submit("bob", runs);
  ASSERT_TRUE(WaitFor(
      [&] { return Job(big).value("waiting", "") == "needs 2 slots, 1 free"; },
      30))
      << Job(big).dump();
  const auto [qrc, order] = Ptctl("vera", "-o json queue");
  const json q = json::parse(order);
  ASSERT_EQ(q["jobs"].size(), 2u) << order;
  std::set<std::string> ids;
  for (const json& j : q["jobs"]) ids.insert(j.value("id", ""));
  EXPECT_EQ(ids, (std::set<std::string>{second, big}));
  EXPECT_EQ(q["jobs"][0].value("queue_position", 0), 1) << order;
  EXPECT_EQ(q["jobs"][1].value("queue_position", 0), 2) << order;
  // The UI's list says the same.
  httplib::Client ui(std::string(absl::StripSuffix(ui_, "/")));
  httplib::Result r =
      ui.Get("/api/v1/jobs", {{"Authorization", "Bearer " + tokens_["vera"]}});
  ASSERT_TRUE(r);
  bool said = false;
  const json listed = json::parse(r->body);
  for (const json& j : listed["jobs"]) {
    if (j.value("id", "") == second) {
      said = j.value("waiting", "") == "user quinn at quota: 2/2 slots";
    }
  }
  EXPECT_TRUE(said) << r->body;
  // More than the quota at once: refused, nothing stored.
  const auto [brc, bad] = Ptctl(
      "quinn", absl::StrCat("submit examples/shakespeare-char.yaml", kSmall,
                            " --set checkpoint.dir=", (dir_ / "ckpt").string(),
                            " --set parallel.dp=4"));
  EXPECT_EQ(brc, 2) << bad;
  EXPECT_TRUE(absl::StrContains(bad, "could never run")) << bad;
  EXPECT_EQ(List("root").size(), 4u);
  // Room again within quinn's quota: the waiting one starts.
  ASSERT_EQ(Ptctl("bob", "cancel " + big).first, 0);
  ASSERT_EQ(Ptctl("quinn", "cancel " + first).first, 0);
  ASSERT_TRUE(WaitState(second, "RUNNING", 120)) << Events(second);
}

// Among queued jobs of one priority, the user of the smallest decayed usage
// goes first: alice, who has used the slot, waits behind bob's job
// submitted after hers.
TEST_F(MultiUserTest, FairShareStartsTheLighterUsersJobFirst) {
  Start({}, /*slots=*/1);
  const std::string a1 = Submit("alice", " --set train.steps=150");
  ASSERT_TRUE(WaitState(a1, "RUNNING"));
  ASSERT_TRUE(WaitFor([&] { return Step(a1) >= 10; }, 120));
  const std::string a2 = Submit("alice", " --set train.steps=20");
  const std::string b1 = Submit("bob", " --set train.steps=20");
  ASSERT_TRUE(WaitFor(
      [&] {
        const json q =
            json::parse(Ptctl("vera", "-o json queue").second, nullptr, false);
        return !q.is_discarded() && q.contains("jobs") &&
               q["jobs"].size() == 2 && q["jobs"][0].value("id", "") == b1;
      },
      30))
      << Ptctl("vera", "queue").second;
  EXPECT_TRUE(absl::StrContains(Job(a2).value("waiting", ""), "behind " + b1))
      << Job(a2).dump();
  for (const std::string& id : {a1, a2, b1}) {
    ASSERT_TRUE(WaitState(id, "SUCCEEDED")) << Events(id);
  }
  const auto started = [&](const std::string& id) {
    return std::stoll(Job(id).value("started_unix_ms", "0"));
  };
  EXPECT_LT(started(b1), started(a2));
}

// Priorities and protection: a member may not protect a job from
// preemption (restart.preemptible: false is an admin's), a priority out of
// range is refused naming the rule, a member may not change the priority
// of another user's job, and a change is an event naming who made it.
TEST_F(MultiUserTest, PriorityRulesAndProtectionAreEnforced) {
  Start();
  const auto submit = [&](const std::string& user, const std::string& sets) {
    return Ptctl(user, absl::StrCat("submit examples/shakespeare-char.yaml",
                                    kSmall, " --set checkpoint.dir=",
                                    (dir_ / "ckpt").string(), sets));
  };
  const auto [prc, protect] =
      submit("alice", " --set restart.preemptible=false");
  EXPECT_NE(prc, 0);
  EXPECT_TRUE(absl::StrContains(protect, "PERMISSION_DENIED")) << protect;
  EXPECT_TRUE(absl::StrContains(protect, "needs role admin")) << protect;
  const auto [orc, out_of_range] = submit("alice", " --set priority=1001");
  EXPECT_EQ(orc, 2) << out_of_range;
  EXPECT_TRUE(absl::StrContains(out_of_range, "priority")) << out_of_range;
  EXPECT_TRUE(List("root").empty());
  const auto [arc, admin] = submit(
      "root", " --set restart.preemptible=false --set train.steps=100000");
  ASSERT_EQ(arc, 0) << admin;
  const std::string job = admin.substr(0, admin.find('\n'));
  const std::string mine = Submit("alice", " --set train.steps=100000");
  EXPECT_NE(Ptctl("alice", "priority " + mine + " 2000").first, 0);
  const auto [drc, denied] = Ptctl("bob", "priority " + mine + " high");
  EXPECT_TRUE(absl::StrContains(denied, "belongs to alice")) << denied;
  ASSERT_EQ(Ptctl("alice", "priority " + mine + " high").first, 0);
  EXPECT_EQ(Job(mine).value("priority", 0), 800);
  EXPECT_TRUE(
      absl::StrContains(Events(mine), "priority set to high (800) by alice"))
      << Events(mine);
  const auto [grc, shown] = Ptctl("vera", "get " + job);
  EXPECT_TRUE(absl::StrContains(shown, "not preemptible")) << shown;
}

}  // namespace
