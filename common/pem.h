// PEM files named by a command-line flag (TLS certificates, keys, CAs), and
// the checks that make a wrong one an error naming the flag at start
// instead of a TLS handshake that fails later with a message about
// addresses.
#ifndef PTRAIN_COMMON_PEM_H_
#define PTRAIN_COMMON_PEM_H_

#include <cstddef>
#include <string>

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

}  // namespace ptrain

#endif  // PTRAIN_COMMON_PEM_H_
