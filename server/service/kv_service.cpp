#include "kv_service.hpp"

#include <algorithm>
#include <array>
#include <deque>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace gpukv::server {

// The wire's Result codes are the table's OpStatus codes.
static_assert(static_cast<int>(v1::RESULT_OK) == static_cast<int>(OpStatus::kOk));
static_assert(static_cast<int>(v1::RESULT_NOT_FOUND) == static_cast<int>(OpStatus::kNotFound));
static_assert(static_cast<int>(v1::RESULT_EXISTS) == static_cast<int>(OpStatus::kExists));
static_assert(static_cast<int>(v1::RESULT_FULL) == static_cast<int>(OpStatus::kFull));
static_assert(static_cast<int>(v1::RESULT_INVALID) == static_cast<int>(OpStatus::kInvalid));
static_assert(static_cast<int>(v1::RESULT_WRONG_SHARD) == kWrongShard);
static_assert(static_cast<int>(v1::OP_PUT_IF_ABSENT) == static_cast<int>(OpKind::kPutIfAbsent));
static_assert(static_cast<int>(v1::OP_DELETE) == static_cast<int>(OpKind::kDelete));

grpc::Status status_of(CallCode code, std::string_view message) {
  switch (code) {
    case CallCode::kOk: return grpc::Status::OK;
    case CallCode::kDeadlineExceeded: return {grpc::StatusCode::DEADLINE_EXCEEDED, std::string(message)};
    case CallCode::kUnavailable: return {grpc::StatusCode::UNAVAILABLE, std::string(message)};
    case CallCode::kResourceExhausted: return {grpc::StatusCode::RESOURCE_EXHAUSTED, std::string(message)};
    case CallCode::kInternal: return {grpc::StatusCode::INTERNAL, std::string(message)};
  }
  return {grpc::StatusCode::INTERNAL, "unknown call outcome"};
}

namespace {

CallOps packed(std::size_t count, OpKind kind, const std::string& keys,
               const google::protobuf::RepeatedField<std::uint32_t>& key_lengths, const std::string& values = {},
               const google::protobuf::RepeatedField<std::uint32_t>* value_lengths = nullptr) {
  CallOps ops;
  ops.count = count;
  ops.kind = kind;
  ops.keys = keys;
  ops.key_lengths = key_lengths.data();
  ops.values = values;
  ops.value_lengths = value_lengths != nullptr ? value_lengths->data() : nullptr;
  return ops;
}

// Sizes a response's result columns for a call's ops and points the batcher at them: it writes the results
// in place. A response without value columns (BatchPut, BatchDelete) takes no GETs.
template <class Response>
CallResults results_in(const CallOps& ops, std::uint32_t value_width, Response& resp) {
  CallResults r;
  resp.mutable_results()->resize(ops.count);
  r.results = resp.mutable_results()->data();
  if constexpr (requires { resp.mutable_values(); }) {
    resp.mutable_value_lengths()->Resize(static_cast<int>(ops.count), 0);  // one per op, as the wire promises
    r.value_lengths = resp.mutable_value_lengths()->mutable_data();
    if (const std::size_t gets = get_count(ops); gets != 0) {
      resp.mutable_values()->resize(gets * value_width);
      r.values = resp.mutable_values()->data();
    }
  }
  return r;
}

}  // namespace

Clock::time_point call_deadline(const grpc::CallbackServerContext& ctx) {
  const auto deadline = ctx.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  const auto left = deadline - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

std::string check_columns(const CallOps& ops, std::size_t keys_size, std::size_t value_lengths_size, std::size_t values_size) {
  std::uint64_t key_bytes = 0;
  for (std::size_t i = 0; i < ops.count; ++i) key_bytes += ops.key_lengths[i];
  if (key_bytes != keys_size)
    return "key_lengths add up to " + std::to_string(key_bytes) + " bytes, keys has " + std::to_string(keys_size);
  std::size_t writes = 0;
  for (std::size_t i = 0; i < ops.count; ++i) writes += carries_value(kind_at(ops, i));
  if (writes != value_lengths_size) {
    return std::to_string(writes) + " write operations but " + std::to_string(value_lengths_size) + " value_lengths";
  }
  std::uint64_t value_bytes = 0;
  for (std::size_t i = 0; i < value_lengths_size; ++i) value_bytes += ops.value_lengths[i];
  if (value_bytes != values_size) {
    return "value_lengths add up to " + std::to_string(value_bytes) + " bytes, values has " + std::to_string(values_size);
  }
  return {};
}

KvService::KvService(std::uint32_t key_width, std::uint32_t value_width, ShardFilter shard, ServiceLimits limits,
                     std::function<void(const char*, grpc::StatusCode)> on_request,
                     std::function<void(std::size_t)> on_wrong_shard, std::function<void(const char*)> on_limit)
    : key_width_(key_width),
      value_width_(value_width),
      shard_(std::move(shard)),
      limits_(limits),
      on_request_(std::move(on_request)),
      on_wrong_shard_(std::move(on_wrong_shard)),
      on_limit_(std::move(on_limit)) {}

void KvService::attach(Batcher* batcher, const TableStats& stats, std::string backend, std::string device) {
  {
    std::lock_guard lock(stats_mutex_);
    backend_ = std::move(backend);
    device_ = std::move(device);
  }
  update_stats(stats, 0);
  max_call_ops_.store(batcher->max_queued_ops());
  batcher_.store(batcher);
}

void KvService::detach() { batcher_.store(nullptr); }

void KvService::update_stats(const TableStats& stats, std::uint64_t batch_ops) {
  std::lock_guard lock(stats_mutex_);
  table_stats_ = stats;
  operations_ += batch_ops;
}

void KvService::count(const char* method, const grpc::Status& status) {
  if (on_request_) on_request_(method, status.error_code());
}

constexpr const char* kStartingOrDraining = "the server is starting or draining";

namespace {

grpc::Status unauthenticated() {
  return {grpc::StatusCode::UNAUTHENTICATED,
          "this server takes calls with its bearer token only (metadata authorization: Bearer <token>)"};
}

// A Stream refused before it starts: finishes at once, reads nothing.
class RefusedStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

std::optional<KvService::Refusal> KvService::refusal(const CallOps& ops) const {
  if (batcher_.load() == nullptr) return Refusal{CallCode::kUnavailable, kStartingOrDraining};
  if (ops.count > max_call_ops_.load())
    return Refusal{CallCode::kResourceExhausted, "the call has more operations than the queue holds"};
  // Room for every GET's value is reserved before any is found: a call of many GETs at a large value width
  // would hold memory for an answer it could never send.
  if (const std::uint64_t gets = get_count(ops); gets * value_width_ > limits_.max_message_bytes) {
    return Refusal{CallCode::kResourceExhausted, "the call's " + std::to_string(gets) + " GETs may answer " +
                                                     std::to_string(gets * value_width_) + " bytes of values (" +
                                                     std::to_string(value_width_) + " bytes each), over the " +
                                                     std::to_string(limits_.max_message_bytes) +
                                                     " bytes a response carries (--max_message_bytes): split the call"};
  }
  return std::nullopt;
}

void KvService::run(CallOps ops, CallResults* results, Clock::time_point deadline, Done done) {
  Batcher* batcher = batcher_.load();
  if (batcher == nullptr) {
    done(CallCode::kUnavailable, kStartingOrDraining);
    return;
  }
  Call call;
  call.ops = ops;
  call.results = results;
  call.deadline = deadline;
  call.done = std::move(done);
  batcher->submit(std::move(call));
}

void KvService::count_wrong_shard(std::size_t keys) {
  wrong_shard_keys_.fetch_add(keys, std::memory_order_relaxed);
  if (on_wrong_shard_) on_wrong_shard_(keys);
}

void KvService::run_owned(const CallOps& ops, CallResults* results, google::protobuf::RepeatedField<std::uint32_t>* owners,
                          Clock::time_point deadline, Done done) {
  ShardFilter::Foreign foreign = shard_.foreign_ops(ops);
  if (foreign.ops.empty()) {
    run(ops, results, deadline, std::move(done));
    return;
  }
  count_wrong_shard(foreign.ops.size());
  owners->Add(foreign.owners.begin(), foreign.owners.end());
  auto part = std::make_shared<OwnedPart>(ops, results, std::move(foreign.ops));
  if (part->ops().count == 0) {  // nothing of it is ours
    part->scatter();
    done(CallCode::kOk, "");
    return;
  }
  run(part->ops(), part->results(), deadline, [part, done = std::move(done)](CallCode code, std::string_view message) {
    if (code == CallCode::kOk) part->scatter();
    done(code, message);
  });
}

namespace {

// What a unary call keeps until it is answered, in one allocation: where its results go, a single-key call's
// result, value length and key and value lengths (the batcher reads the lengths when it copies the call's
// columns), and how to respond. The batcher's done callback holds only a pointer to it, small enough for
// std::function to keep inline.
template <class Respond>
struct UnaryCall {
  KvService* service;
  const char* method;
  FinishableCall* message_call;
  Respond respond;
  CallResults results;
  char result = 0;
  std::uint32_t value_length = 0;
  std::array<std::uint32_t, 2> lengths{};
};

}  // namespace

template <class Respond>
void KvService::unary(const char* method, grpc::CallbackServerContext* ctx, FinishableCall* message_call, CallOps ops,
                      CallResults results, google::protobuf::RepeatedField<std::uint32_t>* owners, Respond respond) {
  auto* call = new UnaryCall<Respond>{this, method, message_call, std::move(respond), results};
  if (ops.count == 1 && ops.key_lengths == nullptr) {  // a single-key call: its request has no length columns
    call->lengths = {static_cast<std::uint32_t>(ops.keys.size()), static_cast<std::uint32_t>(ops.values.size())};
    ops.key_lengths = &call->lengths[0];
    if (carries_value(ops.kind)) ops.value_lengths = &call->lengths[1];
    call->results.results = &call->result;
    if (results.values != nullptr) call->results.value_lengths = &call->value_length;
  }
  auto done = [call](CallCode code, std::string_view message) {
    const std::unique_ptr<UnaryCall<Respond>> owned(call);
    // respond finishes the response in place, and may turn an OK into an error (a Put that met a full table)
    const grpc::Status status = code == CallCode::kOk ? call->respond(call->results) : status_of(code, message);
    call->service->count(call->method, status);  // before Finish: a client that has its answer finds the call counted
    call->message_call->finish(status);
  };
  if (owners != nullptr) {
    run_owned(ops, &call->results, owners, call_deadline(*ctx), std::move(done));
  } else {
    run(ops, &call->results, call_deadline(*ctx), std::move(done));
  }
}

namespace {

// A single-key call's key must be 1..key_width bytes; a batch reports a bad key in its own result.
std::string bad_key(const std::string& key, std::uint32_t width) {
  if (key.empty() || key.size() > width) {
    return "key must be 1.." + std::to_string(width) + " bytes, got " + std::to_string(key.size());
  }
  return {};
}

}  // namespace

void KvService::reject(const char* method, FinishableCall* call, std::string message) {
  if (on_request_) on_request_(method, grpc::StatusCode::INVALID_ARGUMENT);
  call->finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::move(message)));
}

bool KvService::refuse_foreign(const char* method, grpc::CallbackServerContext* ctx, FinishableCall* call, std::string_view key) {
  const std::uint32_t owner = shard_.owner(key);
  if (owner == shard_.index()) return false;
  count_wrong_shard(1);
  ctx->AddTrailingMetadata("gpukv-owner-shard", std::to_string(owner));
  const grpc::Status status(grpc::StatusCode::FAILED_PRECONDITION,
                            "wrong shard: the key belongs to shard " + std::to_string(owner) + "; this server is shard " +
                                std::to_string(shard_.index()) + " of " + std::to_string(shard_.count()));
  count(method, status);
  call->finish(status);
  return true;
}

void KvService::refuse(const char* method, FinishableCall* call, const Refusal& refusal) {
  const grpc::Status status = status_of(refusal.code, refusal.message);
  count(method, status);
  call->finish(status);
}

template <class Call>
grpc::ServerUnaryReactor* KvService::serve(const char* method, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                           grpc::ByteBuffer* out,
                                           void (KvService::*handle)(grpc::CallbackServerContext*, Call*)) {
  auto* call = new Call(ctx, out, calls_in_flight_);    // deleted, and off the count, when finished
  grpc::ServerUnaryReactor* reactor = call->reactor();  // the call may be finished before handle returns
  if (!admitted(*ctx)) {
    const grpc::Status status = unauthenticated();
    count(method, status);
    call->finish(status);
  } else if (call->others_in_flight() >= limits_.max_calls) {
    if (on_limit_) on_limit_("calls");
    refuse(
        method, call,
        Refusal{CallCode::kResourceExhausted, "the server has " + std::to_string(limits_.max_calls) +
                                                  " calls in flight, the most it takes (--max_concurrent_calls): retry later"});
  } else if (!call->parse(in)) {
    reject(method, call, unparsable<std::remove_cvref_t<decltype(call->request())>>());
  } else {
    (this->*handle)(ctx, call);
  }
  return reactor;
}

grpc::ServerUnaryReactor* KvService::Get(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return serve("Get", ctx, in, out, &KvService::get);
}
grpc::ServerUnaryReactor* KvService::Put(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return serve("Put", ctx, in, out, &KvService::put);
}
grpc::ServerUnaryReactor* KvService::Delete(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return serve("Delete", ctx, in, out, &KvService::delete_key);
}
grpc::ServerUnaryReactor* KvService::BatchGet(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                              grpc::ByteBuffer* out) {
  return serve("BatchGet", ctx, in, out, &KvService::batch_get);
}
grpc::ServerUnaryReactor* KvService::BatchPut(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                              grpc::ByteBuffer* out) {
  return serve("BatchPut", ctx, in, out, &KvService::batch_put);
}
grpc::ServerUnaryReactor* KvService::BatchDelete(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                 grpc::ByteBuffer* out) {
  return serve("BatchDelete", ctx, in, out, &KvService::batch_delete);
}
grpc::ServerUnaryReactor* KvService::Stats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return serve("Stats", ctx, in, out, &KvService::stats);
}
grpc::ServerUnaryReactor* KvService::Snapshot(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                              grpc::ByteBuffer* out) {
  return serve("Snapshot", ctx, in, out, &KvService::snapshot);
}

void KvService::get(grpc::CallbackServerContext* ctx, GetCall* call) {
  const v1::GetRequest& req = call->request();
  if (auto e = bad_key(req.key(), key_width_); !e.empty()) return reject("Get", call, e);
  if (refuse_foreign("Get", ctx, call, req.key())) return;
  const CallOps ops{1, {}, OpKind::kGet, req.key(), nullptr, {}, nullptr};
  v1::GetResponse* resp = &call->response();
  std::string* value = resp->mutable_value();  // the batcher writes the value straight into the response
  value->resize(value_width_);
  unary("Get", ctx, call, ops, CallResults{nullptr, value->data(), nullptr}, nullptr, [resp](CallResults& r) {
    resp->set_found(static_cast<OpStatus>(r.results[0]) == OpStatus::kOk);
    resp->mutable_value()->resize(r.values_size);
    return grpc::Status::OK;
  });
}

void KvService::put(grpc::CallbackServerContext* ctx, PutCall* call) {
  const v1::PutRequest& req = call->request();
  std::string e = bad_key(req.key(), key_width_);
  if (e.empty() && req.value().size() > value_width_) {
    e = "value must be at most " + std::to_string(value_width_) + " bytes, got " + std::to_string(req.value().size());
  }
  if (!e.empty()) return reject("Put", call, e);
  if (refuse_foreign("Put", ctx, call, req.key())) return;
  const CallOps ops{1, {}, req.if_absent() ? OpKind::kPutIfAbsent : OpKind::kPut, req.key(), nullptr, req.value(), nullptr};
  unary("Put", ctx, call, ops, CallResults{}, nullptr, [resp = &call->response()](CallResults& r) {
    const auto s = static_cast<OpStatus>(r.results[0]);
    if (s == OpStatus::kFull) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "the table is full");
    resp->set_result(static_cast<v1::Result>(s));
    return grpc::Status::OK;
  });
}

void KvService::delete_key(grpc::CallbackServerContext* ctx, DeleteCall* call) {
  const v1::DeleteRequest& req = call->request();
  if (auto e = bad_key(req.key(), key_width_); !e.empty()) return reject("Delete", call, e);
  if (refuse_foreign("Delete", ctx, call, req.key())) return;
  const CallOps ops{1, {}, OpKind::kDelete, req.key(), nullptr, {}, nullptr};
  unary("Delete", ctx, call, ops, CallResults{}, nullptr, [resp = &call->response()](CallResults& r) {
    resp->set_deleted(static_cast<OpStatus>(r.results[0]) == OpStatus::kOk);
    return grpc::Status::OK;
  });
}

void KvService::batch_get(grpc::CallbackServerContext* ctx, BatchGetCall* call) {
  const v1::BatchGetRequest& req = call->request();
  const CallOps ops = packed(req.key_lengths_size(), OpKind::kGet, req.keys(), req.key_lengths());
  if (auto e = check_columns(ops, req.keys().size(), 0, 0); !e.empty())
    return reject("BatchGet", call, "malformed request: " + e);
  if (const auto r = refusal(ops)) return refuse("BatchGet", call, *r);
  v1::BatchGetResponse* resp = &call->response();
  unary("BatchGet", ctx, call, ops, results_in(ops, value_width_, *resp), resp->mutable_owners(), [resp](CallResults& r) {
    resp->mutable_values()->resize(r.values_size);
    return grpc::Status::OK;
  });
}

void KvService::batch_put(grpc::CallbackServerContext* ctx, BatchPutCall* call) {
  const v1::BatchPutRequest& req = call->request();
  const CallOps ops = packed(req.key_lengths_size(), req.if_absent() ? OpKind::kPutIfAbsent : OpKind::kPut, req.keys(),
                             req.key_lengths(), req.values(), &req.value_lengths());
  if (auto e = check_columns(ops, req.keys().size(), req.value_lengths_size(), req.values().size()); !e.empty()) {
    return reject("BatchPut", call, "malformed request: " + e);
  }
  if (const auto r = refusal(ops)) return refuse("BatchPut", call, *r);
  v1::BatchPutResponse* resp = &call->response();
  unary("BatchPut", ctx, call, ops, results_in(ops, value_width_, *resp), resp->mutable_owners(),
        [](CallResults&) { return grpc::Status::OK; });
}

void KvService::batch_delete(grpc::CallbackServerContext* ctx, BatchDeleteCall* call) {
  const v1::BatchDeleteRequest& req = call->request();
  const CallOps ops = packed(req.key_lengths_size(), OpKind::kDelete, req.keys(), req.key_lengths());
  if (auto e = check_columns(ops, req.keys().size(), 0, 0); !e.empty()) {
    return reject("BatchDelete", call, "malformed request: " + e);
  }
  if (const auto r = refusal(ops)) return refuse("BatchDelete", call, *r);
  v1::BatchDeleteResponse* resp = &call->response();
  unary("BatchDelete", ctx, call, ops, results_in(ops, value_width_, *resp), resp->mutable_owners(),
        [](CallResults&) { return grpc::Status::OK; });
}

void KvService::stats(grpc::CallbackServerContext*, StatsCall* call) {
  v1::StatsResponse* resp = &call->response();
  TableStats s;
  {
    std::lock_guard lock(stats_mutex_);
    s = table_stats_;
    resp->set_operations(operations_);
    resp->set_backend(backend_);
    resp->set_device(device_);
  }
  resp->set_key_width(key_width_);
  resp->set_value_width(value_width_);
  const auto add_tier = [&](const char* name, const TierStats& t) {
    v1::TierStats* tier = resp->add_tiers();
    tier->set_name(name);
    tier->set_items(t.items);
    tier->set_capacity(t.capacity);
    tier->set_max_items(t.max_items);
    tier->set_bytes(t.board_bytes + t.slot_bytes);
    tier->set_tombstones(t.tombstones);
  };
  add_tier("device", s.device);
  if (s.host.capacity != 0) add_tier("host", s.host);
  resp->set_host_reads(s.host_reads);
  resp->set_host_writes(s.host_writes);
  resp->set_host_reads_avoided(s.host_avoided);
  resp->set_batches(s.batches);
  resp->set_tombstones(s.device.tombstones + s.host.tombstones);
  resp->set_cleanups(s.cleanups);
  resp->set_shard_index(shard_.index());
  resp->set_shard_count(shard_.count());
  resp->set_wrong_shard_keys(wrong_shard_keys_.load(std::memory_order_relaxed));
  if (on_request_) on_request_("Stats", grpc::StatusCode::OK);
  call->finish(grpc::Status::OK);
}

void KvService::snapshot(grpc::CallbackServerContext*, SnapshotCall* call) {
  if (!snapshotter_) {
    const grpc::Status status(grpc::StatusCode::FAILED_PRECONDITION,
                              "this server keeps no data: it was started without --data_dir");
    count("Snapshot", status);
    call->finish(status);
    return;
  }
  snapshotter_([this, call](const persistence::SnapshotResult& r) {
    grpc::Status status;
    if (!r.error.empty()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, "the snapshot failed: " + r.error);
    } else {
      v1::SnapshotResponse& resp = call->response();
      resp.set_file(r.path.string());
      resp.set_items(r.items);
      resp.set_bytes(r.bytes);
      resp.set_seconds(r.seconds);
    }
    count("Snapshot", status);
    call->finish(status);
  });
}

namespace {

// One Stream call: every request read is submitted at once (so requests pipeline), and responses are
// written one at a time in the order the requests were read (the batcher may answer calls on several
// threads, in any order). The reactor ends after the client has half-closed and every response is written.
// A message that does not parse as a StreamRequest ends the stream: nothing of it runs, nothing after it is
// read, the requests before it are answered, and the stream ends INVALID_ARGUMENT.
//
// Flow control: a client that sends and does not read its answers would have its requests and their
// answers pile up here without bound (73 MiB and growing, for one such stream). While the requests read and
// not yet written hold more than kStreamHeldBytes, or number kStreamHeldRequests, the reactor reads no more
// of them; gRPC's own flow control then holds the client's sends. A slow reader slows only itself.
class StreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamReactor(KvService& service, grpc::CallbackServerContext* ctx) : service_(service), ctx_(ctx) { StartRead(&incoming_); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or the call broke)
      {
        std::lock_guard lock(mutex_);
        reads_done_ = true;
      }
      pump();
      return;
    }
    auto item = std::make_shared<Item>();
    const bool parsed = consume_message(&incoming_, item->request);  // a paused stream holds the parsed request only
    if (!parsed) {
      {
        std::lock_guard lock(mutex_);
        reads_done_ = true;
        ended_early_ = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, unparsable<v1::StreamRequest>("a message"));
      }
      pump();
      return;
    }
    {
      std::lock_guard lock(mutex_);
      ++outstanding_;
      if (!broken_) order_.push_back(item);
    }
    // Submit before the next read: the next OnReadDone may run on another thread, and requests must reach
    // the batcher in the order they were sent (same-key order within a stream). Submitting never waits
    // for a batch: at most it copies this request's columns into the filling batch. The item goes with it:
    // this thread keeps no reference, so the last one is dropped after every use of the item, by the thread
    // that answered it or under mutex_ (OnWriteDone), never here while a batch thread may still read it.
    submit(std::move(item));
    bool read_next;
    {
      std::lock_guard lock(mutex_);
      read_next = !over_bound();
      reading_paused_ = !read_next;
    }
    if (read_next) StartRead(&incoming_);
  }

  void OnWriteDone(bool ok) override {
    bool resume = false;
    {
      std::lock_guard lock(mutex_);
      writing_ = false;
      if (order_.front()->held) held_bytes_ -= order_.front()->held_bytes;
      order_.pop_front();
      if (!ok) {  // the client is gone
        broken_ = true;
        order_.clear();
        held_bytes_ = 0;
        // No read is in flight while reading is paused, so none will report the end of the requests: the
        // call can finish without one (it is broken: nothing more is read or written).
        if (reading_paused_) reads_done_ = true;
      }
      // Reading resumes once half the bound is free again, not at every write near it.
      if (reading_paused_ && !broken_ && held_bytes_ <= kStreamHeldBytes / 2 && order_.size() <= kStreamHeldRequests / 2) {
        reading_paused_ = false;
        resume = true;
      }
    }
    if (resume) StartRead(&incoming_);
    pump();
  }

  void OnDone() override {
    give_back_place();
    delete this;
  }

 private:
  struct Item {
    v1::StreamRequest request;
    v1::StreamResponse response;
    grpc::ByteBuffer wire;       // the response serialized, when its write starts
    CallResults results;         // in response
    bool answered = false;       // response is complete; guarded by mutex_
    std::size_t held_bytes = 0;  // the request's, and the room its response holds for values (set by submit)
    bool held = false;           // held_bytes counted in held_bytes_; guarded by mutex_
  };

  // Counts the item's bytes as held by the stream: before it can be answered, so before it can be written.
  void hold(Item& item) {
    std::lock_guard lock(mutex_);
    if (broken_) return;  // the item is not in order_
    held_bytes_ += item.held_bytes;
    item.held = true;
  }

  bool over_bound() const { return held_bytes_ > kStreamHeldBytes || order_.size() >= kStreamHeldRequests; }

  void submit(std::shared_ptr<Item> item) {
    const v1::StreamRequest& r = item->request;
    CallOps ops;
    ops.count = r.ops().size();
    ops.kinds = r.ops();
    ops.keys = r.keys();
    ops.key_lengths = r.key_lengths().data();
    ops.values = r.values();
    ops.value_lengths = r.value_lengths().data();
    std::string error;
    if (static_cast<std::size_t>(r.key_lengths_size()) != ops.count) {
      error = std::to_string(ops.count) + " ops but " + std::to_string(r.key_lengths_size()) + " key_lengths";
    } else {
      error = check_columns(ops, r.keys().size(), r.value_lengths_size(), r.values().size());
    }
    item->response.set_id(r.id());
    item->held_bytes = r.ByteSizeLong();
    if (!error.empty()) {  // answer the malformed request, keep the stream
      hold(*item);
      item->response.set_results(std::string(ops.count, static_cast<char>(OpStatus::kInvalid)));
      item->response.mutable_value_lengths()->Resize(static_cast<int>(ops.count), 0);
      respond(item);
      return;
    }
    if (const auto r = service_.refusal(ops)) {  // before the response is sized for it
      hold(*item);
      fail(item, status_of(r->code, r->message));
      return;
    }
    item->results = results_in(ops, service_.value_width(), item->response);
    item->held_bytes += item->response.values().capacity();
    hold(*item);
    Item& held = *item;  // the arguments below are evaluated in no set order with the lambda that takes `item`
    service_.run_owned(ops, &held.results, held.response.mutable_owners(), call_deadline(*ctx_),
                       [this, item = std::move(item)](CallCode code, std::string_view message) {
                         if (code != CallCode::kOk) {
                           fail(item, status_of(code, message));
                           return;
                         }
                         item->response.mutable_values()->resize(item->results.values_size);
                         respond(item);
                       });
  }

  // A request the server could not run (queue full, its deadline passed, draining): every op fails, the
  // stream goes on, and its final status is the first such failure.
  void fail(const std::shared_ptr<Item>& item, const grpc::Status& status) {
    v1::StreamResponse& response = item->response;
    const std::size_t ops = item->request.ops().size();
    response.set_results(std::string(ops, static_cast<char>(OpStatus::kFull)));
    response.clear_values();
    response.clear_owners();  // no key of it is answered WRONG_SHARD either
    response.mutable_value_lengths()->Resize(static_cast<int>(ops), 0);
    std::fill(response.mutable_value_lengths()->begin(), response.mutable_value_lengths()->end(), 0u);
    {
      std::lock_guard lock(mutex_);
      if (first_error_.ok()) first_error_ = status;
    }
    respond(item);
  }

  void respond(const std::shared_ptr<Item>& item) {
    {
      std::lock_guard lock(mutex_);
      --outstanding_;
      item->answered = true;
    }
    pump();
  }

  // Serializes the response about to be written, and frees the message: the bytes are what the write holds.
  // Only when its write starts, one at a time, so that an unread stream holds each answer once, not twice.
  void serialize(Item& item) {
    const grpc::Status serialized = serialize_message(item.response, &item.wire);
    v1::StreamResponse().Swap(&item.response);
    if (serialized.ok()) return;
    // Not for any message the server builds (a response's values are bounded far below protobuf's 2 GiB);
    // should it happen, the stream ends: cancelling fails the read in flight and the write about to start.
    {
      std::lock_guard lock(mutex_);
      if (ended_early_.ok()) {
        ended_early_ =
            grpc::Status(grpc::StatusCode::INTERNAL, "a response could not be serialized: " + serialized.error_message());
      }
    }
    ctx_->TryCancel();
  }

  // Starts the next write, or finishes the call once everything is read, answered and written. Decides under
  // the lock and calls into gRPC outside it.
  void pump() {
    Item* next = nullptr;
    bool finish = false;
    grpc::Status status, counted;
    {
      std::lock_guard lock(mutex_);
      if (!writing_ && !order_.empty() && order_.front()->answered && !broken_) {
        writing_ = true;
        next = order_.front().get();  // stays alive in order_ until its write is done; only this writer touches it
      } else if (!finished_ && reads_done_ && outstanding_ == 0 && !writing_ && order_.empty()) {
        finished_ = true;
        finish = true;
        status = ended_early_.ok() ? first_error_ : ended_early_;
        // A stream whose writes broke (the client went away) is counted as CANCELLED.
        counted = broken_ && ended_early_.ok() ? grpc::Status(grpc::StatusCode::CANCELLED, "") : status;
      }
    }
    if (next != nullptr) {
      serialize(*next);
      StartWrite(&next->wire);
    }
    if (finish) {
      service_.count("Stream", counted);  // once, as the call it is: gpukv_requests_total counts calls finished
      give_back_place();
      Finish(status);
    }
  }

  // Gives the stream's place under --max_streams back, once: before Finish sends the status, so that a client
  // that has seen its stream end may open another at once (OnDone runs after the status has gone out, and a
  // new stream opened in between was refused: test_limits_e2e.py), or in OnDone for a call that never finished.
  void give_back_place() {
    if (!place_given_back_.exchange(true, std::memory_order_relaxed)) service_.stream_closed();
  }

  KvService& service_;
  grpc::CallbackServerContext* ctx_;
  std::atomic<bool> place_given_back_{false};  // give_back_place() has run
  grpc::ByteBuffer incoming_;                // the read in progress
  std::mutex mutex_;                         // guards everything below
  std::deque<std::shared_ptr<Item>> order_;  // read, not yet written, in read order; front: being written
  int outstanding_ = 0;                      // requests read and not yet answered
  bool reads_done_ = false;
  bool reading_paused_ = false;  // flow control: no read started until the client takes some answers
  std::size_t held_bytes_ = 0;   // of the items in order_
  bool writing_ = false;
  bool broken_ = false;  // a write failed: the client is gone
  bool finished_ = false;
  grpc::Status first_error_;  // the stream's final status: the first failed request's, or OK,
  grpc::Status ended_early_;  // unless this one is set: why the stream ended before the client closed it
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* KvService::Stream(grpc::CallbackServerContext* ctx) {
  if (!admitted(*ctx)) {
    const grpc::Status status = unauthenticated();
    count("Stream", status);
    return new RefusedStream(status);
  }
  if (streams_open_.fetch_add(1, std::memory_order_relaxed) >= limits_.max_streams) {
    streams_open_.fetch_sub(1, std::memory_order_relaxed);
    if (on_limit_) on_limit_("streams");
    const grpc::Status status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              "the server has " + std::to_string(limits_.max_streams) +
                                  " streams open, the most it takes (--max_streams): retry later");
    count("Stream", status);
    return new RefusedStream(status);
  }
  return new StreamReactor(*this, ctx);  // stream_closed() when done
}

}  // namespace gpukv::server
