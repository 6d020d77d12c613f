// gRPC server reflection v1 (grpc.reflection.v1.ServerReflection), which newer tools ask for first (grpcurl,
// grpcui, Postman); gRPC's reflection plugin in the Debian release serves only v1alpha, which the server also
// keeps for older tools. Answers from the generated descriptor pool, like v1alpha: every message, enum and
// service compiled into the server (gpukv.v1's among them) can be described.
#pragma once

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace gpukv::server {

class ReflectionV1 final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  // `services`: the fully qualified names list_services answers with, the services the server registered.
  explicit ReflectionV1(std::vector<std::string> services) : services_(std::move(services)) {}

  grpc::Status ServerReflectionInfo(grpc::ServerContext* ctx,
                                    grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                                                             grpc::reflection::v1::ServerReflectionRequest>* stream) override;

 private:
  const std::vector<std::string> services_;
};

}  // namespace gpukv::server
