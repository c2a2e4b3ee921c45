// The audit log: every state-changing request to ptcoord, refused ones
// included, one JSON object a line in STATE/audit.jsonl (docs/users.md):
// when, who, from where, what, on which job or node, and how it ended.
// Append-only; rotated by size (audit.1.jsonl, ...) with spdlog's rotating
// file sink, keeping a bounded number of files. Thread-safe.
#ifndef PTRAIN_COORDINATOR_AUDIT_H_
#define PTRAIN_COORDINATOR_AUDIT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace spdlog {
class logger;
}

namespace ptrain {

struct AuditRecord {
  int64_t unix_ms = 0;
  std::string user;  // "" when the caller was not authenticated
  std::string role;
  std::string peer;    // the client's address as the server saw it
  std::string action;  // the RPC ("CancelJob")
  std::string target;  // its job or node; "" for none
  absl::Status result;
};

class AuditLog {
 public:
  // Appends to `path` (created 0600 by ptcoord's umask); once it holds
  // `max_bytes` it becomes PATH-stem.1.jsonl (older ones shifted up), and
  // at most `keep` such older files are kept.
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(const std::string& path,
                                                        size_t max_bytes,
                                                        size_t keep);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // One line, flushed before it returns.
  void Write(const AuditRecord& r);

 private:
  explicit AuditLog(std::shared_ptr<spdlog::logger> logger);
  std::shared_ptr<spdlog::logger> logger_;
};

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_AUDIT_H_
