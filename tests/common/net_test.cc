// The rule by which a rank advertises its metrics endpoint: an address that
// others can dial, never a host name that may not resolve.
#include "common/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace ptrain {
namespace {

// In a UTS namespace of its own (root): the name set there, and the
// fallback once the name is empty.
TEST(HostName, IsTheMachinesNameElseTheFallback) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (unshare(CLONE_NEWUTS) != 0) _exit(77);
    if (sethostname("node-a", 6) != 0 || HostName() != "node-a") _exit(1);
    if (sethostname("", 0) != 0 || HostName("node") != "node") _exit(2);
    if (HostName() != "localhost") _exit(3);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "no UTS namespace here";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(SplitHostPort, SplitsNamesV4AndBracketedV6) {
  auto a = SplitHostPort("node1:7070");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "node1");
  EXPECT_EQ(a->second, "7070");
  auto b = SplitHostPort("[::1]:9");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first, "::1");
  EXPECT_EQ(b->second, "9");
  EXPECT_FALSE(SplitHostPort("node1").ok());
  EXPECT_FALSE(SplitHostPort("node1:").ok());
}

TEST(JoinHostPort, BracketsV6Only) {
  EXPECT_EQ(JoinHostPort("10.0.0.1", "80"), "10.0.0.1:80");
  EXPECT_EQ(JoinHostPort("::1", "80"), "[::1]:80");
}

TEST(LocalAddressToward, LoopbackIsReachedFromLoopback) {
  auto local = LocalAddressToward("127.0.0.1:9");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1");
}

// For every IPv4 address of this machine's own interfaces, the interface
// that reaches it is the one that holds it.
TEST(LocalAddressToward, AnInterfaceAddressIsReachedFromItself) {
  ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  int checked = 0;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = "";
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr,
              text, sizeof(text));
    auto local = LocalAddressToward(std::string(text) + ":9");
    ASSERT_TRUE(local.ok()) << text << ": " << local.status();
    EXPECT_EQ(*local, text);
    ++checked;
  }
  freeifaddrs(list);
  EXPECT_GE(checked, 1);
}

TEST(LocalAddressToward, AnUnresolvableNameIsUnavailable) {
  auto local = LocalAddressToward("no-such-host.invalid:9");
  EXPECT_FALSE(local.ok());
  EXPECT_EQ(local.status().code(), absl::StatusCode::kUnavailable);
}

TEST(AdvertiseHost, ExplicitHostWins) {
  EXPECT_EQ(
      AdvertiseHost("0.0.0.0:0", "node7.cluster", "127.0.0.1:7070", "box"),
      "node7.cluster");
}

TEST(AdvertiseHost, ASpecificBindAddressIsAdvertisedAsIs) {
  EXPECT_EQ(AdvertiseHost("10.1.2.3:0", "", "127.0.0.1:7070", "box"),
            "10.1.2.3");
  EXPECT_EQ(AdvertiseHost("[::1]:0", "", "127.0.0.1:7070", "box"), "::1");
}

TEST(AdvertiseHost, AWildcardBindIsTheAddressThatReachesThePeer) {
  for (const char* bind : {"0.0.0.0:0", ":0", "[::]:9100"}) {
    EXPECT_EQ(AdvertiseHost(bind, "", "127.0.0.1:7070", "box"), "127.0.0.1")
        << bind;
  }
}

TEST(AdvertiseHost, TheNodeNameIsTheLastResort) {
  EXPECT_EQ(AdvertiseHost("0.0.0.0:0", "", "no-such-host.invalid:1", "box"),
            "box");
  EXPECT_EQ(AdvertiseHost("0.0.0.0:0", "", "", "box"), "box");
}

}  // namespace
}  // namespace ptrain
