// A state database as an older ptcoord wrote it, before rank tokens were
// stored as hashes: its `jobs` table with one RUNNING job row whose token
// column holds the plain token. For the migration tests of the store and
// the coordinator.
#ifndef PTRAIN_TESTS_TESTING_OLD_STORE_H_
#define PTRAIN_TESTS_TESTING_OLD_STORE_H_

#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "ptrain/v1/coordinator.pb.h"

namespace ptrain::testing {

// Writes the database at `path` (WAL journal when `wal`) with `job` as
// job-0001, `token` in plain text and `pid`. "" on success, else what
// SQLite said.
inline std::string WriteOldStore(const std::string& path, const v1::Job& job,
                                 const std::string& token, int64_t pid,
                                 bool wal) {
  sqlite3* db = nullptr;
  std::string error;
  auto failed = [&](int rc) {
    if (rc != SQLITE_OK && rc != SQLITE_DONE && error.empty()) {
      error = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    }
    return !error.empty();
  };
  const std::string schema =
      std::string(wal ? "PRAGMA journal_mode=WAL;\n" : "") + R"sql(
CREATE TABLE jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
  state INTEGER NOT NULL, job BLOB NOT NULL,
  token TEXT NOT NULL DEFAULT '', pid INTEGER NOT NULL DEFAULT 0,
  last_progress_ms INTEGER NOT NULL DEFAULT 0,
  restarts_used INTEGER NOT NULL DEFAULT 0);)sql";
  sqlite3_stmt* st = nullptr;
  const std::string blob = job.SerializeAsString();
  if (!failed(sqlite3_open(path.c_str(), &db)) &&
      !failed(sqlite3_exec(db, schema.c_str(), nullptr, nullptr, nullptr)) &&
      !failed(sqlite3_prepare_v2(db,
                                 "INSERT INTO jobs (id, state, job, token, "
                                 "pid) VALUES ('job-0001', 2, ?, ?, ?)",
                                 -1, &st, nullptr))) {
    sqlite3_bind_blob(st, 1, blob.data(), static_cast<int>(blob.size()),
                      SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, token.data(), static_cast<int>(token.size()),
                      SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 3, pid);
    failed(sqlite3_step(st));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return error;
}

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_TESTING_OLD_STORE_H_
