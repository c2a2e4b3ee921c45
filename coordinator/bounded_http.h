// An HTTP/1.1 server (cpp-httplib's request parser and handler table) whose
// threads and memory no client can exhaust: ptcoord's web UI runs on it.
// One thread accepts connections and reads each request's header block
// without blocking, under one deadline for the whole block (a TLS handshake
// included) and a byte cap, while capping connections in all and per peer
// address; only a request whose headers are complete goes to the fixed pool
// of workers, at most a few a peer at once, and a worker reads the rest and
// answers under a deadline and a byte cap for the whole request. One
// request a connection. Not the handlers or what they accept (ui_server.cc).
//
// Why not cpp-httplib's own listener (0.11.4): it gives every accepted
// connection a worker until its request is read, with a timeout per read()
// rather than per request, an unbounded queue and no limit per client, so
// idle or slow clients hold every worker; and its body limit holds for
// Content-Length only. Server::process_request (protected) parses and
// dispatches one request from any httplib::Stream, so this class keeps the
// parser and handlers and replaces the I/O around them.
#ifndef PTRAIN_COORDINATOR_BOUNDED_HTTP_H_
#define PTRAIN_COORDINATOR_BOUNDED_HTTP_H_

#include <openssl/ssl.h>
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "httplib.h"

namespace ptrain {

class BoundedHttpServer : public httplib::Server {
 public:
  struct Limits {
    int workers = 16;
    // Open connections, in all and from one peer (PeerKey of
    // auth_throttle.h). At either cap a new connection takes the place of
    // the oldest one still sending its headers (of that peer, at the
    // per-peer cap), else it is refused at once with 503.
    int max_connections = 256;
    int max_connections_per_peer = 64;
    // Requests of one peer that workers serve at once; the peer's others
    // wait (the oldest first) so that one slow client never holds them all.
    int max_working_per_peer = 4;
    // The header block (request line and headers): larger is 431.
    size_t max_header_bytes = 16 << 10;
    // A body of at most this, announced by Content-Length, is read with
    // the headers, before a worker is given the request.
    size_t max_prefetched_body_bytes = 4096;
    // Everything a request may send (headers, body and its framing):
    // reading past it fails and ReadEndOfThisThread() says so.
    size_t max_request_bytes = 64 << 10;
    // From accept to the end of the header block (and a prefetched body):
    // then 408.
    absl::Duration header_timeout = absl::Seconds(10);
    // From then to the last byte of the answer, the wait for a worker
    // included (503 when none came).
    absl::Duration request_timeout = absl::Seconds(10);
    // After the answer, what the client still sends is read and dropped
    // for this long (at most linger_bytes), so that closing with unread
    // bytes does not reset the connection before the answer arrives.
    absl::Duration linger = absl::Seconds(2);
    size_t linger_bytes = size_t{16} << 20;
  };

  BoundedHttpServer() : BoundedHttpServer(Limits()) {}
  explicit BoundedHttpServer(Limits limits);
  // Stop().
  ~BoundedHttpServer() override;
  BoundedHttpServer(const BoundedHttpServer&) = delete;
  BoundedHttpServer& operator=(const BoundedHttpServer&) = delete;

  // Serves TLS (1.2 and newer) with the chain and key in `pem_path` (the
  // chain first, then the key). Before Listen. InvalidArgument when they
  // do not load.
  absl::Status UseTls(const std::string& pem_path);
  // Binds `host` (a name or an address, without brackets) and `port` (0:
  // a free one), then serves with the handlers registered so far (register
  // none afterwards). The port bound, or Unavailable with the system's
  // reason.
  absl::StatusOr<int> Listen(const std::string& host, int port);
  // Stops accepting, ends every connection (a worker's within its next
  // wait) and joins the threads. Idempotent.
  void Stop();

  // One request without sockets: `bytes` as a client sent them before it
  // closed its side, from `peer_ip`. Goes through the same header scan,
  // caps and handlers as a connection's request and returns the bytes of
  // the answer ("" when nothing would be answered). Tests and
  // fuzz/ui_http_fuzzer.cc. Thread-safe.
  std::string Exchange(std::string_view bytes,
                       const std::string& peer_ip = "127.0.0.1");

  // Why reading the request this thread is serving stopped early, for its
  // handler: a body read that failed because of kTooLarge
  // (max_request_bytes) or kTimedOut (request_timeout) is the server's
  // limit, not the client's malformed framing.
  enum class ReadEnd { kNone, kTooLarge, kTimedOut };
  static ReadEnd ReadEndOfThisThread();

  // Connections open now (tests).
  int connections() const { return open_.load(); }

 private:
  struct Conn;
  class ConnStream;
  struct Peer {
    int connections = 0;
    int working = 0;
  };

  void Loop();
  void Work();
  void Serve(Conn& c);
  void Accept(absl::Time now);
  // Reads (TLS: handshakes) what `c` has sent, then hands it on or refuses.
  void Advance(Conn& c, absl::Time now);
  // Reads up to `size` bytes of `c` into `buf`: their count, 0 at the end
  // of the stream, else kWouldBlock (c.events says what to wait for) or
  // kError.
  static ssize_t ReadSome(Conn& c, char* buf, size_t size);
  // Goes on with `c`'s TLS handshake: true once done (`c` then reads its
  // headers); false while it waits, or when it failed and closed `c`.
  bool Handshake(Conn& c);
  // Reads `c`'s header block (and a prefetched body) as far as sent; a
  // whole request waits for a worker.
  void ReadRequest(Conn& c, absl::Time now);
  // Writes what is left of `c.out`, then lingers.
  void WriteAnswer(Conn& c, absl::Time now);
  // Drops what a lingering `c` sends; closes it at the end of its stream
  // or past linger_bytes.
  void Drain(Conn& c);
  void Dispatch(absl::Time now);
  void TakeBack(absl::Time now);
  void Refuse(Conn& c, int status, absl::string_view why, absl::Time now);
  void StartLinger(Conn& c, absl::Time now);
  void Close(Conn* c);
  // The oldest connection (of `peer`, or of any when empty) still sending
  // its headers or lingering; null when none.
  Conn* Evictable(const std::string& peer);

  const Limits limits_;
  SSL_CTX* tls_ = nullptr;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: workers gave a connection back, or Stop
  int stop_fd_ = -1;  // eventfd, readable once stopping: ends workers' waits
  std::thread loop_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> open_{0};
  absl::Time accept_paused_until_ = absl::InfinitePast();

  // The loop's alone.
  std::list<std::unique_ptr<Conn>> conns_;  // oldest first
  absl::flat_hash_map<std::string, Peer> peers_;
  int idle_workers_ = 0;

  // Loop -> workers (at most one a free worker) and back.
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<Conn*> work_;
  std::vector<Conn*> done_;
};

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_BOUNDED_HTTP_H_
