// transport_ceiling_server: the gpukv.v1 API with no table and no batcher behind it, to measure what gRPC
// itself costs for the service's workload shapes on a machine. Every GET finds an 8-byte value, every write
// succeeds, and each call is answered by the handler that received it. gpukv-load drives it exactly as it
// drives gpukv-server (bench/service_bench.sh and bench/device/service_gpu.sh run both in one run), so the
// gap between the two is what gpukv's batching and table add to the transport.
//
// --answer_delay_us=D (D > 0) answers unary and batch calls as gpukv-server does, with no table: the handler
// only queues the call, and an answering thread finishes every queued call once the oldest has waited D
// microseconds (--answer_threads of them, calls dealt out in turn, as gpukv-server's answer threads share
// a batch). The gap to the plain ceiling is what answering from a thread that is not gRPC's costs.
//
//   transport_ceiling_server --listen=127.0.0.1:50089 [--answer_delay_us=200 [--answer_threads=4]]
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpukv/v1/kv.grpc.pb.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50089", "address to listen on");
ABSL_FLAG(std::uint32_t, answer_delay_us, 0,
          "0: each call is answered by its handler; else by answering threads (--answer_threads), in batches, "
          "once the oldest queued call has waited this long");
ABSL_FLAG(std::uint32_t, answer_threads, 1, "with --answer_delay_us: the answering threads, each with its own queue");

namespace gpukv::bench {
namespace {

constexpr char kValue[] = "01234567";  // what every GET finds: the benchmarks' 8-byte values
constexpr std::uint32_t kValueBytes = sizeof(kValue) - 1;

// The columns of a batch answer of n GETs that all hit.
template <class Response>
void answer_gets(std::size_t n, Response* resp) {
  resp->mutable_results()->assign(n, static_cast<char>(v1::RESULT_OK));
  std::string* values = resp->mutable_values();
  values->reserve(n * kValueBytes);
  for (std::size_t i = 0; i < n; ++i) values->append(kValue, kValueBytes);
  resp->mutable_value_lengths()->Resize(static_cast<int>(n), kValueBytes);
}

// Answers a stream's groups in order, reading the next group while the previous answer is being written
// (as gpukv-server does), so the stream's pipelining is not limited by this server.
class StreamEcho : public grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse> {
 public:
  StreamEcho() { StartRead(&request_); }

  void OnReadDone(bool ok) override {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    if (!ok) {
      reads_done_ = true;
      if (answers_.empty()) finish(grpc::Status::OK);
      return;
    }
    v1::StreamResponse& r = answers_.emplace_back();
    r.set_id(request_.id());
    const std::size_t n = static_cast<std::size_t>(request_.key_lengths_size());
    r.mutable_results()->assign(n, static_cast<char>(v1::RESULT_OK));
    r.mutable_value_lengths()->Resize(static_cast<int>(n), 0);
    for (std::size_t i = 0; i < n; ++i) {
      const bool get = request_.ops().empty() || request_.ops()[i] == static_cast<char>(v1::OP_GET);
      if (get) {
        r.mutable_values()->append(kValue, kValueBytes);
        r.mutable_value_lengths()->Set(static_cast<int>(i), kValueBytes);
      }
    }
    if (answers_.size() == 1) StartWrite(&answers_.front());
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mutex_);
    answers_.pop_front();
    if (finished_) return;
    if (!ok) {
      finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    if (!answers_.empty()) {
      StartWrite(&answers_.front());
    } else if (reads_done_) {
      finish(grpc::Status::OK);
    }
  }

  void OnDone() override { delete this; }

 private:
  void finish(const grpc::Status& status) {  // mutex_ held
    finished_ = true;
    Finish(status);
  }

  std::mutex mutex_;
  v1::StreamRequest request_;
  std::deque<v1::StreamResponse> answers_;  // front: being written
  bool reads_done_ = false;
  bool finished_ = false;
};

// Finishes queued calls on its own thread, a batch at a time: a batch is every call queued when the oldest
// has waited `delay`.
class AnswerThread {
 public:
  explicit AnswerThread(std::chrono::microseconds delay) : delay_(delay), thread_([this] { run(); }) {}
  ~AnswerThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  void queue(grpc::ServerUnaryReactor* reactor) {
    std::lock_guard lock(mutex_);
    if (queued_.empty()) {
      oldest_ = std::chrono::steady_clock::now();
      wake_.notify_one();
    }
    queued_.push_back(reactor);
  }

 private:
  void run() {
    std::vector<grpc::ServerUnaryReactor*> batch;
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !queued_.empty(); });
      if (stop_) return;
      wake_.wait_until(lock, oldest_ + delay_, [&] { return stop_; });
      batch.swap(queued_);
      lock.unlock();
      for (grpc::ServerUnaryReactor* r : batch) r->Finish(grpc::Status::OK);
      batch.clear();
      lock.lock();
    }
  }

  const std::chrono::microseconds delay_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<grpc::ServerUnaryReactor*> queued_;
  std::chrono::steady_clock::time_point oldest_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

class CeilingService final : public v1::KeyValue::CallbackService {
  grpc::ServerUnaryReactor* ok(grpc::CallbackServerContext* ctx) {
    auto* reactor = ctx->DefaultReactor();
    if (!answerers_.empty()) {
      answerers_[next_.fetch_add(1, std::memory_order_relaxed) % answerers_.size()]->queue(reactor);
    } else {
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }
  std::vector<std::unique_ptr<AnswerThread>> answerers_;
  std::atomic<std::size_t> next_{0};  // the answering thread that takes the next call

 public:
  CeilingService(std::chrono::microseconds answer_delay, std::uint32_t answer_threads) {
    for (std::uint32_t i = 0; answer_delay.count() > 0 && i < std::max<std::uint32_t>(1, answer_threads); ++i) {
      answerers_.push_back(std::make_unique<AnswerThread>(answer_delay));
    }
  }

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const v1::GetRequest*, v1::GetResponse* resp) override {
    resp->set_found(true);
    resp->set_value(kValue, kValueBytes);
    return ok(ctx);
  }
  grpc::ServerUnaryReactor* Put(grpc::CallbackServerContext* ctx, const v1::PutRequest*, v1::PutResponse* resp) override {
    resp->set_result(v1::RESULT_OK);
    return ok(ctx);
  }
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const v1::DeleteRequest*, v1::DeleteResponse* resp) override {
    resp->set_deleted(true);
    return ok(ctx);
  }
  grpc::ServerUnaryReactor* BatchGet(grpc::CallbackServerContext* ctx, const v1::BatchGetRequest* req,
                                     v1::BatchGetResponse* resp) override {
    answer_gets(static_cast<std::size_t>(req->key_lengths_size()), resp);
    return ok(ctx);
  }
  grpc::ServerUnaryReactor* BatchPut(grpc::CallbackServerContext* ctx, const v1::BatchPutRequest* req,
                                     v1::BatchPutResponse* resp) override {
    resp->mutable_results()->assign(static_cast<std::size_t>(req->key_lengths_size()), static_cast<char>(v1::RESULT_OK));
    return ok(ctx);
  }
  grpc::ServerUnaryReactor* BatchDelete(grpc::CallbackServerContext* ctx, const v1::BatchDeleteRequest* req,
                                        v1::BatchDeleteResponse* resp) override {
    resp->mutable_results()->assign(static_cast<std::size_t>(req->key_lengths_size()), static_cast<char>(v1::RESULT_OK));
    return ok(ctx);
  }
  grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse>* Stream(grpc::CallbackServerContext*) override {
    return new StreamEcho;
  }
};

std::sig_atomic_t stop_requested = 0;

}  // namespace
}  // namespace gpukv::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as gpukv-server does (server/main.cpp)
  gpukv::bench::CeilingService service(std::chrono::microseconds(absl::GetFlag(FLAGS_answer_delay_us)),
                                       absl::GetFlag(FLAGS_answer_threads));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "transport_ceiling_server: cannot listen on %s\n", absl::GetFlag(FLAGS_listen).c_str());
    return 1;
  }
  std::fprintf(stderr, "transport_ceiling_server: listening on port %d\n", port);
  std::signal(SIGTERM, [](int) { gpukv::bench::stop_requested = 1; });
  std::signal(SIGINT, [](int) { gpukv::bench::stop_requested = 1; });
  while (gpukv::bench::stop_requested == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
