// ptcoord's throttle on failed authentication: every server of a
// coordinator (gRPC's JobService, RankService and NodeService, the web UI)
// counts the credentials it refuses per peer address, and a peer that
// refused too often has nothing checked for a while, a correct token
// included (else the throttle would not slow a guesser). Refusals are
// logged at a bounded rate, never a line per guess. Not the checks
// themselves (auth.h, common/auth_token.h), not connection limits (the UI's
// bounded_http.h).
#ifndef PTRAIN_COORDINATOR_AUTH_THROTTLE_H_
#define PTRAIN_COORDINATOR_AUTH_THROTTLE_H_

#include <cstddef>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ptrain {

// What a credential opens: the job API and the UI (user tokens), a running
// attempt's reports (rank tokens), NodeService (join tokens).
enum class CredentialKind { kUser, kRank, kNode };

// The key peers are counted by: an IPv4 address as written; an IPv6 address
// by its /64 prefix ("2001:db8:1:2::/64"), since one host commonly holds a
// whole /64; an IPv4-mapped IPv6 address as its IPv4 address. Anything that
// is not an IP address is kept as given.
std::string PeerKey(absl::string_view ip);

// The PeerKey of gRPC's ServerContext::peer() ("ipv4:10.0.0.5:4242",
// "ipv6:[::1]:4242" or "ipv6:%5B::1%5D:4242", "unix:/path"; a unix socket
// is one peer).
std::string PeerKeyOfGrpcPeer(absl::string_view peer);

class AuthThrottle {
 public:
  // A token bucket of failures per peer and kind: `burst` refusals at once,
  // then one more each `refill`.
  struct Policy {
    double burst = 20;
    absl::Duration refill = absl::Seconds(3);
  };
  struct Options {
    // User and join tokens may be short enough to guess (a token file is
    // whatever its operator wrote): 20 refusals, then one every 3 s.
    Policy user;
    Policy node;
    // Rank tokens are 256 random bits, so no rate is a risk; ranks of an
    // attempt that just ended may still report with its token for a while,
    // and must not lock out the next attempt's ranks on the same host.
    Policy rank{200, absl::Milliseconds(50)};
    // Peers with refusals tracked at once; beyond it the one closest to
    // being forgiven is forgotten. Peers without refusals take no room.
    size_t max_peers = 4096;
    // At most one log line this often (the first refusal after a quiet
    // period is logged at once).
    absl::Duration log_every = absl::Seconds(10);
  };

  AuthThrottle() : AuthThrottle(Options()) {}
  explicit AuthThrottle(Options options);
  AuthThrottle(const AuthThrottle&) = delete;
  AuthThrottle& operator=(const AuthThrottle&) = delete;

  // How long `peer` waits before a credential of `kind` from it is checked
  // again: zero when it may try now. A throttled attempt counts towards the
  // log line.
  absl::Duration Wait(absl::string_view peer, CredentialKind kind,
                      absl::Time now);
  // One credential of `kind` from `peer` was refused.
  void Failed(absl::string_view peer, CredentialKind kind, absl::Time now);

  // The whole check: Throttled() while `peer` must wait; otherwise
  // `check()`, whose Unauthenticated counts against `peer` when a
  // credential was `presented` (a request with none is no guess).
  absl::Status Check(absl::string_view peer, CredentialKind kind,
                     bool presented, absl::FunctionRef<absl::Status()> check,
                     absl::Time now);

  // ResourceExhausted naming the peer, the kind and the wait (whole
  // seconds, rounded up).
  static absl::Status Throttled(absl::string_view peer, CredentialKind kind,
                                absl::Duration wait);

  // Peers (with their kind) tracked now.
  size_t tracked() const;

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time updated;
    CredentialKind kind = CredentialKind::kUser;
  };
  const Policy& PolicyOf(CredentialKind kind) const;
  // `b` refilled up to `now`.
  void Refill(Bucket& b, CredentialKind kind, absl::Time now) const;
  // Counts towards the next log line, and writes it when it is due.
  void NoteLocked(absl::string_view peer, bool refused, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  // Since the last log line.
  absl::Time last_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t throttled_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<std::string> peers_seen_ ABSL_GUARDED_BY(mu_);
  bool more_peers_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_AUTH_THROTTLE_H_
