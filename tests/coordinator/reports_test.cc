// The checks on rank reports and run-log lines (coordinator/reports.h): each
// rule refuses what breaks it, names the field, and lets the rest through.
#include "coordinator/reports.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "gtest/gtest.h"
#include "tests/testing/committed_checkpoint.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

const ReportContext kCtx{"job-0001", 2, 4, 100};

v1::ReportProgressRequest GoodProgress() {
  v1::ReportProgressRequest r;
  r.set_job_id("job-0001");
  r.set_attempt(2);
  r.set_rank(3);
  r.set_step(100);
  r.set_loss(2.5);
  r.set_tok_per_s(1e6);
  r.set_mfu(0.3);
  r.set_lr(1e-3);
  return r;
}

TEST(ReportsTest, ProgressWithinTheRulesPasses) {
  EXPECT_TRUE(ValidateProgress(GoodProgress(), kCtx).ok());
  v1::ReportProgressRequest blend = GoodProgress();
  for (int i = 0; i < 64; ++i) {
    (*blend.mutable_val_loss_by_source())[std::to_string(i) +
                                          std::string(62, 'w')] = 2.5;
  }
  (*blend.mutable_val_loss_by_source())["0" + std::string(62, 'w')] = 0;
  EXPECT_TRUE(ValidateProgress(blend, kCtx).ok())
      << ValidateProgress(blend, kCtx);
  v1::ReportProgressRequest zero = GoodProgress();
  zero.set_step(0);
  zero.set_rank(0);
  EXPECT_TRUE(ValidateProgress(zero, kCtx).ok());
}

TEST(ReportsTest, EachProgressFieldIsCheckedAndNamed) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    const char* field;
    void (*edit)(v1::ReportProgressRequest&, double, double);
  };
  const Case cases[] = {
      {"job_id", [](auto& r, double, double) { r.set_job_id("job-0002"); }},
      {"attempt", [](auto& r, double, double) { r.set_attempt(1); }},
      {"rank", [](auto& r, double, double) { r.set_rank(4); }},
      {"rank", [](auto& r, double, double) { r.set_rank(-1); }},
      {"step", [](auto& r, double, double) { r.set_step(101); }},
      {"step", [](auto& r, double, double) { r.set_step(int64_t{1} << 62); }},
      {"step", [](auto& r, double, double) { r.set_step(-3); }},
      {"loss", [](auto& r, double n, double) { r.set_loss(n); }},
      {"loss", [](auto& r, double, double i) { r.set_loss(i); }},
      {"loss", [](auto& r, double, double) { r.set_loss(-1); }},
      {"val_loss", [](auto& r, double n, double) { r.set_val_loss(n); }},
      {"tok_per_s", [](auto& r, double, double) { r.set_tok_per_s(-1); }},
      {"mfu", [](auto& r, double, double i) { r.set_mfu(-i); }},
      {"lr", [](auto& r, double n, double) { r.set_lr(n); }},
      {"val_loss_by_source['web']",
       [](auto& r, double n, double) {
         (*r.mutable_val_loss_by_source())["web"] = n;
       }},
      {"val_loss_by_source['web']",
       [](auto& r, double, double) {
         (*r.mutable_val_loss_by_source())["web"] = -1;
       }},
      {"val_loss_by_source['']",
       [](auto& r, double, double) {
         (*r.mutable_val_loss_by_source())[""] = 1;
       }},
      {"val_loss_by_source['a?b']",
       [](auto& r, double, double) {
         (*r.mutable_val_loss_by_source())["a\nb"] = 1;
       }},
      {"val_loss_by_source[",
       [](auto& r, double, double) {
         (*r.mutable_val_loss_by_source())[std::string(65, 'x')] = 1;
       }},
      {"val_loss_by_source has 65 sources",
       [](auto& r, double, double) {
         for (int i = 0; i < 65; ++i) {
           (*r.mutable_val_loss_by_source())["s" + std::to_string(i)] = 1;
         }
       }},
  };
  for (const Case& c : cases) {
    v1::ReportProgressRequest r = GoodProgress();
    c.edit(r, nan, inf);
    const absl::Status s = ValidateProgress(r, kCtx);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(s.message().rfind(c.field, 0), 0u) << s;
  }
}

// The probe reported step 1 after step 366 of the same attempt and saw it
// shown. A lower step only comes with a new attempt (a new context).
TEST(ReportsTest, ProgressMayNotGoBackWithinAnAttempt) {
  ReportContext ctx = kCtx;
  ctx.last_step = 66;
  v1::ReportProgressRequest r = GoodProgress();
  r.set_step(66);  // again (an evaluation of the step just trained)
  EXPECT_TRUE(ValidateProgress(r, ctx).ok());
  r.set_step(67);
  EXPECT_TRUE(ValidateProgress(r, ctx).ok());
  r.set_step(1);
  const absl::Status back = ValidateProgress(r, ctx);
  EXPECT_EQ(back.code(), absl::StatusCode::kInvalidArgument) << back;
  EXPECT_EQ(back.message().rfind("step=1 is below step 66", 0), 0u) << back;
  ctx.last_step = -1;  // a new attempt starts anywhere
  EXPECT_TRUE(ValidateProgress(r, ctx).ok());
}

TEST(ReportsTest, SignsOfLifeAreCheckedAndNamed) {
  v1::ReportAliveRequest r;
  r.set_job_id("job-0001");
  r.set_attempt(2);
  r.set_rank(3);
  r.set_activity("loading data");
  EXPECT_TRUE(ValidateAlive(r, kCtx).ok());
  struct Case {
    const char* field;
    std::function<void(v1::ReportAliveRequest&)> edit;
  };
  const Case cases[] = {
      {"job_id", [](auto& a) { a.set_job_id("job-0002"); }},
      {"attempt", [](auto& a) { a.set_attempt(1); }},
      {"rank", [](auto& a) { a.set_rank(4); }},
      {"activity", [](auto& a) { a.set_activity("line\nbreak"); }},
      {"activity",
       [](auto& a) {
         a.set_activity(std::string(kMaxActivityBytes + 1, 'a'));
       }},
  };
  for (const Case& c : cases) {
    v1::ReportAliveRequest bad = r;
    c.edit(bad);
    const absl::Status s = ValidateAlive(bad, kCtx);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(s.message().rfind(c.field, 0), 0u) << s;
  }
}

TEST(ReportsTest, StepTimesAreCheckedAndNamed) {
  v1::ReportAliveRequest r;
  r.set_job_id("job-0001");
  r.set_attempt(2);
  r.set_rank(3);
  v1::RankTimes* t = r.mutable_times();
  t->set_step(100);
  t->set_steps(3);
  t->set_step_ms(250);
  t->set_exposed_ms(0);
  (*t->mutable_comm_ms())["dp"] = 12.5;
  (*t->mutable_comm_ms())["pp_2"] = 0;
  EXPECT_TRUE(ValidateAlive(r, kCtx).ok()) << ValidateAlive(r, kCtx);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    const char* field;
    std::function<void(v1::RankTimes&)> edit;
  };
  const Case cases[] = {
      {"step", [](auto& x) { x.set_step(101); }},
      {"times.step", [](auto& x) { x.set_step(0); }},
      {"times.steps", [](auto& x) { x.set_steps(0); }},
      {"times.step_ms", [&](auto& x) { x.set_step_ms(nan); }},
      {"times.exposed_ms", [](auto& x) { x.set_exposed_ms(-1); }},
      {"times.comm_ms[dp]",
       [](auto& x) { (*x.mutable_comm_ms())["dp"] = -0.5; }},
      {"times.comm_ms: group",
       [](auto& x) { (*x.mutable_comm_ms())["d-p"] = 1; }},
      {"times.comm_ms: group",
       [](auto& x) {
         (*x.mutable_comm_ms())[std::string(kMaxRankTimesGroupBytes + 1, 'g')] =
             1;
       }},
      {"times.comm_ms:",
       [](auto& x) {
         for (int g = 0; g < 8; ++g) {
           (*x.mutable_comm_ms())[absl::StrCat("g", g)] = 1;
         }
       }},
  };
  for (const Case& c : cases) {
    v1::ReportAliveRequest bad = r;
    c.edit(*bad.mutable_times());
    const absl::Status s = ValidateAlive(bad, kCtx);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(s.message().rfind(c.field, 0), 0u) << s;
  }
}

TEST(ReportsTest, HostPortNeedsADialableHostAndAPortInRange) {
  for (const char* ok : {"127.0.0.1:9100", "[::1]:1", "node-1:65535",
                         "a.b.example:80", "localhost:8080"}) {
    EXPECT_TRUE(ValidateHostPort("address", ok).ok()) << ok;
  }
  for (const char* bad :
       {"", ":80", "host", "host:", "host:0", "host:65536", "host:99999",
        "host:+80", "host:8 0", "0.0.0.0:80", "[::]:80", "::1:80", "[zz]:80",
        "ho st:80", "-host:80", "host-:80", "a..b:80", "300.1.1.1:80",
        "1.2.3:80"}) {
    const absl::Status s = ValidateHostPort("address", bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.message().rfind("address", 0), 0u) << s;
  }
  EXPECT_FALSE(ValidateHostPort("address", std::string(400, 'a') + ":80").ok());
}

TEST(ReportsTest, EndpointLabelsAreBounded) {
  v1::ReportEndpointRequest r;
  r.set_job_id("job-0001");
  r.set_attempt(2);
  r.set_rank(0);
  r.set_address("127.0.0.1:9100");
  EXPECT_TRUE(ValidateEndpoint(r, kCtx).ok());
  (*r.mutable_labels())["k"] = std::string(kMaxEndpointLabelBytes + 1, 'v');
  EXPECT_EQ(ValidateEndpoint(r, kCtx).code(),
            absl::StatusCode::kInvalidArgument);
  r.clear_labels();
  for (size_t i = 0; i <= kMaxEndpointLabels; ++i) {
    r.mutable_labels()->insert({absl::StrCat("label", i), "v"});
  }
  EXPECT_EQ(ValidateEndpoint(r, kCtx).code(),
            absl::StatusCode::kInvalidArgument);
}

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("reports_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    root_ = dir_ / "ckpt" / "job-uid";
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A committed checkpoint of the step its folder names.
  static fs::path Committed(const fs::path& at) {
    const std::string name = at.filename().string();
    return testing::WriteCommittedCheckpoint(
        at, std::stoll(name.substr(name.find('-') + 1)), "job-uid");
  }
  fs::path dir_, root_;
};

TEST_F(CheckpointDirTest, OnlyACommittedFolderOfTheStepUnderTheRootPasses) {
  const fs::path good = Committed(root_ / StepFolderName(20));
  EXPECT_EQ(StepFolderName(20), "step-00000020");
  EXPECT_EQ(StepFolderName(123456789), "step-123456789");
  auto ok =
      ResolveCheckpointDir("dir", good.string(), 20, root_.string(), "job-uid");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, fs::canonical(good).string());
  // Through a ".." that still lands on it: fine, the real path is kept.
  auto dotted = ResolveCheckpointDir(
      "dir", (root_ / "x" / ".." / "step-00000020").string(), 20,
      root_.string(), "job-uid");
  EXPECT_FALSE(dotted.ok());  // x does not exist, so the path does not either
  fs::create_directories(root_ / "x");
  dotted = ResolveCheckpointDir("dir",
                                (root_ / "x" / ".." / "step-00000020").string(),
                                20, root_.string(), "job-uid");
  EXPECT_TRUE(dotted.ok()) << dotted.status();

  const fs::path other =
      Committed(dir_ / "ckpt" / "other-job" / "step-00000020");
  fs::create_directories(root_ / "step-00000030");  // no manifest
  const fs::path escape = root_ / "step-00000040";
  fs::create_directory_symlink(Committed(dir_ / "outside" / "step-00000040"),
                               escape);
  const fs::path nested = Committed(root_ / "sub" / "step-00000050");
  struct Case {
    std::string dir;
    int64_t step;
  };
  const Case bad[] = {
      {good.string(), 21},                       // another step
      {other.string(), 20},                      // another job's folder
      {(root_ / "step-00000030").string(), 30},  // not committed
      {escape.string(), 40},                     // symlink out of the root
      {nested.string(), 50},                     // not directly under it
      {(root_ / "step-00000060").string(), 60},  // missing
      {"/etc", 0},
  };
  for (const Case& c : bad) {
    auto s =
        ResolveCheckpointDir("dir", c.dir, c.step, root_.string(), "job-uid");
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.dir;
    EXPECT_EQ(s.status().message().rfind("dir", 0), 0u) << s.status();
  }
  EXPECT_FALSE(
      ResolveCheckpointDir("dir", good.string(), 20, "", "job-uid").ok());
}

// The probe's fake checkpoint was a folder with manifest.json holding "{}".
// Only what a committed save leaves passes: the manifest its digest names,
// of this step and job, and every shard it lists there with its size.
TEST_F(CheckpointDirTest, AFolderThatIsNotWhatACommitLeavesIsRefused) {
  struct Case {
    const char* what;
    std::function<void(const fs::path&)> spoil;
  };
  const std::vector<Case> cases = {
      {"a manifest of {} and no digest",
       [](const fs::path& d) {
         std::ofstream(d / "manifest.json") << "{}";
         fs::remove(d / "manifest.sha256");
       }},
      {"a manifest of {} with its own digest",
       [](const fs::path& d) {
         std::ofstream(d / "manifest.json") << "{}";
         std::ofstream(d / "manifest.sha256") << ManifestDigestLine("{}");
       }},
      {"a manifest that its digest does not name",
       [](const fs::path& d) {
         std::ofstream(d / "manifest.json", std::ios::app) << " ";
       }},
      {"a digest that is not a SHA-256 line",
       [](const fs::path& d) { std::ofstream(d / "manifest.sha256") << "x"; }},
      {"a manifest of another step",
       [](const fs::path& d) {
         testing::WriteCommittedCheckpoint(d, 21, "job-uid");
       }},
      {"a manifest of another job",
       [](const fs::path& d) {
         testing::WriteCommittedCheckpoint(d, 20, "other-job");
       }},
      {"a missing shard",
       [](const fs::path& d) { fs::remove(d / "shard-00000.bin"); }},
      {"a shard of another size",
       [](const fs::path& d) {
         std::ofstream(d / "shard-00000.bin", std::ios::app) << "more";
       }},
      {"a shard that is a link",
       [](const fs::path& d) {
         fs::rename(d / "shard-00000.bin", d / "real.bin");
         fs::create_symlink(d / "real.bin", d / "shard-00000.bin");
       }},
      {"a shard name with a folder in it",
       [](const fs::path& d) {
         const std::string m =
             R"({"step":20,"files":{"../x.bin":{"bytes":16}}})";
         std::ofstream(d / "manifest.json") << m;
         std::ofstream(d / "manifest.sha256") << ManifestDigestLine(m);
       }},
      {"no files",
       [](const fs::path& d) {
         const std::string m = R"({"step":20,"files":{}})";
         std::ofstream(d / "manifest.json") << m;
         std::ofstream(d / "manifest.sha256") << ManifestDigestLine(m);
       }},
  };
  for (const Case& c : cases) {
    const fs::path at = Committed(root_ / StepFolderName(20));
    ASSERT_TRUE(
        ResolveCheckpointDir("dir", at.string(), 20, root_.string(), "job-uid")
            .ok())
        << c.what;
    c.spoil(at);
    auto s =
        ResolveCheckpointDir("dir", at.string(), 20, root_.string(), "job-uid");
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_EQ(s.status().message().rfind("dir", 0), 0u) << s.status();
    fs::remove_all(at);
  }
}

TEST(ReportsTest, RunLogLinesAreCheckedLikeReports) {
  auto line = [](const std::string& text) {
    return ParseRunLogLine(text, kCtx);
  };
  auto step = line(
      R"({"type":"step","step":7,"loss":2.5,"lr":0.001,"ms":3,"tok_per_s":9,"mfu":0.1})");
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->kind, RunLogRecord::kStep);
  EXPECT_EQ(step->step, 7);
  EXPECT_EQ(step->loss, 2.5);
  auto eval = line(R"({"type":"eval","step":7,"val_loss":2.0})");
  ASSERT_TRUE(eval.has_value());
  EXPECT_EQ(eval->val_loss, 2.0);
  auto blend = line(
      R"({"type":"eval","step":7,"val_loss":2.0,"val_loss_by_source":{"web":1.5,"code":3.5}})");
  ASSERT_TRUE(blend.has_value());
  EXPECT_EQ(blend->val_loss_by_source,
            (std::map<std::string, double>{{"web", 1.5}, {"code", 3.5}}));
  auto ckpt =
      line(R"({"type":"checkpoint","step":7,"dir":"/c/step-00000007"})");
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_EQ(ckpt->dir, "/c/step-00000007");
  for (
      const char* bad : {
          "",
          "{",
          "[]",
          "null",
          R"({"type":"sample","step":1,"text":"x"})",
          R"({"type":"step","loss":1})",                     // no step
          R"({"type":"step","step":"7","loss":1})",          // step a string
          R"({"type":"step","step":7.5,"loss":1})",          // not integral
          R"({"type":"step","step":101,"loss":1})",          // past the end
          R"({"type":"step","step":7,"loss":-1})",           // negative
          R"({"type":"step","step":7,"loss":"x"})",          // not a number
          R"({"type":"step","step":7,"loss":1e999})",        // infinite
          R"({"type":"step","step":18446744073709551615})",  // wraps negative
          R"({"type":"checkpoint","step":7,"dir":"/etc"})",
          R"({"type":"checkpoint","step":7})",
          R"({"type":"eval","step":7,"val_loss":2,"val_loss_by_source":[1]})",
          R"({"type":"eval","step":7,"val_loss":2,"val_loss_by_source":{"w":"x"}})",
          R"({"type":"eval","step":7,"val_loss":2,"val_loss_by_source":{"w":-1}})",
          R"({"type":"eval","step":7,"val_loss":2,"val_loss_by_source":{"":1}})",
      }) {
    EXPECT_FALSE(line(bad).has_value()) << bad;
  }
}

// A run log at `path`: step records 1..steps and, every `every` steps, an
// evaluation record and (when `checkpoints`) a checkpoint record.
void WriteRunLog(const fs::path& path, int steps, int every, bool checkpoints) {
  std::ofstream out(path);
  for (int step = 1; step <= steps; ++step) {
    out << R"({"type":"step","step":)" << step
        << R"(,"loss":2.5,"lr":0.001,"ms":3,"tok_per_s":9,"mfu":0.1})"
        << "\n";
    if (step % every != 0) continue;
    out << R"({"type":"eval","step":)" << step << R"(,"val_loss":2.0})"
        << "\n";
    if (checkpoints) {
      out << R"({"type":"checkpoint","step":)" << step << R"(,"dir":"/ckpt/)"
          << StepFolderName(step) << R"("})"
          << "\n";
    }
  }
}

// The "end" record says the run trained every step: only at train.steps.
TEST(ReportsTest, OnlyAnEndRecordAtTheLastStepSaysTheRunFinished) {
  const fs::path path = fs::temp_directory_path() /
                        ("reports_end_" + std::to_string(getpid()) + ".jsonl");
  const ReportContext ctx{"job-0001", 2, 4, 100};
  WriteRunLog(path, 100, 50, /*checkpoints=*/false);
  EXPECT_FALSE(ReadRunLog(path.string(), ctx).ended);
  std::ofstream(path, std::ios::app) << R"({"type":"end","step":99})"
                                     << "\n";
  EXPECT_FALSE(ReadRunLog(path.string(), ctx).ended);
  std::ofstream(path, std::ios::app) << R"({"type":"end","step":100})"
                                     << "\n";
  const RunLogSummary done = ReadRunLog(path.string(), ctx, /*known_step=*/99);
  EXPECT_TRUE(done.ended);
  EXPECT_EQ(done.last_step->step, 100);
  fs::remove(path);
}

// A run log longer than the bytes the coordinator reads is read from its
// end, from the first whole line: the summary is of the newest records.
TEST(ReportsTest, LongRunLogIsReadFromItsEnd) {
  const fs::path path = fs::temp_directory_path() /
                        ("reports_test_" + std::to_string(getpid()) + ".jsonl");
  WriteRunLog(path, 2000, 100, /*checkpoints=*/false);
  const ReportContext ctx{"job-0001", 2, 4, 100000};
  const RunLogSummary whole = ReadRunLog(path.string(), ctx);
  ASSERT_EQ(whole.records.size(), 2020u);
  EXPECT_EQ(whole.records.front().step, 1);
  EXPECT_EQ(whole.last_step->step, 2000);
  // The offsets where the file's lines start, and the records they hold.
  std::vector<std::pair<uintmax_t, RunLogRecord>> lines;
  {
    std::ifstream in(path, std::ios::binary);
    std::string text;
    uintmax_t at = 0;
    while (std::getline(in, text)) {
      lines.emplace_back(at, *ParseRunLogLine(text, ctx));
      at += text.size() + 1;
    }
  }
  const uintmax_t size = fs::file_size(path);
  for (const size_t max_bytes : {size_t{16} << 10, size_t{5000}, size_t{77}}) {
    const RunLogSummary tail =
        ReadRunLog(path.string(), ctx, /*known_step=*/-1, max_bytes);
    // Every line that starts within the last max_bytes, and only those.
    size_t first = 0;
    while (lines[first].first < size - max_bytes) ++first;
    ASSERT_EQ(tail.records.size(), lines.size() - first) << max_bytes;
    for (size_t i = 0; i < tail.records.size(); ++i) {
      EXPECT_EQ(tail.records[i].kind, lines[first + i].second.kind);
      EXPECT_EQ(tail.records[i].step, lines[first + i].second.step);
    }
    ASSERT_TRUE(tail.last_eval.has_value()) << max_bytes;
    EXPECT_EQ(tail.last_eval->step, 2000) << max_bytes;
    // The last 77 bytes hold the final evaluation and part of a step line.
    EXPECT_EQ(tail.last_step.has_value(), max_bytes > 77) << max_bytes;
    if (tail.last_step) {
      EXPECT_EQ(tail.last_step->step, 2000) << max_bytes;
    }
  }
  // Exactly at a line's start: that line is kept.
  const RunLogSummary last_line = ReadRunLog(
      path.string(), ctx, /*known_step=*/-1,
      std::string(R"({"type":"eval","step":2000,"val_loss":2.0})").size() + 1);
  ASSERT_EQ(last_line.records.size(), 1u);
  EXPECT_EQ(last_line.records[0].kind, RunLogRecord::kEval);
  fs::remove(path);
}

// Read back from the end to the newest step the store already has: only
// what comes after it, in order. A checkpoint record before that step is
// not reached, while one after it is.
TEST(ReportsTest, RunLogIsReadBackToTheKnownStep) {
  const fs::path path =
      fs::temp_directory_path() /
      ("reports_known_" + std::to_string(getpid()) + ".jsonl");
  // About 2.4 MB: a stop far from the end is reached across the 1 MiB
  // chunks the log is read back in.
  WriteRunLog(path, 30000, 1000, /*checkpoints=*/true);
  const ReportContext ctx{"job-0001", 2, 4, 100000};
  const RunLogSummary whole = ReadRunLog(path.string(), ctx);
  ASSERT_EQ(whole.records.size(), 30030u);
  ASSERT_EQ(whole.checkpoints.size(), 30u);
  for (const int64_t known : {int64_t{29999}, int64_t{25000}, int64_t{7},
                              int64_t{30000}, int64_t{0}}) {
    const RunLogSummary tail = ReadRunLog(path.string(), ctx, known);
    // The records of `whole` after step `known`'s record.
    std::vector<RunLogRecord> want;
    bool past = false;
    for (const RunLogRecord& r : whole.records) {
      if (past) want.push_back(r);
      if (r.kind == RunLogRecord::kStep && r.step == known) past = true;
    }
    if (known == 0) want = whole.records;
    ASSERT_EQ(tail.records.size(), want.size()) << known;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(tail.records[i].kind, want[i].kind) << known;
      EXPECT_EQ(tail.records[i].step, want[i].step) << known;
    }
    std::vector<int64_t> ckpts;
    for (const RunLogRecord& r : tail.checkpoints) ckpts.push_back(r.step);
    std::vector<int64_t> want_ckpts;
    for (int64_t s = 1000; s <= 30000; s += 1000) {
      if (s >= known) want_ckpts.push_back(s);
    }
    EXPECT_EQ(ckpts, want_ckpts) << known;
    EXPECT_EQ(tail.last_step.has_value(), known < 30000) << known;
    if (tail.last_step) {
      EXPECT_EQ(tail.last_step->step, 30000) << known;
    }
  }
  fs::remove(path);
}

// A run log is a rank's file: a line that never ends (megabytes of
// zeros, as /dev/zero gives) is skipped, not gathered whole, and the records
// on either side of it are read.
TEST(ReportsTest, OverlongRunLogLineIsSkippedAndTheRestRead) {
  const fs::path path = fs::temp_directory_path() /
                        ("reports_long_" + std::to_string(getpid()) + ".jsonl");
  const ReportContext ctx{"job-0001", 2, 4, 100};
  {
    std::ofstream out(path, std::ios::binary);
    out << R"({"type":"step","step":1,"loss":2.0,"lr":0.1,"tok_per_s":1,"mfu":0.1})"
        << "\n"
        << std::string(3 * kMaxRunLogLineBytes + 7, '\0') << "\n"
        << R"({"type":"step","step":2,"loss":1.5,"lr":0.1,"tok_per_s":1,"mfu":0.1})"
        << "\n";
  }
  const RunLogSummary log = ReadRunLog(path.string(), ctx);
  ASSERT_EQ(log.records.size(), 2u);
  EXPECT_EQ(log.records[0].step, 1);
  EXPECT_EQ(log.records[1].step, 2);
  fs::remove(path);
}

// Nor is a run log that is no regular file read: a FIFO (which would wait
// for a writer) or a link (to /dev/zero) is an empty summary, at once.
TEST(ReportsTest, RunLogThatIsAFifoOrALinkIsNotRead) {
  const fs::path dir =
      fs::temp_directory_path() / ("reports_fifo_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const ReportContext ctx{"job-0001", 2, 4, 100};
  ASSERT_EQ(::mkfifo((dir / "fifo.jsonl").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", dir / "zero.jsonl");
  std::ofstream(dir / "real.jsonl")
      << R"({"type":"step","step":3,"loss":2.0,"lr":0.1,"tok_per_s":1,"mfu":0.1})"
      << "\n";
  fs::create_symlink(dir / "real.jsonl", dir / "link.jsonl");
  for (const char* name : {"fifo.jsonl", "zero.jsonl", "link.jsonl"}) {
    std::promise<RunLogSummary> done;
    std::future<RunLogSummary> result = done.get_future();
    std::thread reader(
        [&] { done.set_value(ReadRunLog((dir / name).string(), ctx)); });
    if (result.wait_for(std::chrono::seconds(60)) !=
        std::future_status::ready) {
      ADD_FAILURE() << "ReadRunLog blocked on " << name;
      ::close(::open((dir / name).c_str(), O_WRONLY | O_NONBLOCK));
    }
    reader.join();
    const RunLogSummary log = result.get();
    EXPECT_TRUE(log.records.empty()) << name;
    EXPECT_FALSE(log.last_step.has_value()) << name;
  }
  EXPECT_EQ(ReadRunLog((dir / "real.jsonl").string(), ctx).records.size(), 1u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ptrain
