#include "bearer_token.hpp"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace gpukv::server {
namespace {

constexpr std::string_view kScheme = "Bearer ";

std::array<unsigned char, 32> digest(std::string_view bytes) {
  std::array<unsigned char, 32> d{};
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), d.data());
  return d;
}

}  // namespace

BearerToken BearerToken::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("--auth_token_file: cannot read " + path);
  std::ostringstream content;
  content << in.rdbuf();
  std::string token = content.str();
  token.erase(token.find_last_not_of(" \t\r\n") + 1);
  // Visible ASCII only: the token travels in an HTTP/2 header, and a space or a control character would be
  // a token no client can send. Sixteen characters at least: a short token is guessed.
  if (token.size() < 16 || token.size() > 4096) {
    throw std::invalid_argument("--auth_token_file " + path + ": the token must be 16 to 4096 characters, got " +
                                std::to_string(token.size()));
  }
  for (std::size_t i = 0; i < token.size(); ++i) {
    if (token[i] < 0x21 || token[i] > 0x7e) {
      throw std::invalid_argument("--auth_token_file " + path + ": the token must be visible ASCII characters; offset " +
                                  std::to_string(i) + " is not");
    }
  }
  return BearerToken(token);
}

BearerToken::BearerToken(std::string_view token) : expected_(digest(std::string(kScheme) + std::string(token))) {}

bool BearerToken::admits(const grpc::CallbackServerContext& ctx) const {
  const auto& metadata = ctx.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) return false;
  const auto presented = digest(std::string_view(found->second.data(), found->second.size()));
  return CRYPTO_memcmp(presented.data(), expected_.data(), expected_.size()) == 0;
}

}  // namespace gpukv::server
