#include "reflection_v1.hpp"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <unordered_set>

namespace gpukv::server {
namespace {

namespace v1 = grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

// The answers of one stream. A file is sent with the files it imports, each once per stream: a client that
// asked before has them (grpcurl and grpcui keep what they were sent).
class Answers {
 public:
  explicit Answers(const std::vector<std::string>& services) : services_(services) {}

  void answer(const v1::ServerReflectionRequest& request, v1::ServerReflectionResponse& response) {
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    const DescriptorPool& pool = *DescriptorPool::generated_pool();
    switch (request.message_request_case()) {
      case v1::ServerReflectionRequest::kFileByFilename:
        return file(pool.FindFileByName(request.file_by_filename()), "no file " + request.file_by_filename(), response);
      case v1::ServerReflectionRequest::kFileContainingSymbol:
        return file(pool.FindFileContainingSymbol(request.file_containing_symbol()),
                    "no symbol " + request.file_containing_symbol(), response);
      case v1::ServerReflectionRequest::kFileContainingExtension: {
        const auto& e = request.file_containing_extension();
        const auto* type = pool.FindMessageTypeByName(e.containing_type());
        const auto* extension = type != nullptr ? pool.FindExtensionByNumber(type, e.extension_number()) : nullptr;
        return file(extension != nullptr ? extension->file() : nullptr,
                    "no extension " + std::to_string(e.extension_number()) + " of " + e.containing_type(), response);
      }
      case v1::ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const auto* type = pool.FindMessageTypeByName(request.all_extension_numbers_of_type());
        if (type == nullptr)
          return error(grpc::StatusCode::NOT_FOUND, "no message type " + request.all_extension_numbers_of_type(), response);
        std::vector<const google::protobuf::FieldDescriptor*> extensions;
        pool.FindAllExtensions(type, &extensions);
        auto* numbers = response.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(type->full_name());
        for (const auto* e : extensions) numbers->add_extension_number(e->number());
        return;
      }
      case v1::ServerReflectionRequest::kListServices:
        for (const std::string& name : services_) response.mutable_list_services_response()->add_service()->set_name(name);
        return;
      case v1::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        return error(grpc::StatusCode::INVALID_ARGUMENT, "the request asks for nothing (no message_request set)", response);
    }
  }

 private:
  void file(const FileDescriptor* file, const std::string& missing, v1::ServerReflectionResponse& response) {
    if (file == nullptr) return error(grpc::StatusCode::NOT_FOUND, missing, response);
    add(file, *response.mutable_file_descriptor_response());
  }

  // The file, then what it imports that this stream has not been sent.
  void add(const FileDescriptor* file, v1::FileDescriptorResponse& out) {
    if (!sent_.insert(file->name()).second) return;
    google::protobuf::FileDescriptorProto proto;
    file->CopyTo(&proto);
    proto.SerializeToString(out.add_file_descriptor_proto());
    for (int i = 0; i < file->dependency_count(); ++i) add(file->dependency(i), out);
  }

  static void error(grpc::StatusCode code, const std::string& message, v1::ServerReflectionResponse& response) {
    response.mutable_error_response()->set_error_code(static_cast<int>(code));
    response.mutable_error_response()->set_error_message(message);
  }

  const std::vector<std::string>& services_;
  std::unordered_set<std::string> sent_;
};

}  // namespace

grpc::Status ReflectionV1::ServerReflectionInfo(
    grpc::ServerContext*, grpc::ServerReaderWriter<v1::ServerReflectionResponse, v1::ServerReflectionRequest>* stream) {
  Answers answers(services_);
  v1::ServerReflectionRequest request;
  while (stream->Read(&request)) {
    v1::ServerReflectionResponse response;
    answers.answer(request, response);
    if (!stream->Write(response)) break;  // the client is gone
  }
  return grpc::Status::OK;
}

}  // namespace gpukv::server
