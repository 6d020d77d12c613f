// gpukv::client::Stream: a session on the bidirectional Stream call. The caller packs operations into
// groups (OpGroup), sends them, and gets each group's results back through a callback, matched to the group
// by the request id the stream assigned. Several groups are in flight at once: send() queues the group and
// returns; the network write and the response happen on gRPC's threads.
//
//   auto stream = client.stream({.max_in_flight = 8});
//   gpukv::client::OpGroup group;
//   group.put("a", "1").get("a").del("b");
//   stream->send(group, [](const grpc::Status& s, gpukv::client::GroupResult&& r) { ... });
//   grpc::Status end = stream->close();  // every callback has run when close() returns
//
// Order: groups are written in the order send() accepted them, and the server applies operations on one
// key in the order they were sent on the stream (within a group and across groups). Responses usually
// arrive in order too, but only the id says which group a response answers.
//
// Errors: a group the server could not run (its queue was full, the stream's deadline passed, the server
// is draining) comes back with RESULT_FULL for every op, nothing applied, and the stream's final status
// (close()) is then that failure. When the stream itself ends (deadline, cancel, connection lost, server
// gone), every group still unanswered gets the stream's status in its callback. A stream is not retried:
// replaying half a session could apply operations twice.
//
// Why the callback API (a ClientBidiReactor) rather than a synchronous reader-writer with a reader thread:
// send() never blocks on the network (a queue feeds one write at a time), so an open-loop caller can
// keep its schedule and many streams need no thread each; the reactor's state is small and guarded by one
// mutex, and the only blocking is the caller's own choice (send() when max_in_flight groups are out,
// close()).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "gpukv/v1/kv.grpc.pb.h"

namespace gpukv::client {

// Whether an op of this kind carries a value (PUT and PUT_IF_ABSENT): a request's value columns hold one for it.
inline bool carries_value(v1::OpKind kind) { return kind == v1::OP_PUT || kind == v1::OP_PUT_IF_ABSENT; }

// A packed group of operations: the columns of one StreamRequest, appended in place (no allocation per
// operation beyond the columns' amortised growth). Keys and values are bytes; the server checks their
// widths and answers a bad one with RESULT_INVALID for that op.
class OpGroup {
 public:
  OpGroup& get(std::string_view key) { return add(v1::OP_GET, key); }
  OpGroup& put(std::string_view key, std::string_view value) { return add(v1::OP_PUT, key, value); }
  OpGroup& put_if_absent(std::string_view key, std::string_view value) { return add(v1::OP_PUT_IF_ABSENT, key, value); }
  OpGroup& del(std::string_view key) { return add(v1::OP_DELETE, key); }
  // The value is ignored for GET and DELETE. Throws std::invalid_argument for a kind outside OpKind.
  OpGroup& add(v1::OpKind kind, std::string_view key, std::string_view value = {});

  std::size_t size() const { return request_.ops().size(); }
  bool empty() const { return request_.ops().empty(); }
  v1::OpKind kind(std::size_t i) const { return static_cast<v1::OpKind>(request_.ops()[i]); }
  // Empties the group, keeping its buffers for the next one.
  void clear();
  void reserve(std::size_t ops, std::size_t key_bytes, std::size_t value_bytes);

 private:
  friend class Stream;
  friend class ClusterStream;  // splits a group by shard
  v1::StreamRequest request_;  // id is set by the stream
};

// One group's results: result(i) and value(i) for op i of the group, in the order the ops were added.
class GroupResult {
 public:
  GroupResult() = default;
  std::uint64_t id() const { return response_.id(); }
  std::size_t size() const { return response_.results().size(); }
  v1::Result result(std::size_t i) const { return static_cast<v1::Result>(response_.results()[i]); }
  // The value a GET found; empty for every other op and result.
  std::string_view value(std::size_t i) const {
    return std::string_view(response_.values()).substr(offsets_[i], offsets_[i + 1] - offsets_[i]);
  }
  const v1::StreamResponse& response() const { return response_; }

 private:
  friend class Stream;
  friend class ClusterStream;  // merges its shards' results into one
  // Takes the response if its columns fit a group of `ops` operations; returns an error message otherwise.
  std::string adopt(v1::StreamResponse&& response, std::size_t ops);

  v1::StreamResponse response_;
  std::vector<std::uint32_t> offsets_;  // value i is values[offsets_[i], offsets_[i + 1])
};

struct StreamOptions {
  // Deadline of the whole stream, from its start; zero takes the client's per-call timeout.
  std::chrono::milliseconds timeout{0};
  // Groups sent and not yet answered; send() waits (try_send() refuses) beyond it.
  std::size_t max_in_flight = 16;
};

// Runs once per accepted group, on a gRPC thread: with OK and the group's results, or with the stream's
// failure (result is then empty). Callbacks of one stream run one at a time. A callback must not block;
// from inside one, send() does not wait for room but refuses like try_send().
using GroupCallback = std::function<void(const grpc::Status& status, GroupResult&& result)>;

class Stream {
 public:
  // Opens the stream (no round trip: a server that cannot be reached shows in the first callbacks and in
  // close()). Prefer Client::stream().
  Stream(v1::KeyValue::Stub& stub, std::shared_ptr<grpc::Channel> channel, std::chrono::milliseconds timeout,
         std::size_t max_in_flight);
  // Cancels the stream if it was not closed (unanswered groups get CANCELLED) and waits for its end.
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Queues the group for writing, waiting while max_in_flight groups are out. On OK the group is sent and
  // left empty, `done` will run exactly once, and *id (if given) is the group's request id. Otherwise
  // nothing was sent, `done` never runs and the group is untouched: INVALID_ARGUMENT for an empty group or
  // no callback, FAILED_PRECONDITION after close(), or the stream's final status once it has ended.
  grpc::Status send(OpGroup& group, GroupCallback done, std::uint64_t* id = nullptr);
  // As send(), but never waits: RESOURCE_EXHAUSTED when max_in_flight groups are out.
  grpc::Status try_send(OpGroup& group, GroupCallback done, std::uint64_t* id = nullptr);
  // Sends the group and waits for its results. The status is the group's: OK with results, or the
  // stream's failure. Not from inside a callback (FAILED_PRECONDITION).
  grpc::Status call(OpGroup& group, GroupResult* result);

  // Ends the sending side, waits for every answer and for the stream's end, and returns its final status:
  // OK, or the first failure (see the top of this file). Every callback has run when it returns. Idempotent.
  grpc::Status close();
  // Ends the stream at once: unanswered groups get CANCELLED. close() (or the destructor) still waits.
  void cancel();

  std::size_t in_flight() const;

 private:
  class Reactor;

  std::shared_ptr<Reactor> reactor_;  // destroyed only here (~Stream, after OnDone), never on a gRPC thread
};

}  // namespace gpukv::client
