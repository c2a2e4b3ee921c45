// The users file and the authentication of users; see users.h. YAML through
// yaml-cpp, whose marks give the line a refusal names.
#include "coordinator/users.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/auth_token.h"
#include "common/bounded_file.h"
#include "common/digest.h"
#include "common/private_file.h"
#include "coordinator/auth.h"
#include "yaml-cpp/yaml.h"

namespace ptrain {

namespace fs = std::filesystem;

const char* RoleName(Role role) {
  switch (role) {
    case Role::kViewer:
      return "viewer";
    case Role::kMember:
      return "member";
    case Role::kAdmin:
      return "admin";
  }
  return "viewer";
}

std::optional<Role> RoleOfName(absl::string_view name) {
  for (Role r : {Role::kViewer, Role::kMember, Role::kAdmin}) {
    if (name == RoleName(r)) return r;
  }
  return std::nullopt;
}

bool IsUserName(absl::string_view name) {
  if (name.empty() || name.size() > 64 || !absl::ascii_isalnum(name[0])) {
    return false;
  }
  for (char ch : name) {
    if (!absl::ascii_isalnum(ch) && ch != '.' && ch != '_' && ch != '-') {
      return false;
    }
  }
  return true;
}

namespace {

bool IsSha256Hex(absl::string_view s) {
  if (s.size() != 64) return false;
  for (char ch : s) {
    if (!absl::ascii_isxdigit(ch)) return false;
  }
  return true;
}

// Refusals of one file: "WHAT: line N: MESSAGE".
class Refuse {
 public:
  explicit Refuse(absl::string_view what) : what_(what) {}
  absl::Status At(const YAML::Node& n, absl::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat(what_, ": line ", n.Mark().line + 1, ": ", message));
  }
  absl::Status Whole(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": ", message));
  }

 private:
  const std::string what_;
};

absl::StatusOr<int> Limit(const Refuse& refuse, const YAML::Node& n,
                          absl::string_view key) {
  int v = -1;
  if (!n.IsScalar() || !YAML::convert<int>::decode(n, v) || v < 0) {
    return refuse.At(n, absl::StrCat("quota.", key,
                                     " must be a whole number >= 0 (0: no "
                                     "limit)"));
  }
  return v;
}

absl::StatusOr<Quota> ParseQuota(const Refuse& refuse, const YAML::Node& n) {
  if (!n.IsMap()) {
    return refuse.At(n, "quota must be a map of slots, gpus, running_jobs");
  }
  Quota q;
  for (const auto& kv : n) {
    const std::string key = kv.first.as<std::string>();
    int* field = key == "slots"          ? &q.slots
                 : key == "gpus"         ? &q.gpus
                 : key == "running_jobs" ? &q.running_jobs
                                         : nullptr;
    if (field == nullptr) {
      return refuse.At(kv.first,
                       absl::StrCat("unknown key quota.", key,
                                    " (known: slots, gpus, running_jobs)"));
    }
    absl::StatusOr<int> v = Limit(refuse, kv.second, key);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  return q;
}

absl::StatusOr<User> ParseUser(const Refuse& refuse, const YAML::Node& n) {
  if (!n.IsMap()) {
    return refuse.At(n, "each user must be a map (name, role, token_sha256)");
  }
  User u;
  bool has_name = false, has_role = false;
  for (const auto& kv : n) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (key == "name") {
      if (!v.IsScalar() || !IsUserName(v.Scalar())) {
        return refuse.At(v,
                         "name must be 1 to 64 of A-Z a-z 0-9 . _ -, starting "
                         "with a letter or digit");
      }
      u.name = v.Scalar();
      has_name = true;
    } else if (key == "role") {
      std::optional<Role> r =
          v.IsScalar() ? RoleOfName(v.Scalar()) : std::nullopt;
      if (!r.has_value()) {
        return refuse.At(v,
                         absl::StrCat("role '", v.IsScalar() ? v.Scalar() : "",
                                      "' is not one of admin, member, viewer"));
      }
      u.role = *r;
      has_role = true;
    } else if (key == "token_sha256") {
      if (!v.IsSequence()) {
        return refuse.At(v, "token_sha256 must be a list of SHA-256 digests");
      }
      for (const YAML::Node& h : v) {
        if (!h.IsScalar() || !IsSha256Hex(h.Scalar())) {
          return refuse.At(h,
                           "a token_sha256 entry must be 64 hex characters "
                           "(the SHA-256 of a token: sha256sum)");
        }
        u.token_sha256.push_back(absl::AsciiStrToLower(h.Scalar()));
      }
    } else if (key == "quota") {
      absl::StatusOr<Quota> q = ParseQuota(refuse, v);
      if (!q.ok()) return q.status();
      u.quota = *q;
    } else {
      return refuse.At(
          kv.first, absl::StrCat("unknown key '", key,
                                 "' (known: name, role, token_sha256, quota)"));
    }
  }
  if (!has_name) return refuse.At(n, "a user needs a name");
  if (!has_role) {
    return refuse.At(n, absl::StrCat("user ", u.name,
                                     " needs a role (admin, member, viewer)"));
  }
  return u;
}

}  // namespace

absl::StatusOr<UserTable> UserTable::Parse(absl::string_view yaml,
                                           absl::string_view what) {
  const Refuse refuse(what);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": line ", e.mark.line + 1, ": not YAML: ", e.msg));
  }
  if (!root.IsMap()) return refuse.Whole("must be a map with a 'users' list");
  YAML::Node list;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (key != "users") {
      return refuse.At(kv.first,
                       absl::StrCat("unknown key '", key, "' (known: users)"));
    }
    list = kv.second;
  }
  if (!list.IsDefined() || !list.IsSequence() || list.size() == 0) {
    return refuse.Whole("'users' must be a list of at least one user");
  }
  UserTable t;
  std::map<std::string, int> name_line, hash_line;
  for (const YAML::Node& n : list) {
    absl::StatusOr<User> u = ParseUser(refuse, n);
    if (!u.ok()) return u.status();
    const int line = n.Mark().line + 1;
    if (auto [it, fresh] = name_line.emplace(u->name, line); !fresh) {
      return refuse.At(
          n, absl::StrCat("user ", u->name, " is listed twice (also on line ",
                          it->second, ")"));
    }
    for (const std::string& h : u->token_sha256) {
      if (auto [it, fresh] = hash_line.emplace(h, line); !fresh) {
        return refuse.At(
            n, absl::StrCat("a token_sha256 of user ", u->name,
                            " is also the user's on line ", it->second,
                            ": each token belongs to one user, once"));
      }
    }
    t.users_.push_back(*std::move(u));
  }
  return t;
}

absl::StatusOr<UserTable> UserTable::Load(const std::string& path) {
  const std::string what = absl::StrCat("--users-file ", path);
  absl::StatusOr<std::string> text =
      ReadBoundedFile("--users-file", path, kMaxUsersFileBytes);
  if (!text.ok()) return text.status();
  return Parse(*text, what);
}

UserTable UserTable::FromTokens(const std::vector<std::string>& tokens) {
  UserTable t;
  for (size_t i = 0; i < tokens.size(); ++i) {
    User u;
    u.name = absl::StrCat("token-", i + 1);
    u.role = Role::kAdmin;
    u.token_sha256 = {Sha256Hex(tokens[i])};
    t.users_.push_back(std::move(u));
  }
  return t;
}

const User* UserTable::FindToken(absl::string_view token) const {
  const std::string hash = Sha256Hex(token);
  const User* found = nullptr;
  // Every hash compared, whichever matches: the time says nothing.
  for (const User& u : users_) {
    for (const std::string& h : u.token_sha256) {
      if (ConstantTimeEquals(hash, h)) found = &u;
    }
  }
  return found;
}

const User* UserTable::Find(absl::string_view name) const {
  for (const User& u : users_) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<Users>> Users::Create(
    std::function<absl::StatusOr<UserTable>()> load) {
  absl::StatusOr<UserTable> t = load();
  if (!t.ok()) return t.status();
  auto users = std::make_unique<Users>(*std::move(t));
  users->load_ = std::move(load);
  return users;
}

Users::Users(UserTable table)
    : table_(std::make_shared<const UserTable>(std::move(table))) {}

absl::StatusOr<Caller> Users::Authenticate(
    const std::optional<std::string>& authorization) const {
  absl::StatusOr<std::string> token = BearerToken(authorization);
  if (!token.ok()) return token.status();
  const std::shared_ptr<const UserTable> t = table();
  const User* u = t->FindToken(*token);
  if (u == nullptr) return absl::UnauthenticatedError("invalid token");
  return Caller{u->name, u->role};
}

absl::Status Users::Reload() {
  if (!load_) return absl::OkStatus();
  absl::StatusOr<UserTable> t = load_();
  if (!t.ok()) return t.status();
  absl::MutexLock lock(&mu_);
  table_ = std::make_shared<const UserTable>(*std::move(t));
  return absl::OkStatus();
}

std::shared_ptr<const UserTable> Users::table() const {
  absl::MutexLock lock(&mu_);
  return table_;
}

namespace {

std::string QuotaYaml(const Quota& q) {
  return absl::StrCat("{slots: ", q.slots, ", gpus: ", q.gpus,
                      ", running_jobs: ", q.running_jobs, "}");
}

// One user as an item of the file's list.
std::string UserYaml(const User& u) {
  std::string out =
      absl::StrCat("  - name: ", u.name, "\n    role: ", RoleName(u.role),
                   "\n    token_sha256:\n");
  for (const std::string& h : u.token_sha256) {
    absl::StrAppend(&out, "      - ", h, "\n");
  }
  if (!(u.quota == Quota{})) {
    absl::StrAppend(&out, "    quota: ", QuotaYaml(u.quota), "\n");
  }
  return out;
}

// The whole table in the file's form (a rewrite loses comments).
std::string UsersYaml(const std::vector<User>& users) {
  std::string out = "users:\n";
  for (const User& u : users) out += UserYaml(u);
  return out;
}

}  // namespace

absl::StatusOr<std::string> AddUserToken(const std::string& path,
                                         const std::string& name, Role role,
                                         const Quota& quota) {
  if (!IsUserName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "user name '", name,
        "': 1 to 64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"));
  }
  std::string text;
  std::optional<UserTable> old;
  if (fs::exists(path)) {
    absl::StatusOr<std::string> t =
        ReadBoundedFile("--users-file", path, kMaxUsersFileBytes);
    if (!t.ok()) return t.status();
    text = *std::move(t);
    absl::StatusOr<UserTable> parsed =
        UserTable::Parse(text, absl::StrCat("--users-file ", path));
    if (!parsed.ok()) return parsed.status();
    old = *std::move(parsed);
  }
  const std::string token = GenerateToken();
  const std::string hash = Sha256Hex(token);
  const User* existing = old.has_value() ? old->Find(name) : nullptr;
  if (existing != nullptr && existing->role != role) {
    return absl::InvalidArgumentError(absl::StrCat(
        "user ", name, " is a ", RoleName(existing->role), ", not a ",
        RoleName(role), ": change its role in the file itself"));
  }
  std::string next;
  if (existing == nullptr) {
    // Appended to the text as it is, comments kept; checked below.
    const std::string entry = UserYaml(User{name, role, {hash}, quota});
    if (!old.has_value()) {
      next = absl::StrCat(
          "# ptcoord --users-file: users, their roles and the SHA-256 of "
          "their tokens (docs/users.md)\nusers:\n",
          entry);
    } else {
      next = absl::StrCat(text, absl::EndsWith(text, "\n") ? "" : "\n", entry);
    }
  }
  // The expected table; the appended text must read as exactly it, else
  // (a file of another shape) the table is written out whole.
  std::vector<User> want = old.has_value() ? old->users() : std::vector<User>{};
  bool found = false;
  for (User& u : want) {
    if (u.name == name) {
      u.token_sha256.push_back(hash);
      found = true;
    }
  }
  if (!found) want.push_back(User{name, role, {hash}, quota});
  const auto same = [&](const UserTable& t) {
    if (t.users().size() != want.size()) return false;
    for (size_t i = 0; i < want.size(); ++i) {
      const User& a = t.users()[i];
      if (a.name != want[i].name || a.role != want[i].role ||
          a.token_sha256 != want[i].token_sha256 ||
          !(a.quota == want[i].quota)) {
        return false;
      }
    }
    return true;
  };
  absl::StatusOr<UserTable> reread =
      next.empty() ? absl::InvalidArgumentError("no text appended")
                   : UserTable::Parse(next, "the new users file");
  if (!reread.ok() || !same(*reread)) next = UsersYaml(want);
  // The file keeps its owner (root adding a user to the file of the user
  // ptcoord runs as), which a replacement would not.
  struct stat before;
  const bool existed = stat(path.c_str(), &before) == 0;
  if (absl::Status s = ReplacePrivateFile(path, next); !s.ok()) return s;
  if (existed && chown(path.c_str(), before.st_uid, before.st_gid) != 0) {
    return absl::UnavailableError(absl::StrCat("--users-file ", path,
                                               ": written, but its owner could "
                                               "not be kept: ",
                                               std::strerror(errno)));
  }
  return token;
}

}  // namespace ptrain
