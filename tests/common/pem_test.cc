// TLS files are checked as TLS will use them, at start: a certificate that
// does not parse, or a key that is not the certificate's, is an error
// naming the flags and files, never a prompt or a later handshake failure.
// The certificates are made here with OpenSSL's C API.
#include "common/pem.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

// What a memory BIO holds.
std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

// A fresh P-256 key, as PKCS#8 PEM; encrypted with `passphrase` unless
// empty.
std::string KeyPem(EVP_PKEY* key, const std::string& passphrase = "") {
  BIO* bio = BIO_new(BIO_s_mem());
  if (passphrase.empty()) {
    PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  } else {
    PEM_write_bio_PKCS8PrivateKey(
        bio, key, EVP_aes_128_cbc(), const_cast<char*>(passphrase.data()),
        static_cast<int>(passphrase.size()), nullptr, nullptr);
  }
  std::string text = BioText(bio);
  BIO_free(bio);
  return text;
}

// A self-signed certificate for `key`, as PEM.
std::string SelfSignedPem(EVP_PKEY* key) {
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert), 2 * 24 * 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("ptrain"),
                             -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509_sign(cert, key, EVP_sha256());
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  std::string text = BioText(bio);
  BIO_free(bio);
  X509_free(cert);
  return text;
}

class PemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("pem_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    EVP_PKEY* key = EVP_EC_gen("P-256");
    EVP_PKEY* other = EVP_EC_gen("P-256");
    ASSERT_NE(key, nullptr);
    ASSERT_NE(other, nullptr);
    cert_pem_ = SelfSignedPem(key);
    key_pem_ = KeyPem(key);
    other_key_pem_ = KeyPem(other);
    encrypted_key_pem_ = KeyPem(key, "passphrase");
    EVP_PKEY_free(key);
    EVP_PKEY_free(other);
    cert_ = Write("c.pem", cert_pem_);
    key_ = Write("k.pem", key_pem_);
    other_key_ = Write("other.pem", other_key_pem_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  fs::path dir_;
  std::string cert_pem_, key_pem_, other_key_pem_, encrypted_key_pem_;
  std::string cert_, key_, other_key_;
};

TEST_F(PemTest, MatchingCertificateAndKeyPass) {
  absl::StatusOr<std::string> cert = ReadCertificateFile("--tls-cert", cert_);
  ASSERT_TRUE(cert.ok()) << cert.status();
  absl::StatusOr<std::string> key = ReadPemFile("--tls-key", key_);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*cert, cert_pem_);
  EXPECT_EQ(*key, key_pem_);
  const absl::Status s =
      CheckKeyPair("--tls-cert", cert_, *cert, "--tls-key", key_, *key);
  EXPECT_TRUE(s.ok()) << s;
}

// Leaf first: what follows the leaf (its CA) does not change the answer.
TEST_F(PemTest, ChainIsCheckedByItsFirstCertificate) {
  const std::string chain = cert_pem_ + other_key_pem_;
  EXPECT_TRUE(
      CheckKeyPair("--tls-cert", cert_, chain, "--tls-key", key_, key_pem_)
          .ok());
}

TEST_F(PemTest, KeyOfAnotherPairIsRefusedNamingBothFlagsAndFiles) {
  const absl::Status s = CheckKeyPair("--tls-cert", cert_, cert_pem_,
                                      "--tls-key", other_key_, other_key_pem_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(
      s.message(), "--tls-key " + other_key_ +
                       " does not match the certificate of --tls-cert " +
                       cert_))
      << s.message();
}

TEST_F(PemTest, KeyInPlaceOfTheCertificateIsNotACertificate) {
  const absl::Status s =
      CheckKeyPair("--tls-cert", key_, key_pem_, "--tls-key", key_, key_pem_);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StartsWith(
      s.message(), "--tls-cert " + key_ + ": not a PEM certificate"))
      << s.message();
  EXPECT_TRUE(
      absl::StartsWith(ReadCertificateFile("--tls-ca", key_).status().message(),
                       "--tls-ca " + key_ + ": not a PEM certificate"));
}

TEST_F(PemTest, CertificateInPlaceOfTheKeyIsNotAKey) {
  const absl::Status s = CheckKeyPair("--tls-cert", cert_, cert_pem_,
                                      "--tls-key", cert_, cert_pem_);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StartsWith(
      s.message(),
      "--tls-key " + cert_ + ": not an unencrypted PEM private key"))
      << s.message();
}

// The default would read a passphrase from the terminal, holding a service
// at start.
TEST_F(PemTest, EncryptedKeyIsRefusedWithoutAskingForAPassphrase) {
  ASSERT_TRUE(absl::StrContains(encrypted_key_pem_, "ENCRYPTED"));
  const absl::Status s = CheckKeyPair("--tls-cert", cert_, cert_pem_,
                                      "--tls-key", key_, encrypted_key_pem_);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(
      absl::StrContains(s.message(), "not an unencrypted PEM private key"))
      << s.message();
}

TEST_F(PemTest, FileWithoutAPemBlockIsRefused) {
  const std::string path = Write("text", "not pem\n");
  absl::StatusOr<std::string> r = ReadPemFile("--tls-key", path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "--tls-key " + path + ": not a PEM file (no -----BEGIN line)");
}

TEST_F(PemTest, PemFilesAreReadBounded) {
  absl::StatusOr<std::string> r = ReadPemFile("--tls-ca", "/dev/zero");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "--tls-ca /dev/zero: is a character device, not a regular file");
  const std::string big =
      Write("big.pem", cert_pem_ + std::string(kMaxPemBytes, '\n'));
  r = ReadCertificateFile("--tls-ca", big);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "larger than 1 MiB"))
      << r.status().message();
}

}  // namespace
}  // namespace ptrain
