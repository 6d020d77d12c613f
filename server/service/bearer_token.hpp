// Bearer-token access (--auth_token_file): every gpukv.v1.KeyValue call must carry the metadata
// "authorization: Bearer <token>", or it is answered UNAUTHENTICATED and nothing of it runs. Health checks and
// reflection stay open: they tell whether the server serves and what its (public) API is, nothing of the data,
// and Kubernetes' gRPC probes send no metadata.
//
// The token is compared through SHA-256 digests with OpenSSL's CRYPTO_memcmp: the time a comparison takes
// depends on neither the token nor its length, so a client cannot find the token by timing its guesses.
#pragma once

#include <grpcpp/grpcpp.h>

#include <array>
#include <string>
#include <string_view>

namespace gpukv::server {

class BearerToken {
 public:
  // The token in a file: its content less trailing white space (a newline from an editor or a Secret), 16 to
  // 4096 visible ASCII characters. Throws std::invalid_argument naming the file and what is wrong with it.
  static BearerToken from_file(const std::string& path);
  explicit BearerToken(std::string_view token);

  // Whether a call's metadata carries this token.
  bool admits(const grpc::CallbackServerContext& ctx) const;

 private:
  std::array<unsigned char, 32> expected_;  // SHA-256 of the whole header value, "Bearer <token>"
};

}  // namespace gpukv::server
