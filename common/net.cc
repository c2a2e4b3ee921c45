// See net.h.
#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace ptrain {

absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(
    absl::string_view host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == host_port.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", host_port, "' is not HOST:PORT"));
  }
  absl::string_view host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(std::string(host),
                        std::string(host_port.substr(colon + 1)));
}

std::string JoinHostPort(absl::string_view host, absl::string_view port) {
  if (host.find(':') != absl::string_view::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

namespace {

struct AddrinfoFree {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using Addresses = std::unique_ptr<addrinfo, AddrinfoFree>;

absl::StatusOr<Addresses> Resolve(absl::string_view host_port, int socktype) {
  auto parts = SplitHostPort(host_port);
  if (!parts.ok()) return parts.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(parts->first.c_str(), parts->second.c_str(),
                                 &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", parts->first, "' does not resolve: ", gai_strerror(rc)));
  }
  return Addresses(found);
}

// Connects `fd` (non-blocking) to `a` within `timeout_ms`: "" or why not.
std::string ConnectWithin(int fd, const addrinfo* a, int timeout_ms) {
  if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return "";
  if (errno != EINPROGRESS) return std::strerror(errno);
  pollfd p{fd, POLLOUT, 0};
  const int n = poll(&p, 1, timeout_ms);
  if (n == 0) return absl::StrCat("no answer within ", timeout_ms, " ms");
  if (n < 0) return std::strerror(errno);
  int error = 0;
  socklen_t len = sizeof(error);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) {
    return std::strerror(errno);
  }
  return error == 0 ? "" : std::strerror(error);
}

}  // namespace

absl::StatusOr<std::string> LocalAddressToward(absl::string_view host_port) {
  absl::StatusOr<Addresses> found = Resolve(host_port, SOCK_DGRAM);
  if (!found.ok()) return absl::UnavailableError(found.status().message());
  std::string last_error = "no address";
  for (const addrinfo* a = found->get(); a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char text[INET6_ADDRSTRLEN] = "";
    const bool ok =
        connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        getnameinfo(reinterpret_cast<sockaddr*>(&local), len, text,
                    sizeof(text), nullptr, 0, NI_NUMERICHOST) == 0;
    if (!ok) last_error = std::strerror(errno);
    close(fd);
    if (ok) return std::string(text);
  }
  return absl::UnavailableError(
      absl::StrCat("no route to '", host_port, "': ", last_error));
}

absl::Status CheckResolves(absl::string_view host_port) {
  absl::StatusOr<Addresses> found = Resolve(host_port, SOCK_STREAM);
  return found.ok() ? absl::OkStatus() : found.status();
}

absl::Status CheckConnects(absl::string_view host_port, int timeout_ms) {
  absl::StatusOr<Addresses> found = Resolve(host_port, SOCK_STREAM);
  if (!found.ok()) return found.status();
  std::string why = "no address";
  for (const addrinfo* a = found->get(); a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    why = ConnectWithin(fd, a, timeout_ms);
    close(fd);
    if (why.empty()) return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("cannot connect to ", host_port, ": ", why));
}

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

std::string HostName(absl::string_view fallback) {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') {
    return std::string(fallback);
  }
  return buf;
}

std::string AdvertiseHost(absl::string_view bind,
                          absl::string_view explicit_host,
                          absl::string_view peer, absl::string_view fallback) {
  if (!explicit_host.empty()) return std::string(explicit_host);
  auto parts = SplitHostPort(bind);
  if (parts.ok() && !IsWildcardHost(parts->first)) return parts->first;
  if (!peer.empty()) {
    auto local = LocalAddressToward(peer);
    if (local.ok()) return *local;
  }
  return std::string(fallback);
}

}  // namespace ptrain
