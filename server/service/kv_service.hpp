// The gpukv.v1.KeyValue service on gRPC's callback API, every method taking raw bytes and parsing them itself
// (message_call.hpp says why). Every handler turns its request into packed
// columns for the batcher and returns at once; the batcher's threads finish the call. No reaction blocks:
// submitting takes the batcher's queue lock only, and Stats reads a snapshot of the table's figures taken
// after each batch runs and before its calls are answered (a client sees its own writes counted).
// In cluster mode the keys of other shards are refused here, before anything is queued (shard_filter.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "batcher/batcher.hpp"
#include "bearer_token.hpp"
#include "gpukv/v1/kv.grpc.pb.h"
#include "message_call.hpp"
#include "persistence/durability.hpp"
#include "shard_filter.hpp"

namespace gpukv::server {

// What the server takes at once, whoever asks (flags --max_message_bytes, --max_concurrent_calls,
// --max_streams): past them a call is refused RESOURCE_EXHAUSTED (gRPC refuses a message over the size limit
// itself) and counted in gpukv_limit_refusals_total.
struct ServiceLimits {
  std::size_t max_message_bytes = std::size_t{64} << 20;  // a request or a response
  std::size_t max_calls = 16384;                          // unary calls read and not yet answered
  std::size_t max_streams = 1024;                         // Stream calls open
  // Per connection (gRPC's channel arguments; gRPC 1.51 has no bound on the number of connections):
  std::size_t max_calls_per_connection = 1024;     // HTTP/2 streams at once: a client's further calls wait in it
  std::chrono::seconds max_connection_idle{3600};  // a connection without calls this long is closed (0: never)
};
// What one Stream may hold of requests read and answers not yet written before the server stops reading
// its requests (flow control: a client that does not read its answers holds only this much).
inline constexpr std::size_t kStreamHeldBytes = std::size_t{64} << 20;
inline constexpr std::size_t kStreamHeldRequests = 4096;

// Every method on raw bytes: the generated WithRawCallbackMethod_* layers, one per method.
using KeyValueRawService = v1::KeyValue::WithRawCallbackMethod_Get<v1::KeyValue::WithRawCallbackMethod_Put<
    v1::KeyValue::WithRawCallbackMethod_Delete<v1::KeyValue::WithRawCallbackMethod_BatchGet<
        v1::KeyValue::WithRawCallbackMethod_BatchPut<v1::KeyValue::WithRawCallbackMethod_BatchDelete<
            v1::KeyValue::WithRawCallbackMethod_Stream<v1::KeyValue::WithRawCallbackMethod_Stats<
                v1::KeyValue::WithRawCallbackMethod_Snapshot<v1::KeyValue::Service>>>>>>>>>;

class KvService final : public KeyValueRawService {
 public:
  // on_request(method, code) counts each finished call for the metrics, on_wrong_shard(keys) the keys
  // refused for belonging to another shard.
  // on_limit(limit) counts a call refused for a limit ("calls" or "streams").
  KvService(std::uint32_t key_width, std::uint32_t value_width, ShardFilter shard, ServiceLimits limits,
            std::function<void(const char* method, grpc::StatusCode code)> on_request,
            std::function<void(std::size_t keys)> on_wrong_shard = {}, std::function<void(const char* limit)> on_limit = {});

  // Calls are answered UNAVAILABLE until the batcher is attached (the table is being built) and after
  // it is detached (draining).
  void attach(Batcher* batcher, const TableStats& stats, std::string backend, std::string device);
  void detach();
  // The table's figures after the latest batch, for Stats; batch_ops adds to the operation count.
  void update_stats(const TableStats& stats, std::uint64_t batch_ops);

  // The methods: each parses its request (INVALID_ARGUMENT if it does not parse) and goes on below.
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in, grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Put(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in, grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in, grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* BatchGet(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* BatchPut(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* BatchDelete(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                        grpc::ByteBuffer* out) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Stream(grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in, grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Snapshot(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out) override;

  // What the Snapshot call does: asks for a snapshot and returns at once; `done` runs (on another thread)
  // with the result. Set before serving; without one, Snapshot is FAILED_PRECONDITION.
  using SnapshotDone = std::function<void(const persistence::SnapshotResult&)>;
  void set_snapshotter(std::function<void(SnapshotDone)> snapshotter) { snapshotter_ = std::move(snapshotter); }
  // Every call must carry this token (bearer_token.hpp); calls without it are UNAUTHENTICATED. Set before serving.
  void require_token(BearerToken token) { token_.emplace(std::move(token)); }

  // Submits packed columns; `done` runs once with the batcher's outcome (results filled when kOk), or with
  // kUnavailable when no batcher is attached. `done` counts the call, with the status the call ends with (a
  // unary Put that meets a full table ends RESOURCE_EXHAUSTED although its batch ran), before it finishes
  // it. Public for the stream reactor.
  using Done = std::function<void(CallCode code, std::string_view message)>;
  struct Refusal {
    CallCode code;
    std::string message;
  };
  void run(CallOps ops, CallResults* results, Clock::time_point deadline, Done done);
  // As run(), for a call of packed columns that may hold keys of other shards: those are answered
  // RESULT_WRONG_SHARD (their owners appended to `owners`) and the rest run. `results` must stay valid
  // until done; without foreign keys this is run().
  void run_owned(const CallOps& ops, CallResults* results, google::protobuf::RepeatedField<std::uint32_t>* owners,
                 Clock::time_point deadline, Done done);
  // Counts one finished call for the metrics (on_request).
  void count(const char* method, const grpc::Status& status);
  // Why a call cannot be taken now (no batcher attached, more ops than the queue holds, or more GETs than
  // a response can carry values for), asked before its response is sized for it: a refused call would size
  // it for nothing, and only the message size limit bounds its count. Empty if it can be taken.
  std::optional<Refusal> refusal(const CallOps& ops) const;

  const ShardFilter& shard() const { return shard_; }
  // A Stream's reactor is done: one fewer open.
  void stream_closed() { streams_open_.fetch_sub(1, std::memory_order_relaxed); }
  std::uint32_t key_width() const { return key_width_; }
  std::uint32_t value_width() const { return value_width_; }

 private:
  using GetCall = MessageCall<v1::GetRequest, v1::GetResponse>;
  using PutCall = MessageCall<v1::PutRequest, v1::PutResponse>;
  using DeleteCall = MessageCall<v1::DeleteRequest, v1::DeleteResponse>;
  using BatchGetCall = MessageCall<v1::BatchGetRequest, v1::BatchGetResponse>;
  using BatchPutCall = MessageCall<v1::BatchPutRequest, v1::BatchPutResponse>;
  using BatchDeleteCall = MessageCall<v1::BatchDeleteRequest, v1::BatchDeleteResponse>;
  using StatsCall = MessageCall<v1::StatsRequest, v1::StatsResponse>;
  using SnapshotCall = MessageCall<v1::SnapshotRequest, v1::SnapshotResponse>;

  // Parses a unary call's bytes into a new Call and hands it to `handle`, which finishes it (now or once its
  // batch is answered); bytes that are not a request finish it INVALID_ARGUMENT.
  template <class Call>
  grpc::ServerUnaryReactor* serve(const char* method, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                  grpc::ByteBuffer* out, void (KvService::*handle)(grpc::CallbackServerContext*, Call*));
  void get(grpc::CallbackServerContext* ctx, GetCall* call);
  void put(grpc::CallbackServerContext* ctx, PutCall* call);
  void delete_key(grpc::CallbackServerContext* ctx, DeleteCall* call);
  void batch_get(grpc::CallbackServerContext* ctx, BatchGetCall* call);
  void batch_put(grpc::CallbackServerContext* ctx, BatchPutCall* call);
  void batch_delete(grpc::CallbackServerContext* ctx, BatchDeleteCall* call);
  void stats(grpc::CallbackServerContext* ctx, StatsCall* call);
  void snapshot(grpc::CallbackServerContext* ctx, SnapshotCall* call);

  // Whether the call may run: true when no token is required or it carries the token.
  bool admitted(const grpc::CallbackServerContext& ctx) const { return !token_ || token_->admits(ctx); }
  // Finishes a call with INVALID_ARGUMENT (and counts it).
  void reject(const char* method, FinishableCall* call, std::string message);
  // A single-key call's key that belongs to another shard: finishes the call FAILED_PRECONDITION naming the
  // owner, with its index in the trailing metadata gpukv-owner-shard (and counts it). False if this shard
  // owns the key.
  bool refuse_foreign(const char* method, grpc::CallbackServerContext* ctx, FinishableCall* call, std::string_view key);
  void count_wrong_shard(std::size_t keys);
  // Finishes a call with a refusal's status (and counts it).
  void refuse(const char* method, FinishableCall* call, const Refusal& refusal);
  // Submits a unary call whose results go to `results` (its response's fields); respond(results) finishes
  // the response and gives the call's status. A single-key call (count 1) passes null length columns and a
  // null result and value length: the call keeps those itself.
  // A batch call's response lists the owners of its foreign keys in `owners` (null for a single-key call).
  template <class Respond>
  void unary(const char* method, grpc::CallbackServerContext* ctx, FinishableCall* call, CallOps ops, CallResults results,
             google::protobuf::RepeatedField<std::uint32_t>* owners, Respond respond);

  const std::uint32_t key_width_;
  const std::uint32_t value_width_;
  const ShardFilter shard_;
  const ServiceLimits limits_;
  const std::function<void(const char*, grpc::StatusCode)> on_request_;
  const std::function<void(std::size_t)> on_wrong_shard_;
  const std::function<void(const char*)> on_limit_;
  std::atomic<std::size_t> calls_in_flight_{0};  // unary calls read and not yet finished (MessageCall)
  std::atomic<std::size_t> streams_open_{0};
  std::atomic<std::uint64_t> wrong_shard_keys_{0};  // for Stats
  std::function<void(SnapshotDone)> snapshotter_;
  std::optional<BearerToken> token_;
  std::atomic<Batcher*> batcher_{nullptr};
  std::atomic<std::size_t> max_call_ops_{0};  // the attached batcher's queue bound

  std::mutex stats_mutex_;  // guards the snapshot below
  TableStats table_stats_;
  std::uint64_t operations_ = 0;
  std::string backend_, device_;
};

// The gRPC status of a batcher outcome.
grpc::Status status_of(CallCode code, std::string_view message);

// Steady-clock deadline of a call (time_point::max() when it has none).
Clock::time_point call_deadline(const grpc::CallbackServerContext& ctx);

// Checks that packed columns are consistent: key lengths add up to the keys, one value length per write op,
// value lengths add up to the values. Returns an error message, or empty.
std::string check_columns(const CallOps& ops, std::size_t keys_size, std::size_t value_lengths_size, std::size_t values_size);

}  // namespace gpukv::server
