// The service takes every request as gRPC bytes and parses it itself. gRPC's typed callback handlers parse
// before any handler runs, and answer bytes that do not parse as the request with a status a client cannot
// tell from a missing method (UNIMPLEMENTED, no message); a typed Stream ends OK as if the client had closed
// it. Parsing here answers INVALID_ARGUMENT naming the message expected, as README promises for bad input.
// Parsing and serializing cost what they cost in the typed handlers: the same protobuf calls on the same
// buffers, only made here (bench/RESULTS.md, "Requests parsed by the service").
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>  // SerializationTraits of protobuf messages
#include <grpcpp/support/proto_buffer_reader.h>

namespace gpukv::server {

// Parses bytes into a message and releases them; false if they are not one. Releasing is what gRPC's typed
// handlers do too: a large BatchPut is then held once (parsed) while it waits for its batch, not twice.
// gRPC reads nothing of a request's buffer once the handler has it.
template <class Message>
bool consume_message(const grpc::ByteBuffer* bytes, Message& message) {
  auto* buffer = const_cast<grpc::ByteBuffer*>(bytes);  // gRPC's: the handler's to consume
  bool parsed;
  {
    grpc::ProtoBufferReader reader(buffer);
    parsed = reader.status().ok() && message.ParseFromZeroCopyStream(&reader);
  }
  buffer->Clear();
  return parsed;
}

// Serializes a message into gRPC's buffer.
template <class Message>
grpc::Status serialize_message(const Message& message, grpc::ByteBuffer* bytes) {
  bool own_buffer = false;
  return grpc::SerializationTraits<Message>::Serialize(message, bytes, &own_buffer);
}

// Why a message's bytes were refused: names the message they should have been.
template <class Message>
std::string unparsable(const char* what = "the request") {
  return std::string(what) + " does not parse as " + Message::descriptor()->full_name();
}

// A unary call as the handlers see it, from its bytes parsed to its answer serialized: finish() is how every
// handler ends its call.
class FinishableCall {
 public:
  virtual ~FinishableCall() = default;
  // Serializes the response into gRPC's buffer (when the status is OK), finishes the call on gRPC's
  // default reactor (whose reactions run inline) and deletes it: gRPC keeps nothing of it.
  virtual void finish(grpc::Status status) = 0;
};

// One unary call's request and response messages. It counts itself in `in_flight` until it is finished.
template <class Request, class Response>
class MessageCall final : public FinishableCall {
 public:
  MessageCall(grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out, std::atomic<std::size_t>& in_flight)
      : reactor_(ctx->DefaultReactor()),
        out_(out),
        in_flight_(in_flight),
        others_(in_flight.fetch_add(1, std::memory_order_relaxed)) {}

  // How many calls were in flight when this one came.
  std::size_t others_in_flight() const { return others_; }

  grpc::ServerUnaryReactor* reactor() const { return reactor_; }
  // Parses the request from gRPC's buffer, releasing it.
  bool parse(const grpc::ByteBuffer* in) { return consume_message(in, request_); }
  const Request& request() const { return request_; }
  Response& response() { return response_; }

  void finish(grpc::Status status) override {
    if (status.ok()) status = serialize_message(response_, out_);
    reactor_->Finish(status);
    std::atomic<std::size_t>& in_flight = in_flight_;
    delete this;  // after answering, so that freeing the messages does not delay the answer
    in_flight.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  grpc::ServerUnaryReactor* const reactor_;
  grpc::ByteBuffer* const out_;  // gRPC's, valid until the call is finished
  std::atomic<std::size_t>& in_flight_;
  const std::size_t others_;
  Request request_;
  Response response_;
};

}  // namespace gpukv::server
