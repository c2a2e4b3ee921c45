// SQLite persistence for ptcoord; see store.h. Jobs are stored as a
// serialized v1::Job beside the columns queries need, so adding a field to
// the proto needs no migration. Migrations are CREATE TABLE IF NOT EXISTS
// plus the column changes in Migrate().
#include "coordinator/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/digest.h"
#include "common/echo.h"
#include "nlohmann/json.hpp"

namespace ptrain {
namespace {

// Columns that older databases may still have (`token`: the plain rank
// token; `pid`, `last_progress_ms`: now only in memory) are left alone by
// the queries below, except `token`, which Migrate() removes.
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT UNIQUE NOT NULL,
  state INTEGER NOT NULL,
  job BLOB NOT NULL,
  token_sha256 TEXT NOT NULL DEFAULT '',
  attempt_uid TEXT NOT NULL DEFAULT '',
  restarts_used INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS attempts (
  job_id TEXT NOT NULL, number INTEGER NOT NULL, attempt BLOB NOT NULL,
  PRIMARY KEY (job_id, number));
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL,
  unix_ms INTEGER NOT NULL, message TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_job ON events (job_id);
CREATE TABLE IF NOT EXISTS checkpoints (
  job_id TEXT NOT NULL, step INTEGER NOT NULL, dir TEXT NOT NULL,
  attempt INTEGER NOT NULL, unix_ms INTEGER NOT NULL,
  PRIMARY KEY (job_id, step));
CREATE TABLE IF NOT EXISTS loss_history (
  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL, step INTEGER NOT NULL, loss REAL NOT NULL,
  val_loss REAL NOT NULL, tok_per_s REAL NOT NULL DEFAULT 0,
  mfu REAL NOT NULL DEFAULT 0, lr REAL NOT NULL DEFAULT 0,
  unix_ms INTEGER NOT NULL DEFAULT 0,
  val_loss_by_source TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS loss_job ON loss_history (job_id);
CREATE INDEX IF NOT EXISTS loss_attempt_step
  ON loss_history (job_id, attempt, step);
CREATE TABLE IF NOT EXISTS nodes (
  name TEXT PRIMARY KEY, spec BLOB NOT NULL, registered_ms INTEGER NOT NULL,
  secret_sha256 TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS drained_nodes (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS pending_nodes (name TEXT PRIMARY KEY);
)sql";

// A full disk, an I/O error or a lock held elsewhere may pass: Unavailable
// (the caller retries later). Anything else is a bug or corruption.
absl::Status SqliteError(sqlite3* db) {
  const std::string msg = absl::StrCat("state store: ", sqlite3_errmsg(db));
  switch (sqlite3_errcode(db)) {
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_NOMEM:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// One prepared statement, finalized on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
    if (rc_ != SQLITE_OK) prepare_error_ = SqliteError(db);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  absl::Status status() const { return prepare_error_; }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()),
                      SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()),
                      SQLITE_TRANSIENT);
    return *this;
  }
  // SQLITE_ROW -> true, SQLITE_DONE -> false, else the error in *status.
  bool Step(absl::Status* status) {
    if (stmt_ == nullptr) {
      *status = prepare_error_;
      return false;
    }
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) *status = SqliteError(db_);
    return false;
  }
  absl::Status Run() {
    absl::Status s = status();
    if (!s.ok()) return s;
    while (Step(&s)) {
    }
    return s;
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  double Double(int col) { return sqlite3_column_double(stmt_, col); }
  std::string Text(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    const int n = sqlite3_column_bytes(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(static_cast<const char*>(p), n);
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
  absl::Status prepare_error_;
};

JobRecord RowToJob(Stmt& s) {
  // Columns: seq, job, token_sha256, attempt_uid, restarts_used.
  JobRecord r;
  r.seq = s.Int(0);
  r.job.ParseFromString(s.Text(1));
  r.token_sha256 = s.Text(2);
  r.attempt_uid = s.Text(3);
  r.restarts_used = static_cast<int32_t>(s.Int(4));
  return r;
}

constexpr const char* kSelectJob =
    "SELECT seq, job, token_sha256, attempt_uid, restarts_used FROM jobs";

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  // SQLite gives its -wal and -shm files the main file's mode: create that
  // private before SQLite does, whatever the umask.
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  fchmod(fd, 0600);
  close(fd);
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                      nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(
        absl::StrCat("cannot open ", path, ": ", msg));
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<Store> store(new Store(db));
  absl::MutexLock lock(&store->mu_);
  // NORMAL is durable across a ptcoord crash in WAL mode; only a power loss
  // may drop the last transactions.
  for (const char* sql :
       {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=NORMAL;", kSchema}) {
    absl::Status s = store->Exec(sql);
    if (!s.ok()) return s;
  }
  absl::Status s = store->Migrate();
  if (!s.ok()) return s;
  for (const std::string suffix : {"-wal", "-shm"}) {
    chmod((path + suffix).c_str(), 0600);
  }
  return store;
}

Store::~Store() { sqlite3_close(db_); }

absl::Status Store::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = SqliteError(db_);
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

template <typename F>
absl::Status Store::InTransaction(F body) {
  absl::Status s = Exec("BEGIN IMMEDIATE;");
  if (!s.ok()) return s;
  s = body();
  if (s.ok()) s = Exec("COMMIT;");
  if (!s.ok()) Exec("ROLLBACK;").IgnoreError();
  return s;
}

absl::StatusOr<std::set<std::string>> Store::Columns(const char* table) {
  std::set<std::string> columns;
  Stmt q(db_, absl::StrCat("PRAGMA table_info(", table, ")").c_str());
  absl::Status s = q.status();
  if (!s.ok()) return s;
  while (q.Step(&s)) columns.insert(q.Text(1));
  if (!s.ok()) return s;
  return columns;
}

absl::Status Store::Migrate() {
  absl::StatusOr<std::set<std::string>> job_columns = Columns("jobs");
  if (!job_columns.ok()) return job_columns.status();
  const std::set<std::string>& columns = *job_columns;
  const bool plain_tokens = columns.count("token") > 0;
  absl::StatusOr<std::set<std::string>> node_columns = Columns("nodes");
  if (!node_columns.ok()) return node_columns.status();
  absl::StatusOr<std::set<std::string>> loss_columns = Columns("loss_history");
  if (!loss_columns.ok()) return loss_columns.status();
  absl::Status s = InTransaction([&]() -> absl::Status {
    // Loss points stored before speed and time were recorded read as 0.
    for (const char* column :
         {"tok_per_s REAL", "mfu REAL", "lr REAL", "unix_ms INTEGER"}) {
      const std::string name(column, std::strchr(column, ' '));
      if (loss_columns->count(name)) continue;
      absl::Status a = Exec(absl::StrCat("ALTER TABLE loss_history ADD COLUMN ",
                                         column, " NOT NULL DEFAULT 0;")
                                .c_str());
      if (!a.ok()) return a;
    }
    // Evaluations stored before blends were reported have no sources.
    if (!loss_columns->count("val_loss_by_source")) {
      absl::Status a = Exec(
          "ALTER TABLE loss_history ADD COLUMN val_loss_by_source TEXT NOT "
          "NULL DEFAULT '';");
      if (!a.ok()) return a;
    }
    // Nodes registered by an older ptcoord have no secret: the next
    // registration of such a name while it is down binds it (nodes.h).
    if (!node_columns->count("secret_sha256")) {
      absl::Status a = Exec(
          "ALTER TABLE nodes ADD COLUMN secret_sha256 TEXT NOT NULL DEFAULT "
          "'';");
      if (!a.ok()) return a;
    }
    for (const char* column : {"token_sha256", "attempt_uid"}) {
      if (columns.count(column)) continue;
      absl::Status a = Exec(absl::StrCat("ALTER TABLE jobs ADD COLUMN ", column,
                                         " TEXT NOT NULL DEFAULT '';")
                                .c_str());
      if (!a.ok()) return a;
    }
    if (!plain_tokens) return absl::OkStatus();
    // Only the hash survives; an attempt launched by an older ptcoord has no
    // PTRAIN_ATTEMPT_UID, so its processes are found by that hash instead.
    std::vector<std::pair<std::string, std::string>> tokens;
    {
      Stmt q(db_, "SELECT id, token FROM jobs WHERE token != ''");
      absl::Status r = q.status();
      if (!r.ok()) return r;
      while (q.Step(&r)) tokens.emplace_back(q.Text(0), q.Text(1));
      if (!r.ok()) return r;
    }
    for (const auto& [id, token] : tokens) {
      Stmt up(db_, "UPDATE jobs SET token_sha256=? WHERE id=?");
      up.Bind(1, Sha256Hex(token)).Bind(2, id);
      absl::Status r = up.Run();
      if (!r.ok()) return r;
    }
    return Exec("ALTER TABLE jobs DROP COLUMN token;");
  });
  if (!s.ok() || !plain_tokens) return s;
  // The dropped column's bytes may linger in free pages and in the WAL:
  // rewrite the file and empty the log.
  for (const char* sql : {"PRAGMA secure_delete=ON;", "VACUUM;",
                          "PRAGMA wal_checkpoint(TRUNCATE);"}) {
    s = Exec(sql);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<JobRecord> Store::InsertJob(JobRecord record,
                                           const std::string& event,
                                           int64_t unix_ms) {
  absl::MutexLock lock(&mu_);
  absl::Status s = InTransaction([&]() -> absl::Status {
    int64_t next = 1;
    {
      absl::Status r;
      // Past every seq ever given (sqlite_sequence keeps the largest, which
      // a deleted job's row no longer shows): an id is never given again.
      Stmt q(db_,
             "SELECT MAX(COALESCE((SELECT MAX(seq) FROM jobs), 0), "
             "COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'jobs'), "
             "0)) + 1");
      if (q.Step(&r)) next = q.Int(0);
      if (!r.ok()) return r;
    }
    record.seq = next;
    record.job.set_id(absl::StrFormat("job-%04d", next));
    Stmt ins(db_,
             "INSERT INTO jobs (seq, id, state, job, token_sha256, "
             "attempt_uid, restarts_used) VALUES (?, ?, ?, ?, ?, ?, ?)");
    ins.Bind(1, record.seq)
        .Bind(2, record.job.id())
        .Bind(3, static_cast<int64_t>(record.job.state()))
        .BindBlob(4, record.job.SerializeAsString())
        .Bind(5, record.token_sha256)
        .Bind(6, record.attempt_uid)
        .Bind(7, static_cast<int64_t>(record.restarts_used));
    absl::Status r = ins.Run();
    if (!r.ok() || event.empty()) return r;
    return AddEventLocked(record.job.id(), unix_ms, event);
  });
  if (!s.ok()) return s;
  return record;
}

absl::Status Store::UpdateJobLocked(const JobRecord& r) {
  Stmt up(db_,
          "UPDATE jobs SET state=?, job=?, token_sha256=?, attempt_uid=?, "
          "restarts_used=? WHERE id=?");
  up.Bind(1, static_cast<int64_t>(r.job.state()))
      .BindBlob(2, r.job.SerializeAsString())
      .Bind(3, r.token_sha256)
      .Bind(4, r.attempt_uid)
      .Bind(5, static_cast<int64_t>(r.restarts_used))
      .Bind(6, r.job.id());
  absl::Status s = up.Run();
  if (!s.ok()) return s;
  if (sqlite3_changes(db_) == 0)
    return absl::NotFoundError(absl::StrCat("no job ", EchoQuoted(r.job.id())));
  return absl::OkStatus();
}

absl::Status Store::UpdateJob(const JobRecord& r) {
  absl::MutexLock lock(&mu_);
  return UpdateJobLocked(r);
}

absl::Status Store::Apply(const JobUpdate& u) {
  absl::MutexLock lock(&mu_);
  const std::string& id = u.record.job.id();
  return InTransaction([&]() -> absl::Status {
    absl::Status s = UpdateJobLocked(u.record);
    if (s.ok() && u.attempt.has_value())
      s = UpsertAttemptLocked(id, *u.attempt);
    for (const v1::LossPoint& p : u.loss_points) {
      if (s.ok()) s = AddLossPointLocked(id, p);
    }
    for (const v1::Checkpoint& c : u.checkpoints) {
      if (s.ok()) s = AddCheckpointLocked(id, c);
    }
    if (s.ok() && !u.event.empty()) s = AddEventLocked(id, u.unix_ms, u.event);
    return s;
  });
}

absl::StatusOr<JobRecord> Store::GetJob(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, absl::StrCat(kSelectJob, " WHERE id=?").c_str());
  q.Bind(1, id);
  absl::Status s = q.status();
  if (!s.ok()) return s;
  if (q.Step(&s)) return RowToJob(q);
  if (!s.ok()) return s;
  return absl::NotFoundError(absl::StrCat("no job ", EchoQuoted(id)));
}

absl::StatusOr<std::vector<JobRecord>> Store::ListJobs() {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, absl::StrCat(kSelectJob, " ORDER BY seq").c_str());
  absl::Status s = q.status();
  if (!s.ok()) return s;
  std::vector<JobRecord> out;
  while (q.Step(&s)) out.push_back(RowToJob(q));
  if (!s.ok()) return s;
  return out;
}

absl::Status Store::UpsertAttemptLocked(const std::string& job_id,
                                        const v1::Attempt& a) {
  Stmt q(db_,
         "INSERT OR REPLACE INTO attempts (job_id, number, attempt) VALUES (?, "
         "?, ?)");
  q.Bind(1, job_id)
      .Bind(2, static_cast<int64_t>(a.number()))
      .BindBlob(3, a.SerializeAsString());
  return q.Run();
}

absl::Status Store::UpsertAttempt(const std::string& job_id,
                                  const v1::Attempt& a) {
  absl::MutexLock lock(&mu_);
  return UpsertAttemptLocked(job_id, a);
}

absl::StatusOr<std::vector<v1::Attempt>> Store::ListAttempts(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT attempt FROM attempts WHERE job_id=? ORDER BY number");
  q.Bind(1, job_id);
  absl::Status s = q.status();
  if (!s.ok()) return s;
  std::vector<v1::Attempt> out;
  while (q.Step(&s)) out.emplace_back().ParseFromString(q.Text(0));
  if (!s.ok()) return s;
  return out;
}

absl::Status Store::AddEventLocked(const std::string& job_id, int64_t unix_ms,
                                   const std::string& message) {
  Stmt q(db_, "INSERT INTO events (job_id, unix_ms, message) VALUES (?, ?, ?)");
  q.Bind(1, job_id).Bind(2, unix_ms).Bind(3, message);
  return q.Run();
}

absl::Status Store::AddEvent(const std::string& job_id, int64_t unix_ms,
                             const std::string& message) {
  absl::MutexLock lock(&mu_);
  return AddEventLocked(job_id, unix_ms, message);
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> Store::ListEvents(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT unix_ms, message FROM events WHERE job_id=? ORDER BY id");
  q.Bind(1, job_id);
  absl::Status s = q.status();
  if (!s.ok()) return s;
  std::vector<std::pair<int64_t, std::string>> out;
  while (q.Step(&s)) out.emplace_back(q.Int(0), q.Text(1));
  if (!s.ok()) return s;
  return out;
}

absl::Status Store::AddLossPointLocked(const std::string& job_id,
                                       const v1::LossPoint& p) {
  Stmt q(db_,
         "INSERT INTO loss_history (job_id, attempt, step, loss, val_loss, "
         "tok_per_s, mfu, lr, unix_ms, val_loss_by_source) VALUES (?, ?, ?, "
         "?, ?, ?, ?, ?, ?, ?)");
  // Each source's loss as a JSON object ("" for none).
  const std::string by_source =
      p.val_loss_by_source().empty()
          ? ""
          : nlohmann::json(p.val_loss_by_source()).dump();
  q.Bind(1, job_id)
      .Bind(2, static_cast<int64_t>(p.attempt()))
      .Bind(3, p.step())
      .Bind(4, p.loss())
      .Bind(5, p.val_loss())
      .Bind(6, p.tok_per_s())
      .Bind(7, p.mfu())
      .Bind(8, p.lr())
      .Bind(9, p.unix_ms())
      .Bind(10, by_source);
  return q.Run();
}

absl::Status Store::AddLossPoint(const std::string& job_id,
                                 const v1::LossPoint& p) {
  absl::MutexLock lock(&mu_);
  return AddLossPointLocked(job_id, p);
}

absl::StatusOr<std::vector<v1::LossPoint>> Store::LossHistory(
    const std::string& job_id, int64_t max_per_series, int64_t* stored,
    int64_t after, int64_t* last) {
  absl::MutexLock lock(&mu_);
  // Series 0 holds the training points, series 1 the evaluations (a
  // val_loss). Point i of a series of n is kept when n <= max, else when it
  // is the last or i is a multiple of the stride ceil(n / (max - 1)): at
  // most max. One pass over the rows after `after` in the order they were
  // added (the (job_id) index holds the row id: a range, not a scan).
  std::array<int64_t, 2> n = {0, 0}, stride = {1, 1}, seen = {0, 0};
  absl::Status s;
  if (max_per_series > 0) {
    Stmt count(db_,
               "SELECT COALESCE(SUM(val_loss = 0), 0),"
               " COALESCE(SUM(val_loss != 0), 0)"
               " FROM loss_history WHERE job_id=? AND id>?");
    count.Bind(1, job_id).Bind(2, after);
    s = count.status();
    if (!s.ok()) return s;
    if (!count.Step(&s)) {
      return s.ok() ? absl::InternalError("SUM gave no row") : s;
    }
    for (int k = 0; k < 2; ++k) {
      n[k] = count.Int(k);
      if (max_per_series > 1) {
        stride[k] = (n[k] + max_per_series - 2) / (max_per_series - 1);
      }
    }
  }
  Stmt q(db_,
         "SELECT attempt, step, loss, val_loss, tok_per_s, mfu, lr, unix_ms, "
         "id, val_loss_by_source FROM loss_history WHERE job_id=? AND id>? "
         "ORDER BY id");
  q.Bind(1, job_id).Bind(2, after);
  s = q.status();
  if (!s.ok()) return s;
  std::vector<v1::LossPoint> out;
  int64_t newest = after;
  while (q.Step(&s)) {
    newest = q.Int(8);
    const double val_loss = q.Double(3);
    const int k = val_loss != 0 ? 1 : 0;
    const int64_t i = seen[k]++;
    const bool keep = max_per_series <= 0 || n[k] <= max_per_series ||
                      i == n[k] - 1 ||
                      (max_per_series > 1 && i % stride[k] == 0);
    if (!keep) continue;
    v1::LossPoint& p = out.emplace_back();
    p.set_attempt(static_cast<int32_t>(q.Int(0)));
    p.set_step(q.Int(1));
    p.set_loss(q.Double(2));
    p.set_val_loss(val_loss);
    p.set_tok_per_s(q.Double(4));
    p.set_mfu(q.Double(5));
    p.set_lr(q.Double(6));
    p.set_unix_ms(q.Int(7));
    if (const std::string by = q.Text(9); !by.empty()) {
      // Written by AddLossPoint as an object; anything else reads as none.
      const nlohmann::json j = nlohmann::json::parse(by, nullptr, false);
      if (j.is_object()) {
        for (const auto& [name, loss] : j.items()) {
          if (loss.is_number()) {
            (*p.mutable_val_loss_by_source())[name] = loss.get<double>();
          }
        }
      }
    }
  }
  if (!s.ok()) return s;
  if (stored != nullptr) *stored = seen[0] + seen[1];
  if (last != nullptr) *last = newest;
  return out;
}

absl::StatusOr<Store::LastSteps> Store::LastLossSteps(const std::string& job_id,
                                                      int attempt) {
  absl::MutexLock lock(&mu_);
  // Each series walks the (job_id, attempt, step) index down from the
  // attempt's newest step and stops at its first row: a few rows, where one
  // MAX over both series read every row of the job.
  LastSteps out;
  for (const bool eval : {false, true}) {
    Stmt q(db_, eval
                    ? "SELECT step FROM loss_history WHERE job_id=? AND"
                      " attempt=? AND val_loss != 0 ORDER BY step DESC LIMIT 1"
                    : "SELECT step FROM loss_history WHERE job_id=? AND"
                      " attempt=? AND val_loss = 0 ORDER BY step DESC LIMIT 1");
    q.Bind(1, job_id).Bind(2, static_cast<int64_t>(attempt));
    absl::Status s = q.status();
    if (!s.ok()) return s;
    if (q.Step(&s)) (eval ? out.eval : out.step) = q.Int(0);
    if (!s.ok()) return s;
  }
  return out;
}

absl::Status Store::AddCheckpointLocked(const std::string& job_id,
                                        const v1::Checkpoint& c) {
  Stmt q(db_,
         "INSERT OR REPLACE INTO checkpoints (job_id, step, dir, attempt, "
         "unix_ms) "
         "VALUES (?, ?, ?, ?, ?)");
  q.Bind(1, job_id)
      .Bind(2, c.step())
      .Bind(3, c.dir())
      .Bind(4, static_cast<int64_t>(c.attempt()))
      .Bind(5, c.unix_ms());
  return q.Run();
}

absl::Status Store::AddCheckpoint(const std::string& job_id,
                                  const v1::Checkpoint& c) {
  absl::MutexLock lock(&mu_);
  return AddCheckpointLocked(job_id, c);
}

absl::StatusOr<std::vector<v1::Checkpoint>> Store::ListCheckpoints(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_,
         "SELECT step, dir, attempt, unix_ms FROM checkpoints WHERE job_id=? "
         "ORDER BY step");
  q.Bind(1, job_id);
  absl::Status s = q.status();
  if (!s.ok()) return s;
  std::vector<v1::Checkpoint> out;
  while (q.Step(&s)) {
    v1::Checkpoint& c = out.emplace_back();
    c.set_step(q.Int(0));
    c.set_dir(q.Text(1));
    c.set_attempt(static_cast<int32_t>(q.Int(2)));
    c.set_unix_ms(q.Int(3));
  }
  if (!s.ok()) return s;
  return out;
}

absl::Status Store::UpsertNode(const v1::NodeSpec& spec,
                               int64_t registered_unix_ms,
                               const std::string& secret_sha256,
                               bool pending_approval) {
  absl::MutexLock lock(&mu_);
  return InTransaction([&]() -> absl::Status {
    Stmt q(db_,
           "INSERT OR REPLACE INTO nodes (name, spec, registered_ms, "
           "secret_sha256) VALUES (?, ?, ?, ?)");
    q.Bind(1, spec.name())
        .BindBlob(2, spec.SerializeAsString())
        .Bind(3, registered_unix_ms)
        .Bind(4, secret_sha256);
    if (absl::Status s = q.Run(); !s.ok()) return s;
    if (!pending_approval) return absl::OkStatus();
    Stmt p(db_, "INSERT OR REPLACE INTO pending_nodes (name) VALUES (?)");
    p.Bind(1, spec.name());
    return p.Run();
  });
}

absl::Status Store::ApproveNode(const std::string& name) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "DELETE FROM pending_nodes WHERE name = ?");
  q.Bind(1, name);
  return q.Run();
}

absl::Status Store::DeleteJob(const std::string& id) {
  absl::MutexLock lock(&mu_);
  return InTransaction([&]() -> absl::Status {
    for (const char* sql : {"DELETE FROM jobs WHERE id = ?",
                            "DELETE FROM attempts WHERE job_id = ?",
                            "DELETE FROM events WHERE job_id = ?",
                            "DELETE FROM checkpoints WHERE job_id = ?",
                            "DELETE FROM loss_history WHERE job_id = ?"}) {
      Stmt q(db_, sql);
      q.Bind(1, id);
      if (absl::Status s = q.Run(); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

absl::Status Store::DeleteNode(const std::string& name) {
  absl::MutexLock lock(&mu_);
  return InTransaction([&]() -> absl::Status {
    for (const char* sql : {"DELETE FROM nodes WHERE name = ?",
                            "DELETE FROM drained_nodes WHERE name = ?",
                            "DELETE FROM pending_nodes WHERE name = ?"}) {
      Stmt q(db_, sql);
      q.Bind(1, name);
      if (absl::Status s = q.Run(); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

absl::Status Store::SetNodeDraining(const std::string& name, bool draining) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, draining
                  ? "INSERT OR REPLACE INTO drained_nodes (name) VALUES (?)"
                  : "DELETE FROM drained_nodes WHERE name = ?");
  q.Bind(1, name);
  return q.Run();
}

absl::StatusOr<std::vector<StoredNode>> Store::ListNodes() {
  absl::MutexLock lock(&mu_);
  Stmt q(db_,
         "SELECT spec, registered_ms, "
         "EXISTS (SELECT 1 FROM drained_nodes d WHERE d.name = nodes.name), "
         "secret_sha256, "
         "EXISTS (SELECT 1 FROM pending_nodes p WHERE p.name = nodes.name) "
         "FROM nodes ORDER BY name");
  absl::Status s = q.status();
  if (!s.ok()) return s;
  std::vector<StoredNode> out;
  while (q.Step(&s)) {
    StoredNode& stored = out.emplace_back();
    v1::Node& n = stored.node;
    if (!n.mutable_spec()->ParseFromString(q.Text(0))) {
      return absl::DataLossError("state store: a node row does not parse");
    }
    n.set_registered_unix_ms(q.Int(1));
    n.set_draining(q.Int(2) != 0);
    stored.secret_sha256 = q.Text(3);
    n.set_pending_approval(q.Int(4) != 0);
  }
  if (!s.ok()) return s;
  return out;
}

}  // namespace ptrain
