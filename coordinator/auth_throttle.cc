// See auth_throttle.h.
#include "coordinator/auth_throttle.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace {

// Addresses a log line names; more are counted as "and more".
constexpr size_t kLoggedPeers = 8;

const char* KindName(CredentialKind kind) {
  switch (kind) {
    case CredentialKind::kUser:
      return "user token";
    case CredentialKind::kRank:
      return "rank (attempt) token";
    case CredentialKind::kNode:
      return "join token";
  }
  return "token";
}

std::string BucketKey(absl::string_view peer, CredentialKind kind) {
  return absl::StrCat(static_cast<int>(kind), " ", peer);
}

}  // namespace

std::string PeerKey(absl::string_view ip) {
  const std::string s(ip);
  in_addr v4{};
  if (inet_pton(AF_INET, s.c_str(), &v4) == 1) return s;
  in6_addr v6{};
  if (inet_pton(AF_INET6, s.c_str(), &v6) != 1) return s;
  char text[INET6_ADDRSTRLEN] = {};
  if (IN6_IS_ADDR_V4MAPPED(&v6)) {
    std::memcpy(&v4, &v6.s6_addr[12], sizeof(v4));
    inet_ntop(AF_INET, &v4, text, sizeof(text));
    return text;
  }
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return "::1";
  std::memset(&v6.s6_addr[8], 0, 8);
  inet_ntop(AF_INET6, &v6, text, sizeof(text));
  return absl::StrCat(text, "/64");
}

std::string PeerKeyOfGrpcPeer(absl::string_view peer) {
  absl::string_view address = peer;
  if (absl::ConsumePrefix(&address, "ipv4:")) {
    return PeerKey(address.substr(0, address.rfind(':')));
  }
  if (absl::ConsumePrefix(&address, "ipv6:")) {
    address = address.substr(0, address.rfind(':'));
    // "[::1]", or percent-encoded as a URI: "%5B::1%5D".
    if (!absl::ConsumePrefix(&address, "[")) {
      absl::ConsumePrefix(&address, "%5B");
    }
    if (!absl::ConsumeSuffix(&address, "]")) {
      absl::ConsumeSuffix(&address, "%5D");
    }
    // A zone ("fe80::1%eth0") is not part of the address.
    return PeerKey(address.substr(0, address.find('%')));
  }
  return std::string(peer);
}

AuthThrottle::AuthThrottle(Options options) : options_(std::move(options)) {}

const AuthThrottle::Policy& AuthThrottle::PolicyOf(CredentialKind kind) const {
  switch (kind) {
    case CredentialKind::kRank:
      return options_.rank;
    case CredentialKind::kNode:
      return options_.node;
    case CredentialKind::kUser:
      break;
  }
  return options_.user;
}

void AuthThrottle::Refill(Bucket& b, CredentialKind kind,
                          absl::Time now) const {
  const Policy& p = PolicyOf(kind);
  if (now > b.updated) {
    b.tokens = std::min(
        p.burst, b.tokens + absl::FDivDuration(now - b.updated, p.refill));
    b.updated = now;
  }
}

absl::Duration AuthThrottle::Wait(absl::string_view peer, CredentialKind kind,
                                  absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = buckets_.find(BucketKey(peer, kind));
  if (it == buckets_.end()) return absl::ZeroDuration();
  Refill(it->second, kind, now);
  if (it->second.tokens >= PolicyOf(kind).burst) {
    buckets_.erase(it);  // forgiven: the peer takes no more room
    return absl::ZeroDuration();
  }
  if (it->second.tokens >= 1) return absl::ZeroDuration();
  const absl::Duration wait = (1 - it->second.tokens) * PolicyOf(kind).refill;
  NoteLocked(peer, /*refused=*/false, now);
  return wait;
}

void AuthThrottle::Failed(absl::string_view peer, CredentialKind kind,
                          absl::Time now) {
  absl::MutexLock lock(&mu_);
  const std::string key = BucketKey(peer, kind);
  auto it = buckets_.find(key);
  if (it == buckets_.end()) {
    if (buckets_.size() >= options_.max_peers) {
      // Forget the peer closest to being forgiven, so that a flood of new
      // addresses cannot reset the count of a peer that is guessing hard.
      auto victim = buckets_.end();
      double best = -1e300;
      for (auto b = buckets_.begin(); b != buckets_.end(); ++b) {
        Bucket projected = b->second;
        Refill(projected, projected.kind, now);
        const double forgiven =
            projected.tokens / PolicyOf(projected.kind).burst;
        if (forgiven > best) {
          best = forgiven;
          victim = b;
        }
      }
      if (victim != buckets_.end()) buckets_.erase(victim);
    }
    it = buckets_.emplace(key, Bucket{PolicyOf(kind).burst, now, kind}).first;
  }
  Refill(it->second, kind, now);
  // Concurrent checks may all pass Wait(); the debt stays bounded.
  it->second.tokens = std::max(it->second.tokens - 1, -PolicyOf(kind).burst);
  NoteLocked(peer, /*refused=*/true, now);
}

absl::Status AuthThrottle::Check(absl::string_view peer, CredentialKind kind,
                                 bool presented,
                                 absl::FunctionRef<absl::Status()> check,
                                 absl::Time now) {
  if (const absl::Duration wait = Wait(peer, kind, now);
      wait > absl::ZeroDuration()) {
    return Throttled(peer, kind, wait);
  }
  absl::Status s = check();
  if (presented && s.code() == absl::StatusCode::kUnauthenticated) {
    Failed(peer, kind, now);
  }
  return s;
}

absl::Status AuthThrottle::Throttled(absl::string_view peer,
                                     CredentialKind kind, absl::Duration wait) {
  const int64_t seconds = std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(wait))));
  return absl::ResourceExhaustedError(absl::StrCat(
      "too many refused ", KindName(kind), "s from ", peer,
      ": ptcoord checks none from there for ", seconds,
      " s (failed authentication is throttled); retry then with the right "
      "token"));
}

size_t AuthThrottle::tracked() const {
  absl::MutexLock lock(&mu_);
  return buckets_.size();
}

void AuthThrottle::NoteLocked(absl::string_view peer, bool refused,
                              absl::Time now) {
  (refused ? refused_ : throttled_) += 1;
  if (peers_seen_.size() < kLoggedPeers) {
    peers_seen_.insert(std::string(peer));
  } else if (!peers_seen_.contains(peer)) {
    more_peers_ = true;
  }
  if (now - last_log_ < options_.log_every) return;
  std::vector<std::string> peers(peers_seen_.begin(), peers_seen_.end());
  std::sort(peers.begin(), peers.end());
  const std::string since =
      last_log_ == absl::InfinitePast()
          ? ""
          : absl::StrCat(
                " in the last ",
                static_cast<int64_t>(absl::ToDoubleSeconds(now - last_log_)),
                " s");
  spdlog::warn(
      "authentication: {} credential(s) refused and {} attempt(s) refused "
      "unchecked while throttled{}, from {}{}",
      refused_, throttled_, since, absl::StrJoin(peers, ", "),
      more_peers_ ? " and more" : "");
  last_log_ = now;
  refused_ = throttled_ = 0;
  peers_seen_.clear();
  more_peers_ = false;
}

}  // namespace ptrain
