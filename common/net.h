// Network addresses as ranks and nodes advertise them: which local address
// other machines can reach, and whether an advertised one resolves and
// answers. Not a socket library: name resolution, the kernel's routing
// decision and a TCP connect, no traffic.
#ifndef PTRAIN_COMMON_NET_H_
#define PTRAIN_COMMON_NET_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptrain {

// This machine's name (gethostname(2)); `fallback` when it has none to
// give.
std::string HostName(absl::string_view fallback = "localhost");

// Splits "host:port", "[v6]:port" into host (without brackets) and port.
// InvalidArgument when there is no port.
absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(
    absl::string_view host_port);

// "host:port", bracketing an IPv6 literal.
std::string JoinHostPort(absl::string_view host, absl::string_view port);

// The numeric address of this machine's interface that the kernel would use
// to reach `host_port` (a name or an address): a UDP socket is connected,
// which sends nothing, and asked for its local address. Unavailable when the
// host does not resolve or no route leads there.
absl::StatusOr<std::string> LocalAddressToward(absl::string_view host_port);

// Whether `host_port` resolves here: InvalidArgument saying why not (the
// resolver's words), else OK.
absl::Status CheckResolves(absl::string_view host_port);

// Whether a TCP connection to `host_port` opens within `timeout` (to any
// of its addresses; closed at once): InvalidArgument when it does not
// resolve, Unavailable with the system's words when none answers.
absl::Status CheckConnects(absl::string_view host_port, int timeout_ms);

// True for "", "0.0.0.0", "::" and "[::]": a bind address that says "every
// interface" and so names none that others could dial.
bool IsWildcardHost(absl::string_view host);

// The host under which a server bound to `bind` (host:port) is advertised:
// `explicit_host` when set; else the bind host when it names one interface;
// else the local address toward `peer` (host:port of whoever must reach
// us, e.g. the coordinator); else `fallback` (the node's name). Why each
// was chosen is not reported: the rule is documented in docs/metrics.md.
std::string AdvertiseHost(absl::string_view bind,
                          absl::string_view explicit_host,
                          absl::string_view peer, absl::string_view fallback);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_NET_H_
