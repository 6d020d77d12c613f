// gpukv: the command-line client.
//
//   gpukv [--target=host:port | --targets=host:port,...] [--timeout_ms=N] COMMAND ...
//     get KEY                    prints the value; exit code 1 if absent
//     put KEY VALUE [--if_absent]
//     delete KEY                 exit code 1 if absent
//     batch-get [FILE|-]         one key per line; prints "key<TAB>RESULT<TAB>value"
//     batch-put [FILE|-]         "key<TAB>value" per line; prints "key<TAB>RESULT"
//     batch-delete [FILE|-]      one key per line; prints "key<TAB>RESULT"
//     stream [FILE|-]            "OP<TAB>KEY[<TAB>VALUE]" per line, OP one of get, put, put-if-absent, delete;
//                                sent on one stream in groups of --group ops; prints "OP<TAB>KEY<TAB>RESULT<TAB>value"
//                                per line, in input order (the value of a GET that found its key, else empty)
//     stats                      the server's Stats, as text (a cluster's: the sum over its shards)
//     health                     prints SERVING or NOT_SERVING; exit code 1 unless SERVING (every shard)
//     cluster-stats              every shard's place, items and traffic, and the sum; exit code 1 if a shard's
//                                own --shard_index / --shard_count disagree with its place in --targets
//     shard-of [FILE|-]          one key per line; prints "slot<TAB>shard" for each, over --shard_count shards
//                                (default: as many as --targets lists; asks no server)
//     snapshot                   has the server (every shard, at once) write a snapshot of its table to its data
//                                directory; prints "file<TAB>items<TAB>bytes<TAB>seconds" (a shard's line starts
//                                with its index) once it is durable; waits up to --snapshot_timeout_s
//
// --targets (default $GPUKV_TARGETS) names a cluster's shards in shard order, with {a..b} ranges expanded
// (gpukv-{0..2}.gpukv-shards.gpukv.svc:50051): every key goes to its shard, batch and stream input is split by
// shard and merged back in input order, and a shard that fails prints its error on stderr while its keys read
// UNAVAILABLE.
//
// Keys and values are taken as bytes; batch and stream input is read from stdin when FILE is "-" or missing.
// Exit codes: 0 done, 1 absent / not serving / some batch or stream op not OK, 2 usage or bad input, 3 the
// call (or a shard's part of it) failed. --timeout_ms is the whole stream's deadline for `stream`.
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/flags/usage.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "gpukv/client.hpp"
#include "gpukv/cluster.hpp"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "server address (host:port)");
ABSL_FLAG(std::string, targets, "",
          "a cluster's shards in shard order: host:port,... with {a..b} ranges (default $GPUKV_TARGETS; empty: --target)");
ABSL_FLAG(std::uint32_t, shard_count, 0, "shard-of: the number of shards (0: as many as --targets lists)");
ABSL_FLAG(std::uint32_t, timeout_ms, 5000, "deadline of each call attempt, milliseconds");
ABSL_FLAG(bool, if_absent, false, "put / batch-put: store only keys that are absent");
ABSL_FLAG(std::string, tls_ca, "", "CA certificate (PEM) to trust; plaintext when empty");
ABSL_FLAG(std::string, tls_cert, "", "this client's certificate (PEM), for a server that asks for one (mutual TLS); with --tls_ca");
ABSL_FLAG(std::string, tls_key, "", "the private key (PEM) of --tls_cert");
ABSL_FLAG(std::string, token_file, "", "file holding the bearer token the server asks for (its --auth_token_file)");
ABSL_FLAG(std::uint32_t, group, 100, "stream: operations per group");
ABSL_FLAG(std::uint32_t, snapshot_timeout_s, 600, "snapshot: how long to wait for the snapshot, seconds");


namespace {

namespace v1 = gpukv::v1;

const char* result_name(v1::Result r) { return v1::Result_Name(r).c_str() + 7; }  // drop "RESULT_"

int failed(const grpc::Status& s) {
  std::fprintf(stderr, "gpukv: %s: %s\n", gpukv::client::status_code_name(s.error_code()), s.error_message().c_str());
  return 3;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream file;
  std::istream* in = &std::cin;
  if (!path.empty() && path != "-") {
    file.open(path);
    if (!file) throw std::runtime_error("cannot read " + path);
    in = &file;
  }
  for (std::string line; std::getline(*in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

int usage() {
  std::fprintf(stderr, "usage: gpukv [flags] get KEY | put KEY VALUE | delete KEY | batch-get [FILE] |\n"
                       "             batch-put [FILE] | batch-delete [FILE] | stream [FILE] | stats | health |\n"
                       "             cluster-stats | shard-of [FILE] | snapshot\n");
  return 2;
}

// A cluster's batch call reports the shards whose part failed (their keys read UNAVAILABLE); one server's
// has none. Returns whether any did.
bool report(const std::vector<gpukv::client::ShardFailure>& failures) {
  for (const auto& f : failures) {
    std::fprintf(stderr, "gpukv: %s: %s\n", gpukv::client::status_code_name(f.status.error_code()), f.status.error_message().c_str());
  }
  return !failures.empty();
}

struct StreamOp {
  std::string name;  // as written: get, put, put-if-absent, delete
  v1::OpKind kind;
  std::string key;
  std::string value;
};

// "OP<TAB>KEY[<TAB>VALUE]"; throws std::invalid_argument naming the line.
StreamOp parse_stream_op(const std::string& line, std::size_t number) {
  const auto bad = [&](const std::string& why) { return std::invalid_argument("line " + std::to_string(number) + ": " + why); };
  const auto tab1 = line.find('\t');
  if (tab1 == std::string::npos) throw bad("expected OP<TAB>KEY[<TAB>VALUE], got '" + line + "'");
  const std::string op = line.substr(0, tab1);
  const auto tab2 = line.find('\t', tab1 + 1);
  StreamOp parsed{op, v1::OP_GET, line.substr(tab1 + 1, tab2 == std::string::npos ? std::string::npos : tab2 - tab1 - 1), {}};
  if (op == "get") parsed.kind = v1::OP_GET;
  else if (op == "put") parsed.kind = v1::OP_PUT;
  else if (op == "put-if-absent") parsed.kind = v1::OP_PUT_IF_ABSENT;
  else if (op == "delete") parsed.kind = v1::OP_DELETE;
  else throw bad("unknown op '" + op + "' (get, put, put-if-absent, delete)");
  const bool write = gpukv::client::carries_value(parsed.kind);
  if (write && tab2 == std::string::npos) throw bad(op + " needs KEY<TAB>VALUE");
  if (!write && tab2 != std::string::npos) throw bad(op + " takes a key only");
  if (write) parsed.value = line.substr(tab2 + 1);
  return parsed;
}

// Sends every op on one stream, --group ops per group, and prints one line per op in input order.
template <class ClientType>
int run_stream(ClientType& client, const std::string& path) {
  const std::vector<std::string> lines = read_lines(path);
  std::vector<StreamOp> ops;
  for (std::size_t i = 0; i < lines.size(); ++i) ops.push_back(parse_stream_op(lines[i], i + 1));
  const std::size_t per_group = std::max(1u, absl::GetFlag(FLAGS_group));
  const std::size_t groups = (ops.size() + per_group - 1) / per_group;
  // Written by the callbacks, read after close(), which returns after the last callback.
  std::vector<gpukv::client::GroupResult> results(groups);
  std::vector<grpc::Status> statuses(groups);
  auto stream = client.stream({.max_in_flight = 8});
  gpukv::client::OpGroup group;
  for (std::size_t g = 0; g < groups; ++g) {
    for (std::size_t i = g * per_group; i < std::min(ops.size(), (g + 1) * per_group); ++i) {
      group.add(ops[i].kind, ops[i].key, ops[i].value);
    }
    const grpc::Status sent = stream->send(group, [&, g](const grpc::Status& s, gpukv::client::GroupResult&& r) {
      statuses[g] = s;
      results[g] = std::move(r);
    });
    if (!sent.ok()) break;  // the stream ended; close() says why
  }
  // A cluster's stream ends with its failed shard's status, and that shard's ops read UNAVAILABLE: print
  // what every op got, then the failure.
  const grpc::Status end = stream->close();
  bool all_ok = true;
  for (std::size_t g = 0; g < groups; ++g) {
    if (!statuses[g].ok()) return failed(statuses[g]);
    for (std::size_t j = 0; j < results[g].size(); ++j) {
      const StreamOp& op = ops[g * per_group + j];
      const std::string_view value = results[g].value(j);
      std::printf("%s\t%s\t%s\t%.*s\n", op.name.c_str(), op.key.c_str(), result_name(results[g].result(j)),
                  static_cast<int>(value.size()), value.data());
      all_ok &= results[g].result(j) == v1::RESULT_OK;
    }
  }
  if (!end.ok()) return failed(end);
  return all_ok ? 0 : 1;
}

// One line per shard (its place, as it reports it, and its figures), then the sum. A shard that does not
// answer is shown with its error.
// Snapshots of every server at once (a cluster's shards each write their own); a line per server, prefixed
// with its shard index when there are several.
int snapshot(const std::vector<gpukv::client::Client*>& servers) {
  const std::chrono::milliseconds timeout(std::chrono::seconds(absl::GetFlag(FLAGS_snapshot_timeout_s)));
  std::vector<v1::SnapshotResponse> responses(servers.size());
  std::vector<grpc::Status> statuses(servers.size());
  std::vector<std::thread> callers;
  for (std::size_t i = 0; i < servers.size(); ++i) {
    callers.emplace_back([&, i] { statuses[i] = servers[i]->snapshot(&responses[i], timeout); });
  }
  for (auto& c : callers) c.join();
  int code = 0;
  for (std::size_t i = 0; i < servers.size(); ++i) {
    const std::string shard = servers.size() > 1 ? std::to_string(i) + "\t" : "";
    if (!statuses[i].ok()) {
      std::fprintf(stderr, "gpukv: %s%s: %s\n", shard.c_str(), gpukv::client::status_code_name(statuses[i].error_code()),
                   statuses[i].error_message().c_str());
      code = 3;
      continue;
    }
    const v1::SnapshotResponse& r = responses[i];
    std::printf("%s%s\t%llu\t%llu\t%.3f\n", shard.c_str(), r.file().c_str(), static_cast<unsigned long long>(r.items()),
                static_cast<unsigned long long>(r.bytes()), r.seconds());
  }
  return code;
}

int cluster_stats(gpukv::client::ClusterClient& cluster) {
  const auto shards = cluster.shard_stats();
  std::printf("%-6s %-32s %-8s %-6s %12s %12s %14s %12s %s\n", "shard", "target", "reports", "backend", "items", "max_items",
              "operations", "wrong_shard", "status");
  std::uint64_t items = 0, max_items = 0, operations = 0, wrong = 0;
  bool failed_any = false, mismatch = false;
  for (std::uint32_t s = 0; s < shards.size(); ++s) {
    const v1::StatsResponse& st = shards[s].stats;
    if (!shards[s].status.ok()) {
      failed_any = true;
      std::printf("%-6u %-32s %-8s %-6s %12s %12s %14s %12s %s\n", s, cluster.target(s).c_str(), "-", "-", "-", "-", "-", "-",
                  shards[s].status.error_message().c_str());
      continue;
    }
    std::uint64_t shard_items = 0, shard_max = 0;
    for (const auto& tier : st.tiers()) {
      shard_items += tier.items();
      shard_max += tier.max_items();
    }
    const std::uint32_t count = std::max<std::uint32_t>(1, st.shard_count());
    const bool agrees = st.shard_index() == s && count == cluster.shard_count();
    mismatch |= !agrees;
    const std::string place = std::to_string(st.shard_index()) + "/" + std::to_string(count);
    std::printf("%-6u %-32s %-8s %-6s %12llu %12llu %14llu %12llu %s\n", s, cluster.target(s).c_str(), place.c_str(),
                st.backend().c_str(), static_cast<unsigned long long>(shard_items), static_cast<unsigned long long>(shard_max),
                static_cast<unsigned long long>(st.operations()), static_cast<unsigned long long>(st.wrong_shard_keys()),
                agrees ? "OK" : "MISMATCH: the server's --shard_index/--shard_count disagree with its place in --targets");
    items += shard_items;
    max_items += shard_max;
    operations += st.operations();
    wrong += st.wrong_shard_keys();
  }
  std::printf("%-6s %-32s %-8s %-6s %12llu %12llu %14llu %12llu %s\n", "total", "", "", "", static_cast<unsigned long long>(items),
              static_cast<unsigned long long>(max_items), static_cast<unsigned long long>(operations),
              static_cast<unsigned long long>(wrong), failed_any ? "SOME SHARDS DID NOT ANSWER" : "");
  if (failed_any) return 3;
  return mismatch ? 1 : 0;
}

// Prints "slot<TAB>shard" for each key, asking no server.
int shard_of(std::uint32_t shards, const std::string& path) {
  const gpukv::ShardMap map(shards);
  for (const std::string& key : read_lines(path)) {
    const std::uint32_t slot = gpukv::key_slot(key);
    std::printf("%u\t%u\n", slot, map.shard_of_slot(slot));
  }
  return 0;
}

// The commands that talk to the key-value API, on one server (Client) or a cluster (ClusterClient).
template <class ClientType>
int run_command(ClientType& client, const std::vector<char*>& args) {
  constexpr bool kCluster = std::is_same_v<ClientType, gpukv::client::ClusterClient>;
  const std::string command = args[1];
  const auto arg = [&](std::size_t i) { return i < args.size() ? std::string(args[i]) : std::string(); };
  std::vector<gpukv::client::ShardFailure> failures;
  // A batch call's shard failures, where the client reports them.
  const auto batch = [&](auto&& call) {
    if constexpr (kCluster) {
      return call(&failures);
    } else {
      return call();
    }
  };
  if (command == "get" && args.size() == 3) {
    std::optional<std::string> value;
    if (auto s = client.get(arg(2), &value); !s.ok()) return failed(s);
    if (!value) return 1;
    std::fwrite(value->data(), 1, value->size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  if (command == "put" && args.size() == 4) {
    v1::Result result;
    if (auto s = client.put(arg(2), arg(3), absl::GetFlag(FLAGS_if_absent), &result); !s.ok()) return failed(s);
    std::printf("%s\n", result_name(result));
    return result == v1::RESULT_OK ? 0 : 1;
  }
  if (command == "delete" && args.size() == 3) {
    bool deleted = false;
    if (auto s = client.del(arg(2), &deleted); !s.ok()) return failed(s);
    std::printf("%s\n", deleted ? "OK" : "NOT_FOUND");
    return deleted ? 0 : 1;
  }
  if (command == "batch-get" || command == "batch-delete") {
    const std::vector<std::string> keys = read_lines(arg(2));
    bool all_ok = true;
    if (command == "batch-get") {
      std::vector<gpukv::client::KeyResult> results;
      const grpc::Status s = batch([&](auto... f) { return client.batch_get(keys, &results, f...); });
      if (!s.ok()) return failed(s);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        std::printf("%s\t%s\t%s\n", keys[i].c_str(), result_name(results[i].result), results[i].value.c_str());
        all_ok &= results[i].result == v1::RESULT_OK;
      }
    } else {
      std::vector<v1::Result> results;
      const grpc::Status s = batch([&](auto... f) { return client.batch_delete(keys, &results, f...); });
      if (!s.ok()) return failed(s);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        std::printf("%s\t%s\n", keys[i].c_str(), result_name(results[i]));
        all_ok &= results[i] == v1::RESULT_OK;
      }
    }
    if (report(failures)) return 3;
    return all_ok ? 0 : 1;
  }
  if (command == "batch-put") {
    std::vector<std::pair<std::string, std::string>> entries;
    for (const std::string& line : read_lines(arg(2))) {
      const auto tab = line.find('\t');
      entries.emplace_back(line.substr(0, tab), tab == std::string::npos ? std::string() : line.substr(tab + 1));
    }
    std::vector<v1::Result> results;
    const grpc::Status s = batch([&](auto... f) { return client.batch_put(entries, absl::GetFlag(FLAGS_if_absent), &results, f...); });
    if (!s.ok()) return failed(s);
    bool all_ok = true;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      std::printf("%s\t%s\n", entries[i].first.c_str(), result_name(results[i]));
      all_ok &= results[i] == v1::RESULT_OK;
    }
    if (report(failures)) return 3;
    return all_ok ? 0 : 1;
  }
  if (command == "stream" && args.size() <= 3) return run_stream(client, arg(2));
  if (command == "stats") {
    v1::StatsResponse stats;
    if (auto s = client.stats(&stats); !s.ok()) return failed(s);
    std::printf("%s", stats.DebugString().c_str());
    return 0;
  }
  if (command == "health") {
    bool serving = false;
    if (auto s = client.health(&serving); !s.ok()) return failed(s);
    std::printf("%s\n", serving ? "SERVING" : "NOT_SERVING");
    return serving ? 0 : 1;
  }
  if constexpr (kCluster) {
    if (command == "cluster-stats" && args.size() == 2) return cluster_stats(client);
  }
  return usage();
}

}  // namespace


int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("gpukv: command-line client of the gpukv service");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) return usage();
  const std::string command = args[1];

  gpukv::client::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  std::string targets = absl::GetFlag(FLAGS_targets);
  if (targets.empty() && std::getenv("GPUKV_TARGETS") != nullptr) targets = std::getenv("GPUKV_TARGETS");
  try {
    if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) options.auth_token = gpukv::client::read_token_file(file);
    std::vector<std::string> shards;
    if (!targets.empty()) shards = gpukv::client::parse_targets(targets);
    if (command == "shard-of" && args.size() <= 3) {
      const std::uint32_t count = absl::GetFlag(FLAGS_shard_count);
      return shard_of(count != 0 ? count : std::max<std::uint32_t>(1, static_cast<std::uint32_t>(shards.size())),
                      args.size() == 3 ? std::string(args[2]) : std::string());
    }
    if (command == "cluster-stats" && shards.empty()) shards.push_back(options.target);  // a cluster of one
    if (!shards.empty()) {
      gpukv::client::ClusterClient cluster(gpukv::client::ClusterOptions{shards, options});
      if (command == "snapshot" && args.size() == 2) {
        std::vector<gpukv::client::Client*> servers;
        for (std::uint32_t i = 0; i < cluster.shard_count(); ++i) servers.push_back(&cluster.shard(i));
        return snapshot(servers);
      }
      return run_command(cluster, args);
    }
    gpukv::client::Client client(options);
    if (command == "snapshot" && args.size() == 2) return snapshot({&client});
    return run_command(client, args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpukv: %s\n", e.what());
    return 2;
  }
}
