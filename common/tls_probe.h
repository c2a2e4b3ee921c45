// Why a gRPC call to ptcoord failed at the TLS layer, found out by one TLS
// handshake of our own with the same port after the call failed: gRPC only
// says "Socket closed" or "Ssl handshake failed". The probe tells a plain
// port from a TLS one, a server certificate the client's CA did not sign
// from one that does not name the host, and, with a client certificate,
// whether the server refused it (its TLS alert) and which CAs the server
// asked for (the certificate_authorities of its CertificateRequest, which
// gRPC fills from ptcoord's --tls-client-ca). Nothing is sent over the
// connection but the handshake. Not a TLS client: the caller's gRPC channel
// is.
#ifndef PTRAIN_COMMON_TLS_PROBE_H_
#define PTRAIN_COMMON_TLS_PROBE_H_

#include <string>
#include <vector>

namespace ptrain {

struct TlsProbeRequest {
  std::string address;  // HOST:PORT, as the channel dials it
  // PEM: the CAs the client trusts for the server's certificate ("" = do
  // not judge it), and the certificate chain and key it presents ("" =
  // none).
  std::string ca_pem, cert_pem, key_pem;
};

struct TlsProbeResult {
  enum class Outcome {
    kNoConnection,  // the connection itself failed (refused, timed out)
    kNotTls,        // the port answered, not with TLS
    kAccepted,      // the handshake went through, a client certificate too
    // The server's certificate does not verify against ca_pem, or does not
    // name the host (`detail` says how, `server_issuer` who signed it).
    kServerUntrusted,
    // The server refused the certificate this client presented: it sent a
    // TLS alert (`alert`), or closed the connection in or right after the
    // handshake while the same handshake without the certificate goes
    // through (gRPC's servers close without an alert).
    kClientCertRefused,
    // The server ended the connection in or right after the handshake for
    // another reason (`alert` when it sent one).
    kRefused,
  };
  Outcome outcome = Outcome::kNoConnection;
  std::string alert;   // the alert's description ("unknown CA"), or ""
  std::string detail;  // why the server's certificate is not trusted
  // kServerUntrusted because the certificate does not name the host dialed
  // (its CA may well be the right one).
  bool name_mismatch = false;
  std::string server_subject, server_issuer;  // RFC 2253
  // The CAs the server named in its certificate request (RFC 2253); empty
  // when it sent none or asked for no certificate.
  std::vector<std::string> acceptable_cas;
};

// One TLS handshake with `request.address` (at most 5 s per step), then a
// wait of up to 2 s for the server's first bytes, an alert or a close: with
// TLS 1.3 a server judges the client's certificate after the client
// considers the handshake done. When the server closes without an alert
// after a certificate was presented, a second handshake without it tells
// whether the certificate was the reason. Thread-compatible; uses OpenSSL's
// error queue and leaves it empty.
TlsProbeResult ProbeTls(const TlsProbeRequest& request);

// How a client names its TLS settings in its messages.
struct TlsClientNames {
  std::string client;      // who talks: "ptctl", "ptworkerd"
  std::string plain_hint;  // how to turn TLS on: "--tls-ca (or PTCTL_TLS_CA)"
  std::string ca_flag;     // the CA's flag, to drop: "--tls-ca"
  std::string ca;          // the CA's flag and file: "--tls-ca ca.pem"
  std::string cert;        // the certificate's flag and file
};

// One sentence saying why a call to `request.address` failed at the TLS
// layer, from ProbeTls(request): ptcoord serves TLS and the client talked
// plain text (request.ca_pem ""), or the reverse; ptcoord's certificate is
// not signed by the client's CA, or does not name the host; ptcoord
// refused the client's certificate (its issuer, the alert, an expiry, and
// the CAs ptcoord asked for, which are those of its --tls-client-ca); or
// ptcoord ended the handshake otherwise. "" when the handshake goes
// through or nothing answers.
std::string ExplainTlsFailure(const TlsProbeRequest& request,
                              const TlsClientNames& names);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_TLS_PROBE_H_
