// Store: jobs, attempts, events, checkpoints and loss history survive a
// reopen of the database (what a ptcoord restart relies on); a change is
// written whole or not at all; an older database loses its plain tokens.
#include "coordinator/store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "common/digest.h"
#include "gtest/gtest.h"
#include "tests/testing/old_store.h"

namespace ptrain {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("store_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string TempDb() const { return (dir_ / "ptcoord.db").string(); }
  std::filesystem::path dir_;
};

TEST_F(StoreTest, JobsAndHistorySurviveReopen) {
  const std::string path = TempDb();
  {
    auto store = Store::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    JobRecord r;
    r.job.set_name("a");
    r.job.set_state(v1::JOB_STATE_QUEUED);
    r.token_sha256 = Sha256Hex("t");
    r.attempt_uid = "a-1.1";
    auto a = (*store)->InsertJob(r);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->job.id(), "job-0001");
    auto b = (*store)->InsertJob(r);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->job.id(), "job-0002");
    EXPECT_GT(b->seq, a->seq);
    a->job.set_state(v1::JOB_STATE_RUNNING);
    a->restarts_used = 2;
    ASSERT_TRUE((*store)->UpdateJob(*a).ok());
    v1::LossPoint p;
    p.set_step(1);
    p.set_loss(4.5);
    ASSERT_TRUE((*store)->AddLossPoint("job-0001", p).ok());
    v1::Checkpoint c;
    c.set_step(20);
    c.set_dir("/x/step-00000020");
    ASSERT_TRUE((*store)->AddCheckpoint("job-0001", c).ok());
    v1::Attempt at;
    at.set_number(1);
    at.set_exit_code(-1);
    ASSERT_TRUE((*store)->UpsertAttempt("job-0001", at).ok());
    ASSERT_TRUE((*store)->AddEvent("job-0001", 1, "hello").ok());
  }
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ((*jobs)[0].restarts_used, 2);
  EXPECT_EQ((*jobs)[0].token_sha256, Sha256Hex("t"));
  EXPECT_EQ((*jobs)[0].attempt_uid, "a-1.1");
  auto h = (*store)->LossHistory("job-0001");
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->size(), 1u);
  EXPECT_EQ((*h)[0].loss(), 4.5);
  auto cps = (*store)->ListCheckpoints("job-0001");
  ASSERT_TRUE(cps.ok());
  ASSERT_EQ(cps->size(), 1u);
  EXPECT_EQ((*cps)[0].step(), 20);
  auto attempts = (*store)->ListAttempts("job-0001");
  ASSERT_TRUE(attempts.ok());
  EXPECT_EQ(attempts->size(), 1u);
  auto events = (*store)->ListEvents("job-0001");
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 1u);
}

// A long job's history comes back thinned: each series (training points,
// evaluation points) to at most the maximum, evenly by position, keeping
// its first and newest point and the order they were added in; a short
// series, and any series without a maximum, whole.
TEST_F(StoreTest, LossHistoryThinsEachSeriesEvenly) {
  auto store = Store::Open(TempDb());
  ASSERT_TRUE(store.ok()) << store.status();
  for (int step = 1; step <= 25; ++step) {
    v1::LossPoint p;
    p.set_step(step);
    p.set_loss(5.0 - 0.1 * step);
    ASSERT_TRUE((*store)->AddLossPoint("job-0001", p).ok());
    if (step % 4 == 0) {  // 6 evaluations among them
      v1::LossPoint e;
      e.set_step(step);
      e.set_val_loss(4.0 - 0.1 * step);
      ASSERT_TRUE((*store)->AddLossPoint("job-0001", e).ok());
    }
  }
  v1::LossPoint other;  // another job's point is not counted
  other.set_step(1);
  other.set_loss(1.0);
  ASSERT_TRUE((*store)->AddLossPoint("job-0002", other).ok());
  int64_t stored = -1;
  EXPECT_EQ((*store)->LossHistory("job-0001", 0, &stored)->size(), 31u);
  EXPECT_EQ(stored, 31);
  EXPECT_EQ((*store)->LossHistory("job-0001", 31)->size(), 31u);

  // The steps of each series, in the order given.
  auto series = [](const std::vector<v1::LossPoint>& h) {
    std::pair<std::vector<int64_t>, std::vector<int64_t>> train_eval;
    for (const v1::LossPoint& p : h) {
      (p.val_loss() != 0 ? train_eval.second : train_eval.first)
          .push_back(p.step());
    }
    return train_eval;
  };
  stored = -1;
  auto h = (*store)->LossHistory("job-0001", 10, &stored);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(stored, 31);
  auto [train, eval] = series(*h);
  // 25 points, stride ceil(25 / 9) = 3: steps 1, 4, ..., 25 (the newest).
  EXPECT_EQ(train, (std::vector<int64_t>{1, 4, 7, 10, 13, 16, 19, 22, 25}));
  EXPECT_EQ(eval, (std::vector<int64_t>{4, 8, 12, 16, 20, 24}));
  // In the order added: each evaluation right after its step's point.
  for (size_t i = 1; i < h->size(); ++i) {
    EXPECT_LE((*h)[i - 1].step(), (*h)[i].step()) << i;
  }
  auto three = (*store)->LossHistory("job-0001", 3);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(series(*three).first,
            (std::vector<int64_t>{1, 14, 25}));  // stride 13
  EXPECT_EQ(series(*three).second,
            (std::vector<int64_t>{4, 16, 24}));     // stride 3
  auto one = (*store)->LossHistory("job-0001", 1);  // the newest of each
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 2u);
  EXPECT_EQ((*one)[0].step(), 24);
  EXPECT_NE((*one)[0].val_loss(), 0);
  EXPECT_EQ((*one)[1].step(), 25);
  EXPECT_EQ((*one)[1].val_loss(), 0);
  stored = -1;
  EXPECT_TRUE((*store)->LossHistory("job-0003", 10, &stored)->empty());
  EXPECT_EQ(stored, 0);
}

// A blend job's evaluation point keeps each source's loss by name; other
// points have none, also those of a database from before the column (the
// older-database test below).
TEST_F(StoreTest, AnEvaluationKeepsEachSourcesLoss) {
  auto store = Store::Open(TempDb());
  ASSERT_TRUE(store.ok()) << store.status();
  v1::LossPoint train, eval;
  train.set_step(4);
  train.set_loss(3.0);
  eval.set_step(4);
  eval.set_val_loss(2.5);
  (*eval.mutable_val_loss_by_source())["web"] = 2.25;
  (*eval.mutable_val_loss_by_source())["code \"x\""] = 3.25;
  ASSERT_TRUE((*store)->AddLossPoint("job-0001", train).ok());
  ASSERT_TRUE((*store)->AddLossPoint("job-0001", eval).ok());
  auto h = (*store)->LossHistory("job-0001", 0);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->size(), 2u);
  EXPECT_TRUE((*h)[0].val_loss_by_source().empty());
  const auto& by = (*h)[1].val_loss_by_source();
  ASSERT_EQ(by.size(), 2u);
  EXPECT_EQ(by.at("web"), 2.25);
  EXPECT_EQ(by.at("code \"x\""), 3.25);
}

// What a restarted ptcoord asks before adding an attempt's logged points:
// the newest training and evaluation step that attempt's reports stored.
TEST_F(StoreTest, LastLossStepsArePerAttemptAndSeries) {
  auto store = Store::Open(TempDb());
  ASSERT_TRUE(store.ok()) << store.status();
  auto add = [&](int attempt, int64_t step, double loss, double val_loss) {
    v1::LossPoint p;
    p.set_attempt(attempt);
    p.set_step(step);
    p.set_loss(loss);
    p.set_val_loss(val_loss);
    ASSERT_TRUE((*store)->AddLossPoint("job-0001", p).ok());
  };
  add(1, 30, 2.0, 0);
  add(1, 20, 0, 2.5);
  add(2, 10, 2.2, 0);  // attempt 2 resumed from step 9
  add(2, 12, 2.1, 0);
  add(1, 31, 1.9, 0);  // a late report of attempt 1
  auto one = (*store)->LastLossSteps("job-0001", 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->step, 31);
  EXPECT_EQ(one->eval, 20);
  auto two = (*store)->LastLossSteps("job-0001", 2);
  EXPECT_EQ(two->step, 12);
  EXPECT_EQ(two->eval, -1);
  auto none = (*store)->LastLossSteps("job-0002", 1);
  EXPECT_EQ(none->step, -1);
  EXPECT_EQ(none->eval, -1);
}

// The newest steps of an attempt are asked for at each attempt's end, under
// ptcoord's lock; a job of days has millions of points. A database written
// before the (job_id, attempt, step) index existed gets it on opening, so
// that the question walks the index instead of the job's rows.
TEST_F(StoreTest, OlderDatabaseGetsTheAttemptStepIndex) {
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(TempDb().c_str(), &db), SQLITE_OK);
    const char* old_schema = R"sql(
CREATE TABLE loss_history (
  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL, step INTEGER NOT NULL, loss REAL NOT NULL,
  val_loss REAL NOT NULL);
CREATE INDEX loss_job ON loss_history (job_id);
INSERT INTO loss_history (job_id, attempt, step, loss, val_loss) VALUES
  ('job-0001', 1, 40, 2.0, 0), ('job-0001', 1, 40, 0, 2.4),
  ('job-0001', 1, 41, 1.9, 0);)sql";
    EXPECT_EQ(sqlite3_exec(db, old_schema, nullptr, nullptr, nullptr),
              SQLITE_OK)
        << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  auto store = Store::Open(TempDb());
  ASSERT_TRUE(store.ok()) << store.status();
  auto last = (*store)->LastLossSteps("job-0001", 1);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->step, 41);
  EXPECT_EQ(last->eval, 40);
  // Its points get the speed and time columns (0), and new points keep
  // theirs; `after` asks for what came since.
  v1::LossPoint p;
  p.set_attempt(1);
  p.set_step(42);
  p.set_loss(1.8);
  p.set_tok_per_s(5000);
  p.set_mfu(0.3);
  p.set_lr(1e-4);
  p.set_unix_ms(1234);
  ASSERT_TRUE((*store)->AddLossPoint("job-0001", p).ok());
  int64_t stored = 0, newest = 0;
  auto all = (*store)->LossHistory("job-0001", 0, &stored, 0, &newest);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 4u);
  EXPECT_EQ(stored, 4);
  EXPECT_EQ((*all)[0].tok_per_s(), 0);
  EXPECT_EQ((*all)[0].unix_ms(), 0);
  EXPECT_EQ((*all)[3].tok_per_s(), 5000);
  EXPECT_EQ((*all)[3].mfu(), 0.3);
  EXPECT_EQ((*all)[3].lr(), 1e-4);
  EXPECT_EQ((*all)[3].unix_ms(), 1234);
  EXPECT_TRUE((*all)[1].val_loss_by_source().empty());
  int64_t since_third = 0;
  ASSERT_TRUE(
      (*store)->LossHistory("job-0001", 0, nullptr, 0, &since_third).ok());
  auto after =
      (*store)->LossHistory("job-0001", 0, &stored, newest - 1, &since_third);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->size(), 1u);
  EXPECT_EQ((*after)[0].step(), 42);
  EXPECT_EQ(stored, 1);
  EXPECT_EQ(since_third, newest);
  auto none = (*store)->LossHistory("job-0001", 0, &stored, newest, &newest);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(newest, since_third);
  store->reset();

  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(TempDb().c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db,
                               "SELECT ii.name FROM sqlite_master AS m,"
                               " pragma_index_info(m.name) AS ii"
                               " WHERE m.type='index' AND"
                               " m.tbl_name='loss_history'"
                               " ORDER BY m.name, ii.seqno",
                               -1, &st, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  std::string columns;
  while (sqlite3_step(st) == SQLITE_ROW) {
    columns += reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    columns += ' ';
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  // loss_attempt_step, then loss_job.
  EXPECT_EQ(columns, "job_id attempt step job_id ");
}

TEST_F(StoreTest, UnknownJobIsNotFound) {
  auto store = Store::Open(TempDb());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->GetJob("job-9999").status().code(),
            absl::StatusCode::kNotFound);
  JobRecord r;
  r.job.set_id("job-9999");
  EXPECT_EQ((*store)->UpdateJob(r).code(), absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, UpdateIsWrittenWholeOrNotAtAll) {
  auto store = Store::Open(TempDb());
  ASSERT_TRUE(store.ok());
  JobRecord r;
  r.job.set_name("a");
  auto a = (*store)->InsertJob(r, "submitted", 1);
  ASSERT_TRUE(a.ok());
  JobUpdate u;
  u.record = *a;
  u.record.job.set_id("job-0042");  // no such job: the whole update fails
  u.event = "ghost";
  u.loss_points.emplace_back().set_step(1);
  u.checkpoints.emplace_back().set_step(1);
  u.attempt.emplace().set_number(1);
  EXPECT_EQ((*store)->Apply(u).code(), absl::StatusCode::kNotFound);
  for (const std::string id : {"job-0001", "job-0042"}) {
    EXPECT_TRUE((*store)->LossHistory(id)->empty());
    EXPECT_TRUE((*store)->ListCheckpoints(id)->empty());
    EXPECT_TRUE((*store)->ListAttempts(id)->empty());
  }
  EXPECT_EQ((*store)->ListEvents("job-0001")->size(), 1u);  // "submitted"
  EXPECT_TRUE((*store)->ListEvents("job-0042")->empty());
  u.record.job.set_id("job-0001");
  u.record.job.set_state(v1::JOB_STATE_RUNNING);
  ASSERT_TRUE((*store)->Apply(u).ok());
  EXPECT_EQ((*store)->GetJob("job-0001")->job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ((*store)->LossHistory("job-0001")->size(), 1u);
  EXPECT_EQ((*store)->ListCheckpoints("job-0001")->size(), 1u);
  EXPECT_EQ((*store)->ListAttempts("job-0001")->size(), 1u);
  EXPECT_EQ((*store)->ListEvents("job-0001")->size(), 2u);
}

TEST_F(StoreTest, NewDatabaseIsOwnerOnly) {
  const mode_t old = umask(022);
  auto store = Store::Open(TempDb());
  umask(old);
  ASSERT_TRUE(store.ok());
  for (const std::string suffix : {"", "-wal", "-shm"}) {
    struct stat st;
    ASSERT_EQ(stat((TempDb() + suffix).c_str(), &st), 0) << suffix;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << suffix;
  }
}

// A database of an older ptcoord: plain rank tokens in jobs.token.
TEST_F(StoreTest, OldPlainTokenColumnIsReplacedByItsHash) {
  const std::string token = "0123456789abcdef-plain-secret-token-of-a-rank";
  {
    v1::Job job;
    job.set_id("job-0001");
    job.set_name("old");
    job.set_state(v1::JOB_STATE_RUNNING);
    ASSERT_EQ(testing::WriteOldStore(TempDb(), job, token, 77, /*wal=*/true),
              "");
  }
  auto store = Store::Open(TempDb());
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].job.name(), "old");
  EXPECT_EQ((*jobs)[0].token_sha256, Sha256Hex(token));
  EXPECT_EQ((*jobs)[0].attempt_uid, "");
  store->reset();
  for (const std::string suffix : {"", "-wal", "-shm"}) {
    std::ifstream in(TempDb() + suffix, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    EXPECT_EQ(bytes.str().find(token), std::string::npos)
        << "ptcoord.db" << suffix << " still holds the plain token";
  }
  // Reopening a migrated database changes nothing.
  store = Store::Open(TempDb());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->ListJobs()->at(0).token_sha256, Sha256Hex(token));
}

}  // namespace
}  // namespace ptrain
