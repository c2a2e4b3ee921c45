// NodeRegistry without RPC: the join token, every field rule, the timeout
// that makes a node DOWN (on a clock the test sets), sessions, and the
// registrations a restarted coordinator finds in the store.
#include "coordinator/nodes.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "coordinator/scheduler.h"
#include "gtest/gtest.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

class NodeRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("nodes_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    store_ = std::move(*Store::Open((dir_ / "ptcoord.db").string()));
    options_.join_tokens = {"join"};
    options_.heartbeat_interval = absl::Seconds(1);
    options_.timeout = absl::Seconds(5);
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(dir_);
  }
  std::unique_ptr<NodeRegistry> Make() {
    return std::move(*NodeRegistry::Create(store_.get(), options_));
  }
  static v1::RegisterNodeRequest Request(const std::string& name) {
    v1::RegisterNodeRequest r;
    r.mutable_node()->set_name(name);
    r.mutable_node()->set_address(name + ":7071");
    r.mutable_node()->set_slots(4);
    r.mutable_node()->set_cores(4);
    r.mutable_node()->set_memory_bytes(1 << 30);
    r.mutable_node()->set_version("0.1.0");
    return r;
  }
  static v1::RegisterNodeRequest WithSecret(v1::RegisterNodeRequest r,
                                            const std::string& secret) {
    r.set_node_secret(secret);
    return r;
  }
  static v1::NodeHeartbeatRequest Beat(const std::string& name,
                                       const std::string& session) {
    v1::NodeHeartbeatRequest b;
    b.set_name(name);
    b.set_session(session);
    b.set_load1(0.5);
    return b;
  }

  fs::path dir_;
  std::unique_ptr<Store> store_;
  NodeRegistryOptions options_;
  const absl::Time t0_ = absl::FromUnixSeconds(1'800'000'000);
};

TEST_F(NodeRegistryTest, OnlyAJoinTokenAuthenticates) {
  auto r = Make();
  EXPECT_TRUE(r->AuthenticateNode(std::string("Bearer join")).ok());
  EXPECT_EQ(r->AuthenticateNode(std::string("Bearer user")).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r->AuthenticateNode(std::nullopt).code(),
            absl::StatusCode::kUnauthenticated);
  options_.join_tokens.clear();  // no --join-token-file: nobody joins
  EXPECT_EQ(Make()->AuthenticateNode(std::string("Bearer join")).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(NodeRegistryTest, EveryRuleOfARegistrationIsNamedAndChangesNothing) {
  auto r = Make();
  struct Case {
    std::function<void(v1::NodeSpec*)> spoil;
    const char* field;
  };
  const std::vector<Case> cases = {
      {[](v1::NodeSpec* s) { s->set_name(""); }, "node.name"},
      {[](v1::NodeSpec* s) { s->set_name(std::string(64, 'a')); }, "node.name"},
      {[](v1::NodeSpec* s) { s->set_name("Node1"); }, "node.name"},
      {[](v1::NodeSpec* s) { s->set_name("-node"); }, "node.name"},
      {[](v1::NodeSpec* s) { s->set_name("a/b"); }, "node.name"},
      {[](v1::NodeSpec* s) { s->set_address("nohost"); }, "node.address"},
      {[](v1::NodeSpec* s) { s->set_address(":7071"); }, "node.address"},
      {[](v1::NodeSpec* s) { s->set_address("h:70x1"); }, "node.address"},
      // What ptrsh would dial with an attempt's token: no wildcard, as for
      // a rank's endpoint, and a real port.
      {[](v1::NodeSpec* s) { s->set_address("0.0.0.0:1"); }, "node.address"},
      {[](v1::NodeSpec* s) { s->set_address("[::]:7071"); }, "node.address"},
      {[](v1::NodeSpec* s) { s->set_address("h:0"); }, "node.address"},
      {[](v1::NodeSpec* s) { s->set_address("h:65536"); }, "node.address"},
      {[](v1::NodeSpec* s) { s->set_slots(0); }, "node.slots"},
      {[](v1::NodeSpec* s) { s->set_slots(4097); }, "node.slots"},
      {[](v1::NodeSpec* s) { s->set_cores(0); }, "node.cores"},
      {[](v1::NodeSpec* s) { s->set_memory_bytes(-1); }, "node.memory_bytes"},
      {[](v1::NodeSpec* s) {
         for (int c : {0, 2, 2}) s->add_cpus(c);
       },
       "node.cpus"},
      {[](v1::NodeSpec* s) {
         for (int c : {3, 1}) s->add_cpus(c);
       },
       "node.cpus"},
      {[](v1::NodeSpec* s) { s->add_cpus(-1); }, "node.cpus"},
      {[](v1::NodeSpec* s) { s->add_cpus(1 << 20); }, "node.cpus"},
      {[](v1::NodeSpec* s) { s->set_version(std::string(65, 'v')); },
       "node.version"},
  };
  for (const Case& c : cases) {
    v1::RegisterNodeRequest req = Request("node1");
    c.spoil(req.mutable_node());
    auto got = r->Register(req, t0_);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument)
        << c.field;
    EXPECT_NE(got.status().message().find(c.field), std::string::npos)
        << got.status();
  }
  EXPECT_TRUE(r->List(t0_).empty());
  EXPECT_TRUE(store_->ListNodes()->empty());
  EXPECT_TRUE(r->Register(Request("node-1.rack-2"), t0_).ok());
}

TEST_F(NodeRegistryTest, NodeIsUpWhileItHeartbeatsAndDownAfterTheTimeout) {
  auto r = Make();
  auto reg = r->Register(Request("n1"), t0_);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->heartbeat_interval_ms(), 1000);
  EXPECT_EQ(r->List(t0_)[0].state(), v1::NODE_STATE_UP);
  absl::Time t = t0_;
  for (int i = 0; i < 10; ++i) {  // 40 s of heartbeats every 4 s
    t += absl::Seconds(4);
    ASSERT_TRUE(r->Heartbeat(Beat("n1", reg->session()), t).ok());
    EXPECT_EQ(r->List(t + absl::Seconds(5)).at(0).state(), v1::NODE_STATE_UP);
  }
  const v1::Node n = r->List(t).at(0);
  EXPECT_EQ(n.last_heartbeat_unix_ms(), absl::ToUnixMillis(t));
  EXPECT_DOUBLE_EQ(n.load1(), 0.5);
  EXPECT_EQ(r->List(t + absl::Seconds(6)).at(0).state(), v1::NODE_STATE_DOWN);
  // A late heartbeat brings it back.
  ASSERT_TRUE(
      r->Heartbeat(Beat("n1", reg->session()), t + absl::Seconds(7)).ok());
  EXPECT_EQ(r->List(t + absl::Seconds(7)).at(0).state(), v1::NODE_STATE_UP);
  // Reports are checked.
  v1::NodeHeartbeatRequest bad = Beat("n1", reg->session());
  bad.set_load1(std::nan(""));
  EXPECT_EQ(r->Heartbeat(bad, t).code(), absl::StatusCode::kInvalidArgument);
  bad = Beat("n1", reg->session());
  bad.set_processes(-1);
  EXPECT_EQ(r->Heartbeat(bad, t).code(), absl::StatusCode::kInvalidArgument);
}

// Time ptcoord could not run does not count towards a node's timeout; the
// last heartbeat shown stays when it came.
TEST_F(NodeRegistryTest, TimeLeftOutDoesNotCountTowardsTheTimeout) {
  auto r = Make();
  auto reg = r->Register(Request("n1"), t0_);
  ASSERT_TRUE(reg.ok()) << reg.status();
  const absl::Time beat = t0_ + absl::Seconds(1);
  ASSERT_TRUE(r->Heartbeat(Beat("n1", reg->session()), beat).ok());
  r->LeaveOut(absl::Seconds(20));
  const absl::Time later = beat + absl::Seconds(24);  // 4 s heard of 24
  const v1::Node n = r->List(later).at(0);
  EXPECT_EQ(n.state(), v1::NODE_STATE_UP);
  EXPECT_EQ(n.last_heartbeat_unix_ms(), absl::ToUnixMillis(beat));
  EXPECT_EQ(r->List(later + absl::Seconds(2)).at(0).state(),
            v1::NODE_STATE_DOWN);
  // A heartbeat restarts the count from itself.
  ASSERT_TRUE(r->Heartbeat(Beat("n1", reg->session()), later).ok());
  EXPECT_EQ(r->List(later + absl::Seconds(5)).at(0).state(), v1::NODE_STATE_UP);
  EXPECT_EQ(r->List(later + absl::Seconds(6)).at(0).state(),
            v1::NODE_STATE_DOWN);
}

TEST_F(NodeRegistryTest, ANewRegistrationReplacesTheOldSession) {
  auto r = Make();
  auto first = r->Register(Request("n1"), t0_);
  ASSERT_TRUE(first.ok());
  auto second = r->Register(WithSecret(Request("n1"), first->node_secret()),
                            t0_ + absl::Seconds(1));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(first->session(), second->session());
  EXPECT_EQ(r->Heartbeat(Beat("n1", first->session()), t0_).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(r->Heartbeat(Beat("n1", second->session()), t0_).ok());
  EXPECT_EQ(r->Heartbeat(Beat("n2", second->session()), t0_).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(r->List(t0_).size(), 1u);
}

TEST_F(NodeRegistryTest, ARestartedCoordinatorKnowsItsNodesAsDown) {
  {
    auto r = Make();
    ASSERT_TRUE(r->Register(Request("n1"), t0_).ok());
    ASSERT_TRUE(r->Register(Request("n2"), t0_).ok());
  }
  auto r = Make();
  const std::vector<v1::Node> nodes = r->List(t0_);
  ASSERT_EQ(nodes.size(), 2u);
  for (const v1::Node& n : nodes) {
    EXPECT_EQ(n.state(), v1::NODE_STATE_DOWN) << n.spec().name();
    EXPECT_EQ(n.last_heartbeat_unix_ms(), 0);
    EXPECT_EQ(n.registered_unix_ms(), absl::ToUnixMillis(t0_));
    EXPECT_EQ(n.spec().slots(), 4);
  }
  // The old session means nothing to it: the daemon must register again.
  EXPECT_EQ(r->Heartbeat(Beat("n1", "old"), t0_).code(),
            absl::StatusCode::kNotFound);
}

// The probe: anything holding the join token registered "n1" with a new
// address while n1 heartbeated, and the next job's token went there. A
// name is bound to the secret its first registration got.
TEST_F(NodeRegistryTest, ALiveNodesNameCannotBeTakenOverWithTheJoinToken) {
  auto r = Make();
  auto real = r->Register(Request("n1"), t0_, "ipv4:10.0.0.1:40000");
  ASSERT_TRUE(real.ok());
  EXPECT_EQ(real->node_secret().size(), 64u);
  ASSERT_TRUE(r->Heartbeat(Beat("n1", real->session()), t0_).ok());
  v1::RegisterNodeRequest impostor = Request("n1");
  impostor.mutable_node()->set_address("evil.example:7071");
  for (const std::string& secret :
       {std::string(), std::string("guess"), real->session()}) {
    auto got = r->Register(WithSecret(impostor, secret), t0_ + absl::Seconds(1),
                           "ipv4:6.6.6.6:1");
    EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied)
        << secret;
    EXPECT_NE(got.status().message().find("ptctl forget-node n1"),
              std::string::npos)
        << got.status();
  }
  // Nothing changed: the node, its address, its session.
  const std::vector<v1::Node> nodes = r->List(t0_ + absl::Seconds(1));
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].spec().address(), "n1:7071");
  EXPECT_EQ(nodes[0].state(), v1::NODE_STATE_UP);
  EXPECT_TRUE(r->Heartbeat(Beat("n1", real->session()), t0_).ok());
  EXPECT_EQ((*store_->ListNodes())[0].node.spec().address(), "n1:7071");
  // ...but the refusals are counted, shown and logged as events.
  EXPECT_EQ(nodes[0].refused_registrations(), 3);
  EXPECT_EQ(nodes[0].last_refused_peer(), "ipv4:6.6.6.6:1");
  EXPECT_EQ(nodes[0].last_refused_unix_ms(),
            absl::ToUnixMillis(t0_ + absl::Seconds(1)));
  auto events = store_->ListEvents("node:n1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 3u);
  EXPECT_NE((*events)[0].second.find("6.6.6.6"), std::string::npos);
  // The daemon that holds the secret may move.
  v1::RegisterNodeRequest moved =
      WithSecret(Request("n1"), real->node_secret());
  moved.mutable_node()->set_address("10.0.0.9:7071");
  auto again = r->Register(moved, t0_ + absl::Seconds(2));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->node_secret().empty());  // the old one stays valid
  EXPECT_EQ(r->List(t0_)[0].spec().address(), "10.0.0.9:7071");
  EXPECT_EQ(r->List(t0_)[0].refused_registrations(), 3);
}

TEST_F(NodeRegistryTest, ADownNodesNameIsBoundAcrossCoordinatorRestarts) {
  std::string secret;
  {
    auto r = Make();
    auto first = r->Register(Request("n1"), t0_);
    ASSERT_TRUE(first.ok());
    secret = first->node_secret();
  }
  auto r = Make();  // n1 is down to it until it registers
  EXPECT_EQ(r->Register(Request("n1"), t0_).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(r->List(t0_)[0].state(), v1::NODE_STATE_DOWN);
  auto back = r->Register(WithSecret(Request("n1"), secret), t0_);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->node_secret().empty());
  EXPECT_EQ(r->List(t0_)[0].state(), v1::NODE_STATE_UP);
  // Another name joins with the join token alone, as before.
  auto other = r->Register(Request("n2"), t0_);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->node_secret(), secret);
}

TEST_F(NodeRegistryTest,
       ANodeStoredWithoutASecretIsBoundByItsNextRegistration) {
  // What an older ptcoord left: a registration and no secret.
  ASSERT_TRUE(store_->UpsertNode(Request("n1").node(), 1, "").ok());
  auto r = Make();
  auto first = r->Register(Request("n1"), t0_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->node_secret().size(), 64u);
  EXPECT_EQ(r->Register(Request("n1"), t0_).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE((*store_->ListNodes())[0].secret_sha256.empty());
}

TEST_F(NodeRegistryTest, OnlyADownIdleNodeIsForgottenAndThenJoinsAfresh) {
  auto r = Make();
  auto first = r->Register(Request("n1"), t0_);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(r->SetDraining("n1", true, t0_).ok());
  EXPECT_EQ(r->Forget("n1", /*busy=*/false, t0_).code(),
            absl::StatusCode::kFailedPrecondition);  // up
  const absl::Time later = t0_ + options_.timeout + absl::Seconds(1);
  EXPECT_EQ(r->Forget("n1", /*busy=*/true, later).code(),
            absl::StatusCode::kFailedPrecondition);  // an attempt is there
  EXPECT_EQ(r->Forget("n9", false, later).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r->List(later).size(), 1u);
  ASSERT_TRUE(r->Forget("n1", false, later).ok());
  EXPECT_TRUE(r->List(later).empty());
  EXPECT_TRUE(store_->ListNodes()->empty());
  EXPECT_TRUE(Make()->List(later).empty());  // also after a restart
  // The name is free: a reinstalled node (no secret) is bound anew, and
  // nothing of the old node stays (draining, the old secret).
  auto fresh = r->Register(Request("n1"), later);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE(fresh->node_secret().empty());
  EXPECT_NE(fresh->node_secret(), first->node_secret());
  EXPECT_FALSE(r->List(later)[0].draining());
  EXPECT_EQ(r->Register(WithSecret(Request("n1"), first->node_secret()), later)
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
}

// The join token lets its holder add a node of a new name, and jobs placed
// there would hand it their attempt tokens. With require_approval such a
// node registers and heartbeats, but nothing is placed on it and it
// authorizes no Exec until an operator approves it; the wait is stored.
TEST_F(NodeRegistryTest, ANewNodeWaitsForApprovalAcrossCoordinatorRestarts) {
  options_.require_approval = true;
  std::string secret;
  {
    auto r = Make();
    auto reg = r->Register(Request("n1"), t0_, "ipv4:10.0.0.5:1234");
    ASSERT_TRUE(reg.ok()) << reg.status();
    EXPECT_TRUE(reg->pending_approval());
    secret = reg->node_secret();
    const v1::Node n = r->List(t0_).at(0);
    EXPECT_TRUE(n.pending_approval());
    EXPECT_EQ(n.state(), v1::NODE_STATE_UP);  // up, and still waiting
    EXPECT_TRUE(FreeNodesOf(r->List(t0_), {}, {}, false).empty());
    const absl::Status exec = r->CheckSession("n1", reg->session());
    EXPECT_EQ(exec.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(exec.message().find("--require-node-approval"), std::string::npos)
        << exec;
    EXPECT_NE(exec.message().find("ptctl nodes approve n1"), std::string::npos)
        << exec;
    bool pending = false;
    ASSERT_TRUE(r->Heartbeat(Beat("n1", reg->session()), t0_, &pending).ok());
    EXPECT_TRUE(pending);
    auto events = store_->ListEvents("node:n1");
    ASSERT_TRUE(events.ok());
    ASSERT_EQ(events->size(), 1u);
    EXPECT_NE((*events)[0].second.find("waits for approval"), std::string::npos)
        << (*events)[0].second;
  }
  // Restarted, even without the requirement: the node still waits, and
  // registering again (with its secret) does not end the wait.
  options_.require_approval = false;
  {
    auto r = Make();
    EXPECT_TRUE(r->List(t0_).at(0).pending_approval());
    auto back = r->Register(WithSecret(Request("n1"), secret), t0_);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(back->pending_approval());
    EXPECT_TRUE(FreeNodesOf(r->List(t0_), {}, {}, false).empty());
    // Approved: schedulable at once, and Exec may be authorized.
    auto approved = r->Approve("n1", t0_);
    ASSERT_TRUE(approved.ok()) << approved.status();
    EXPECT_FALSE(approved->pending_approval());
    EXPECT_EQ(approved->state(), v1::NODE_STATE_UP);
    EXPECT_TRUE(r->CheckSession("n1", back->session()).ok());
    ASSERT_EQ(FreeNodesOf(r->List(t0_), {}, {}, false).size(), 1u);
    bool pending = true;
    ASSERT_TRUE(r->Heartbeat(Beat("n1", back->session()), t0_, &pending).ok());
    EXPECT_FALSE(pending);
    // Approving again changes nothing and is no error.
    EXPECT_TRUE(r->Approve("n1", t0_).ok());
  }
  options_.require_approval = true;
  auto r = Make();
  EXPECT_FALSE(r->List(t0_).at(0).pending_approval());  // the approval is kept
  auto again = r->Register(WithSecret(Request("n1"), secret), t0_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->pending_approval());
}

TEST_F(NodeRegistryTest, NodesKnownBeforeApprovalWasRequiredKeepTheirStanding) {
  std::string secret;
  {
    auto r = Make();  // no approval required
    auto reg = r->Register(Request("n1"), t0_);
    ASSERT_TRUE(reg.ok());
    EXPECT_FALSE(reg->pending_approval());
    secret = reg->node_secret();
  }
  // A node an older ptcoord stored (no secret) counts as known too.
  ASSERT_TRUE(store_->UpsertNode(Request("n2").node(), 1, "").ok());
  options_.require_approval = true;
  auto r = Make();
  auto n1 = r->Register(WithSecret(Request("n1"), secret), t0_);
  ASSERT_TRUE(n1.ok()) << n1.status();
  EXPECT_FALSE(n1->pending_approval());
  auto n2 = r->Register(Request("n2"), t0_);
  ASSERT_TRUE(n2.ok()) << n2.status();
  EXPECT_FALSE(n2->pending_approval());
  auto n3 = r->Register(Request("n3"), t0_);
  ASSERT_TRUE(n3.ok()) << n3.status();
  EXPECT_TRUE(n3->pending_approval());
  // A forgotten node's name is new again: it waits.
  const absl::Time later = t0_ + options_.timeout + absl::Seconds(1);
  ASSERT_TRUE(r->Forget("n1", false, later).ok());
  auto fresh = r->Register(Request("n1"), later);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(fresh->pending_approval());
  // Forgetting a waiting node forgets its wait with it.
  ASSERT_TRUE(
      r->Forget("n3", false, later + options_.timeout + absl::Seconds(1)).ok());
  const absl::StatusOr<std::vector<StoredNode>> stored = store_->ListNodes();
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->size(), 2u);  // n1 (afresh) and n2
  for (const StoredNode& n : *stored) {
    EXPECT_EQ(n.node.pending_approval(), n.node.spec().name() == "n1")
        << n.node.spec().name();
  }
}

TEST_F(NodeRegistryTest, ApprovingAnUnknownNodeIsNotFoundAndChangesNothing) {
  options_.require_approval = true;
  auto r = Make();
  ASSERT_TRUE(r->Register(Request("n1"), t0_).ok());
  const absl::StatusOr<v1::Node> none = r->Approve("n2", t0_);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("'n2'"), std::string::npos);
  EXPECT_TRUE(r->List(t0_).at(0).pending_approval());
  EXPECT_TRUE((*store_->ListNodes())[0].node.pending_approval());
}

// Names a client sends come back in messages bounded (common/echo.h): a
// 100 KB name is a few hundred bytes of answer, not a status gRPC refuses.
TEST_F(NodeRegistryTest, ANameNoNodeHasIsEchoedBounded) {
  auto r = Make();
  const std::string huge(100 * 1024, 'x');
  const std::vector<absl::Status> refusals = {
      r->Heartbeat(Beat(huge, "s"), t0_),
      r->CheckSession(huge, "s"),
      r->SetDraining(huge, true, t0_).status(),
      r->Approve(huge, t0_).status(),
      r->Forget(huge, false, t0_),
  };
  for (const absl::Status& s : refusals) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_LT(s.message().size(), 400u);
    EXPECT_NE(s.message().find("… (102400 bytes)"), std::string::npos)
        << s.message().substr(0, 400);
  }
}

}  // namespace
}  // namespace ptrain
