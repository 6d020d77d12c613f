// Many clients at once over gRPC against a model. The server runs in process on the CPU backend with small
// device batches (so calls from different clients share batches and long calls span several), and each of
// kClients threads drives it through the client library with long random sequences of unary, batch and
// stream calls (GET, PUT, PUT_IF_ABSENT, DELETE; overwrites, deletes and re-inserts). The same test runs
// against one server through client::Client and against a cluster of three shards (three servers, each
// refusing the others' keys) through client::ClusterClient, whose calls are split by shard and merged; and
// the three shards once more on the GPU backend where a GPU is present (skipped, and said so, where not); and
// one server with a write-ahead log (--wal=batch), whose log thread answers every batch:
//
// - Each client owns a disjoint key range and keeps its own std::unordered_map model. Its calls are
//   sequential (stream groups are pipelined, but the stream keeps their order), so every result on an
//   owned key must be exactly the model's.
// - A small hot range is written by every client. A read there must return a value that some client wrote
//   (values are unique, and registered before they are sent), and the final value must be the last value
//   some client applied, or absent only if some client's last applied change was a delete.
// - Phase 1 stays below the table's limit: no FULL is allowed. Phase 2 inserts new keys until the table is
//   full: FULL then means nothing was stored (the model says absent), and overwrites of present keys still
//   succeed. A last top-up fills the table exactly, and a new key is then refused.
// - After each phase, BatchGet of every key ever used must equal the union of the models, and Stats must
//   count exactly that many items: nothing lost, nothing extra.
//
// The seeds are fixed (GPUKV_SEED overrides) and every failure names its client, seed, phase and step.
// GPUKV_TEST_SCALE scales the sequence lengths (the ThreadSanitizer build runs a fifth).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gpukv/client.hpp"
#include "gpukv/cluster.hpp"
#include "gpukv/table.hpp"
#include "service/server.hpp"

namespace gpukv::server {
namespace {

using namespace std::chrono_literals;
using client::GroupResult;
using client::OpGroup;

constexpr int kClients = 8;
constexpr int kOwnKeys = 300;  // per client, in phase 1
constexpr int kHotKeys = 12;
constexpr std::uint64_t kCapacity = 4000;  // about 3800 keys at the maximum load; phase 1 holds at most 2412

double scale() {
  const char* s = std::getenv("GPUKV_TEST_SCALE");
  return s ? std::max(0.01, std::atof(s)) : 1.0;
}

std::uint64_t base_seed() {
  const char* s = std::getenv("GPUKV_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261122;
}

std::string hot_key(int h) { return "hot:" + std::to_string(h); }

// One operation as the test tracks it. hot is the hot key's index, or -1 for an owned key.
struct Op {
  v1::OpKind kind;
  std::string key;
  std::string value;
  int hot = -1;
};

// What every client has sent to the hot keys.
class HotKeys {
 public:
  void wrote(int h, const std::string& value) {
    std::lock_guard lock(mutex_);
    written_[h].insert(value);
  }
  bool was_written(int h, std::string_view value) {
    std::lock_guard lock(mutex_);
    return written_[h].count(std::string(value)) != 0;
  }

 private:
  std::mutex mutex_;
  std::unordered_set<std::string> written_[kHotKeys];
};

// Failures from every thread, reported by the main thread; the first one stops every client.
class Failures {
 public:
  void add(std::string message) {
    std::lock_guard lock(mutex_);
    if (messages_.size() < 20) messages_.push_back(std::move(message));
    stop_ = true;
  }
  bool stopped() const { return stop_.load(); }
  void report() {
    std::lock_guard lock(mutex_);
    for (const std::string& m : messages_) ADD_FAILURE() << m;
    if (!messages_.empty()) ADD_FAILURE() << "seeds: GPUKV_SEED=" << base_seed() << " (client c uses seed*1000 + c)";
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> messages_;
  std::atomic<bool> stop_{false};
};

// A client's last applied change to a hot key: a value, or a delete.
struct HotChange {
  bool deleted;
  std::string value;
};

// Client options for the model: a retried write could apply twice.
client::ClientOptions model_client_options() {
  client::ClientOptions o;
  o.timeout = 60s;
  o.max_attempts = 1;
  return o;
}

// The servers a test runs against, and a client of them: one server and client::Client, or three shards and
// client::ClusterClient, on the CPU backend; and the three shards on the GPU backend where a GPU is present.
struct OneServer {
  using ClientType = client::Client;
  static constexpr std::uint32_t kShards = 1;
  static constexpr BackendKind kBackend = BackendKind::kCpu;
  static std::unique_ptr<ClientType> connect(const std::vector<int>& ports) {
    client::ClientOptions o = model_client_options();
    o.target = "127.0.0.1:" + std::to_string(ports[0]);
    return std::make_unique<ClientType>(o);
  }
};

struct ThreeShards {
  using ClientType = client::ClusterClient;
  static constexpr std::uint32_t kShards = 3;
  static constexpr BackendKind kBackend = BackendKind::kCpu;
  static std::unique_ptr<ClientType> connect(const std::vector<int>& ports) {
    client::ClusterOptions o;
    o.client = model_client_options();
    for (const int port : ports) o.targets.push_back("127.0.0.1:" + std::to_string(port));
    return std::make_unique<ClientType>(o);
  }
};

struct ThreeGpuShards : ThreeShards {
  static constexpr BackendKind kBackend = BackendKind::kGpu;
};

// One server whose writes go through the write-ahead log (--wal=batch): its log thread answers every batch.
struct OneDurableServer : OneServer {};

template <class Servers>
constexpr bool kDurable = std::is_same_v<Servers, OneDurableServer>;

template <class Servers>
class ModelClient {
 public:
  using ClientType = typename Servers::ClientType;

  ModelClient(int id, const std::vector<int>& ports, HotKeys& hot, Failures& failures)
      : id_(id), seed_(base_seed() * 1000 + static_cast<std::uint64_t>(id)), rng_(seed_), hot_(hot), failures_(failures) {
    client_ = Servers::connect(ports);
    for (int i = 0; i < kOwnKeys; ++i) keys_.push_back("c" + std::to_string(id) + ":" + std::to_string(i));
  }

  // Phase 1: random calls on the owned range and the hot keys; the table never fills.
  void run_mixed(int steps) {
    phase_ = "mixed";
    full_allowed_ = false;
    auto stream = client_->stream({.timeout = 600s, .max_in_flight = 4});
    for (step_ = 0; step_ < steps && !failures_.stopped(); ++step_) random_step(*stream, /*fresh_share=*/0);
    if (const grpc::Status s = stream->close(); !s.ok()) fail("stream ended with " + s.error_message());
  }

  // Phase 2: mostly inserts of new keys, until this client has been refused enough of them.
  void run_until_full(int max_steps) {
    phase_ = "fill";
    full_allowed_ = true;
    auto stream = client_->stream({.timeout = 600s, .max_in_flight = 4});
    for (step_ = 0; step_ < max_steps && fulls_ < 10 && !failures_.stopped(); ++step_) random_step(*stream, /*fresh_share=*/0.7);
    if (const grpc::Status s = stream->close(); !s.ok()) fail("stream ended with " + s.error_message());
  }

  // With the table full, an overwrite of a present key must still succeed (check() fails a FULL for it).
  void overwrite_one() {
    phase_ = "full";
    full_allowed_ = true;
    if (model_.empty()) return fail("no key to overwrite");
    unary(Op{v1::OP_PUT, model_.begin()->first, "c" + std::to_string(id_) + "#over", -1});
  }

  const std::unordered_map<std::string, std::string>& model() const { return model_; }
  std::uint64_t ops() const { return ops_; }
  const std::vector<std::string>& keys() const { return keys_; }
  const std::optional<HotChange>& last_hot(int h) const { return last_hot_[h]; }
  std::uint64_t fulls() const { return fulls_; }
  ClientType& client() { return *client_; }

 private:
  Op random_op(double fresh_share) {
    Op op;
    const double r = uniform_(rng_);
    op.kind = r < 0.3 ? v1::OP_GET : r < 0.6 ? v1::OP_PUT : r < 0.75 ? v1::OP_PUT_IF_ABSENT : v1::OP_DELETE;
    if (uniform_(rng_) < 0.1) {
      op.hot = static_cast<int>(rng_() % kHotKeys);
      op.key = hot_key(op.hot);
    } else if (fresh_share > 0 && uniform_(rng_) < fresh_share) {
      op.kind = uniform_(rng_) < 0.7 ? v1::OP_PUT : v1::OP_PUT_IF_ABSENT;
      keys_.push_back("c" + std::to_string(id_) + ":f" + std::to_string(keys_.size()));
      op.key = keys_.back();
    } else {
      op.key = keys_[rng_() % keys_.size()];
    }
    if (client::carries_value(op.kind)) {
      op.value = "c" + std::to_string(id_) + "#" + std::to_string(next_value_++);
      if (op.hot >= 0) hot_.wrote(op.hot, op.value);  // before it is sent: a read may see it at once
    }
    return op;
  }

  std::vector<Op> random_ops(std::size_t n, double fresh_share) {
    std::vector<Op> ops;
    for (std::size_t i = 0; i < n; ++i) ops.push_back(random_op(fresh_share));
    return ops;
  }

  template <class Stream>
  void random_step(Stream& stream, double fresh_share) {
    const double form = uniform_(rng_);
    if (form < 0.3) {
      unary(random_op(fresh_share));
    } else if (form < 0.6) {
      batch(random_ops(1 + rng_() % 32, fresh_share));
    } else {
      std::vector<std::vector<Op>> groups(1 + rng_() % 4);
      for (auto& g : groups) g = random_ops(1 + rng_() % 32, fresh_share);
      streamed(stream, groups);
    }
  }

  void unary(const Op& op) {
    grpc::Status s;
    v1::Result result = v1::RESULT_OK;
    std::string value;
    if (op.kind == v1::OP_GET) {
      std::optional<std::string> v;
      s = client_->get(op.key, &v);
      result = v ? v1::RESULT_OK : v1::RESULT_NOT_FOUND;
      value = v.value_or("");
    } else if (op.kind == v1::OP_DELETE) {
      bool deleted = false;
      s = client_->del(op.key, &deleted);
      result = deleted ? v1::RESULT_OK : v1::RESULT_NOT_FOUND;
    } else {
      s = client_->put(op.key, op.value, op.kind == v1::OP_PUT_IF_ABSENT, &result);
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {  // a unary call reports a full table so
        s = grpc::Status::OK;
        result = v1::RESULT_FULL;
      }
    }
    if (!s.ok()) return fail("unary " + v1::OpKind_Name(op.kind) + " failed: " + s.error_message());
    check(op, result, value);
  }

  // One batch call: the kind of the first op for all of them.
  void batch(std::vector<Op> ops) {
    for (Op& op : ops) {
      op.kind = ops[0].kind;
      if (client::carries_value(op.kind)) {
        if (op.value.empty()) {
          op.value = "c" + std::to_string(id_) + "#" + std::to_string(next_value_++);
          if (op.hot >= 0) hot_.wrote(op.hot, op.value);
        }
      }
    }
    grpc::Status s;
    std::vector<v1::Result> results;
    std::vector<std::string> values(ops.size());
    if (ops[0].kind == v1::OP_GET || ops[0].kind == v1::OP_DELETE) {
      std::vector<std::string> keys;
      for (const Op& op : ops) keys.push_back(op.key);
      if (ops[0].kind == v1::OP_GET) {
        std::vector<client::KeyResult> got;
        s = client_->batch_get(keys, &got);
        for (std::size_t i = 0; i < got.size(); ++i) {
          results.push_back(got[i].result);
          values[i] = got[i].value;
        }
      } else {
        s = client_->batch_delete(keys, &results);
      }
    } else {
      std::vector<std::pair<std::string, std::string>> entries;
      for (const Op& op : ops) entries.emplace_back(op.key, op.value);
      s = client_->batch_put(entries, ops[0].kind == v1::OP_PUT_IF_ABSENT, &results);
    }
    if (!s.ok()) return fail("batch " + v1::OpKind_Name(ops[0].kind) + " failed: " + s.error_message());
    if (results.size() != ops.size()) return fail("batch: " + std::to_string(results.size()) + " results for " + std::to_string(ops.size()) + " keys");
    for (std::size_t i = 0; i < ops.size() && !failures_.stopped(); ++i) check(ops[i], results[i], values[i]);
  }

  // Several groups in flight on the stream; checked in send order once all are back.
  template <class Stream>
  void streamed(Stream& stream, const std::vector<std::vector<Op>>& groups) {
    std::mutex m;
    std::condition_variable cv;
    std::size_t answered = 0;
    std::vector<grpc::Status> statuses(groups.size());
    std::vector<GroupResult> results(groups.size());
    std::size_t sent = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      OpGroup group;
      for (const Op& op : groups[g]) group.add(op.kind, op.key, op.value);
      const grpc::Status s = stream.send(group, [&, g](const grpc::Status& status, GroupResult&& r) {
        std::lock_guard lock(m);
        statuses[g] = status;
        results[g] = std::move(r);
        ++answered;
        cv.notify_one();  // under the lock: m and cv are this frame's
      });
      if (!s.ok()) {
        fail("stream send failed: " + s.error_message());
        break;
      }
      ++sent;
    }
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return answered == sent; });
    for (std::size_t g = 0; g < sent && !failures_.stopped(); ++g) {
      if (!statuses[g].ok()) return fail("stream group failed: " + statuses[g].error_message());
      if (results[g].size() != groups[g].size()) return fail("stream group: wrong result count");
      for (std::size_t i = 0; i < groups[g].size(); ++i) check(groups[g][i], results[g].result(i), results[g].value(i));
    }
  }

  // Checks one result against the model in the order the ops were sent, then applies it to the model.
  void check(const Op& op, v1::Result result, std::string_view value) {
    ++ops_;
    const auto fail_op = [&](const std::string& why) {
      fail(v1::OpKind_Name(op.kind) + " " + op.key + " -> " + v1::Result_Name(result) + " '" + std::string(value) + "': " + why);
    };
    if (result == v1::RESULT_FULL) {
      if (!full_allowed_) return fail_op("FULL below the table's limit");
      if (!client::carries_value(op.kind)) return fail_op("FULL for a read or delete");
      if (op.hot < 0 && model_.count(op.key) != 0) return fail_op("FULL for an overwrite of a present key");
      ++fulls_;
      return;  // nothing stored: the model stays as it is
    }
    if (op.hot >= 0) {
      std::optional<HotChange>& last = last_hot_[op.hot];
      switch (op.kind) {
        case v1::OP_GET:
          if (result == v1::RESULT_OK && !hot_.was_written(op.hot, value)) return fail_op("a value nobody wrote");
          if (result != v1::RESULT_OK && result != v1::RESULT_NOT_FOUND) return fail_op("unexpected result");
          return;
        case v1::OP_PUT:
          if (result != v1::RESULT_OK) return fail_op("unexpected result");
          last = HotChange{false, op.value};
          return;
        case v1::OP_PUT_IF_ABSENT:
          if (result == v1::RESULT_OK) last = HotChange{false, op.value};
          else if (result != v1::RESULT_EXISTS) return fail_op("unexpected result");
          return;
        default:
          if (result == v1::RESULT_OK) last = HotChange{true, {}};
          else if (result != v1::RESULT_NOT_FOUND) return fail_op("unexpected result");
          return;
      }
    }
    const auto it = model_.find(op.key);
    const bool present = it != model_.end();
    switch (op.kind) {
      case v1::OP_GET:
        if (present && (result != v1::RESULT_OK || value != it->second)) return fail_op("the model has '" + it->second + "'");
        if (!present && result != v1::RESULT_NOT_FOUND) return fail_op("the model has no such key");
        return;
      case v1::OP_PUT:
        if (result != v1::RESULT_OK) return fail_op("want OK");
        model_[op.key] = op.value;
        return;
      case v1::OP_PUT_IF_ABSENT:
        if (result != (present ? v1::RESULT_EXISTS : v1::RESULT_OK)) return fail_op(present ? "want EXISTS" : "want OK");
        if (!present) model_[op.key] = op.value;
        return;
      default:
        if (result != (present ? v1::RESULT_OK : v1::RESULT_NOT_FOUND)) return fail_op(present ? "want OK" : "want NOT_FOUND");
        if (present) model_.erase(it);
        return;
    }
  }

  void fail(const std::string& why) {
    std::ostringstream s;
    s << "client " << id_ << " (seed " << seed_ << "), phase " << phase_ << ", step " << step_ << ": " << why;
    failures_.add(s.str());
  }

  const int id_;
  const std::uint64_t seed_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0, 1};
  HotKeys& hot_;
  Failures& failures_;
  std::unique_ptr<ClientType> client_;
  std::vector<std::string> keys_;  // every owned key this client has used
  std::unordered_map<std::string, std::string> model_;
  std::optional<HotChange> last_hot_[kHotKeys];
  std::uint64_t next_value_ = 0;
  std::uint64_t fulls_ = 0;
  std::uint64_t ops_ = 0;  // checked
  const char* phase_ = "";
  int step_ = 0;
  bool full_allowed_ = false;
};

template <class Servers>
class ServiceModelTest : public testing::Test {
 protected:
  using Model = ModelClient<Servers>;

  void SetUp() override {
    if (Servers::kBackend == BackendKind::kGpu && !Table::gpu_available()) {
      GTEST_SKIP() << "SKIPPED: no CUDA device on this machine; the model test on GPU shards did not run";
    }
    std::vector<int> ports;
    for (std::uint32_t shard = 0; shard < Servers::kShards; ++shard) {
      ServerOptions o;
      o.listen = "127.0.0.1:0";
      o.metrics_listen = "127.0.0.1:0";
      o.table.backend = Servers::kBackend;
      o.table.capacity = kCapacity / Servers::kShards;  // the cluster holds about what one server does
      o.table.key_width = 16;
      o.table.value_width = 32;
      o.batcher.batch_size = 64;  // calls from several clients share batches, and long calls span several
      o.batcher.max_delay = 100us;
      o.batcher.completion_threads = 3;  // calls answered concurrently, stream responses still in order
      o.shard_index = shard;
      o.shard_count = Servers::kShards;
      if constexpr (kDurable<Servers>) {
        data_dir_ = std::filesystem::temp_directory_path() / ("gpukv-model-wal-" + std::to_string(getpid()));
        std::filesystem::remove_all(data_dir_);
        o.durability = {data_dir_, server::persistence::WalMode::kEveryBatch, false};
      }
      servers_.push_back(std::make_unique<Server>(o));
      ports.push_back(servers_.back()->port());
    }
    for (int c = 0; c < kClients; ++c) clients_.push_back(std::make_unique<Model>(c, ports, hot_, failures_));
  }

  template <class Body>
  void in_parallel(Body body) {
    std::vector<std::thread> threads;
    for (auto& c : clients_) threads.emplace_back([&body, &c] { body(*c); });
    for (auto& t : threads) t.join();
  }

  // BatchGet of every key ever used against the models; Stats' item count against theirs. `extra` is a
  // model of keys outside the clients' (the top-up).
  void check_contents(const std::unordered_map<std::string, std::string>& extra = {}) {
    std::vector<std::string> keys;
    for (auto& c : clients_) keys.insert(keys.end(), c->keys().begin(), c->keys().end());
    for (int h = 0; h < kHotKeys; ++h) keys.push_back(hot_key(h));
    for (const auto& [k, v] : extra) keys.push_back(k);
    std::vector<client::KeyResult> got;
    auto& client = clients_[0]->client();
    ASSERT_TRUE(client.batch_get(keys, &got).ok());
    ASSERT_EQ(got.size(), keys.size());
    std::uint64_t expected_items = extra.size();
    std::size_t i = 0;
    for (auto& c : clients_) {
      expected_items += c->model().size();
      for (const std::string& k : c->keys()) {
        const auto it = c->model().find(k);
        if (it == c->model().end()) {
          EXPECT_EQ(got[i].result, v1::RESULT_NOT_FOUND) << k << " should be absent";
        } else {
          EXPECT_EQ(got[i].result, v1::RESULT_OK) << k << " was lost";
          EXPECT_EQ(got[i].value, it->second) << k;
        }
        ++i;
      }
    }
    for (int h = 0; h < kHotKeys; ++h, ++i) {
      // The last change applied to a hot key is some client's last change to it.
      bool any_delete = false, any_change = false, matches = false;
      for (auto& c : clients_) {
        const auto& last = c->last_hot(h);
        if (!last) continue;
        any_change = true;
        any_delete |= last->deleted;
        matches |= !last->deleted && got[i].result == v1::RESULT_OK && last->value == got[i].value;
      }
      if (got[i].result == v1::RESULT_OK) {
        ++expected_items;
        EXPECT_TRUE(matches) << hot_key(h) << " holds '" << got[i].value << "', no client's last write";
      } else {
        EXPECT_EQ(got[i].result, v1::RESULT_NOT_FOUND);
        EXPECT_TRUE(any_delete || !any_change) << hot_key(h) << " is absent, but every client's last change wrote it";
      }
    }
    for (const auto& [k, v] : extra) {
      EXPECT_EQ(got[i].result, v1::RESULT_OK) << k << " was lost";
      EXPECT_EQ(got[i].value, v) << k;
      ++i;
    }
    v1::StatsResponse stats;
    ASSERT_TRUE(client.stats(&stats).ok());
    EXPECT_EQ(stats.tiers(0).items(), expected_items) << "the table holds keys no model has, or lost some";
  }

  void TearDown() override {
    clients_.clear();
    servers_.clear();
    if (!data_dir_.empty()) std::filesystem::remove_all(data_dir_);
  }

  std::vector<std::unique_ptr<Server>> servers_;
  std::filesystem::path data_dir_;
  HotKeys hot_;
  Failures failures_;
  std::vector<std::unique_ptr<Model>> clients_;
};

using Deployments = testing::Types<OneServer, ThreeShards, ThreeGpuShards, OneDurableServer>;
class DeploymentName {
 public:
  template <class T>
  static std::string GetName(int) {
    if (std::is_same_v<T, OneServer>) return "OneServer";
    if (std::is_same_v<T, ThreeShards>) return "ThreeShards";
    return std::is_same_v<T, ThreeGpuShards> ? "ThreeGpuShards" : "OneDurableServer";
  }
};
TYPED_TEST_SUITE(ServiceModelTest, Deployments, DeploymentName);

TYPED_TEST(ServiceModelTest, ManyClientsMixingUnaryBatchAndStreamCallsMatchTheirModels) {
  using Model = typename TestFixture::Model;
  auto& clients_ = this->clients_;
  auto& failures_ = this->failures_;
  const int steps = std::max(20, static_cast<int>(1500 * scale()));
  this->in_parallel([&](Model& c) { c.run_mixed(steps); });
  failures_.report();
  if (this->HasFailure()) return;
  this->check_contents();
  if (this->HasFailure()) return;

  // Until full: FULL refuses new keys and stores nothing; everything else behaves as before.
  this->in_parallel([&](Model& c) { c.run_until_full(20 * steps); });
  failures_.report();
  if (this->HasFailure()) return;
  std::uint64_t fulls = 0;
  for (auto& c : clients_) fulls += c->fulls();
  EXPECT_GT(fulls, 0u) << "the table never filled";
  this->check_contents();
  if (this->HasFailure()) return;

  // Top up to exactly the limit (deletes in phase 2 may have made room) until every new key is refused (a
  // cluster's shards fill one after another), then: a new key is refused, an overwrite is not, and nothing
  // was lost.
  auto& client = clients_[0]->client();
  v1::StatsResponse stats;
  ASSERT_TRUE(client.stats(&stats).ok());
  const std::uint64_t max_items = stats.tiers(0).max_items();
  std::unordered_map<std::string, std::string> top;
  for (int round = 0; round < 100; ++round) {
    std::vector<std::pair<std::string, std::string>> entries;
    for (int i = 0; i < 64; ++i) entries.emplace_back("top:" + std::to_string(round * 64 + i), "t" + std::to_string(i));
    std::vector<v1::Result> results;
    ASSERT_TRUE(client.batch_put(entries, false, &results).ok());
    std::size_t stored = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (results[i] == v1::RESULT_OK) {
        top.insert(entries[i]);
        ++stored;
      } else {
        ASSERT_EQ(results[i], v1::RESULT_FULL) << entries[i].first;
      }
    }
    if (stored == 0) break;
  }
  // Stats holds every batch whose calls have been answered.
  ASSERT_TRUE(client.stats(&stats).ok());
  EXPECT_EQ(stats.tiers(0).items(), max_items);
  EXPECT_EQ(client.put("refused", "v").error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::optional<std::string> refused;
  ASSERT_TRUE(client.get("refused", &refused).ok());
  EXPECT_FALSE(refused.has_value());
  clients_[1]->overwrite_one();
  failures_.report();
  this->check_contents(top);

  std::uint64_t ops = 0;
  for (auto& c : clients_) ops += c->ops();
  std::printf("%u shard(s), %d clients checked %llu operations; %llu writes refused FULL; %zu keys topped up to %llu\n",
              TypeParam::kShards, kClients,
              static_cast<unsigned long long>(ops), static_cast<unsigned long long>(fulls), top.size(),
              static_cast<unsigned long long>(max_items));
}

}  // namespace
}  // namespace gpukv::server
