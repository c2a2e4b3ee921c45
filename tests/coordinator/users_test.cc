// Users, roles, the access table and the audit log (users.h, access.h,
// audit.h): what a users file may hold and how each refusal names its line,
// tokens found by their hashes only, reloads that keep the old table on an
// error, `ptcoord users add` keeping a file's comments, each role's rights,
// and the audit log turning over by size.
#include "coordinator/users.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "coordinator/access.h"
#include "coordinator/audit.h"
#include "coordinator/ui_server.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/files.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

std::string Hash(const std::string& token) { return Sha256Hex(token); }

std::string ReadFile(const fs::path& p) {
  return ptrain::testing::ReadAll(p.string());
}

class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() /
              absl::StrCat("users_test_", getpid(), "_",
                           ::testing::UnitTest::GetInstance()
                               ->current_test_info()
                               ->name())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(UserTable, ParsesUsersRolesHashesAndQuotasAndFindsTokensByHash) {
  const std::string yaml = absl::StrCat(
      "# the team\nusers:\n"
      "  - name: alice\n    role: member\n    token_sha256: [",
      Hash("alice-token"), ", ", Hash("alice-2"),
      "]\n    quota: {slots: 8, gpus: 2, running_jobs: 3}\n"
      "  - name: root\n    role: admin\n    token_sha256:\n      - ",
      Hash("root-token"), "\n");
  absl::StatusOr<UserTable> t = UserTable::Parse(yaml, "users.yaml");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->users().size(), 2u);
  const User* alice = t->FindToken("alice-2");
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->role, Role::kMember);
  EXPECT_EQ(alice->quota, (Quota{8, 2, 3}));
  EXPECT_EQ(t->FindToken("root-token")->role, Role::kAdmin);
  EXPECT_EQ(t->FindToken(Hash("root-token")), nullptr);  // a hash is no token
  EXPECT_EQ(t->FindToken("nobody"), nullptr);
}

TEST(UserTable, EachBrokenRuleIsRefusedNamingItsLine) {
  const std::string h = Hash("x");
  const struct {
    std::string yaml, want;
  } cases[] = {
      {absl::StrCat("users:\n  - name: a\n    role: root\n"),
       "line 3: role 'root'"},
      {absl::StrCat("users:\n  - name: a\n    role: admin\n    token_sha256: [",
                    h, "]\n  - name: a\n    role: viewer\n"),
       "line 5: user a is listed twice (also on line 2)"},
      {absl::StrCat("users:\n  - name: a\n    role: admin\n    token_sha256: [",
                    h, "]\n  - name: b\n    role: viewer\n    token_sha256: [",
                    h, "]\n"),
       "line 5: a token_sha256 of user b is also the user's on line 2"},
      {"users:\n  - name: a\n    role: admin\n    token_sha256: [abc]\n",
       "line 4: a token_sha256 entry must be 64 hex"},
      {"users:\n  - name: 'a b'\n    role: admin\n", "line 2: name must be"},
      {"users:\n  - role: admin\n", "line 2: a user needs a name"},
      {"users:\n  - name: a\n", "needs a role"},
      {"users:\n  - name: a\n    role: admin\n    quota: {slots: -1}\n",
       "line 4: quota.slots must be a whole number >= 0"},
      {"users:\n  - name: a\n    role: admin\n    quota: {cpus: 1}\n",
       "unknown key quota.cpus"},
      {"people: []\n", "line 1: unknown key 'people'"},
      {"users: []\n", "'users' must be a list of at least one user"},
      {"users: [\n", "not YAML"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<UserTable> t = UserTable::Parse(c.yaml, "F");
    ASSERT_FALSE(t.ok()) << c.yaml;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(t.status().message(), "F: "))
        << t.status().message();
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.want))
        << t.status().message() << "\nwanted: " << c.want;
  }
}

TEST(UserTable, TokenFileTokensAreAdminsNamedInOrder) {
  const UserTable t = UserTable::FromTokens({"first", "second"});
  ASSERT_EQ(t.users().size(), 2u);
  EXPECT_EQ(t.FindToken("second")->name, "token-2");
  EXPECT_EQ(t.FindToken("first")->role, Role::kAdmin);
}

TEST(Users, AReloadThatFailsKeepsTheOldTableAndOneThatWorksDropsRemovedTokens) {
  std::string yaml =
      absl::StrCat("users:\n  - name: a\n    role: admin\n    token_sha256: [",
                   Hash("ta"), "]\n");
  absl::StatusOr<std::unique_ptr<Users>> users =
      Users::Create([&]() { return UserTable::Parse(yaml, "F"); });
  ASSERT_TRUE(users.ok());
  EXPECT_EQ((*users)->Authenticate("Bearer ta")->user, "a");
  EXPECT_EQ((*users)->Authenticate("Bearer tb").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*users)->Authenticate(std::nullopt).status().code(),
            absl::StatusCode::kUnauthenticated);
  yaml = "users: [";
  EXPECT_FALSE((*users)->Reload().ok());
  EXPECT_TRUE((*users)->Authenticate("Bearer ta").ok());
  yaml = absl::StrCat(
      "users:\n  - name: b\n    role: viewer\n"
      "    token_sha256: [",
      Hash("tb"), "]\n");
  ASSERT_TRUE((*users)->Reload().ok());
  EXPECT_EQ((*users)->Authenticate("Bearer ta").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*users)->Authenticate("Bearer tb")->role, Role::kViewer);
}

TEST(AddUserToken, AppendsANewUserKeepingCommentsAndAddsTokensToAnOldOne) {
  TempDir dir;
  const std::string path = (dir.path() / "users.yaml").string();
  absl::StatusOr<std::string> a =
      AddUserToken(path, "alice", Role::kMember, Quota{4, 0, 0});
  ASSERT_TRUE(a.ok()) << a.status();
  std::ofstream(path, std::ios::app) << "# keep me\n";
  absl::StatusOr<std::string> b =
      AddUserToken(path, "bob", Role::kViewer, Quota{});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(absl::StrContains(ReadFile(path), "# keep me"));
  // Only hashes are written.
  EXPECT_FALSE(absl::StrContains(ReadFile(path), *a));
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::group_all,
            fs::perms::none);
  absl::StatusOr<std::string> a2 =
      AddUserToken(path, "alice", Role::kMember, Quota{});
  ASSERT_TRUE(a2.ok());
  absl::StatusOr<UserTable> t = UserTable::Load(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->FindToken(*a)->name, "alice");
  EXPECT_EQ(t->FindToken(*a2)->name, "alice");
  EXPECT_EQ(t->FindToken(*a2)->quota, (Quota{4, 0, 0}));
  EXPECT_EQ(t->FindToken(*b)->role, Role::kViewer);
  // Another role for an existing user, or a bad name: refused, file kept.
  const std::string before = ReadFile(path);
  EXPECT_FALSE(AddUserToken(path, "alice", Role::kAdmin, Quota{}).ok());
  EXPECT_FALSE(AddUserToken(path, "al ice", Role::kAdmin, Quota{}).ok());
  EXPECT_EQ(ReadFile(path), before);
}

TEST(Access, EachRoleGetsWhatItsRuleSaysAndOthersJobsNeedAnAdmin) {
  const Caller viewer{"v", Role::kViewer}, alice{"alice", Role::kMember},
      root{"root", Role::kAdmin};
  const AccessRule& read = *FindAccessRule("GetJob");
  const AccessRule& submit = *FindAccessRule("SubmitJob");
  const AccessRule& own = *FindAccessRule("CancelJob");
  const AccessRule& admin = *FindAccessRule("DrainNode");
  EXPECT_TRUE(Authorize(viewer, read).ok());
  EXPECT_EQ(Authorize(viewer, submit).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Authorize(alice, submit).ok());
  EXPECT_TRUE(Authorize(alice, own, "job-0001", "alice").ok());
  const absl::Status other = Authorize(alice, own, "job-0001", "bob");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(other.message(), "belongs to bob"));
  EXPECT_TRUE(absl::StrContains(other.message(), "needs role admin"));
  // A job of no recorded owner is an admin's alone.
  EXPECT_FALSE(Authorize(alice, own, "job-0001", "").ok());
  EXPECT_TRUE(Authorize(root, own, "job-0001", "bob").ok());
  EXPECT_FALSE(Authorize(alice, admin).ok());
  EXPECT_TRUE(Authorize(root, admin).ok());
  EXPECT_EQ(FindAccessRule("NoSuchRpc"), nullptr);
}

// Every UI rule of the table is the route of some path, and every path a
// route answers has a rule: the UI cannot grow a route the table misses.
TEST(Access, EveryUiRouteHasARuleAndEveryUiRuleARoute) {
  std::set<std::string> routed;
  for (const char* path :
       {"/", "/nodes", "/jobs/job-0001", "/static/ui.js", "/static/ui.css",
        "/static/chart.js", "/api/v1/jobs", "/api/v1/nodes",
        "/api/v1/jobs/job-0001", "/api/v1/jobs/job-0001/metrics",
        "/api/v1/jobs/job-0001/log"}) {
    const std::string route = UiRoute(path);
    ASSERT_FALSE(route.empty()) << path;
    EXPECT_NE(FindAccessRule(route), nullptr) << route;
    routed.insert(route);
  }
  for (const AccessRule& r : AccessRules()) {
    if (absl::StartsWith(r.name, "GET ")) {
      EXPECT_TRUE(routed.count(std::string(r.name))) << r.name;
      EXPECT_FALSE(r.audited) << r.name;  // the UI only reads
    }
  }
  EXPECT_EQ(UiRoute("/api/v1/jobs/job-0001/secrets"), "");
  EXPECT_EQ(UiRoute("/etc/passwd"), "");
}

TEST(AuditLog, WritesOneJsonLineARequestAndTurnsOverBySizeKeepingN) {
  TempDir dir;
  const std::string path = (dir.path() / "audit.jsonl").string();
  absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(path, 4096, 2);
  ASSERT_TRUE(log.ok()) << log.status();
  for (int i = 0; i < 200; ++i) {
    (*log)->Write(AuditRecord{
        1000 + i, "alice", "member", "ipv4:1.2.3.4:5", "CancelJob",
        absl::StrCat("job-", i),
        i % 2 == 0 ? absl::OkStatus() : absl::PermissionDeniedError("no")});
  }
  EXPECT_TRUE(fs::exists(dir.path() / "audit.1.jsonl"));
  EXPECT_TRUE(fs::exists(dir.path() / "audit.2.jsonl"));
  EXPECT_FALSE(fs::exists(dir.path() / "audit.3.jsonl"));
  EXPECT_LE(fs::file_size(path), 4096u);
  // The newest record is the current file's last line, whole.
  std::string text = ReadFile(path);
  text.pop_back();
  const nlohmann::json last =
      nlohmann::json::parse(text.substr(text.rfind('\n') + 1));
  EXPECT_EQ(last["target"], "job-199");
  EXPECT_EQ(last["result"], "PERMISSION_DENIED");
  EXPECT_EQ(last["error"], "no");
  EXPECT_EQ(last["user"], "alice");
  EXPECT_EQ(last["time"], "1970-01-01T00:00:01.199Z");
  EXPECT_FALSE(AuditLog::Open(path, 100, 2).ok());
  EXPECT_FALSE(AuditLog::Open(path, 4096, 0).ok());
}

}  // namespace
}  // namespace ptrain
