// gpukv-load: a closed-loop load generator for the gpukv service.
//
//   gpukv-load --target=127.0.0.1:50051 --mode=batch --batch=100 --callers=64 --seconds=10 \
//              --keys=1000000 --distribution=zipf --get=0.5 --put=0.45 --delete=0.05
//
// Each of --callers threads keeps one call in flight: a unary call per key (mode unary), a batch call of
// --batch keys (mode batch, one op kind per call, drawn from the mix), or a packed group of --batch ops on a
// bidirectional stream (mode stream, --depth groups in flight per stream). Prints a progress line every
// second, then keys/s, calls/s and the latency percentiles of calls (or stream groups).
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpukv/client.hpp"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "server address");
ABSL_FLAG(std::string, mode, "unary", "unary, batch or stream");
ABSL_FLAG(std::uint32_t, batch, 100, "keys per batch call or per stream group");
ABSL_FLAG(std::uint32_t, depth, 4, "stream mode: groups in flight per stream");
ABSL_FLAG(std::uint32_t, callers, 16, "concurrent callers (threads)");
ABSL_FLAG(double, seconds, 10, "run time");
ABSL_FLAG(std::uint64_t, keys, 1000000, "key space");
ABSL_FLAG(std::string, distribution, "uniform", "uniform or zipf");
ABSL_FLAG(double, zipf, 0.99, "zipf exponent");
ABSL_FLAG(double, get, 0.5, "share of GETs");
ABSL_FLAG(double, put, 0.45, "share of PUTs (the rest are DELETEs)");
ABSL_FLAG(std::uint32_t, value_size, 8, "value bytes");
ABSL_FLAG(std::uint32_t, timeout_ms, 10000, "deadline of each call");

namespace {

namespace v1 = gpukv::v1;
using Clock = std::chrono::steady_clock;

// Zipf over [0, n) by inverting the continuous approximation of its CDF: cheap per draw, close enough to
// concentrate load the way a skewed workload does.
class KeyChooser {
 public:
  KeyChooser(std::uint64_t n, bool zipf, double s) : n_(n), zipf_(zipf), s_(s) {}
  std::uint64_t next(std::mt19937_64& rng) {
    if (!zipf_) return std::uniform_int_distribution<std::uint64_t>(0, n_ - 1)(rng);
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    const double x = s_ == 1.0 ? std::pow(static_cast<double>(n_), u)
                               : std::pow(u * (std::pow(static_cast<double>(n_), 1 - s_) - 1) + 1, 1 / (1 - s_));
    return std::min<std::uint64_t>(n_ - 1, static_cast<std::uint64_t>(x) - 1);
  }

 private:
  std::uint64_t n_;
  bool zipf_;
  double s_;
};

std::string key_of(std::uint64_t k) { return "key:" + std::to_string(k); }

struct Totals {
  std::atomic<std::uint64_t> keys{0}, calls{0}, errors{0};
  std::mutex mutex;
  std::vector<double> latencies_us;  // merged per-call latencies
};

v1::OpKind pick(std::mt19937_64& rng, double get, double put) {
  const double r = std::uniform_real_distribution<double>(0, 1)(rng);
  return r < get ? v1::OP_GET : r < get + put ? v1::OP_PUT : v1::OP_DELETE;
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "unary" && mode != "batch" && mode != "stream") {
    std::fprintf(stderr, "--mode must be unary, batch or stream\n");
    return 2;
  }
  const std::uint32_t batch = std::max(1u, absl::GetFlag(FLAGS_batch));
  const double get = absl::GetFlag(FLAGS_get), put = absl::GetFlag(FLAGS_put);
  const std::string value(absl::GetFlag(FLAGS_value_size), 'v');
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
  Totals totals;

  gpukv::client::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  options.max_attempts = 1;  // measure the server, not the retries

  const auto caller = [&](std::uint32_t id) {
    gpukv::client::Client client(options);
    std::mt19937_64 rng(id * 7919 + 1);
    KeyChooser keys(absl::GetFlag(FLAGS_keys), absl::GetFlag(FLAGS_distribution) == "zipf", absl::GetFlag(FLAGS_zipf));
    std::vector<double> lat;
    const auto record = [&](Clock::time_point start, std::uint64_t n, bool ok) {
      lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
      totals.keys += n;
      totals.calls += 1;
      if (!ok) totals.errors += 1;
    };
    if (mode == "stream") {
      grpc::ClientContext ctx;
      auto stream = client.stub().Stream(&ctx);
      std::vector<Clock::time_point> sent;  // per group id, when it was written
      std::uint64_t next_id = 0, received = 0;
      const auto send = [&] {
        v1::StreamRequest req;
        req.set_id(next_id++);
        for (std::uint32_t i = 0; i < batch; ++i) {
          const v1::OpKind kind = pick(rng, get, put);
          req.mutable_ops()->push_back(static_cast<char>(kind));
          const std::string k = key_of(keys.next(rng));
          req.mutable_keys()->append(k);
          req.add_key_lengths(static_cast<std::uint32_t>(k.size()));
          if (kind == v1::OP_PUT) {
            req.mutable_values()->append(value);
            req.add_value_lengths(static_cast<std::uint32_t>(value.size()));
          }
        }
        sent.push_back(Clock::now());
        return stream->Write(req);
      };
      bool open = true;
      for (std::uint32_t i = 0; i < absl::GetFlag(FLAGS_depth) && open; ++i) open = send();
      v1::StreamResponse resp;
      while (open && stream->Read(&resp)) {
        record(sent[resp.id()], resp.results().size(), true);
        ++received;
        if (Clock::now() < deadline) open = send();
        else if (received == next_id) break;
      }
      stream->WritesDone();
      while (received < next_id && stream->Read(&resp)) ++received;
      if (!stream->Finish().ok()) totals.errors += 1;
    } else {
      while (Clock::now() < deadline) {
        const v1::OpKind kind = pick(rng, get, put);
        const auto start = Clock::now();
        grpc::Status s;
        if (mode == "unary") {
          const std::string k = key_of(keys.next(rng));
          if (kind == v1::OP_GET) {
            std::optional<std::string> v;
            s = client.get(k, &v);
          } else if (kind == v1::OP_PUT) {
            s = client.put(k, value);
          } else {
            s = client.del(k);
          }
          record(start, 1, s.ok());
        } else {
          std::vector<std::string> ks(batch);
          for (auto& k : ks) k = key_of(keys.next(rng));
          if (kind == v1::OP_GET) {
            std::vector<gpukv::client::KeyResult> r;
            s = client.batch_get(ks, &r);
          } else if (kind == v1::OP_PUT) {
            std::vector<std::pair<std::string, std::string>> entries;
            for (auto& k : ks) entries.emplace_back(std::move(k), value);
            std::vector<v1::Result> r;
            s = client.batch_put(entries, false, &r);
          } else {
            std::vector<v1::Result> r;
            s = client.batch_delete(ks, &r);
          }
          record(start, batch, s.ok());
        }
      }
    }
    std::lock_guard lock(totals.mutex);
    totals.latencies_us.insert(totals.latencies_us.end(), lat.begin(), lat.end());
  };

  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (std::uint32_t i = 0; i < absl::GetFlag(FLAGS_callers); ++i) threads.emplace_back(caller, i);
  std::uint64_t last_keys = 0;
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const std::uint64_t k = totals.keys.load();
    std::fprintf(stderr, "progress: %.0f keys/s, %llu errors\n", static_cast<double>(k - last_keys),
                 static_cast<unsigned long long>(totals.errors.load()));
    last_keys = k;
  }
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double>& lat = totals.latencies_us;
  std::printf("RESULT load mode=%s batch=%u callers=%u distribution=%s keys_per_s=%.0f calls_per_s=%.0f p50_us=%.0f "
              "p99_us=%.0f p999_us=%.0f errors=%llu\n",
              mode.c_str(), mode == "unary" ? 1u : batch, absl::GetFlag(FLAGS_callers), absl::GetFlag(FLAGS_distribution).c_str(),
              static_cast<double>(totals.keys.load()) / elapsed, static_cast<double>(totals.calls.load()) / elapsed,
              percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 0.999),
              static_cast<unsigned long long>(totals.errors.load()));
  return totals.errors.load() == 0 ? 0 : 1;
}
