// See pem.h. Certificates and keys are parsed with OpenSSL's libcrypto, the
// library gRPC's TLS would reject them with later.
#include "common/pem.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <climits>
#include <ctime>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"

namespace ptrain {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

// Null (parsed as nothing) for text past what a BIO's int length holds.
std::unique_ptr<BIO, BioFree> MemoryBio(absl::string_view pem) {
  if (pem.size() > static_cast<size_t>(INT_MAX)) return nullptr;
  return std::unique_ptr<BIO, BioFree>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// OpenSSL's reason for the last failure, for the end of a message; the
// error queue is emptied so that it does not leak into a later call.
std::string OpenSslReason() {
  const unsigned long e = ERR_peek_last_error();
  const char* reason = e == 0 ? nullptr : ERR_reason_error_string(e);
  ERR_clear_error();
  return reason == nullptr ? "" : absl::StrCat(" (", reason, ")");
}

// The default would prompt on the terminal for an encrypted key; gRPC
// cannot use one anyway.
int NoPassphrase(char*, int, int, void*) { return -1; }

// The first object of the kind `read` reads (PEM_read_bio_X509: a
// certificate, PEM_read_bio_PrivateKey: a key) in `pem`, other blocks
// skipped; null when there is none.
template <typename T, typename Free>
std::unique_ptr<T, Free> ReadFirst(absl::string_view pem,
                                   T* (*read)(BIO*, T**, pem_password_cb*,
                                              void*)) {
  auto bio = MemoryBio(pem);
  return std::unique_ptr<T, Free>(
      bio == nullptr ? nullptr
                     : read(bio.get(), nullptr, NoPassphrase, nullptr));
}

absl::StatusOr<X509Ptr> ParseCertificate(absl::string_view flag,
                                         const std::string& path,
                                         absl::string_view pem) {
  auto cert = ReadFirst<X509, X509Deleter>(pem, PEM_read_bio_X509);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", path, ": not a PEM certificate", OpenSslReason()));
  }
  return cert;
}

}  // namespace

std::string X509NameText(const X509_NAME* name) {
  std::unique_ptr<BIO, BioFree> out(BIO_new(BIO_s_mem()));
  if (out == nullptr || name == nullptr ||
      X509_NAME_print_ex(out.get(), name, 0, XN_FLAG_RFC2253) < 0) {
    ERR_clear_error();
    return "";
  }
  char* data = nullptr;
  const long n = BIO_get_mem_data(out.get(), &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : "";
}

void X509Deleter::operator()(X509* x) const { X509_free(x); }

std::vector<X509Ptr> ParseCertificates(absl::string_view pem) {
  std::vector<X509Ptr> out;
  auto bio = MemoryBio(pem);
  while (bio != nullptr) {
    X509* x = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr);
    if (x == nullptr) break;
    out.emplace_back(x);
  }
  ERR_clear_error();  // the end of the text reads as an error
  return out;
}

std::vector<CertificateNames> DescribeCertificates(absl::string_view pem) {
  std::vector<CertificateNames> out;
  for (const X509Ptr& cert : ParseCertificates(pem)) {
    CertificateNames& n = out.emplace_back();
    n.subject = X509NameText(X509_get_subject_name(cert.get()));
    n.issuer = X509NameText(X509_get_issuer_name(cert.get()));
    const ASN1_TIME* end = X509_get0_notAfter(cert.get());
    struct tm t = {};
    if (end != nullptr && ASN1_TIME_to_tm(end, &t) == 1) {
      n.not_after_unix = static_cast<int64_t>(timegm(&t));
    }
  }
  return out;
}

absl::StatusOr<std::string> ReadPemFile(absl::string_view flag,
                                        const std::string& path) {
  absl::StatusOr<std::string> text = ReadBoundedFile(flag, path, kMaxPemBytes);
  if (!text.ok()) return text.status();
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": not a PEM file (no -----BEGIN line)"));
  }
  return text;
}

absl::StatusOr<std::string> ReadCertificateFile(absl::string_view flag,
                                                const std::string& path) {
  absl::StatusOr<std::string> text = ReadPemFile(flag, path);
  if (!text.ok()) return text.status();
  if (absl::Status s = ParseCertificate(flag, path, *text).status(); !s.ok()) {
    return s;
  }
  return text;
}

absl::Status CheckKeyPair(absl::string_view cert_flag,
                          const std::string& cert_path,
                          absl::string_view cert_pem,
                          absl::string_view key_flag,
                          const std::string& key_path,
                          absl::string_view key_pem) {
  absl::StatusOr<X509Ptr> cert =
      ParseCertificate(cert_flag, cert_path, cert_pem);
  if (!cert.ok()) return cert.status();
  auto key = ReadFirst<EVP_PKEY, KeyFree>(key_pem, PEM_read_bio_PrivateKey);
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_flag, " ", key_path,
                     ": not an unencrypted PEM private key", OpenSslReason()));
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        key_flag, " ", key_path, " does not match the certificate of ",
        cert_flag, " ", cert_path, " (the first certificate in the file)"));
  }
  return absl::OkStatus();
}

}  // namespace ptrain
