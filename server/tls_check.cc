#include "server/tls_check.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

namespace lmserve::server {
namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& bytes) {
  return std::unique_ptr<BIO, BioFree>(
      BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

}  // namespace

absl::Status CheckTlsKeyPair(const std::string& cert_pem, const std::string& key_pem) {
  std::unique_ptr<BIO, BioFree> cert_bio = MemoryBio(cert_pem);
  std::unique_ptr<X509, X509Free> cert(
      cert_bio == nullptr ? nullptr : PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("--tls-cert: no PEM certificate in the file");
  }
  std::unique_ptr<BIO, BioFree> key_bio = MemoryBio(key_pem);
  // No passphrase callback: an encrypted key fails here rather than prompting on the terminal.
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      key_bio == nullptr
          ? nullptr
          : PEM_read_bio_PrivateKey(
                key_bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  if (key == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("--tls-key: no unencrypted PEM private key in the file");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        "--tls-key: the private key does not match the certificate of --tls-cert");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::server
