// See tls_probe.h. OpenSSL's libssl, the library gRPC's TLS runs on here.
#include "common/tls_probe.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <climits>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/pem.h"

namespace ptrain {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free_all(b); }
};
struct CtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

int NoPassphrase(char*, int, int, void*) { return -1; }

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& pem) {
  if (pem.size() > static_cast<size_t>(INT_MAX)) return nullptr;
  return std::unique_ptr<BIO, BioFree>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The CAs trusted and the certificate presented, set on `ctx`; false when
// the client certificate or key does not load.
bool Configure(const TlsProbeRequest& r, SSL_CTX* ctx) {
  // Judged after the handshake (SSL_get_verify_result): a failed check
  // must not hide what the server would say of the client's certificate.
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  for (const X509Ptr& ca : ParseCertificates(r.ca_pem))
    X509_STORE_add_cert(store, ca.get());
  if (r.cert_pem.empty()) return true;
  const std::vector<X509Ptr> chain = ParseCertificates(r.cert_pem);
  auto key_bio = MemoryBio(r.key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      key_bio == nullptr ? nullptr
                         : PEM_read_bio_PrivateKey(key_bio.get(), nullptr,
                                                   NoPassphrase, nullptr));
  if (chain.empty() || key == nullptr ||
      SSL_CTX_use_certificate(ctx, chain.front().get()) != 1 ||
      SSL_CTX_use_PrivateKey(ctx, key.get()) != 1) {
    return false;
  }
  for (size_t i = 1; i < chain.size(); ++i) {
    SSL_CTX_add1_chain_cert(ctx, chain[i].get());
  }
  return true;
}

// The host part of HOST:PORT ([v6]:port unbracketed).
std::string HostOf(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

bool IsIpAddress(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// The TLS alert the last failure carried, as OpenSSL describes it; "" when
// the failure was no alert.
std::string AlertOfLastError() {
  const unsigned long e = ERR_peek_last_error();
  const int reason = ERR_GET_REASON(e);
  if (e == 0 || reason < SSL_AD_REASON_OFFSET) return "";
  return SSL_alert_desc_string_long(reason - SSL_AD_REASON_OFFSET);
}

// What one handshake with the server showed.
struct Handshake {
  bool connected = false;   // the TCP connection was made
  bool completed = false;   // SSL_connect succeeded
  std::string alert;        // the server's TLS alert, if it sent one
  bool closed = false;      // the server closed without an alert
  bool answered = false;    // after the handshake, the server sent bytes
  long verify = X509_V_OK;  // the server certificate's verification
  std::string server_subject, server_issuer;
  std::vector<std::string> acceptable_cas;
};

// The last I/O error of `ssl` (after `ret`) as an alert or a close.
void NoteFailure(SSL* ssl, int ret, Handshake* h) {
  const int error = SSL_get_error(ssl, ret);
  h->alert = AlertOfLastError();
  const int reason = ERR_GET_REASON(ERR_peek_last_error());
  ERR_clear_error();
  if (!h->alert.empty()) return;
  h->closed =
      error == SSL_ERROR_ZERO_RETURN ||
      (error == SSL_ERROR_SYSCALL && errno != EAGAIN && errno != EWOULDBLOCK) ||
      reason == SSL_R_UNEXPECTED_EOF_WHILE_READING;
}

// One handshake as `r` describes it, presenting its certificate when
// `with_cert`, then a wait of up to 2 s for the server's first bytes.
Handshake Shake(const TlsProbeRequest& r, bool with_cert) {
  Handshake h;
  TlsProbeRequest config = r;
  if (!with_cert) config.cert_pem = config.key_pem = "";
  std::unique_ptr<SSL_CTX, CtxFree> ctx(SSL_CTX_new(TLS_client_method()));
  if (ctx == nullptr || !Configure(config, ctx.get())) {
    ERR_clear_error();
    return h;
  }
  std::unique_ptr<SSL, SslFree> ssl(SSL_new(ctx.get()));
  BIO* connection = BIO_new_connect(r.address.c_str());
  if (ssl == nullptr || connection == nullptr ||
      BIO_do_connect(connection) <= 0) {
    BIO_free_all(connection);
    ERR_clear_error();
    return h;
  }
  h.connected = true;
  // A port that takes the connection and never answers is not TLS either.
  const int fd = static_cast<int>(BIO_get_fd(connection, nullptr));
  const timeval patience{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &patience, sizeof(patience));
  SSL_set_bio(ssl.get(), connection, connection);            // ssl owns it now
  static constexpr unsigned char kAlpnH2[] = {2, 'h', '2'};  // as gRPC asks
  SSL_set_alpn_protos(ssl.get(), kAlpnH2, sizeof(kAlpnH2));
  const std::string host = HostOf(r.address);
  if (IsIpAddress(host)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl.get(), host.c_str());
    SSL_set1_host(ssl.get(), host.c_str());
  }
  const int connected = SSL_connect(ssl.get());
  if (const STACK_OF(X509_NAME)* cas = SSL_get0_peer_CA_list(ssl.get())) {
    for (int i = 0; i < sk_X509_NAME_num(cas); ++i) {
      h.acceptable_cas.push_back(X509NameText(sk_X509_NAME_value(cas, i)));
    }
  }
  if (connected != 1) {
    NoteFailure(ssl.get(), connected, &h);
    return h;
  }
  h.completed = true;
  if (const X509Ptr peer(SSL_get1_peer_certificate(ssl.get()));
      peer != nullptr) {
    h.server_subject = X509NameText(X509_get_subject_name(peer.get()));
    h.server_issuer = X509NameText(X509_get_issuer_name(peer.get()));
  }
  h.verify = SSL_get_verify_result(ssl.get());
  // TLS 1.3: the server checks the client's certificate after the client's
  // last handshake message; its verdict is its first bytes (HTTP/2
  // settings), or an alert, or (gRPC) a connection closed without one.
  const timeval verdict{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &verdict, sizeof(verdict));
  char byte = 0;
  const int n = SSL_read(ssl.get(), &byte, 1);
  if (n > 0) {
    h.answered = true;
  } else {
    NoteFailure(ssl.get(), n, &h);
  }
  ERR_clear_error();
  return h;
}

}  // namespace

TlsProbeResult ProbeTls(const TlsProbeRequest& request) {
  using Outcome = TlsProbeResult::Outcome;
  TlsProbeResult out;
  if (absl::StrContains(request.address, "://") ||
      absl::StartsWith(request.address, "unix:")) {
    return out;
  }
  const bool presented = !request.cert_pem.empty();
  const Handshake h = Shake(request, presented);
  if (!h.connected) return out;
  out.alert = h.alert;
  out.server_subject = h.server_subject;
  out.server_issuer = h.server_issuer;
  out.acceptable_cas = h.acceptable_cas;
  if (h.completed && !request.ca_pem.empty() && h.verify != X509_V_OK) {
    out.outcome = Outcome::kServerUntrusted;
    out.detail = X509_verify_cert_error_string(h.verify);
    out.name_mismatch = h.verify == X509_V_ERR_HOSTNAME_MISMATCH ||
                        h.verify == X509_V_ERR_IP_ADDRESS_MISMATCH;
    return out;
  }
  if (h.answered || (h.completed && !h.closed && h.alert.empty())) {
    out.outcome = Outcome::kAccepted;
    return out;
  }
  if (!h.alert.empty()) {
    out.outcome = presented ? Outcome::kClientCertRefused : Outcome::kRefused;
    return out;
  }
  // Closed without a word (what gRPC's server does with a certificate it
  // refuses, in TLS 1.2 and 1.3 alike). The same handshake without the
  // certificate tells whether the certificate was the reason: ptcoord
  // takes clients without one at the TLS layer.
  if (presented) {
    const Handshake bare = Shake(request, false);
    if (bare.completed && !bare.closed && bare.alert.empty()) {
      out.outcome = Outcome::kClientCertRefused;
      if (out.acceptable_cas.empty()) out.acceptable_cas = bare.acceptable_cas;
      return out;
    }
  }
  // A port that does not speak TLS answers a ClientHello with something
  // that is not a handshake, or with nothing.
  out.outcome = h.completed ? Outcome::kRefused : Outcome::kNotTls;
  return out;
}

std::string ExplainTlsFailure(const TlsProbeRequest& request,
                              const TlsClientNames& names) {
  using Outcome = TlsProbeResult::Outcome;
  const TlsProbeResult r = ProbeTls(request);
  const std::string& at = request.address;
  const std::string cas = absl::StrJoin(r.acceptable_cas, " or ");
  if (request.ca_pem.empty()) {
    if (r.outcome == Outcome::kNoConnection || r.outcome == Outcome::kNotTls) {
      return "";
    }
    return absl::StrCat("ptcoord at ", at, " serves TLS and ", names.client,
                        " talked plain text: give the CA that signed its "
                        "certificate with ",
                        names.plain_hint);
  }
  switch (r.outcome) {
    case Outcome::kNotTls:
      return absl::StrCat("ptcoord at ", at,
                          " talks plain text, not TLS: drop ", names.ca_flag);
    case Outcome::kServerUntrusted:
      if (r.name_mismatch) {
        return absl::StrCat(
            "ptcoord's certificate (", r.server_subject,
            ") does not name the host of ", at,
            ": dial a name the certificate holds (its subject alternative "
            "names), or give ptcoord a certificate for this one");
      }
      return absl::StrCat("ptcoord at ", at, " presented a certificate (",
                          r.server_subject, ", issued by ", r.server_issuer,
                          ") that the CA of ", names.ca, " does not verify (",
                          r.detail, "): give the CA that signed it");
    case Outcome::kClientCertRefused: {
      const std::vector<CertificateNames> mine =
          DescribeCertificates(request.cert_pem);
      std::string why = r.alert.empty()
                            ? std::string("it ended the TLS handshake")
                            : absl::StrCat("TLS alert: ", r.alert);
      if (!mine.empty() && mine.front().not_after_unix > 0 &&
          mine.front().not_after_unix < absl::ToUnixSeconds(absl::Now())) {
        absl::StrAppend(
            &why, "; this certificate expired on ",
            absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                             absl::FromUnixSeconds(mine.front().not_after_unix),
                             absl::UTCTimeZone()));
      }
      return absl::StrCat(
          "ptcoord at ", at, " refused the client certificate of ", names.cert,
          " (", mine.empty() ? "" : mine.front().subject, ", issued by ",
          mine.empty() ? "?" : mine.front().issuer, "; ", why,
          "): it expects one issued by the CA of its --tls-client-ca",
          cas.empty() ? "" : absl::StrCat(" (", cas, ")"));
    }
    case Outcome::kRefused:
      return absl::StrCat(
          "ptcoord at ", at, " ended the TLS connection in the handshake",
          r.alert.empty() ? "" : absl::StrCat(" (TLS alert: ", r.alert, ")"),
          cas.empty() ? ""
                      : absl::StrCat("; it asks for a client certificate "
                                     "issued by ",
                                     cas));
    case Outcome::kNoConnection:
    case Outcome::kAccepted:
      break;
  }
  return "";
}

}  // namespace ptrain
