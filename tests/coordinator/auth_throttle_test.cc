// AuthThrottle: a peer that failed authentication too often waits before
// anything of its is checked again, other peers and other kinds of
// credential do not; the table of peers stays bounded and keeps the worst
// guesser; refusals are logged at a bounded rate. Peers are counted by
// address (IPv6 by /64).
#include "coordinator/auth_throttle.h"

#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace ptrain {
namespace {

constexpr CredentialKind kUser = CredentialKind::kUser;
constexpr CredentialKind kRank = CredentialKind::kRank;

AuthThrottle::Options Small() {
  AuthThrottle::Options o;
  o.user = {3, absl::Seconds(10)};
  o.rank = {3, absl::Seconds(10)};
  o.node = {3, absl::Seconds(10)};
  return o;
}

TEST(AuthThrottleTest, AfterItsBurstAPeerWaitsAndOnlyThatPeerAndKind) {
  AuthThrottle t(Small());
  const absl::Time now = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(t.Wait("10.0.0.1", kUser, now), absl::ZeroDuration()) << i;
    t.Failed("10.0.0.1", kUser, now);
  }
  EXPECT_EQ(t.Wait("10.0.0.1", kUser, now), absl::Seconds(10));
  EXPECT_EQ(t.Wait("10.0.0.2", kUser, now), absl::ZeroDuration());
  EXPECT_EQ(t.Wait("10.0.0.1", kRank, now), absl::ZeroDuration());
  // One failure more is forgiven each 10 s.
  EXPECT_EQ(t.Wait("10.0.0.1", kUser, now + absl::Seconds(4)),
            absl::Seconds(6));
  EXPECT_EQ(t.Wait("10.0.0.1", kUser, now + absl::Seconds(10)),
            absl::ZeroDuration());
  t.Failed("10.0.0.1", kUser, now + absl::Seconds(10));
  EXPECT_EQ(t.Wait("10.0.0.1", kUser, now + absl::Seconds(10)),
            absl::Seconds(10));
  // Forgiven whole, the peer takes no room.
  EXPECT_EQ(t.Wait("10.0.0.1", kUser, now + absl::Seconds(100)),
            absl::ZeroDuration());
  EXPECT_EQ(t.tracked(), 0u);
}

TEST(AuthThrottleTest, AThrottledPeerIsRefusedUncheckedAndSaysWhy) {
  AuthThrottle t(Small());
  const absl::Time now = absl::FromUnixSeconds(1000);
  int checks = 0;
  const auto wrong = [&] {
    ++checks;
    return absl::UnauthenticatedError("invalid token");
  };
  const auto right = [&] {
    ++checks;
    return absl::OkStatus();
  };
  // No credential at all is no guess.
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(
        t.Check("10.0.0.1", kUser, /*presented=*/false, wrong, now).code(),
        absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(t.Check("10.0.0.1", kUser, true, right, now), absl::OkStatus());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(t.Check("10.0.0.1", kUser, true, wrong, now).code(),
              absl::StatusCode::kUnauthenticated);
  }
  checks = 0;
  const absl::Status s = t.Check("10.0.0.1", kUser, true, right, now);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(checks, 0) << "the right token of a throttled peer is not checked";
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "too many refused user tokens from 10.0.0.1"))
      << s.message();
  EXPECT_TRUE(absl::StrContains(s.message(), "for 10 s")) << s.message();
  // Another peer's right token works.
  EXPECT_EQ(t.Check("10.0.0.2", kUser, true, right, now), absl::OkStatus());
  EXPECT_EQ(checks, 1);
}

TEST(AuthThrottleTest, TheTableIsBoundedAndKeepsTheWorstGuesser) {
  AuthThrottle::Options o = Small();
  o.max_peers = 4;
  AuthThrottle t(o);
  const absl::Time now = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 3; ++i) t.Failed("10.9.9.9", kUser, now);
  for (int i = 0; i < 1000; ++i) {
    t.Failed(absl::StrCat("10.0.", i / 250, ".", i % 250), kUser, now);
  }
  EXPECT_LE(t.tracked(), 4u);
  EXPECT_GT(t.Wait("10.9.9.9", kUser, now), absl::ZeroDuration());
}

TEST(AuthThrottleTest, RefusalsAreLoggedAtABoundedRate) {
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "auth_throttle_test",
      std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  AuthThrottle t;  // one line at most every 10 s
  const absl::Time start = absl::FromUnixSeconds(1000);
  // 1000 guesses from two peers over 25 s.
  for (int i = 0; i < 1000; ++i) {
    const absl::Time now = start + i * absl::Milliseconds(25);
    const std::string peer = i % 2 ? "10.0.0.1" : "10.0.0.2";
    t.Check(
         peer, kUser, true,
         [] { return absl::UnauthenticatedError("invalid token"); }, now)
        .IgnoreError();
  }
  spdlog::set_default_logger(previous);
  const std::string text = log.str();
  int lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_EQ(lines, 3) << text;  // at 0 s, 10 s and 20 s
  EXPECT_TRUE(absl::StrContains(text, "10.0.0.1, 10.0.0.2")) << text;
  EXPECT_TRUE(absl::StrContains(text, "refused unchecked while throttled"))
      << text;
}

TEST(AuthThrottleTest, PeersAreCountedByAddressAndIpv6By64) {
  EXPECT_EQ(PeerKey("10.0.0.5"), "10.0.0.5");
  EXPECT_EQ(PeerKey("::ffff:10.0.0.5"), "10.0.0.5");
  EXPECT_EQ(PeerKey("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
  EXPECT_EQ(PeerKey("2001:db8:1:2:ffff::1"), "2001:db8:1:2::/64");
  EXPECT_EQ(PeerKey("::1"), "::1");
  EXPECT_EQ(PeerKeyOfGrpcPeer("ipv4:10.0.0.5:4242"), "10.0.0.5");
  EXPECT_EQ(PeerKeyOfGrpcPeer("ipv6:[::1]:4242"), "::1");
  EXPECT_EQ(PeerKeyOfGrpcPeer("ipv6:%5B::ffff:127.0.0.1%5D:80"), "127.0.0.1");
  EXPECT_EQ(PeerKeyOfGrpcPeer("ipv6:[2001:db8:1:2::9]:80"),
            "2001:db8:1:2::/64");
  EXPECT_EQ(PeerKeyOfGrpcPeer("unix:/run/ptcoord.sock"),
            "unix:/run/ptcoord.sock");
}

}  // namespace
}  // namespace ptrain
