// See net.h.
#include "common/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

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

absl::StatusOr<std::string> LocalAddressToward(absl::string_view host_port) {
  auto parts = SplitHostPort(host_port);
  if (!parts.ok()) return parts.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(parts->first.c_str(), parts->second.c_str(),
                                 &hints, &found);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", parts->first,
                                               "': ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
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
    if (ok) {
      freeaddrinfo(found);
      return std::string(text);
    }
  }
  freeaddrinfo(found);
  return absl::UnavailableError(
      absl::StrCat("no route to '", host_port, "': ", last_error));
}

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
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
