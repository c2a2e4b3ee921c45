// Who may use ptcoord: named users, each with a role and the SHA-256 of its
// bearer tokens (never a token in clear), read from `--users-file` (YAML,
// docs/users.md) or made from the old `--token-file` (each token an admin
// named token-N). Authentication only; what each role may do is access.h's.
#ifndef PTRAIN_COORDINATOR_USERS_H_
#define PTRAIN_COORDINATOR_USERS_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace ptrain {

// viewer: reads; member: also submits and acts on its own jobs; admin:
// everything. Ordered: a role includes the ones below it.
enum class Role { kViewer = 0, kMember = 1, kAdmin = 2 };

// "viewer", "member", "admin".
const char* RoleName(Role role);
std::optional<Role> RoleOfName(absl::string_view name);

// Per-user limits on what its running jobs hold at once; 0: no limit.
struct Quota {
  int slots = 0;
  int gpus = 0;
  int running_jobs = 0;
  bool operator==(const Quota& o) const {
    return slots == o.slots && gpus == o.gpus && running_jobs == o.running_jobs;
  }
};

struct User {
  std::string name;
  Role role = Role::kViewer;
  std::vector<std::string> token_sha256;  // 64 lowercase hex characters each
  Quota quota;
};

// The authenticated caller of one request.
struct Caller {
  std::string user;
  Role role = Role::kViewer;
};

// A users file is a list of users; anything larger is the wrong file.
inline constexpr size_t kMaxUsersFileBytes = size_t{1} << 20;

// A user's name: 1 to 64 of [A-Za-z0-9._-], starting with a letter or digit.
bool IsUserName(absl::string_view name);

// An immutable table of users.
class UserTable {
 public:
  // The YAML of a users file (docs/users.md). Every rule broken is
  // InvalidArgument starting with `what` and naming the line: a key that is
  // not known, a name repeated or malformed, an unknown role, a hash that is
  // not 64 hex characters or that two entries share, a negative quota, an
  // empty list.
  static absl::StatusOr<UserTable> Parse(absl::string_view yaml,
                                         absl::string_view what);
  // Parse of the file at `path` (a regular file of at most
  // kMaxUsersFileBytes); messages start with "--users-file PATH".
  static absl::StatusOr<UserTable> Load(const std::string& path);
  // The old --token-file: its Nth token (from 1) an admin named token-N.
  static UserTable FromTokens(const std::vector<std::string>& tokens);

  // The user one of whose hashes is Sha256Hex(token), compared in constant
  // time against every hash; null when none.
  const User* FindToken(absl::string_view token) const;
  const User* Find(absl::string_view name) const;
  const std::vector<User>& users() const { return users_; }

 private:
  std::vector<User> users_;
};

// The users a running ptcoord knows, reloaded on SIGHUP. Thread-safe.
class Users {
 public:
  // `load` reads the table (the users file, or the token file); it is
  // called now, and again by Reload.
  static absl::StatusOr<std::unique_ptr<Users>> Create(
      std::function<absl::StatusOr<UserTable>()> load);
  // A fixed table (tests, a ptcoord of one generated token).
  explicit Users(UserTable table);

  // The caller whose bearer token `authorization` carries; Unauthenticated
  // for a missing, malformed or unknown token.
  absl::StatusOr<Caller> Authenticate(
      const std::optional<std::string>& authorization) const;
  // Reads the table again. On an error the old table stays and the error
  // is returned; from a success on, a removed token is refused.
  absl::Status Reload();
  std::shared_ptr<const UserTable> table() const;

 private:
  std::function<absl::StatusOr<UserTable>()> load_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const UserTable> table_ ABSL_GUARDED_BY(mu_);
};

// `ptcoord users add NAME --role ROLE`: a new token for user `name` (added
// with `role` and `quota` when the file does not have it; an existing user
// must have `role`, and keeps its quota), whose SHA-256 the users file at
// `path` gains (the file is created when missing). The file is checked
// whole before it is replaced (atomically, 0600); a new user is appended to
// its text, so comments stay. Returns the token, which is stored nowhere.
absl::StatusOr<std::string> AddUserToken(const std::string& path,
                                         const std::string& name, Role role,
                                         const Quota& quota);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_USERS_H_
