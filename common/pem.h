// PEM files named by a command-line flag (TLS certificates, keys, CAs), and
// the checks that make a wrong one an error naming the flag at start
// instead of a TLS handshake that fails later with a message about
// addresses.
#ifndef PTRAIN_COMMON_PEM_H_
#define PTRAIN_COMMON_PEM_H_

#include <openssl/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptrain {

// A certificate chain or a key is a few KiB; a bundle of every public CA
// about 200 KiB.
inline constexpr size_t kMaxPemBytes = size_t{1} << 20;

// The file's text, read with ReadBoundedFile (at most kMaxPemBytes, a
// regular file); InvalidArgument (NotFound, PermissionDenied) naming the
// flag and the path when it cannot be read or holds no PEM block.
absl::StatusOr<std::string> ReadPemFile(absl::string_view flag,
                                        const std::string& path);

// ReadPemFile, and the text must hold an X.509 certificate (the first of
// a chain or a bundle is parsed): for certificate and CA flags. Else
// InvalidArgument "FLAG PATH: not a PEM certificate (...)".
absl::StatusOr<std::string> ReadCertificateFile(absl::string_view flag,
                                                const std::string& path);

// OK when the first certificate of `cert_pem` (a chain, leaf first) and the
// private key `key_pem` belong together. Else InvalidArgument naming both
// flags and both files ("--tls-key k.pem does not match the certificate of
// --tls-cert c.pem"), or the one that does not parse ("--tls-key k.pem: not
// an unencrypted PEM private key"). Never asks for a passphrase.
absl::Status CheckKeyPair(absl::string_view cert_flag,
                          const std::string& cert_path,
                          absl::string_view cert_pem,
                          absl::string_view key_flag,
                          const std::string& key_path,
                          absl::string_view key_pem);

// Who a certificate names, for messages: its subject and issuer as RFC 2253
// text ("CN=ptctl-user,O=Lab"), and when it stops being valid.
struct CertificateNames {
  std::string subject, issuer;
  int64_t not_after_unix = 0;  // 0 when it cannot be read
};

// Every certificate in `pem` (a chain, a bundle of CAs), in order, other
// PEM blocks skipped; empty when none parses.
struct X509Deleter {
  void operator()(X509* x) const;
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
std::vector<X509Ptr> ParseCertificates(absl::string_view pem);

// An X.509 name as RFC 2253 text ("CN=ptctl-user,O=Lab"); "" for null.
std::string X509NameText(const X509_NAME* name);

// The names of every certificate in `pem` (a chain, a bundle of CAs), in
// order; empty when none parses.
std::vector<CertificateNames> DescribeCertificates(absl::string_view pem);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_PEM_H_
