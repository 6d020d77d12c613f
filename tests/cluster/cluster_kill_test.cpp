// Three gpukv-server processes with --shard_count=3, driven through client::ClusterClient by several
// clients at once, each checking every result against its own model. One shard is killed with SIGKILL in
// the middle of the load, and later started again on its port.
//
// What the user is promised, and what is checked:
// - While a shard is down, only its keys fail: each of them either answers as the model says (the call
//   reached the shard before it died) or says UNAVAILABLE (a unary call's status, a batch or stream key's
//   result). Every key of the other shards answers exactly as the model says, in unary, batch and stream
//   calls alike.
// - Once it is back, its keys answer again: the restarted shard is empty (nothing is persisted here), so
//   each of its keys reads absent until written again, and everything is exact once more.
// - At the end, a BatchGet of every key equals the union of the models.
//
// The servers run on the CPU backend. On a GPU machine, GPUKV_TEST_BACKEND=gpu runs them on the GPU backend
// and GPUKV_TEST_GPUS=N puts shard i on GPU i % N (CUDA_VISIBLE_DEVICES), one server per GPU as deployed;
// GPUKV_SERVER names the server binary where the build's path is not the one to run.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gpukv/cluster.hpp"
#include "support/server_process.hpp"

namespace gpukv {
namespace {

using namespace std::chrono_literals;

constexpr int kClients = 4;
constexpr int kKeysPerClient = 300;
constexpr std::uint32_t kShards = 3, kVictim = 1;

// One client's load and model. The shard `down` (or none, kShards) is the one whose keys may fail.
class KillModelClient {
 public:
  KillModelClient(int id, const std::vector<std::string>& targets)
      : id_(id), rng_(20261124 + static_cast<std::uint64_t>(id)) {
    client::ClusterOptions o;
    o.targets = targets;
    o.client.timeout = 10s;
    o.client.max_attempts = 1;  // a retried write could apply twice
    cluster_ = std::make_unique<client::ClusterClient>(o);
    for (int i = 0; i < kKeysPerClient; ++i) keys_.push_back("c" + std::to_string(id) + ":" + std::to_string(i));
  }

  // Runs random steps until `stop`, keys of shard `down` allowed to fail (kShards: none may).
  void run(const std::atomic<bool>& stop, std::uint32_t down) {
    down_ = down;
    auto stream = cluster_->stream({.timeout = 120s, .max_in_flight = 4});
    while (!stop.load() && failures_.empty()) step(*stream);
    const grpc::Status end = stream->close();
    if (down == kShards && !end.ok()) fail("stream ended with " + end.error_message());
  }

  // The shard came back empty: its keys are absent, whatever happened to them before.
  void forget_shard(std::uint32_t shard) {
    for (const std::string& k : keys_) {
      if (cluster_->shard_of(k) == shard) {
        model_.erase(k);
        unknown_.erase(k);
      }
    }
  }

  // Waits until this client's channel to `shard` works again (its reconnect backoff is at most 5 s).
  bool reconnect(std::uint32_t shard) {
    for (auto until = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < until;) {
      bool serving = false;
      if (cluster_->shard(shard).health(&serving).ok() && serving) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  void check_contents() {
    std::vector<client::KeyResult> got;
    std::vector<client::ShardFailure> failed;
    if (!cluster_->batch_get(keys_, &got, &failed).ok() || !failed.empty()) return fail("final BatchGet failed");
    for (std::size_t i = 0; i < keys_.size(); ++i) expect(keys_[i], v1::OP_GET, "", got[i].result, got[i].value);
  }

  const std::vector<std::string>& failures() const { return failures_; }
  std::uint64_t failed_down() const { return failed_down_; }
  std::uint64_t answered_down() const { return answered_down_; }
  std::uint64_t answered_live() const { return answered_live_; }

 private:
  struct Op {
    v1::OpKind kind;
    std::string key;
    std::string value;
  };

  Op random_op() {
    Op op;
    const int r = static_cast<int>(rng_() % 10);
    op.kind = r < 4 ? v1::OP_GET : r < 8 ? v1::OP_PUT : v1::OP_DELETE;
    op.key = keys_[rng_() % keys_.size()];
    if (op.kind == v1::OP_PUT) op.value = "c" + std::to_string(id_) + "#" + std::to_string(next_value_++);
    return op;
  }

  void step(client::ClusterStream& stream) {
    const int form = static_cast<int>(rng_() % 3);
    if (form == 0) {
      const Op op = random_op();
      grpc::Status s;
      v1::Result result = v1::RESULT_OK;
      std::string value;
      if (op.kind == v1::OP_GET) {
        std::optional<std::string> v;
        s = cluster_->get(op.key, &v);
        result = v ? v1::RESULT_OK : v1::RESULT_NOT_FOUND;
        value = v.value_or("");
      } else if (op.kind == v1::OP_PUT) {
        s = cluster_->put(op.key, op.value, false, &result);
      } else {
        bool deleted = false;
        s = cluster_->del(op.key, &deleted);
        result = deleted ? v1::RESULT_OK : v1::RESULT_NOT_FOUND;
      }
      if (!s.ok()) result = s.error_code() == grpc::StatusCode::UNAVAILABLE ? v1::RESULT_UNAVAILABLE : v1::RESULT_INVALID;
      expect(op.key, op.kind, op.value, result, value);
    } else if (form == 1) {
      // A batch of one kind over keys of every shard.
      const v1::OpKind kind = random_op().kind;
      std::vector<Op> ops;
      std::unordered_set<std::string> seen;  // distinct keys: a batch's repeated key is its own rule
      while (ops.size() < 24) {
        Op op = random_op();
        if (!seen.insert(op.key).second) continue;
        op.kind = kind;
        if (kind == v1::OP_PUT && op.value.empty()) op.value = "c" + std::to_string(id_) + "#" + std::to_string(next_value_++);
        ops.push_back(op);
      }
      std::vector<std::string> keys;
      for (const Op& op : ops) keys.push_back(op.key);
      std::vector<v1::Result> results;
      std::vector<std::string> values(ops.size());
      grpc::Status s;
      if (kind == v1::OP_GET) {
        std::vector<client::KeyResult> got;
        s = cluster_->batch_get(keys, &got);
        for (std::size_t i = 0; i < got.size(); ++i) {
          results.push_back(got[i].result);
          values[i] = got[i].value;
        }
      } else if (kind == v1::OP_PUT) {
        std::vector<std::pair<std::string, std::string>> entries;
        for (const Op& op : ops) entries.emplace_back(op.key, op.value);
        s = cluster_->batch_put(entries, false, &results);
      } else {
        s = cluster_->batch_delete(keys, &results);
      }
      if (!s.ok() || results.size() != ops.size()) return fail("batch call failed whole: " + s.error_message());
      for (std::size_t i = 0; i < ops.size(); ++i) expect(ops[i].key, ops[i].kind, ops[i].value, results[i], values[i]);
    } else {
      std::vector<Op> ops;
      for (int i = 0; i < 16; ++i) ops.push_back(random_op());
      client::OpGroup group;
      for (const Op& op : ops) group.add(op.kind, op.key, op.value);
      client::GroupResult result;
      const grpc::Status s = stream.call(group, &result);
      if (!s.ok() || result.size() != ops.size()) return fail("stream group failed whole: " + s.error_message());
      for (std::size_t i = 0; i < ops.size(); ++i) expect(ops[i].key, ops[i].kind, ops[i].value, result.result(i), result.value(i));
    }
  }

  // Checks one op's outcome against the model (in the order the ops were sent) and applies it.
  void expect(const std::string& key, v1::OpKind kind, const std::string& value, v1::Result result, std::string_view got) {
    const bool on_down = cluster_->shard_of(key) == down_;
    if (result == v1::RESULT_UNAVAILABLE) {
      if (!on_down) return fail(key + ": UNAVAILABLE on a shard that is up");
      ++failed_down_;
      if (kind != v1::OP_GET) unknown_.insert(key);  // applied or not, nobody can say
      return;
    }
    ++(on_down ? answered_down_ : answered_live_);
    if (unknown_.count(key) != 0) {  // only a shard that is down leaves keys unknown; its answers are not checked
      if (kind != v1::OP_GET) {
        if (kind == v1::OP_PUT && result == v1::RESULT_OK) {
          model_[key] = value;
          unknown_.erase(key);
        } else if (kind == v1::OP_DELETE) {
          model_.erase(key);
          unknown_.erase(key);
        }
      }
      return;
    }
    const auto it = model_.find(key);
    const bool present = it != model_.end();
    const std::string what = key + " " + v1::OpKind_Name(kind) + " -> " + v1::Result_Name(result);
    switch (kind) {
      case v1::OP_GET:
        if (present && (result != v1::RESULT_OK || got != it->second)) return fail(what + ", the model has '" + it->second + "'");
        if (!present && result != v1::RESULT_NOT_FOUND) return fail(what + ", the model has no such key");
        return;
      case v1::OP_PUT:
        if (result != v1::RESULT_OK) return fail(what + ", want OK");
        model_[key] = value;
        return;
      default:
        if (result != (present ? v1::RESULT_OK : v1::RESULT_NOT_FOUND)) return fail(what + (present ? ", want OK" : ", want NOT_FOUND"));
        if (present) model_.erase(it);
        return;
    }
  }

  void fail(const std::string& why) {
    if (failures_.size() < 10) failures_.push_back("client " + std::to_string(id_) + ": " + why);
  }

  const int id_;
  std::mt19937_64 rng_;
  std::unique_ptr<client::ClusterClient> cluster_;
  std::vector<std::string> keys_;
  std::unordered_map<std::string, std::string> model_;
  std::unordered_set<std::string> unknown_;  // keys whose last write failed on a dead shard
  std::uint32_t down_ = kShards;
  std::uint64_t next_value_ = 0;
  std::uint64_t failed_down_ = 0, answered_down_ = 0, answered_live_ = 0;
  std::vector<std::string> failures_;
};

class ClusterKillTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("gpukv-cluster-kill-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    const char* binary = std::getenv("GPUKV_SERVER");
    const char* backend = std::getenv("GPUKV_TEST_BACKEND");
    const char* gpus = std::getenv("GPUKV_TEST_GPUS");
    std::vector<std::string> targets;
    for (std::uint32_t i = 0; i < kShards; ++i) {
      std::vector<std::string> env;
      if (gpus != nullptr && std::atoi(gpus) > 0) env.push_back("CUDA_VISIBLE_DEVICES=" + std::to_string(i % std::atoi(gpus)));
      servers_.push_back(std::make_unique<test::ServerProcess>(
          binary != nullptr ? binary : GPUKV_SERVER_BINARY,
          std::vector<std::string>{std::string("--backend=") + (backend != nullptr ? backend : "cpu"), "--capacity=20000",
                                   "--key_width=16", "--value_width=32", "--cpu_threads=1", "--max_queue_delay=100",
                                   "--log_level=warn", "--shard_count=" + std::to_string(kShards),
                                   "--shard_index=" + std::to_string(i)},
          (dir_ / ("shard" + std::to_string(i) + ".log")).string(), std::move(env)));
      targets.push_back(servers_.back()->target());
    }
    for (int c = 0; c < kClients; ++c) clients_.push_back(std::make_unique<KillModelClient>(c, targets));
  }

  void TearDown() override {
    if (HasFailure()) {
      for (std::uint32_t i = 0; i < kShards; ++i) std::printf("--- shard %u log:\n%s\n", i, servers_[i]->log().c_str());
    }
    clients_.clear();
    servers_.clear();
    std::filesystem::remove_all(dir_);
  }

  // Runs every client until `body` returns, keys of `down` allowed to fail.
  template <class Body>
  void under_load(std::uint32_t down, Body body) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (auto& c : clients_) threads.emplace_back([&, client = c.get()] { client->run(stop, down); });
    body();
    stop.store(true);
    for (auto& t : threads) t.join();
  }

  void report() {
    for (auto& c : clients_) {
      for (const std::string& f : c->failures()) ADD_FAILURE() << f;
    }
  }

  std::filesystem::path dir_;
  std::vector<std::unique_ptr<test::ServerProcess>> servers_;
  std::vector<std::unique_ptr<KillModelClient>> clients_;
};

TEST_F(ClusterKillTest, AKilledShardFailsOnlyItsKeysAndAnswersAgainOnceRestarted) {
  under_load(kShards, [] { std::this_thread::sleep_for(1s); });
  report();
  if (HasFailure()) return;

  // SIGKILL in the middle of the load; the clients go on for a while with the shard dead.
  under_load(kVictim, [&] {
    std::this_thread::sleep_for(300ms);
    const int status = servers_[kVictim]->kill(SIGKILL);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    std::this_thread::sleep_for(1500ms);
  });
  report();
  if (HasFailure()) return;
  std::uint64_t failed = 0, live = 0;
  for (auto& c : clients_) {
    failed += c->failed_down();
    live += c->answered_live();
  }
  EXPECT_GT(failed, 0u) << "no call met the dead shard";
  EXPECT_GT(live, 0u);

  // Back on its port, empty: its keys answer again (absent until written).
  servers_[kVictim]->restart();
  for (auto& c : clients_) {
    c->forget_shard(kVictim);
    ASSERT_TRUE(c->reconnect(kVictim)) << "the restarted shard did not answer within 30 s";
  }
  under_load(kShards, [] { std::this_thread::sleep_for(1s); });
  report();
  if (HasFailure()) return;
  for (auto& c : clients_) c->check_contents();
  report();
  std::printf("during the kill: %llu ops failed on the dead shard, %llu answered by the others\n",
              static_cast<unsigned long long>(failed), static_cast<unsigned long long>(live));
}

}  // namespace
}  // namespace gpukv
