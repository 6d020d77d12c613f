// The durability promise of --data_dir with --wal=batch (and everysec), tested by killing the real server
// process:
//
//   A write answered OK survives kill -9: after the restart every acknowledged write is there with its last
//   acknowledged value, and every acknowledged delete is absent.
//
// Several clients drive a gpukv-server (--wal=batch) with unary and batch PUTs, DELETEs and GETs on keys of
// their own, each keeping a model of what the server acknowledged. At a random moment of each round the
// server gets SIGKILL; calls cut off by it have an unknown outcome, so their keys may hold any value written
// to them since their last known state (or that state). The server restarts on the same port and data
// directory, and a BatchGet of every key is checked against the models: a known key exactly, an unknown
// one within its possibilities (and known again from then on). GPUKV_KILL_ROUNDS sets the rounds (5; the
// long suite runs more); GPUKV_TEST_BACKEND=gpu runs the server on a GPU; GPUKV_SERVER names its binary.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpukv/client.hpp"
#include "support/server_process.hpp"

namespace gpukv {
namespace {

using namespace std::chrono_literals;
using State = std::optional<std::string>;  // a key's value, or absent

constexpr int kClients = 4;
constexpr int kKeysPerClient = 150;

// One client: its keys, what the server acknowledged, and for keys whose last write was cut off, every
// state they may be in.
class DurableModelClient {
 public:
  DurableModelClient(int id, const std::string& target, std::uint64_t seed) : id_(id), rng_(seed) {
    connect(target);
    for (int i = 0; i < kKeysPerClient; ++i) {
      keys_.push_back("c" + std::to_string(id) + ":" + std::to_string(i));
      possible_[keys_.back()] = {State{}};  // absent, known
    }
  }

  void connect(const std::string& target) {
    client::ClientOptions o;
    o.target = target;
    o.timeout = 5s;
    o.max_attempts = 1;  // a retried write could apply twice
    client_ = std::make_unique<client::Client>(o);
  }

  void run(const std::atomic<bool>& stop) {
    while (!stop.load() && failures_.empty()) step();
  }

  // After a restart: every key's state read back must be one the model allows; it is known from then on.
  void check_after_restart() {
    std::vector<client::KeyResult> got;
    const grpc::Status s = client_->batch_get(keys_, &got);
    if (!s.ok() || got.size() != keys_.size()) return fail("BatchGet after the restart failed: " + s.error_message());
    for (std::size_t i = 0; i < keys_.size(); ++i) {
      const State read = got[i].result == v1::RESULT_OK ? State(got[i].value) : State();
      if (got[i].result != v1::RESULT_OK && got[i].result != v1::RESULT_NOT_FOUND) return fail(keys_[i] + ": result " + std::to_string(got[i].result));
      observe(keys_[i], read, "after the restart");
    }
  }

  bool wait_serving() {
    for (auto until = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < until;) {
      bool serving = false;
      if (client_->health(&serving).ok() && serving) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  const std::vector<std::string>& failures() const { return failures_; }
  std::uint64_t acknowledged() const { return acknowledged_; }
  std::uint64_t cut_off() const { return cut_off_; }

 private:
  std::string fresh_value() { return "c" + std::to_string(id_) + "#" + std::to_string(next_value_++); }

  void step() {
    const int form = static_cast<int>(rng_() % 6);
    if (form < 3) {  // unary
      const std::string& key = keys_[rng_() % keys_.size()];
      if (form == 0) {
        const std::string value = fresh_value();
        v1::Result r = v1::RESULT_OK;
        const grpc::Status s = client_->put(key, value, false, &r);
        written(key, State(value), s.ok() && r == v1::RESULT_OK, s);
      } else if (form == 1) {
        bool deleted = false;
        const grpc::Status s = client_->del(key, &deleted);
        written(key, State(), s.ok(), s);
      } else {
        std::optional<std::string> v;
        if (client_->get(key, &v).ok()) observe(key, v, "GET");
      }
      return;
    }
    std::vector<std::string> keys;
    std::set<std::string> seen;  // distinct keys: a batch's repeated key is a rule of its own
    while (keys.size() < 20) {
      const std::string& k = keys_[rng_() % keys_.size()];
      if (seen.insert(k).second) keys.push_back(k);
    }
    if (form == 3) {
      std::vector<std::pair<std::string, std::string>> entries;
      for (const auto& k : keys) entries.emplace_back(k, fresh_value());
      std::vector<v1::Result> results;
      const grpc::Status s = client_->batch_put(entries, false, &results);
      for (std::size_t i = 0; i < entries.size(); ++i) {
        written(entries[i].first, State(entries[i].second), s.ok() && results.size() == entries.size() && results[i] == v1::RESULT_OK, s);
      }
    } else if (form == 4) {
      std::vector<v1::Result> results;
      const grpc::Status s = client_->batch_delete(keys, &results);
      for (const auto& k : keys) written(k, State(), s.ok(), s);
    } else {
      std::vector<client::KeyResult> got;
      if (client_->batch_get(keys, &got).ok() && got.size() == keys.size()) {
        for (std::size_t i = 0; i < keys.size(); ++i) {
          observe(keys[i], got[i].result == v1::RESULT_OK ? State(got[i].value) : State(), "BatchGet");
        }
      }
    }
  }

  // A write of `to` on `key`: acknowledged, it is the key's one state; cut off, one more possibility.
  void written(const std::string& key, const State& to, bool ok, const grpc::Status& s) {
    if (ok) {
      possible_[key] = {to};
      ++acknowledged_;
      return;
    }
    if (s.ok()) return fail(key + ": a write answered without OK in a call that succeeded");
    possible_[key].insert(to);
    ++cut_off_;
  }

  // A state read from the server must be one the model allows. A read sees only writes whose log record is
  // durable (batches run one at a time, each logged before the next), so it is the key's state from now on.
  void observe(const std::string& key, const State& read, const char* how) {
    std::set<State>& states = possible_[key];
    if (states.count(read) == 0) {
      std::string allowed;
      for (const State& st : states) allowed += (st ? "'" + *st + "'" : "absent") + std::string(" ");
      return fail(std::string(how) + ": " + key + " is " + (read ? "'" + *read + "'" : "absent") + ", allowed: " + allowed);
    }
    states = {read};
  }

  void fail(const std::string& why) {
    if (failures_.size() < 10) failures_.push_back("client " + std::to_string(id_) + ": " + why);
  }

  const int id_;
  std::mt19937_64 rng_;
  std::unique_ptr<client::Client> client_;
  std::vector<std::string> keys_;
  std::map<std::string, std::set<State>> possible_;
  std::uint64_t next_value_ = 0;
  std::uint64_t acknowledged_ = 0, cut_off_ = 0;
  std::vector<std::string> failures_;
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : fallback;
}

// Both log policies: with everysec, writes reach the kernel before they are acknowledged and only a machine
// crash (not a killed process) can lose the last second of them, so the promise under kill -9 is the same.
// batch_snapshots also asks for snapshots back to back while the clients run, so that kills land during a
// snapshot's scan, between its file and the removal of the log it supersedes, and after it, and restarts load
// a snapshot and the log after it.
class DurabilityKillTest : public testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Wal, DurabilityKillTest, testing::Values("batch", "everysec", "batch_snapshots"),
                         [](const testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

TEST_P(DurabilityKillTest, EveryAcknowledgedWriteSurvivesKill9) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gpukv-durability-kill-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const char* binary = std::getenv("GPUKV_SERVER");
  const char* backend = std::getenv("GPUKV_TEST_BACKEND");
  const std::string param = GetParam();
  const std::string wal = param.substr(0, param.find('_'));
  const bool snapshots = param.find("snapshots") != std::string::npos;
  test::ServerProcess server(binary != nullptr ? binary : GPUKV_SERVER_BINARY,
                             {std::string("--backend=") + (backend != nullptr ? backend : "cpu"), "--capacity=20000",
                              "--key_width=16", "--value_width=32", "--cpu_threads=1", "--max_queue_delay=100",
                              "--log_level=warn", "--data_dir=" + (dir / "data").string(),
                              "--wal=" + wal, "--snapshot_interval=0"},
                             (dir / "server.log").string());
  std::vector<std::unique_ptr<DurableModelClient>> clients;
  for (int c = 0; c < kClients; ++c) clients.push_back(std::make_unique<DurableModelClient>(c, server.target(), 20261124 + c));

  const int rounds = env_int("GPUKV_KILL_ROUNDS", 5);
  std::mt19937 rng(7);
  std::uint64_t acknowledged = 0, cut_off = 0;
  int total_snapshots = 0;
  for (int round = 0; round < rounds && !HasFailure(); ++round) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (auto& c : clients) threads.emplace_back([&, client = c.get()] { client->run(stop); });
    std::atomic<int> snapshots_taken{0};
    if (snapshots) {
      threads.emplace_back([&] {
        client::ClientOptions o;
        o.target = server.target();
        client::Client admin(o);
        while (!stop.load()) {
          v1::SnapshotResponse r;
          if (admin.snapshot(&r, 10s).ok()) ++snapshots_taken;
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng() % 500));  // a random kill point
    const int status = server.kill(SIGKILL);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "round " << round;
    stop.store(true);
    for (auto& t : threads) t.join();
    total_snapshots += snapshots_taken;

    server.restart();
    for (auto& c : clients) {
      c->connect(server.target());
      ASSERT_TRUE(c->wait_serving()) << "round " << round << ": the restarted server does not serve\n" << server.log();
      c->check_after_restart();
      for (const std::string& f : c->failures()) ADD_FAILURE() << "round " << round << ": " << f;
    }
  }
  for (auto& c : clients) {
    acknowledged += c->acknowledged();
    cut_off += c->cut_off();
  }
  EXPECT_GT(acknowledged, 1000u) << "the load acknowledged too few writes to test anything";
  if (snapshots) EXPECT_GE(total_snapshots, rounds) << "too few snapshots were taken to test them";
  std::printf("%d kill rounds: %llu writes acknowledged, %llu cut off by the kills, %d snapshots\n", rounds,
              static_cast<unsigned long long>(acknowledged), static_cast<unsigned long long>(cut_off), total_snapshots);
  if (HasFailure()) std::printf("--- server log:\n%s\n", server.log().c_str());
  server.kill(SIGKILL);
  std::filesystem::remove_all(dir);
}

// A full disk, for real: the data directory on a small tmpfs, a file filling most of it. Promised: a write the
// log cannot take fails (UNAVAILABLE, naming the log) and is not acknowledged; reads keep working; a snapshot
// fails (INTERNAL, naming the error) and leaves no partial file; once space returns, writes and snapshots
// succeed again; and after kill -9 every acknowledged write is there.
TEST(DurabilityDiskFullTest, WritesFailWhileTheDiskIsFullAndWorkOnceSpaceReturns) {
  if (geteuid() != 0) GTEST_SKIP() << "SKIPPED: mounting a small tmpfs needs root; the disk-full test did not run";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gpukv-disk-full-" + std::to_string(getpid()));
  const std::filesystem::path fs = dir / "fs";
  std::filesystem::create_directories(fs);
  if (std::system(("mount -t tmpfs -o size=512k gpukv-test " + fs.string() + " 2>/dev/null").c_str()) != 0) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "SKIPPED: this machine lets no process mount a tmpfs (a container without CAP_SYS_ADMIN); the "
                    "disk-full test did not run";
  }
  struct Unmount {
    std::filesystem::path fs, dir;
    ~Unmount() {
      std::system(("umount " + fs.string()).c_str());
      std::filesystem::remove_all(dir);
    }
  } unmount{fs, dir};
  {
    std::ofstream filler(fs / "filler", std::ios::binary);
    filler << std::string(400 * 1024, 'f');
  }
  const char* binary = std::getenv("GPUKV_SERVER");
  test::ServerProcess server(binary != nullptr ? binary : GPUKV_SERVER_BINARY,
                             {"--backend=cpu", "--capacity=20000", "--key_width=16", "--value_width=1024", "--cpu_threads=1",
                              "--max_queue_delay=100", "--log_level=warn", "--data_dir=" + (fs / "data").string(), "--wal=batch"},
                             (dir / "server.log").string());
  client::ClientOptions o;
  o.target = server.target();
  o.max_attempts = 1;
  auto client = std::make_unique<client::Client>(o);

  std::map<std::string, std::string> acknowledged;
  const std::string big(1000, 'v');
  grpc::Status refused;
  int i = 0;
  for (; i < 1000; ++i) {
    const std::string key = "k" + std::to_string(i);
    const grpc::Status s = client->put(key, big + std::to_string(i));
    if (!s.ok()) {
      refused = s;
      break;
    }
    acknowledged[key] = big + std::to_string(i);
  }
  ASSERT_FALSE(refused.ok()) << "the disk never filled";
  ASSERT_GT(acknowledged.size(), 10u);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.error_message().find("write-ahead log"), std::string::npos) << refused.error_message();
  EXPECT_FALSE(client->put("another", big).ok()) << "still full: a write of the same size is still refused";

  // Reads keep working.
  std::optional<std::string> v;
  ASSERT_TRUE(client->get("k0", &v).ok());
  EXPECT_EQ(v, acknowledged["k0"]);

  // A snapshot cannot be written either.
  v1::SnapshotResponse snapshot;
  const grpc::Status no_room = client->snapshot(&snapshot, 30s);
  EXPECT_EQ(no_room.error_code(), grpc::StatusCode::INTERNAL) << no_room.error_message();
  EXPECT_NE(no_room.error_message().find("No space left on device"), std::string::npos) << no_room.error_message();
  for (const auto& entry : std::filesystem::directory_iterator(fs / "data")) {
    EXPECT_NE(entry.path().extension(), ".tmp") << "a failed snapshot left " << entry.path();
    EXPECT_NE(entry.path().extension(), ".snap") << "a snapshot exists although none could be written";
  }

  // Space returns: writes and snapshots work again, without a restart.
  std::filesystem::remove(fs / "filler");
  const grpc::Status again = client->put("after", "space returned");
  ASSERT_TRUE(again.ok()) << again.error_message();
  acknowledged["after"] = "space returned";
  const grpc::Status taken = client->snapshot(&snapshot, 30s);
  ASSERT_TRUE(taken.ok()) << taken.error_message();
  // Every acknowledged write, and perhaps the two refused ones: refused for want of a log record, they are in
  // the table all the same (their outcome is unknown to the client, as README says).
  EXPECT_GE(snapshot.items(), acknowledged.size());
  EXPECT_LE(snapshot.items(), acknowledged.size() + 2);

  // And every acknowledged write survives kill -9.
  server.kill(SIGKILL);
  server.restart();
  client = std::make_unique<client::Client>(o);
  bool serving = false;
  for (int t = 0; t < 300 && !(client->health(&serving).ok() && serving); ++t) std::this_thread::sleep_for(20ms);
  for (const auto& [key, value] : acknowledged) {
    ASSERT_TRUE(client->get(key, &v).ok());
    EXPECT_EQ(v, value) << key;
  }
}

// Start-up on a damaged data directory, with the real binary. Promised: a torn last record (a crash
// mid-write) is dropped and the server starts with every acknowledged write; a damaged record before the end
// stops start-up with the file's name and the offset, unless --recover_skip_corrupt is given; a directory
// written with other widths is refused naming both; an empty directory starts empty; a second server on the
// same directory is refused.
TEST(DurabilityStartTest, TornCorruptAndForeignLogsGetWhatIsPromised) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("gpukv-damaged-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::filesystem::path data = dir / "data";
  const char* binary = std::getenv("GPUKV_SERVER");
  const std::vector<std::string> flags = {"--backend=cpu", "--capacity=20000", "--key_width=16", "--value_width=32", "--cpu_threads=1",
                                          "--log_level=info", "--data_dir=" + data.string(), "--wal=batch"};
  test::ServerProcess server(binary != nullptr ? binary : GPUKV_SERVER_BINARY, flags, (dir / "server.log").string());
  client::ClientOptions o;
  o.max_attempts = 1;
  const auto connect = [&] {
    o.target = server.target();
    auto c = std::make_unique<client::Client>(o);
    bool serving = false;
    for (int t = 0; t < 300 && !(c->health(&serving).ok() && serving); ++t) std::this_thread::sleep_for(20ms);
    return c;
  };
  const auto get = [](client::Client& c, const std::string& key) {
    std::optional<std::string> v;
    EXPECT_TRUE(c.get(key, &v).ok());
    return v;
  };
  try {  // one server per directory
    test::ServerProcess second(binary != nullptr ? binary : GPUKV_SERVER_BINARY, flags, (dir / "second.log").string());
    ADD_FAILURE() << "two servers started on one data directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("is in use by another gpukv-server"), std::string::npos) << e.what();
  }
  {
    auto c = connect();
    EXPECT_EQ(get(*c, "a"), std::nullopt) << "an empty directory starts empty";
    for (const char* key : {"a", "b", "c"}) ASSERT_TRUE(c->put(key, std::string("value of ") + key).ok());  // a record each
  }
  server.kill(SIGKILL);
  const std::filesystem::path segment = data / "wal-0000000000000001.log";
  ASSERT_TRUE(std::filesystem::exists(segment));
  std::string bytes;
  {
    std::ifstream in(segment, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto record_end = [&](std::size_t at) {  // a record's header: magic, 0, payload length, sequence number
    std::uint64_t length = 0;
    std::memcpy(&length, bytes.data() + at + 8, 8);
    return at + 24 + length + 8;
  };
  const std::size_t second = record_end(40), third = record_end(second);
  const auto write = [&](const std::string& b) { std::ofstream(segment, std::ios::binary | std::ios::trunc) << b; };

  // A torn last record: the start of a fourth, cut short.
  write(bytes + bytes.substr(second, 20));
  server.restart();
  {
    auto c = connect();
    for (const char* key : {"a", "b", "c"}) EXPECT_EQ(get(*c, key), std::string("value of ") + key) << key;
  }
  EXPECT_NE(server.log().find("dropped a torn last log record"), std::string::npos);
  server.kill(SIGKILL);

  // A flipped byte in the second record's payload: start-up stops, naming the file and the offset.
  std::string damaged = bytes;
  damaged[second + 30] = static_cast<char>(damaged[second + 30] ^ 0x40);
  write(damaged);
  try {
    server.restart();
    ADD_FAILURE() << "a server started on a damaged log";
  } catch (const std::runtime_error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find(segment.string() + " at offset " + std::to_string(second)), std::string::npos) << text;
    EXPECT_NE(text.find("--recover_skip_corrupt"), std::string::npos) << text;
  }
  // Passing over it loses that record's write, and says so.
  server.restart({"--recover_skip_corrupt"});
  {
    auto c = connect();
    EXPECT_EQ(get(*c, "a"), "value of a");
    EXPECT_EQ(get(*c, "b"), std::nullopt) << "the damaged record's write is lost";
    EXPECT_EQ(get(*c, "c"), "value of c");
  }
  EXPECT_NE(server.log().find("passed over damage"), std::string::npos);
  server.kill(SIGKILL);
  EXPECT_LT(third, bytes.size());

  // Other widths: refused, naming both.
  write(bytes);
  try {
    server.restart({"--key_width=32"});
    ADD_FAILURE() << "a server started on a log of other widths";
  } catch (const std::runtime_error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("key width 16 and value width 32; this server has key width 32 and value width 32"), std::string::npos) << text;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpukv
