// ptcoord's web UI without a browser: every route behind the user token
// (401 and nothing shown without it), the login cookie, the JSON of each
// endpoint (shapes, thinning, since=, 404, 400 naming the parameter),
// static files only by name, the refusals at start, and one request over
// real HTTP. The pages themselves draw in tests/integration/ui_browser.py.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/job_state.h"
#include "coordinator/auth_throttle.h"
#include "coordinator/coordinator.h"
#include "coordinator/ui_api.h"
#include "coordinator/ui_server.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/testing/coordinator_options.h"
#include "tests/testing/raw_http.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSpec = R"(name: ui-job
data: {path: data/x.txt}
train: {steps: 1000, global_batch: 4}
model: {block_size: 8, n_layer: 1, n_head: 1, n_embd: 8}
parallel: {dp: 2}
restart: {hang_timeout_s: 600}
)";

class UiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat(
               "ui_test_", getpid(), "_",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    std::ofstream(dir_ / "data" / "x.txt") << "some text to train on\n";
    // The attempt's ranks: one process that sleeps until killed.
    std::ofstream(dir_ / "fake_mpirun") << "#!/bin/sh\nexec sleep 100\n";
    fs::permissions(dir_ / "fake_mpirun", fs::perms::owner_all);
    std::ofstream(dir_ / "chart.js") << "/* Chart.js */";
    CoordinatorOptions o = testing::LocalCoordinatorOptions(dir_);
    o.user_tokens = {"user-token"};
    o.mpirun = (dir_ / "fake_mpirun").string();
    o.cancel_grace = absl::Milliseconds(100);
    o.loss_points_per_series = 10;
    auto c = Coordinator::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = std::move(*c);
    UiOptions u;
    u.listen = "127.0.0.1:0";
    u.chart_js = (dir_ / "chart.js").string();
    auto ui = CoordinatorUi::Start(u, c_.get());
    ASSERT_TRUE(ui.ok()) << ui.status();
    ui_ = std::move(*ui);
  }
  void TearDown() override {
    ui_.reset();
    if (c_ != nullptr) {
      absl::StatusOr<std::vector<v1::Job>> jobs =
          c_->List(v1::JOB_STATE_UNSPECIFIED, 0);
      for (const v1::Job& j : jobs.value_or(std::vector<v1::Job>{})) {
        c_->Cancel(j.id()).IgnoreError();
      }
      for (int i = 0; i < 100 && !c_->List(v1::JOB_STATE_RUNNING, 0)->empty();
           ++i) {
        c_->Tick();
        absl::SleepFor(absl::Milliseconds(50));
      }
    }
    c_.reset();
    fs::remove_all(dir_);
  }

  // A job whose first attempt runs (its id).
  std::string RunningJob() {
    auto job = c_->Submit(kSpec, {});
    EXPECT_TRUE(job.ok()) << job.status();
    for (int i = 0; i < 200; ++i) {
      c_->Tick();
      if (c_->Get(job->id(), false)->job().state() == v1::JOB_STATE_RUNNING) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(25));
    }
    EXPECT_EQ(c_->Get(job->id(), false)->job().state(), v1::JOB_STATE_RUNNING);
    return job->id();
  }
  void Progress(const std::string& id, int64_t step, double loss,
                bool eval = false) {
    v1::ReportProgressRequest r;
    r.set_job_id(id);
    r.set_attempt(1);
    r.set_rank(0);
    r.set_step(step);
    r.set_is_eval(eval);
    if (eval) {
      r.set_val_loss(loss);
    } else {
      r.set_loss(loss);
      r.set_tok_per_s(3200);
      r.set_mfu(0.25);
      r.set_lr(1e-3);
    }
    ASSERT_TRUE(c_->ReportProgress(r).ok());
  }
  void RankTimes(const std::string& id, int rank, int64_t step, double ms) {
    v1::ReportAliveRequest r;
    r.set_job_id(id);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_progress_age_ms(0);
    r.mutable_times()->set_step(step);
    r.mutable_times()->set_steps(2);
    r.mutable_times()->set_step_ms(ms);
    (*r.mutable_times()->mutable_comm_ms())["dp"] = ms / 4;
    ASSERT_TRUE(c_->ReportAlive(r).ok());
  }
  fs::path AttemptDir(const std::string& id, int n) const {
    return dir_ / "state" / "jobs" / id / absl::StrCat("attempt-", n);
  }

  CoordinatorUi::Response Get(const std::string& path,
                              const std::string& query = "",
                              const std::string& auth = "Bearer user-token",
                              const std::string& peer = "127.0.0.1") {
    CoordinatorUi::Request r;
    r.path = path;
    r.query = query;
    r.authorization = auth;
    r.peer = peer;
    return ui_->Handle(r);
  }
  json GetJson(const std::string& path, const std::string& query = "",
               int status = 200) {
    CoordinatorUi::Response out = Get(path, query);
    EXPECT_EQ(out.status, status) << path << "?" << query << ": " << out.body;
    EXPECT_EQ(out.content_type, "application/json");
    return json::parse(out.body);
  }

  fs::path dir_;
  std::unique_ptr<Coordinator> c_;
  std::unique_ptr<CoordinatorUi> ui_;
};

std::string Header(const CoordinatorUi::Response& r, const std::string& name) {
  for (const auto& [n, v] : r.headers) {
    if (n == name) return v;
  }
  return "";
}

TEST_F(UiTest, WithoutTheTokenEveryRouteIs401AndShowsNothing) {
  const std::string id = RunningJob();
  Progress(id, 1, 4.5);
  for (const std::string& path :
       {std::string("/"), std::string("/nodes"), "/jobs/" + id,
        std::string("/static/ui.js"), std::string("/static/chart.js"),
        std::string("/api/v1/jobs"), "/api/v1/jobs/" + id,
        "/api/v1/jobs/" + id + "/metrics", "/api/v1/jobs/" + id + "/log",
        std::string("/api/v1/nodes"), std::string("/no/such/page")}) {
    for (const std::string& auth :
         {std::string(""), std::string("Bearer wrong"),
          std::string("Basic dXNlcg==")}) {
      // Each from an address of its own: a peer guessing is throttled.
      static int peer = 0;
      CoordinatorUi::Response r =
          Get(path, "", auth, absl::StrCat("10.1.0.", ++peer));
      EXPECT_EQ(r.status, 401) << path << " with '" << auth << "'";
      EXPECT_FALSE(absl::StrContains(r.body, id)) << path;
      EXPECT_FALSE(absl::StrContains(r.body, "ui-job")) << path;
    }
  }
  // A wrong cookie is no better.
  CoordinatorUi::Request r;
  r.path = "/api/v1/jobs";
  r.cookie = "ptrain_token=wrong";
  EXPECT_EQ(ui_->Handle(r).status, 401);
  // Nor may anything but GET change that (read-only).
  r.cookie = "";
  r.authorization = "Bearer user-token";
  r.method = "DELETE";
  r.path = "/api/v1/jobs/" + id;
  EXPECT_EQ(ui_->Handle(r).status, 405);
  EXPECT_EQ(c_->Get(id, false)->job().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(UiTest, TheLoginFormSetsAStrictHttpOnlyCookieThatOpensThePages) {
  CoordinatorUi::Request login;
  login.method = "POST";
  login.path = "/login";
  login.body = "token=wrong";
  CoordinatorUi::Response refused = ui_->Handle(login);
  EXPECT_EQ(refused.status, 401);
  EXPECT_TRUE(Header(refused, "Set-Cookie").empty());
  EXPECT_TRUE(absl::StrContains(refused.body, "not a user token"))
      << refused.body;
  login.body = "token=user-token";
  CoordinatorUi::Response ok = ui_->Handle(login);
  EXPECT_EQ(ok.status, 303);
  EXPECT_EQ(Header(ok, "Location"), "/");
  const std::string cookie = Header(ok, "Set-Cookie");
  EXPECT_TRUE(absl::StartsWith(cookie, "ptrain_token=user-token;")) << cookie;
  EXPECT_TRUE(absl::StrContains(cookie, "HttpOnly")) << cookie;
  EXPECT_TRUE(absl::StrContains(cookie, "SameSite=Strict")) << cookie;
  // Plain text here: a Secure cookie would never come back.
  EXPECT_FALSE(absl::StrContains(cookie, "Secure")) << cookie;
  CoordinatorUi::Request page;
  page.path = "/";
  page.cookie = "theme=x; " + cookie.substr(0, cookie.find(';'));
  CoordinatorUi::Response index = ui_->Handle(page);
  EXPECT_EQ(index.status, 200);
  EXPECT_TRUE(absl::StrContains(index.body, "data-page=\"jobs\""))
      << index.body;
  EXPECT_TRUE(absl::StrContains(Header(index, "Content-Security-Policy"),
                                "script-src 'self'"));
}

// A token pasted with a line end or blanks around it logs in as the
// token; the cookie carries the token alone (found by the UI fuzz target:
// the cookie had carried "user-token%0D").
TEST_F(UiTest, APastedTokensBlanksAreNotPartOfTheCookie) {
  CoordinatorUi::Request login;
  login.method = "POST";
  login.path = "/login";
  for (const char* body : {"token=user-token%0D%0A", "token=+user-token%09",
                           "token=%20user-token"}) {
    login.body = body;
    CoordinatorUi::Response ok = ui_->Handle(login);
    EXPECT_EQ(ok.status, 303) << body;
    EXPECT_TRUE(
        absl::StartsWith(Header(ok, "Set-Cookie"), "ptrain_token=user-token;"))
        << body << ": " << Header(ok, "Set-Cookie");
  }
  login.body = "token=%0D%0A";
  EXPECT_EQ(ui_->Handle(login).status, 401);
}

TEST_F(UiTest, JobsListStateProgressAndEtaAndFilterByState) {
  const std::string id = RunningJob();
  // No step trained yet: no figures ("—" on the page), not zeros.
  const json before = GetJson("/api/v1/jobs")["jobs"][0];
  for (const char* figure : {"loss", "tok_per_s", "mfu", "lr", "eta_s"}) {
    EXPECT_TRUE(before[figure].is_null()) << figure << ": " << before;
  }
  Progress(id, 40, 3.25);
  json all = GetJson("/api/v1/jobs");
  ASSERT_EQ(all["jobs"].size(), 1u) << all;
  const json& j = all["jobs"][0];
  EXPECT_EQ(j["id"], id);
  EXPECT_EQ(j["name"], "ui-job");
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["step"], 40);
  EXPECT_EQ(j["steps"], 1000);
  EXPECT_EQ(j["loss"], 3.25);
  EXPECT_EQ(j["tok_per_s"], 3200);
  EXPECT_TRUE(j["val_loss"].is_null());
  EXPECT_EQ(j["attempts"], 1);
  EXPECT_GT(j["created_ms"].get<int64_t>(), 0);
  // 960 steps of 4 sequences of 8 tokens at 3200 tokens/s.
  EXPECT_DOUBLE_EQ(j["eta_s"].get<double>(), 960.0 * 32 / 3200);
  EXPECT_GE(all["now_ms"].get<int64_t>(), j["created_ms"].get<int64_t>());
  EXPECT_EQ(GetJson("/api/v1/jobs", "state=running")["jobs"].size(), 1u);
  EXPECT_EQ(GetJson("/api/v1/jobs", "state=succeeded")["jobs"].size(), 0u);
  EXPECT_EQ(GetJson("/api/v1/jobs", "limit=1")["jobs"].size(), 1u);
  for (const std::string& bad :
       {std::string("state=done"), std::string("limit=0"),
        std::string("limit=x"), "limit=" + std::string(100, '1')}) {
    json e = GetJson("/api/v1/jobs", bad, 400);
    const std::string name = bad.substr(0, bad.find('='));
    EXPECT_TRUE(
        absl::StrContains(e["error"].get<std::string>(), "'" + name + "'"))
        << bad << ": " << e;
  }
}

TEST_F(UiTest, AJobShowsItsAttemptsEventsCheckpointsAndLatestSample) {
  const std::string id = RunningJob();
  Progress(id, 5, 4.0);
  std::ofstream(AttemptDir(id, 1) / "run.jsonl")
      << R"({"type":"step","step":4,"loss":4.1})"
         "\n"
      << R"({"type":"sample","step":4,"text":"old"})"
         "\n"
      << R"({"type":"sample","step":5,"text":"ROMEO: <b>hi</b>"})"
         "\n"
      << R"({"type":"step","step":5,"loss":4.0})"
         "\n";
  json j = GetJson("/api/v1/jobs/" + id);
  EXPECT_EQ(j["job"]["id"], id);
  EXPECT_EQ(j["job"]["spec"]["train"]["steps"], "1000");  // proto JSON int64
  EXPECT_EQ(j["job"]["spec"]["model"]["n_embd"], 8);
  ASSERT_EQ(j["attempts"].size(), 1u) << j;
  EXPECT_EQ(j["attempts"][0]["number"], 1);
  EXPECT_EQ(j["attempts"][0]["end"], "running");
  std::set<std::string> kinds;
  for (const json& e : j["events"]) kinds.insert(e["kind"]);
  EXPECT_TRUE(kinds.count("submitted")) << j["events"];
  EXPECT_TRUE(kinds.count("attempt")) << j["events"];
  EXPECT_EQ(j["sample"]["step"], 5);
  EXPECT_EQ(j["sample"]["text"], "ROMEO: <b>hi</b>");
  EXPECT_EQ(j["sample"]["attempt"], 1);
  EXPECT_TRUE(j["checkpoints"].is_array());
  EXPECT_EQ(GetJson("/api/v1/jobs/job-9999", "", 404)["error"],
            "no job 'job-9999'");
}

// A job page polls every 2 s: each poll reads only what the run log gained
// (none of it when nothing did), a record still being written is taken once
// its line ends, a replaced log is read again, and the logs kept are
// bounded.
TEST(LatestSamplesTest, APollReadsOnlyWhatTheLogGained) {
  const fs::path dir =
      fs::temp_directory_path() / absl::StrCat("ptrain-samples-", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string log = (dir / "run.jsonl").string();
  const auto append = [&](const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::app) << text;
    return static_cast<int64_t>(text.size());
  };
  append(log, R"({"type":"step","step":4,"loss":4.1})"
              "\n"
              R"({"type":"sample","step":4,"text":"a"})"
              "\n"
              R"({"type":"step","step":5,"loss":4.0})"
              "\n");
  LatestSamples samples(/*max_logs=*/2);
  const json a = samples.Of(log, 1 << 20);
  EXPECT_EQ(a, json({{"step", 4}, {"text", "a"}}));
  int64_t read = samples.bytes_read();
  EXPECT_EQ(read, static_cast<int64_t>(fs::file_size(log)));
  EXPECT_EQ(samples.Of(log, 1 << 20), a);
  EXPECT_EQ(samples.bytes_read(), read) << "nothing new, nothing read";
  read += append(log, R"({"type":"step","step":6,"loss":3.9})"
                      "\n");
  EXPECT_EQ(samples.Of(log, 1 << 20), a);
  EXPECT_EQ(samples.bytes_read(), read) << "only the appended line read";
  const int64_t half = append(log, R"({"type":"sample","step":9,"te)");
  read += half;
  EXPECT_EQ(samples.Of(log, 1 << 20), a) << "a line not yet ended";
  EXPECT_EQ(samples.bytes_read(), read);
  read += half + append(log, R"(xt":"b"})"
                             "\n");
  EXPECT_EQ(samples.Of(log, 1 << 20), json({{"step", 9}, {"text", "b"}}));
  EXPECT_EQ(samples.bytes_read(), read) << "the cut line read again, whole";
  // Replaced by a shorter log: read from its start.
  const std::string other = R"({"type":"sample","step":1,"text":"c"})"
                            "\n";
  std::ofstream(log, std::ios::trunc) << other;
  EXPECT_EQ(samples.Of(log, 1 << 20), json({{"step", 1}, {"text", "c"}}));
  // Two logs kept at most: the least recently asked for is read whole again.
  const std::string second = (dir / "second.jsonl").string();
  const std::string third = (dir / "third.jsonl").string();
  append(second, other);
  append(third, other);
  EXPECT_EQ(samples.Of(second, 1 << 20)["step"], 1);
  EXPECT_EQ(samples.Of(third, 1 << 20)["step"], 1);  // forgets `log`
  read = samples.bytes_read();
  EXPECT_EQ(samples.Of(third, 1 << 20)["step"], 1);
  EXPECT_EQ(samples.bytes_read(), read);
  EXPECT_EQ(samples.Of(log, 1 << 20)["step"], 1);
  EXPECT_EQ(samples.bytes_read(), read + static_cast<int64_t>(other.size()));
  // Gone: null, and nothing kept of it.
  fs::remove(log);
  EXPECT_TRUE(samples.Of(log, 1 << 20).is_null());
  fs::remove_all(dir);
}

// A Mixture-of-Experts job's expert load: the newest well-formed
// `experts` record of the log (one with a layer lacking its counts is
// passed over), found by the same reads as the sample.
TEST(LatestSamplesTest, TheNewestExpertLoadIsKeptBesideTheSample) {
  const fs::path dir =
      fs::temp_directory_path() / absl::StrCat("ptrain-experts-", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string log = (dir / "run.jsonl").string();
  LatestSamples samples;
  std::ofstream(log) << R"({"type":"step","step":1,"loss":4.1})"
                        "\n";
  EXPECT_TRUE(samples.Of(log, 1 << 20).is_null());
  EXPECT_TRUE(samples.ExpertsOf(log).is_null()) << "a dense job's log";
  std::ofstream(log, std::ios::app)
      << R"({"type":"experts","step":1,"aux_loss":0.05,"layers":[)"
         R"({"layer":0,"tokens":[30,10],"dropped":2,"imbalance":1.5}]})"
         "\n"
         R"({"type":"experts","step":2,"layers":[{"layer":0,"tokens":[1]}]})"
         "\n";
  samples.Of(log, 1 << 20);
  EXPECT_EQ(samples.ExpertsOf(log),
            json::parse(R"({"step":1,"layers":[{"layer":0,"tokens":[30,10],)"
                        R"("dropped":2,"imbalance":1.5}]})"));
  std::ofstream(log, std::ios::app)
      << R"({"type":"experts","step":50,"layers":[)"
         R"({"layer":0,"tokens":[20,20],"dropped":0,"imbalance":1},)"
         R"({"layer":1,"tokens":[40,0],"dropped":0,"imbalance":2}]})"
         "\n";
  samples.Of(log, 1 << 20);
  const json e = samples.ExpertsOf(log);
  EXPECT_EQ(e["step"], 50);
  ASSERT_EQ(e["layers"].size(), 2u);
  EXPECT_EQ(e["layers"][1]["tokens"], json::parse("[40,0]"));
  EXPECT_TRUE(samples.ExpertsOf((dir / "other.jsonl").string()).is_null());
  fs::remove_all(dir);
}

TEST(JobStateNamesTest, LowerNamesRoundTripAndNothingElseParses) {
  const std::vector<std::string> names = LowerStateNames();
  EXPECT_EQ(names.size(), 8u);
  for (const std::string& n : names) {
    ASSERT_TRUE(StateOfLowerName(n).has_value()) << n;
    EXPECT_EQ(LowerStateName(*StateOfLowerName(n)), n);
  }
  for (const char* bad : {"", "unspecified", "RUNNING", "run", "all"}) {
    EXPECT_FALSE(StateOfLowerName(bad).has_value()) << bad;
  }
}

TEST_F(UiTest, EventKindsNameWhatHappened) {
  EXPECT_EQ(EventKind("submitted (2 slots)"), "submitted");
  EXPECT_EQ(EventKind("submitted by alice (2 slots)"), "submitted");
  EXPECT_EQ(EventKind("preempted for job-0003 (priority high (800), of "
                      "carol): asked to save its step and stop"),
            "preempt");
  EXPECT_EQ(EventKind("queued again after its preemption: resumes from its "
                      "newest checkpoint when room returns"),
            "preempt");
  EXPECT_EQ(EventKind("attempt 2 started"), "attempt");
  EXPECT_EQ(EventKind("attempt 1 failed (restart 1 of 3): exit 9"), "restart");
  EXPECT_EQ(EventKind("rolled back at step 40 (loss spike) to the checkpoint "
                      "at step 30, skipping the 10 steps of data since"),
            "rollback");
  EXPECT_EQ(EventKind("checkpoint at step 20"), "checkpoint");
  EXPECT_EQ(EventKind("pause requested"), "pause");
  EXPECT_EQ(EventKind("cancel requested"), "cancel");
  EXPECT_EQ(EventKind("rank 0 metrics at 127.0.0.1:9"), "other");
}

// A blend job's evaluation, as the rank reports it, reaches the page with
// each source's loss; a training point has none.
TEST_F(UiTest, ABlendsEvaluationPointCarriesEachSourcesLoss) {
  const std::string id = RunningJob();
  Progress(id, 5, 3.0);
  v1::ReportProgressRequest r;
  r.set_job_id(id);
  r.set_attempt(1);
  r.set_step(5);
  r.set_is_eval(true);
  r.set_val_loss(2.6);
  (*r.mutable_val_loss_by_source())["web"] = 2.5;
  (*r.mutable_val_loss_by_source())["code"] = 3.0;
  ASSERT_TRUE(c_->ReportProgress(r).ok());
  const json m = GetJson("/api/v1/jobs/" + id + "/metrics");
  ASSERT_EQ(m["points"].size(), 2u) << m;
  EXPECT_FALSE(m["points"][0].contains("val_loss_by_source")) << m;
  EXPECT_EQ(m["points"][1]["val_loss"], 2.6);
  EXPECT_EQ(m["points"][1]["val_loss_by_source"],
            json({{"web", 2.5}, {"code", 3.0}}));
}

TEST_F(UiTest, MetricsAreThinnedThenContinueFromTheCursor) {
  const std::string id = RunningJob();
  for (int s = 1; s <= 30; ++s) Progress(id, s, 10.0 - s * 0.1);
  Progress(id, 30, 7.5, /*eval=*/true);
  json m = GetJson("/api/v1/jobs/" + id + "/metrics");
  EXPECT_EQ(m["loss_points_stored"], 31);
  // loss_points_per_series 10: the 30 training points thinned to at most
  // 10, first and last kept; the one evaluation point as it is.
  int train = 0, eval = 0;
  for (const json& p : m["points"]) (p["val_loss"].is_null() ? train : eval)++;
  EXPECT_LE(train, 10);
  EXPECT_GE(train, 8);
  EXPECT_EQ(eval, 1);
  EXPECT_EQ(m["points"][0]["step"], 1);
  EXPECT_EQ(m["points"][0]["tok_per_s"], 3200);
  EXPECT_EQ(m["points"][0]["lr"], 1e-3);
  EXPECT_GT(m["points"][0]["unix_ms"].get<int64_t>(), 0);
  const json& last = m["points"][m["points"].size() - 1];
  EXPECT_EQ(last["val_loss"], 7.5);
  EXPECT_TRUE(last["loss"].is_null());
  const int64_t since = m["next_since"];
  EXPECT_GT(since, 0);
  // Nothing new: nothing sent.
  json none =
      GetJson("/api/v1/jobs/" + id + "/metrics", absl::StrCat("since=", since));
  EXPECT_EQ(none["points"].size(), 0u);
  EXPECT_EQ(none["next_since"], since);
  Progress(id, 31, 6.75);
  Progress(id, 32, 6.5);
  json more =
      GetJson("/api/v1/jobs/" + id + "/metrics", absl::StrCat("since=", since));
  ASSERT_EQ(more["points"].size(), 2u) << more;
  EXPECT_EQ(more["points"][0]["step"], 31);
  EXPECT_EQ(more["points"][1]["loss"], 6.5);
  EXPECT_GT(more["next_since"].get<int64_t>(), since);
  for (const std::string& bad :
       {std::string("since=-1"), std::string("since=%zz"),
        std::string("rank_since=1.5"), "since=" + std::string(65, '9')}) {
    json e = GetJson("/api/v1/jobs/" + id + "/metrics", bad, 400);
    const std::string name = bad.substr(0, bad.find('='));
    EXPECT_TRUE(
        absl::StrContains(e["error"].get<std::string>(), "'" + name + "'"))
        << bad << ": " << e;
  }
  EXPECT_EQ(GetJson("/api/v1/jobs/nope/metrics", "", 404)["error"],
            "no job 'nope'");
}

TEST_F(UiTest, RankTimesComeOnePerRankReportAndContinueFromTheirCursor) {
  const std::string id = RunningJob();
  RankTimes(id, 0, 2, 100);
  RankTimes(id, 1, 2, 180);
  json m = GetJson("/api/v1/jobs/" + id + "/metrics");
  EXPECT_EQ(m["ranks"]["world_size"], 2);
  EXPECT_EQ(m["ranks"]["attempt"], 1);
  ASSERT_EQ(m["ranks"]["points"].size(), 2u) << m["ranks"];
  EXPECT_EQ(m["ranks"]["points"][1]["rank"], 1);
  EXPECT_EQ(m["ranks"]["points"][1]["step_ms"], 180);
  EXPECT_EQ(m["ranks"]["points"][1]["comm_ms"]["dp"], 45);
  const int64_t cursor = m["next_rank_since"];
  RankTimes(id, 0, 4, 110);
  json more = GetJson("/api/v1/jobs/" + id + "/metrics",
                      absl::StrCat("rank_since=", cursor));
  ASSERT_EQ(more["ranks"]["points"].size(), 1u) << more["ranks"];
  EXPECT_EQ(more["ranks"]["points"][0]["step"], 4);
}

TEST_F(UiTest, TheLogTailIsBoundedAndValidUtf8) {
  const std::string id = RunningJob();
  std::ofstream(AttemptDir(id, 1) / "stderr.log")
      << "first line\nsecond \xff line\n";
  json all = GetJson("/api/v1/jobs/" + id + "/log");
  EXPECT_EQ(all["attempt"], 1);
  EXPECT_EQ(all["stream"], "stderr");
  EXPECT_EQ(all["size"], 25);
  EXPECT_EQ(all["text"], "first line\nsecond \xef\xbf\xbd line\n");
  json tail = GetJson("/api/v1/jobs/" + id + "/log", "bytes=5");
  EXPECT_EQ(tail["text"], "line\n");
  GetJson("/api/v1/jobs/" + id + "/log", "stream=passwd", 400);
  GetJson("/api/v1/jobs/" + id + "/log", "bytes=0", 400);
  GetJson("/api/v1/jobs/" + id + "/log", "bytes=1048577", 400);
}

// The attempt's folder is its ranks' to write: a log or run log that is a
// FIFO (whose open would wait for a writer) or a link to /dev/zero is not
// read, the log route says why, and the job page answers without its
// sample.
TEST_F(UiTest, LogsThatAreNoRegularFileAreNotReadAndThePagesAnswer) {
  const std::string id = RunningJob();
  const fs::path a = AttemptDir(id, 1);
  // The launched child opens its logs after the fork, creating them: wait
  // for that, or it creates a log again after it was replaced.
  for (int i = 0; i < 1000 && !(fs::exists(a / "stderr.log") &&
                                fs::exists(a / "stdout.log"));
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::vector<fs::path> fifos = {a / "stderr.log", a / "run.jsonl"};
  for (const fs::path& f : fifos) {
    fs::remove(f);
    ASSERT_EQ(::mkfifo(f.c_str(), 0600), 0) << f;
  }
  fs::remove(a / "stdout.log");
  fs::create_symlink("/dev/zero", a / "stdout.log");
  std::promise<std::vector<json>> done;
  std::future<std::vector<json>> result = done.get_future();
  std::thread asker([&] {
    done.set_value({GetJson("/api/v1/jobs/" + id + "/log"),
                    GetJson("/api/v1/jobs/" + id + "/log", "stream=stdout"),
                    GetJson("/api/v1/jobs/" + id)});
  });
  if (result.wait_for(std::chrono::minutes(1)) != std::future_status::ready) {
    ADD_FAILURE() << "a route blocked on the attempt's files";
    while (result.wait_for(std::chrono::milliseconds(100)) !=
           std::future_status::ready) {
      for (const fs::path& f : fifos) {
        ::close(::open(f.c_str(), O_WRONLY | O_NONBLOCK));
      }
    }
  }
  asker.join();
  const std::vector<json> got = result.get();
  EXPECT_EQ(got[0]["text"], "");
  EXPECT_EQ(
      got[0]["omitted"],
      "stderr.log of attempt 1: is a FIFO, not a regular file: not shown");
  EXPECT_EQ(got[1]["text"], "");
  EXPECT_EQ(got[1]["omitted"],
            "stdout.log of attempt 1: is a symbolic link, not a regular file: "
            "not shown");
  EXPECT_EQ(got[2]["job"]["id"], id);
  EXPECT_TRUE(got[2]["sample"].is_null());
  // A log that is only missing is empty, nothing omitted.
  fs::remove(a / "stderr.log");
  const json missing = GetJson("/api/v1/jobs/" + id + "/log");
  EXPECT_EQ(missing["size"], 0);
  EXPECT_TRUE(missing["omitted"].is_null());
}

TEST_F(UiTest, StaticFilesAreServedByNameOnlyAndUnknownRoutesAre404) {
  EXPECT_EQ(Get("/static/chart.js").body, "/* Chart.js */");
  EXPECT_EQ(Get("/static/ui.js").status, 200);
  EXPECT_EQ(Get("/static/ui.css").status, 200);
  for (const char* path :
       {"/static/../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd",
        "/static/..%2f..%2fetc/passwd", "/static/ui.js/", "/static/",
        "/etc/passwd", "/api/v2/jobs", "/api/v1/jobs/a/b/c", "/api/v1/jobs/..",
        "/jobs/a%2fb", "/favicon.ico"}) {
    CoordinatorUi::Response r = Get(path);
    EXPECT_EQ(r.status, 404) << path;
    EXPECT_FALSE(absl::StrContains(r.body, "root:")) << path;
  }
  json e = GetJson("/api/v1/jobs", std::string(2000, 'a'), 400);
  EXPECT_TRUE(absl::StrContains(e["error"].get<std::string>(), "query string"));
}

TEST_F(UiTest, NodesListTheLocalHostWhenNoNodeRegistered) {
  json n = GetJson("/api/v1/nodes");
  EXPECT_EQ(n["nodes"].size(), 0u);
  EXPECT_EQ(n["local_slots"], 2);
  EXPECT_EQ(n["local_slots_used"], 0);
  // The host's own figures, as a node's row has them.
  EXPECT_GE(n["local"]["cores"].get<int>(), 1) << n;
  EXPECT_GT(n["local"]["memory_bytes"].get<int64_t>(), 0) << n;
  EXPECT_GE(n["local"]["load1"].get<double>(), 0.0) << n;
  EXPECT_GE(n["local"]["gpus"].get<int>(), 0) << n;
  RunningJob();
  EXPECT_EQ(GetJson("/api/v1/nodes")["local_slots_used"], 2);
}

TEST_F(UiTest, StartRefusesPlainTextOffLoopbackAPortInUseAndNoChartJs) {
  UiOptions u;
  u.chart_js = (dir_ / "chart.js").string();
  u.listen = "0.0.0.0:0";
  auto open = CoordinatorUi::Start(u, c_.get());
  ASSERT_FALSE(open.ok());
  EXPECT_TRUE(absl::StrContains(open.status().message(), "--ui-insecure"))
      << open.status();
  EXPECT_TRUE(absl::StrContains(open.status().message(), "--ui-listen"))
      << open.status();
  u.insecure = true;
  EXPECT_TRUE(CoordinatorUi::Start(u, c_.get()).ok());
  u.listen = absl::StrCat("127.0.0.1:", ui_->port());  // in use
  auto taken = CoordinatorUi::Start(u, c_.get());
  ASSERT_FALSE(taken.ok());
  EXPECT_TRUE(
      absl::StrContains(taken.status().message(),
                        absl::StrCat("--ui-listen 127.0.0.1:", ui_->port())))
      << taken.status();
  u.listen = "127.0.0.1:0";
  u.chart_js = (dir_ / "none.js").string();
  auto no_chart = CoordinatorUi::Start(u, c_.get());
  ASSERT_FALSE(no_chart.ok());
  EXPECT_TRUE(absl::StrContains(no_chart.status().message(), "libjs-chart.js"))
      << no_chart.status();
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.8.0.1"));
  EXPECT_TRUE(IsLoopbackHost("[::1]"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("example.org"));
}

TEST_F(UiTest, OverHttpTheStatusHeadersAndBodyArrive) {
  httplib::Client client("127.0.0.1", ui_->port());
  httplib::Result r =
      client.Get("/api/v1/nodes", {{"Authorization", "Bearer user-token"}});
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(r->get_header_value("Cache-Control"), "no-store");
  EXPECT_EQ(json::parse(r->body)["local_slots"], 2);
  r = client.Get("/api/v1/nodes");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  // The login form over HTTP: its cookie, then a page with it.
  r = client.Post("/login", "token=user%2Dtoken",
                  "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 303);
  const std::string cookie = r->get_header_value("Set-Cookie");
  r = client.Get("/nodes", {{"Cookie", cookie.substr(0, cookie.find(';'))}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(absl::StrContains(r->body, "data-page=\"nodes\"")) << r->body;
}

// Guessing the token is throttled per address: after its burst of wrong
// tokens a peer's attempts, the right token included, get 429 with
// Retry-After and no cookie; another address's right token still opens the
// pages, and a request without a token is no guess.
TEST_F(UiTest, RepeatedWrongTokensAreThrottledForThatAddressOnly) {
  CoordinatorUi::Request login;
  login.method = "POST";
  login.path = "/login";
  login.peer = "10.2.0.1";
  login.body = "token=wrong";
  int refused = 0;
  for (int i = 0; i < 100; ++i) {
    CoordinatorUi::Response r = ui_->Handle(login);
    if (r.status == 429) break;
    EXPECT_EQ(r.status, 401);
    ++refused;
  }
  EXPECT_EQ(refused, static_cast<int>(AuthThrottle::Options().user.burst));
  login.body = "token=user-token";
  CoordinatorUi::Response throttled = ui_->Handle(login);
  EXPECT_EQ(throttled.status, 429);
  EXPECT_TRUE(Header(throttled, "Set-Cookie").empty());
  EXPECT_GT(std::atoi(Header(throttled, "Retry-After").c_str()), 0);
  EXPECT_TRUE(absl::StrContains(throttled.body, "Too many wrong tokens"))
      << throttled.body;
  CoordinatorUi::Response api =
      Get("/api/v1/jobs", "", "Bearer user-token", "10.2.0.1");
  EXPECT_EQ(api.status, 429);
  EXPECT_TRUE(
      absl::StrContains(json::parse(api.body)["error"].get<std::string>(),
                        "too many refused user tokens from 10.2.0.1"))
      << api.body;
  EXPECT_EQ(Get("/", "", "", "10.2.0.1").status, 401);
  login.peer = "10.2.0.2";
  EXPECT_EQ(ui_->Handle(login).status, 303);
  EXPECT_EQ(Get("/api/v1/jobs", "", "Bearer user-token", "10.2.0.2").status,
            200);
}

// A loopback listener answers only to a loopback Host with its port: a
// page whose DNS name was rebound to 127.0.0.1 reads nothing.
TEST_F(UiTest, OnLoopbackAHostThatIsNotThisUisIsMisdirected) {
  const std::string port = absl::StrCat(ui_->port());
  CoordinatorUi::Request r;
  r.path = "/api/v1/nodes";
  r.authorization = "Bearer user-token";
  for (const std::string& host :
       {"evil.example:" + port, std::string("evil.example"),
        std::string("127.0.0.1:1"), std::string("127.0.0.1"),
        "127.0.0.1.evil.example:" + port, "10.0.0.1:" + port,
        std::string("[::1]"), "127.0.0.1:" + port + "0", "127.0.0.1:+" + port,
        "[::1" + port}) {
    r.host = host;
    CoordinatorUi::Response out = ui_->Handle(r);
    EXPECT_EQ(out.status, 421) << host;
    EXPECT_FALSE(absl::StrContains(out.body, "local_slots")) << host;
  }
  for (const std::string& host :
       {"127.0.0.1:" + port, "localhost:" + port, "LocalHost:" + port,
        "[::1]:" + port, "127.8.0.1:" + port, std::string()}) {
    r.host = host;
    EXPECT_EQ(ui_->Handle(r).status, 200) << host;
  }
}

// Login CSRF and logout by image: a POST whose Origin (or Referer) is
// another site's is refused, and logging out takes a POST.
TEST_F(UiTest, FormsOfOtherSitesCannotLogInOrOutAndLogoutIsAPost) {
  const std::string own = absl::StrCat("127.0.0.1:", ui_->port());
  CoordinatorUi::Request login;
  login.method = "POST";
  login.path = "/login";
  login.host = own;
  login.body = "token=user-token";
  for (const std::string& origin :
       {std::string("http://127.0.0.1:1"), std::string("http://evil.example"),
        std::string("null"), "https://" + own, "http://" + own + ".evil"}) {
    login.origin = origin;
    CoordinatorUi::Response r = ui_->Handle(login);
    EXPECT_EQ(r.status, 403) << origin;
    EXPECT_TRUE(Header(r, "Set-Cookie").empty()) << origin;
  }
  login.origin = "";
  login.referer = "http://evil.example/" + own;
  EXPECT_EQ(ui_->Handle(login).status, 403);
  login.referer = "http://" + own + "/login";
  EXPECT_EQ(ui_->Handle(login).status, 303);
  login.referer = "";
  login.origin = "http://" + own;
  CoordinatorUi::Response ok = ui_->Handle(login);
  EXPECT_EQ(ok.status, 303);
  EXPECT_FALSE(Header(ok, "Set-Cookie").empty());
  login.origin = "";  // no browser: curl, ptrain's tests
  EXPECT_EQ(ui_->Handle(login).status, 303);
  // The UI's own forms carry their origin: not "no-referrer", under which
  // a browser sends "Origin: null".
  EXPECT_EQ(Header(ok, "Referrer-Policy"), "same-origin");

  CoordinatorUi::Request logout;
  logout.path = "/logout";
  logout.host = own;
  logout.cookie = "ptrain_token=user-token";
  CoordinatorUi::Response by_get = ui_->Handle(logout);
  EXPECT_EQ(by_get.status, 405);
  EXPECT_EQ(Header(by_get, "Allow"), "POST");
  EXPECT_TRUE(Header(by_get, "Set-Cookie").empty());
  logout.method = "POST";
  logout.origin = "http://127.0.0.1:1";
  EXPECT_EQ(ui_->Handle(logout).status, 403);
  logout.origin = "http://" + own;
  CoordinatorUi::Response out = ui_->Handle(logout);
  EXPECT_EQ(out.status, 303);
  EXPECT_EQ(Header(out, "Location"), "/login");
  EXPECT_TRUE(absl::StrContains(Header(out, "Set-Cookie"), "Max-Age=0"));
  // Every page has the form that signs out.
  for (const char* page : {"/", "/nodes", "/jobs/job-0001"}) {
    EXPECT_TRUE(
        absl::StrContains(Get(page).body, "method=\"post\" action=\"/logout\""))
        << page;
  }
  CoordinatorUi::Request put;
  put.method = "PUT";
  put.path = "/";
  put.authorization = "Bearer user-token";
  CoordinatorUi::Response refused = ui_->Handle(put);
  EXPECT_EQ(refused.status, 405);
  EXPECT_EQ(Header(refused, "Allow"), "GET, HEAD, POST");
}

// A chunk of `n` bytes of 'a' in chunked framing.
std::string Chunk(size_t n) {
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", n);
  return size + std::string(n, 'a') + "\r\n";
}

std::string Post(const std::string& path, const std::string& headers,
                 const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\n" + headers + "\r\n" + body;
}

// Over HTTP (the server's whole path, without a socket): a body over
// kMaxBody is 413 whatever its framing, method or route, and nothing is
// set; a body of a method that takes none is 413 too.
TEST_F(UiTest, ABodyOverTheLimitIs413WhateverItsFramingMethodOrRoute) {
  const std::string chunked = "Transfer-Encoding: chunked\r\n";
  std::string tiny_chunks;
  for (int i = 0; i < 5000; ++i) tiny_chunks += Chunk(1);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"one chunk", Post("/login", chunked, Chunk(8192) + Chunk(0) + "\r\n")},
      {"a chunk of 1 MiB", Post("/login", chunked, Chunk(1 << 20))},
      {"5000 chunks of a byte",
       Post("/login", chunked, tiny_chunks + Chunk(0) + "\r\n")},
      {"a chunk extension of 70 KiB",
       Post("/login", chunked,
            "1;x=" + std::string(70 << 10, 'e') + "\r\na\r\n0\r\n\r\n")},
      {"Content-Length 5000",
       Post("/login", "Content-Length: 5000\r\n", std::string(5000, 'a'))},
      {"Content-Length 300 MB",
       Post("/login", "Content-Length: 300000000\r\n", std::string(1000, 'a'))},
      {"another route", Post("/api/v1/jobs", chunked, Chunk(8192))},
      {"GET with a body",
       "GET / HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789"},
      {"GET, chunked", "GET /login HTTP/1.1\r\n" + chunked + "\r\n" +
                           Chunk(10) + Chunk(0) + "\r\n"},
      {"HEAD, chunked", "HEAD / HTTP/1.1\r\n" + chunked + "\r\n" + Chunk(10)},
      {"PUT, chunked", "PUT / HTTP/1.1\r\n" + chunked + "\r\n" + Chunk(10)},
      {"DELETE",
       "DELETE /api/v1/jobs/job-0001 HTTP/1.1\r\nContent-Length: "
       "100\r\n\r\n" +
           std::string(100, 'a')},
      {"Expect: 100-continue",
       Post("/login", "Content-Length: 5000\r\nExpect: 100-continue\r\n", "")},
  };
  for (const auto& [name, bytes] : cases) {
    const std::string reply = ui_->Exchange(bytes);
    EXPECT_EQ(::ptrain::testing::HttpStatus(reply), 413)
        << name << ": " << reply.substr(0, 300);
    EXPECT_FALSE(absl::StrContains(reply, "Set-Cookie")) << name;
    EXPECT_FALSE(absl::StrContains(reply, "100 Continue")) << name;
  }
}

TEST_F(UiTest, MalformedFramingIsRefusedAndAChunkedLoginWorks) {
  const std::string chunked = "Transfer-Encoding: chunked\r\n";
  const std::string login = ui_->Exchange(
      Post("/login", chunked, "6\r\ntoken=\r\na\r\nuser-token\r\n0\r\n\r\n"));
  EXPECT_EQ(::ptrain::testing::HttpStatus(login), 303) << login;
  EXPECT_TRUE(absl::StrContains(login, "Set-Cookie: ptrain_token=user-token"))
      << login;
  const std::string path(3000, 'a');
  const std::vector<std::tuple<std::string, std::string, int>> cases = {
      {"bad chunk size", Post("/login", chunked, "zz\r\nabc\r\n0\r\n\r\n"),
       400},
      {"no last chunk", Post("/login", chunked, "3\r\nabc\r\n"), 400},
      {"both lengths", Post("/login", chunked + "Content-Length: 3\r\n", "abc"),
       400},
      {"another transfer encoding",
       Post("/login", "Transfer-Encoding: gzip\r\n", "abc"), 501},
      {"two encodings",
       Post("/login", "Transfer-Encoding: gzip, chunked\r\n",
            "3\r\nabc\r\n0\r\n\r\n"),
       501},
      {"two lengths",
       Post("/login", "Content-Length: 3\r\nContent-Length: 3\r\n", "abc"),
       400},
      {"negative length", Post("/login", "Content-Length: -1\r\n", ""), 400},
      {"hex length", Post("/login", "Content-Length: 0x10\r\n", ""), 400},
      {"compressed",
       Post("/login",
            "Content-Encoding: gzip\r\n"
            "Content-Length: 3\r\n",
            "abc"),
       415},
      {"multipart",
       Post("/login",
            "Content-Type: multipart/form-data; boundary=x\r\n"
            "Content-Length: 3\r\n",
            "abc"),
       415},
      {"two hosts",
       "GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: "
       "evil.example\r\n\r\n",
       400},
      {"a long path", "GET /" + path + " HTTP/1.1\r\n\r\n", 414},
      {"headers of 20 KiB",
       "GET /login HTTP/1.1\r\nX-Big: " + std::string(20 << 10, 'a') +
           "\r\n\r\n",
       431},
      {"headers cut off", "GET /login HTTP/1.1\r\nX-A: b\r\n", 400},
      {"body cut off", Post("/login", "Content-Length: 30\r\n", "token="), 400},
  };
  for (const auto& [name, bytes, want] : cases) {
    const std::string reply = ui_->Exchange(bytes);
    EXPECT_EQ(::ptrain::testing::HttpStatus(reply), want)
        << name << ": " << reply.substr(0, 300);
    EXPECT_FALSE(absl::StrContains(reply, "Set-Cookie")) << name;
  }
  EXPECT_EQ(ui_->Exchange(""), "");
}

// cpp-httplib 0.11.4 would build every range of a multi-range request into
// one answer: ranges are ignored, the whole file is the answer.
TEST_F(UiTest, RangesAreIgnored) {
  std::string ranges = "bytes=0-";
  for (int i = 0; i < 2000; ++i) ranges += ",0-";
  const std::string reply = ui_->Exchange(
      "GET /static/chart.js HTTP/1.1\r\nAuthorization: Bearer "
      "user-token\r\nRange: " +
      ranges + "\r\nIf-Range: x\r\n\r\n");
  EXPECT_EQ(::ptrain::testing::HttpStatus(reply), 200) << reply.substr(0, 300);
  EXPECT_TRUE(absl::EndsWith(reply, "\r\n\r\n/* Chart.js */")) << reply;
  // Also behind a line that ends without its '\r' (cpp-httplib skips that
  // line, then reads the next).
  const std::string hidden = ui_->Exchange(
      "GET /static/chart.js HTTP/1.1\r\nAuthorization: Bearer "
      "user-token\r\nX-A: b\nRange: " +
      ranges + "\r\n\r\n");
  EXPECT_EQ(::ptrain::testing::HttpStatus(hidden), 200)
      << hidden.substr(0, 300);
  EXPECT_TRUE(absl::EndsWith(hidden, "\r\n\r\n/* Chart.js */")) << hidden;
}

}  // namespace
}  // namespace ptrain
