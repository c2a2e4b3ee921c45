// See bounded_http.h. The loop thread owns every connection except while a
// worker serves it; connections pass between them through mu_.
#include "coordinator/bounded_http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/thread_entry.h"
#include "coordinator/auth_throttle.h"
#include "spdlog/spdlog.h"

namespace ptrain {

namespace {

using ReadEnd = BoundedHttpServer::ReadEnd;

thread_local ReadEnd this_thread_read_end = ReadEnd::kNone;

constexpr ssize_t kWouldBlock = -1;
constexpr ssize_t kError = -2;

const char* StatusText(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
  }
  return "Error";
}

// A refusal the loop writes itself, before any handler has seen the
// request.
std::string Canned(int status, absl::string_view why) {
  return absl::StrCat("HTTP/1.1 ", status, " ", StatusText(status),
                      "\r\nContent-Type: text/plain; charset=utf-8\r\n"
                      "Content-Length: ",
                      why.size() + 1,
                      "\r\nConnection: close\r\nCache-Control: no-store\r\n"
                      "X-Content-Type-Options: nosniff\r\n\r\n",
                      why, "\n");
}

int64_t CeilMs(absl::Duration d) {
  return std::max<int64_t>(
      0, absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1))));
}

void AddressOf(const sockaddr_storage& a, std::string* ip, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    *port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    *port = ntohs(v6->sin6_port);
  }
  *ip = text;
}

// Writes to a peer that has gone raise SIGPIPE in the writing thread
// (OpenSSL writes with write(2)); blocked here, they fail with EPIPE.
void BlockSigpipe() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

// What the bytes a connection sent so far say of its request.
struct Scan {
  enum What { kMore, kRefuse, kReady } what = kMore;
  int status = 0;
  std::string why;
  size_t want = 0;  // kReady: the bytes to have before a worker takes it
};

bool AllDigits(absl::string_view s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
}

// Looks for the end of the header block in `in`, from `*scanned` on. The
// header lines are only looked at, not judged (cpp-httplib's parser and
// the handlers judge them): Content-Length decides how much body to read
// before a worker takes the request. Range and If-Range lines are dropped:
// the UI serves no partial content, and cpp-httplib 0.11.4 builds every
// range of a multi-range request into one answer in memory.
Scan ScanRequest(std::string& in, size_t* scanned,
                 const BoundedHttpServer::Limits& limits) {
  const size_t end = in.find("\r\n\r\n", *scanned);
  if (end == std::string::npos) {
    *scanned = in.size() < 3 ? 0 : in.size() - 3;
    if (in.size() > limits.max_header_bytes) {
      return {Scan::kRefuse, 431,
              absl::StrCat("the request line and headers are larger than ",
                           limits.max_header_bytes, " bytes")};
    }
    return {};
  }
  size_t header_end = end + 4;
  if (header_end > limits.max_header_bytes) {
    return {Scan::kRefuse, 431,
            absl::StrCat("the request line and headers are larger than ",
                         limits.max_header_bytes, " bytes")};
  }
  int lengths = 0;
  bool length_ok = false, transfer_encoding = false;
  uint64_t length = 0;
  // Lines end at '\n', as cpp-httplib reads them (it skips a line without
  // its '\r' but reads the next one).
  const size_t request_line_end = in.find('\n');
  for (size_t line = request_line_end + 1; line < header_end;) {
    const size_t next = in.find('\n', line) + 1;
    absl::string_view text(in.data() + line, next - 1 - line);
    absl::ConsumeSuffix(&text, "\r");
    const size_t colon = text.find(':');
    const absl::string_view name = text.substr(0, colon);
    if (absl::EqualsIgnoreCase(name, "range") ||
        absl::EqualsIgnoreCase(name, "if-range")) {
      in.erase(line, next - line);
      header_end -= next - line;
      continue;
    }
    if (absl::EqualsIgnoreCase(name, "content-length")) {
      const absl::string_view value =
          colon == absl::string_view::npos
              ? absl::string_view()
              : absl::StripAsciiWhitespace(text.substr(colon + 1));
      ++lengths;
      length_ok = AllDigits(value);
      if (length_ok) length = std::stoull(std::string(value));
    }
    if (absl::EqualsIgnoreCase(name, "transfer-encoding")) {
      transfer_encoding = true;
    }
    line = next;
  }
  Scan s;
  s.what = Scan::kReady;
  s.want = header_end;
  if (!transfer_encoding && lengths == 1 && length_ok &&
      length <= limits.max_prefetched_body_bytes) {
    s.want += length;
  }
  return s;
}

}  // namespace

struct BoundedHttpServer::Conn {
  enum State { kHandshake, kHeaders, kWaiting, kWorking, kWriting, kLinger };
  int fd = -1;
  SSL* ssl = nullptr;
  bool memory = false;  // Exchange(): no socket behind it
  std::string peer;     // PeerKey(ip)
  std::string ip, local_ip;
  int port = 0, local_port = 0;
  State state = kHeaders;
  absl::Time deadline;    // of the current state
  short events = POLLIN;  // what the current state waits for
  std::string in;         // what the client sent, as far as read
  size_t scanned = 0;     // `in` holds no header block end before this
  size_t want = 0;        // 0 until the header block ended
  std::string out;        // a refusal being written; Exchange's answer
  size_t sent = 0;
  size_t drained = 0;  // bytes dropped while lingering
  std::list<std::unique_ptr<Conn>>::iterator self;
};

// A request's connection as cpp-httplib reads and writes it: first the
// bytes the loop buffered, then the socket (or TLS), each wait bounded by
// the request's deadline and the server's stop, and never more than
// max_request_bytes in all.
class BoundedHttpServer::ConnStream final : public httplib::Stream {
 public:
  ConnStream(Conn& c, size_t cap, int stop_fd, absl::Time deadline)
      : c_(c), cap_(cap), stop_fd_(stop_fd), deadline_(deadline) {}

  bool is_readable() const override { return true; }
  bool is_writable() const override { return true; }

  ssize_t read(char* ptr, size_t size) override {
    if (total_ >= cap_) {
      this_thread_read_end = ReadEnd::kTooLarge;
      return -1;
    }
    size = std::min(size, cap_ - total_);
    if (pos_ < c_.in.size()) {
      const size_t n = std::min(size, c_.in.size() - pos_);
      std::memcpy(ptr, c_.in.data() + pos_, n);
      pos_ += n;
      total_ += n;
      return static_cast<ssize_t>(n);
    }
    if (c_.memory) return 0;  // the client closed its side
    for (;;) {
      short want = POLLIN;
      if (c_.ssl != nullptr) {
        ERR_clear_error();
        const int n = SSL_read(
            c_.ssl, ptr, static_cast<int>(std::min<size_t>(size, INT_MAX)));
        if (n > 0) {
          total_ += static_cast<size_t>(n);
          return n;
        }
        const int e = SSL_get_error(c_.ssl, n);
        if (e == SSL_ERROR_ZERO_RETURN) return 0;
        if (e == SSL_ERROR_WANT_WRITE) {
          want = POLLOUT;
        } else if (e != SSL_ERROR_WANT_READ) {
          return -1;
        }
      } else {
        const ssize_t n = ::recv(c_.fd, ptr, size, 0);
        if (n >= 0) {
          total_ += static_cast<size_t>(n);
          return n;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      }
      if (!WaitFor(want)) return -1;
    }
  }

  // Writes all of it or fails: cpp-httplib sends some lines with one
  // write() and does not look at a short count.
  ssize_t write(const char* ptr, size_t size) override {
    if (c_.memory) {
      c_.out.append(ptr, size);
      return static_cast<ssize_t>(size);
    }
    size_t done = 0;
    while (done < size) {
      short want = POLLOUT;
      if (c_.ssl != nullptr) {
        ERR_clear_error();
        const int n =
            SSL_write(c_.ssl, ptr + done,
                      static_cast<int>(std::min<size_t>(size - done, INT_MAX)));
        if (n > 0) {
          done += static_cast<size_t>(n);
          continue;
        }
        const int e = SSL_get_error(c_.ssl, n);
        if (e == SSL_ERROR_WANT_READ) {
          want = POLLIN;
        } else if (e != SSL_ERROR_WANT_WRITE) {
          return -1;
        }
      } else {
        const ssize_t n = ::send(c_.fd, ptr + done, size - done, MSG_NOSIGNAL);
        if (n >= 0) {
          done += static_cast<size_t>(n);
          continue;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      }
      if (!WaitFor(want)) return -1;
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.ip;
    port = c_.port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.local_ip;
    port = c_.local_port;
  }
  // cpp-httplib asks only to refuse a descriptor beyond select()'s
  // FD_SETSIZE; this stream waits with poll(), so none is beyond it.
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  bool WaitFor(short events) {
    const absl::Time now = absl::Now();
    if (now >= deadline_) {
      this_thread_read_end = ReadEnd::kTimedOut;
      return false;
    }
    pollfd fds[2] = {{c_.fd, events, 0}, {stop_fd_, POLLIN, 0}};
    const int n = ::poll(
        fds, 2,
        static_cast<int>(std::min<int64_t>(CeilMs(deadline_ - now), INT_MAX)));
    if (n < 0) return errno == EINTR;
    if (fds[1].revents != 0) return false;  // stopping
    if (n == 0) {
      this_thread_read_end = ReadEnd::kTimedOut;
      return false;
    }
    return true;
  }

  Conn& c_;
  const size_t cap_;
  const int stop_fd_;
  const absl::Time deadline_;
  size_t pos_ = 0;    // of c_.in replayed
  size_t total_ = 0;  // bytes given to cpp-httplib
};

BoundedHttpServer::BoundedHttpServer(Limits limits)
    : limits_(std::move(limits)) {}

BoundedHttpServer::~BoundedHttpServer() { Stop(); }

BoundedHttpServer::ReadEnd BoundedHttpServer::ReadEndOfThisThread() {
  return this_thread_read_end;
}

absl::Status BoundedHttpServer::UseTls(const std::string& pem_path) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  const bool ok =
      ctx != nullptr &&
      SSL_CTX_use_certificate_chain_file(ctx, pem_path.c_str()) == 1 &&
      SSL_CTX_use_PrivateKey_file(ctx, pem_path.c_str(), SSL_FILETYPE_PEM) ==
          1 &&
      SSL_CTX_check_private_key(ctx) == 1 &&
      SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) == 1;
  ERR_clear_error();
  if (!ok) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(
        absl::StrCat(pem_path, ": the certificate and key do not load"));
  }
  // Writes resume where a partial one stopped; a client cannot make the
  // server renegotiate (a TLS 1.2 handshake's cost, on demand).
  SSL_CTX_set_mode(
      ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_free(tls_);
  tls_ = ctx;
  return absl::OkStatus();
}

absl::StatusOr<int> BoundedHttpServer::Listen(const std::string& host,
                                              int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int e = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                                service.c_str(), &hints, &found);
      e != 0) {
    return absl::UnavailableError(gai_strerror(e));
  }
  int error = 0;
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family,
                            a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = errno;
      continue;
    }
    // SO_REUSEADDR only: SO_REUSEPORT would let two servers share a port,
    // where one in use must be refused.
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      error = errno;
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) return absl::UnavailableError(std::strerror(error));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  std::string ip;
  int bound_port = 0;
  AddressOf(bound, &ip, &bound_port);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  idle_workers_ = limits_.workers;
  for (int i = 0; i < limits_.workers; ++i) {
    workers_.emplace_back(ThreadEntry("ui-worker", [this] { Work(); }));
  }
  loop_ = std::thread(ThreadEntry("ui-listener", [this] { Loop(); }));
  return bound_port;
}

void BoundedHttpServer::Stop() {
  if (stopping_.exchange(true)) return;
  const uint64_t one = 1;
  if (stop_fd_ >= 0) ::write(stop_fd_, &one, sizeof(one));
  if (wake_fd_ >= 0) ::write(wake_fd_, &one, sizeof(one));
  {
    std::lock_guard<std::mutex> lock(mu_);
    work_cv_.notify_all();
  }
  if (loop_.joinable()) loop_.join();
  for (std::thread& w : workers_) w.join();
  workers_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    work_.clear();
    done_.clear();
  }
  while (!conns_.empty()) Close(conns_.front().get());
  for (int* fd : {&listen_fd_, &wake_fd_, &stop_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  SSL_CTX_free(tls_);
  tls_ = nullptr;
}

void BoundedHttpServer::Loop() {
  BlockSigpipe();
  std::vector<pollfd> fds;
  std::vector<Conn*> polled;
  while (!stopping_) {
    absl::Time now = absl::Now();
    TakeBack(now);
    for (auto it = conns_.begin(); it != conns_.end();) {
      Conn* c = (it++)->get();
      if (c->state == Conn::kWorking || now < c->deadline) continue;
      switch (c->state) {
        case Conn::kHeaders:
          Refuse(*c, 408,
                 absl::StrCat("the request's headers did not arrive within ",
                              absl::FormatDuration(limits_.header_timeout)),
                 now);
          break;
        case Conn::kWaiting:
          Refuse(*c, 503,
                 "ptcoord's web UI is busy with other requests; try again",
                 now);
          break;
        default:  // a handshake, a refusal or a linger that took too long
          Close(c);
      }
    }
    Dispatch(now);
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    const bool accepting = now >= accept_paused_until_;
    if (accepting) fds.push_back({listen_fd_, POLLIN, 0});
    absl::Time next = accepting ? now + absl::Seconds(1) : accept_paused_until_;
    for (const std::unique_ptr<Conn>& c : conns_) {
      if (c->state == Conn::kWorking) continue;
      next = std::min(next, c->deadline);
      if (c->state == Conn::kWaiting) continue;  // not read until served
      fds.push_back({c->fd, c->events, 0});
      polled.push_back(c.get());
    }
    const int n = ::poll(
        fds.data(), fds.size(),
        static_cast<int>(std::min<int64_t>(CeilMs(next - absl::Now()), 1000)));
    if (n < 0) continue;  // EINTR
    now = absl::Now();
    if (fds[0].revents != 0) {
      uint64_t count;
      while (::read(wake_fd_, &count, sizeof(count)) > 0) {
      }
    }
    const size_t first = accepting ? 2 : 1;
    // Each step may close its own connection only; accepting may close
    // others (evictions), so it comes last.
    for (size_t i = 0; i < polled.size(); ++i) {
      if (fds[first + i].revents != 0) Advance(*polled[i], now);
    }
    if (accepting && fds[1].revents != 0) Accept(now);
  }
}

void BoundedHttpServer::Accept(absl::Time now) {
  for (int i = 0; i < 64; ++i) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr),
                             &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        // Out of descriptors: the connection waits in the backlog.
        accept_paused_until_ = now + absl::Milliseconds(100);
      }
      return;
    }
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    AddressOf(addr, &c->ip, &c->port);
    c->peer = PeerKey(c->ip);
    sockaddr_storage local{};
    len = sizeof(local);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
    AddressOf(local, &c->local_ip, &c->local_port);
    bool room = true;
    if (static_cast<int>(conns_.size()) >= limits_.max_connections) {
      Conn* victim = Evictable("");
      if (victim != nullptr) {
        Close(victim);
      } else {
        room = false;
      }
    }
    if (room && peers_.contains(c->peer) &&
        peers_[c->peer].connections >= limits_.max_connections_per_peer) {
      Conn* victim = Evictable(c->peer);
      if (victim != nullptr) {
        Close(victim);
      } else {
        room = false;
      }
    }
    if (!room) {
      // Refused at once; a TLS client cannot read a plain answer.
      if (tls_ == nullptr) {
        const std::string busy = Canned(
            503, absl::StrCat("too many connections to ptcoord's web UI (",
                              limits_.max_connections, " in all, ",
                              limits_.max_connections_per_peer,
                              " from one address); try again"));
        ::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      ::close(fd);
      continue;
    }
    c->deadline = now + limits_.header_timeout;
    if (tls_ != nullptr) {
      c->ssl = SSL_new(tls_);
      if (c->ssl == nullptr || SSL_set_fd(c->ssl, fd) != 1) {
        SSL_free(c->ssl);
        ::close(fd);
        continue;
      }
      SSL_set_accept_state(c->ssl);
      c->state = Conn::kHandshake;
    }
    ++peers_[c->peer].connections;
    ++open_;
    conns_.push_back(std::move(c));
    conns_.back()->self = std::prev(conns_.end());
  }
}

BoundedHttpServer::Conn* BoundedHttpServer::Evictable(const std::string& peer) {
  // A lingering connection has had its answer; then the oldest of those
  // still sending headers (a client that is not slow sends them at once).
  for (const Conn::State wanted : {Conn::kLinger, Conn::kHeaders}) {
    for (const std::unique_ptr<Conn>& c : conns_) {
      const bool match =
          c->state == wanted ||
          (wanted == Conn::kHeaders && c->state == Conn::kHandshake) ||
          (wanted == Conn::kLinger && c->state == Conn::kWriting);
      if (match && (peer.empty() || c->peer == peer)) return c.get();
    }
  }
  return nullptr;
}

void BoundedHttpServer::Close(Conn* c) {
  auto p = peers_.find(c->peer);
  if (p != peers_.end() && --p->second.connections <= 0) peers_.erase(p);
  if (c->ssl != nullptr) SSL_free(c->ssl);
  if (c->fd >= 0) ::close(c->fd);
  --open_;
  conns_.erase(c->self);
}

ssize_t BoundedHttpServer::ReadSome(Conn& c, char* buf, size_t size) {
  if (c.ssl != nullptr) {
    ERR_clear_error();
    const int n = SSL_read(c.ssl, buf, static_cast<int>(size));
    if (n > 0) return n;
    const int e = SSL_get_error(c.ssl, n);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      c.events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
      return kWouldBlock;
    }
    return e == SSL_ERROR_ZERO_RETURN ? 0 : kError;
  }
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, size, 0);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      c.events = POLLIN;
      return kWouldBlock;
    }
    return kError;
  }
}

bool BoundedHttpServer::Handshake(Conn& c) {
  ERR_clear_error();
  const int r = SSL_do_handshake(c.ssl);
  if (r != 1) {
    const int e = SSL_get_error(c.ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      c.events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
    } else {
      Close(&c);
    }
    return false;
  }
  c.state = Conn::kHeaders;
  c.events = POLLIN;
  return true;
}

void BoundedHttpServer::ReadRequest(Conn& c, absl::Time now) {
  char buf[16 << 10];
  for (;;) {
    const size_t limit = c.want != 0 ? c.want : limits_.max_header_bytes + 1;
    if (c.in.size() >= limit) break;
    const ssize_t n =
        ReadSome(c, buf, std::min(sizeof(buf), limit - c.in.size()));
    if (n == kWouldBlock) break;
    if (n <= 0) {
      if (n == 0 && !c.in.empty()) {
        Refuse(c, 400,
               c.want == 0 ? "the request ended before its headers"
                           : "the request ended before its body",
               now);
      } else {
        Close(&c);
      }
      return;
    }
    c.in.append(buf, static_cast<size_t>(n));
    if (c.want == 0) {
      Scan s = ScanRequest(c.in, &c.scanned, limits_);
      if (s.what == Scan::kRefuse) {
        Refuse(c, s.status, s.why, now);
        return;
      }
      if (s.what == Scan::kReady) c.want = s.want;
    }
  }
  if (c.want != 0 && c.in.size() >= c.want) {
    c.state = Conn::kWaiting;
    c.deadline = now + limits_.request_timeout;
  }
}

void BoundedHttpServer::WriteAnswer(Conn& c, absl::Time now) {
  while (c.sent < c.out.size()) {
    ssize_t n;
    if (c.ssl != nullptr) {
      ERR_clear_error();
      n = SSL_write(c.ssl, c.out.data() + c.sent,
                    static_cast<int>(c.out.size() - c.sent));
      if (n <= 0) {
        const int e = SSL_get_error(c.ssl, static_cast<int>(n));
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
          c.events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
          return;
        }
        Close(&c);
        return;
      }
    } else {
      n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent,
                 MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
          c.events = POLLOUT;
          return;
        }
        Close(&c);
        return;
      }
    }
    c.sent += static_cast<size_t>(n);
  }
  StartLinger(c, now);
}

void BoundedHttpServer::Drain(Conn& c) {
  char buf[16 << 10];
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0 ||
        (c.drained += static_cast<size_t>(n)) >= limits_.linger_bytes) {
      Close(&c);
      return;
    }
  }
}

void BoundedHttpServer::Advance(Conn& c, absl::Time now) {
  switch (c.state) {
    case Conn::kHandshake:
      if (!Handshake(c)) return;
      [[fallthrough]];  // data may have come with the handshake
    case Conn::kHeaders:
      ReadRequest(c, now);
      return;
    case Conn::kWriting:
      WriteAnswer(c, now);
      return;
    case Conn::kLinger:
      Drain(c);
      return;
    case Conn::kWaiting:
    case Conn::kWorking:
      return;
  }
}

void BoundedHttpServer::Refuse(Conn& c, int status, absl::string_view why,
                               absl::Time now) {
  if (c.state == Conn::kHandshake) {
    Close(&c);  // no TLS session to answer in
    return;
  }
  c.out = Canned(status, why);
  c.sent = 0;
  c.state = Conn::kWriting;
  c.events = POLLOUT;
  c.deadline = now + limits_.linger;
  Advance(c, now);
}

void BoundedHttpServer::StartLinger(Conn& c, absl::Time now) {
  if (c.ssl != nullptr) {
    ERR_clear_error();
    SSL_shutdown(c.ssl);  // close_notify, if it fits now
  }
  ::shutdown(c.fd, SHUT_WR);
  c.state = Conn::kLinger;
  c.events = POLLIN;
  c.deadline = now + limits_.linger;
  c.drained = 0;
  Advance(c, now);
}

void BoundedHttpServer::Dispatch(absl::Time now) {
  for (const std::unique_ptr<Conn>& c : conns_) {
    if (idle_workers_ == 0) return;
    if (c->state != Conn::kWaiting) continue;
    Peer& p = peers_[c->peer];
    if (p.working >= limits_.max_working_per_peer) continue;
    ++p.working;
    --idle_workers_;
    c->state = Conn::kWorking;
    {
      std::lock_guard<std::mutex> lock(mu_);
      work_.push_back(c.get());
    }
    work_cv_.notify_one();
  }
}

void BoundedHttpServer::TakeBack(absl::Time now) {
  std::vector<Conn*> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done.swap(done_);
  }
  for (Conn* c : done) {
    --peers_[c->peer].working;
    ++idle_workers_;
    StartLinger(*c, now);
  }
}

void BoundedHttpServer::Work() {
  BlockSigpipe();
  for (;;) {
    Conn* c = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this] { return stopping_ || !work_.empty(); });
      if (work_.empty()) return;
      c = work_.front();
      work_.pop_front();
    }
    Serve(*c);
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(c);
    }
    const uint64_t one = 1;
    ::write(wake_fd_, &one, sizeof(one));
  }
}

void BoundedHttpServer::Serve(Conn& c) {
  ConnStream stream(c, limits_.max_request_bytes, stop_fd_, c.deadline);
  this_thread_read_end = ReadEnd::kNone;
  bool closed = true;
  process_request(stream, /*close_connection=*/true, closed, nullptr);
  this_thread_read_end = ReadEnd::kNone;
}

std::string BoundedHttpServer::Exchange(std::string_view bytes,
                                        const std::string& peer_ip) {
  Conn c;
  c.memory = true;
  c.ip = peer_ip;
  c.peer = PeerKey(peer_ip);
  c.port = 40000;
  c.local_ip = "127.0.0.1";
  c.in.assign(bytes.data(), bytes.size());
  Scan s = ScanRequest(c.in, &c.scanned, limits_);
  if (s.what == Scan::kRefuse) return Canned(s.status, s.why);
  if (s.what == Scan::kMore) {
    return c.in.empty() ? ""
                        : Canned(400, "the request ended before its headers");
  }
  if (c.in.size() < s.want)
    return Canned(400, "the request ended before its body");
  c.deadline = absl::Now() + limits_.request_timeout;
  Serve(c);
  return c.out;
}

}  // namespace ptrain
