// A raw TCP client for the HTTP endpoints under test, and the requests a
// browser, a port scanner or a broken client sends them. Not an HTTP
// client: the bytes go out exactly as given, malformed ones included.
#ifndef PTRAIN_TESTS_TESTING_RAW_HTTP_H_
#define PTRAIN_TESTS_TESTING_RAW_HTTP_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace ptrain::testing {

// A TCP connection to 127.0.0.1:port from `from` (another loopback
// address, such as 127.0.0.2, is another peer to the server; "": the
// system's choice), whose reads and writes give up after `wait_s`. The
// descriptor, or -1.
inline int ConnectTo(int port, const std::string& from = "", int wait_s = 60) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (!from.empty()) {
    sockaddr_in source{};
    source.sin_family = AF_INET;
    if (inet_pton(AF_INET, from.c_str(), &source.sin_addr) != 1 ||
        bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof(source)) != 0) {
      close(fd);
      return -1;
    }
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const timeval wait{wait_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof(wait));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `bytes` to 127.0.0.1:port (from `from`, as ConnectTo). With
// `read_reply`, half-closes and returns everything the server sent until
// it closed ("" if it answered nothing); without, closes at once. A server
// that neither answers nor closes within `wait_s` (a minute) returns what
// came so far, so that a broken server fails the test instead of hanging
// it.
inline std::string SendRaw(int port, std::string_view bytes,
                           bool read_reply = true, const std::string& from = "",
                           int wait_s = 60) {
  const int fd = ConnectTo(port, from, wait_s);
  std::string out;
  if (fd >= 0) {
    // A server may close before reading all of a huge request.
    for (size_t sent = 0; sent < bytes.size();) {
      const ssize_t n =
          send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    if (read_reply) {
      shutdown(fd, SHUT_WR);
      char buf[4096];
      for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) {
        out.append(buf, static_cast<size_t>(n));
      }
    }
    close(fd);
  }
  return out;
}

// The status code of a reply ("HTTP/1.1 404 Not Found" -> 404); 0 when it
// does not start with a status line.
inline int HttpStatus(std::string_view reply) {
  if (reply.substr(0, 5) != "HTTP/") return 0;
  const size_t space = reply.find(' ');
  if (space == std::string_view::npos) return 0;
  return std::atoi(std::string(reply.substr(space + 1, 3)).c_str());
}

struct HostileRequest {
  std::string name, bytes;
  int want = 0;            // the status it must get; 0: any, or none
  bool read_reply = true;  // false: the client hangs up without reading
};

// Requests none of which may end a server, for one that serves GET
// `page`: paths it does not serve (want 404), malformed request lines and
// headers, garbage, a request cut off by its client.
inline std::vector<HostileRequest> HostileRequests(const std::string& page) {
  std::string garbage;
  for (int i = 0; i < 1024; ++i) garbage.push_back(static_cast<char>(i * 37));
  return {
      {"GET /", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 404},
      {"GET /nope", "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 404},
      {"GET page/", "GET " + page + "/ HTTP/1.1\r\n\r\n", 404},
      {"GET /..", "GET /../../etc/passwd HTTP/1.1\r\n\r\n", 404},
      {"HEAD /", "HEAD / HTTP/1.1\r\n\r\n", 404},
      {"HTTP/1.0 GET /", "GET / HTTP/1.0\r\n\r\n", 404},
      {"POST page",
       "POST " + page + " HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"},
      {"DELETE page", "DELETE " + page + " HTTP/1.1\r\n\r\n"},
      {"OPTIONS *", "OPTIONS * HTTP/1.1\r\n\r\n"},
      {"absolute URI", "GET http://elsewhere" + page + " HTTP/1.1\r\n\r\n"},
      {"no path", "GET HTTP/1.1\r\n\r\n"},
      {"unknown method", "BREW " + page + " HTTP/1.1\r\n\r\n"},
      {"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"},
      {"huge header", "GET " + page + " HTTP/1.1\r\nX-Big: " +
                          std::string(100000, 'a') + "\r\n\r\n"},
      {"many headers", "GET " + page + " HTTP/1.1\r\n" +
                           [] {
                             std::string h;
                             for (int i = 0; i < 2000; ++i)
                               h += "X-" + std::to_string(i) + ": y\r\n";
                             return h;
                           }() +
                           "\r\n"},
      {"header without colon", "GET " + page + " HTTP/1.1\r\nnocolon\r\n\r\n"},
      {"bare CRLF", "\r\n"},
      {"binary garbage", garbage},
      {"half request", "GET " + page.substr(0, 3)},
      {"half request, then hang up", "GET " + page.substr(0, 3), 0, false},
      {"nothing, then hang up", "", 0, false},
  };
}

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_TESTING_RAW_HTTP_H_
