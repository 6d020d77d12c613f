// gpukv: the command-line client.
//
//   gpukv [--target=host:port] [--timeout_ms=N] COMMAND ...
//     get KEY                    prints the value; exit code 1 if absent
//     put KEY VALUE [--if_absent]
//     delete KEY                 exit code 1 if absent
//     batch-get [FILE|-]         one key per line; prints "key<TAB>RESULT<TAB>value"
//     batch-put [FILE|-]         "key<TAB>value" per line; prints "key<TAB>RESULT"
//     batch-delete [FILE|-]      one key per line; prints "key<TAB>RESULT"
//     stream [FILE|-]            "OP<TAB>KEY[<TAB>VALUE]" per line, OP one of get, put, put-if-absent, delete;
//                                sent on one stream in groups of --group ops; prints "OP<TAB>KEY<TAB>RESULT<TAB>value"
//                                per line, in input order (the value of a GET that found its key, else empty)
//     stats                      the server's Stats, as text
//     health                     prints SERVING or NOT_SERVING; exit code 1 unless SERVING
//
// Keys and values are taken as bytes; batch and stream input is read from stdin when FILE is "-" or missing.
// Exit codes: 0 done, 1 absent / not serving / some batch or stream op not OK, 2 usage or bad input, 3 the
// call failed. --timeout_ms is the whole stream's deadline for `stream`.
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/flags/usage.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "gpukv/client.hpp"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "server address (host:port)");
ABSL_FLAG(std::uint32_t, timeout_ms, 5000, "deadline of each call attempt, milliseconds");
ABSL_FLAG(bool, if_absent, false, "put / batch-put: store only keys that are absent");
ABSL_FLAG(std::string, tls_ca, "", "CA certificate (PEM) to trust; plaintext when empty");
ABSL_FLAG(std::uint32_t, group, 100, "stream: operations per group");


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
                       "             batch-put [FILE] | batch-delete [FILE] | stream [FILE] | stats | health\n");
  return 2;
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
  const bool write = parsed.kind == v1::OP_PUT || parsed.kind == v1::OP_PUT_IF_ABSENT;
  if (write && tab2 == std::string::npos) throw bad(op + " needs KEY<TAB>VALUE");
  if (!write && tab2 != std::string::npos) throw bad(op + " takes a key only");
  if (write) parsed.value = line.substr(tab2 + 1);
  return parsed;
}

// Sends every op on one stream, --group ops per group, and prints one line per op in input order.
int run_stream(gpukv::client::Client& client, const std::string& path) {
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
  if (grpc::Status end = stream->close(); !end.ok()) return failed(end);
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
  return all_ok ? 0 : 1;
}

}  // namespace


int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("gpukv: command-line client of the gpukv service");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) return usage();
  const std::string command = args[1];
  const auto arg = [&](std::size_t i) { return i < args.size() ? std::string(args[i]) : std::string(); };

  gpukv::client::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  try {
    gpukv::client::Client client(options);
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
        if (auto s = client.batch_get(keys, &results); !s.ok()) return failed(s);
        for (std::size_t i = 0; i < keys.size(); ++i) {
          std::printf("%s\t%s\t%s\n", keys[i].c_str(), result_name(results[i].result), results[i].value.c_str());
          all_ok &= results[i].result == v1::RESULT_OK;
        }
      } else {
        std::vector<v1::Result> results;
        if (auto s = client.batch_delete(keys, &results); !s.ok()) return failed(s);
        for (std::size_t i = 0; i < keys.size(); ++i) {
          std::printf("%s\t%s\n", keys[i].c_str(), result_name(results[i]));
          all_ok &= results[i] == v1::RESULT_OK;
        }
      }
      return all_ok ? 0 : 1;
    }
    if (command == "batch-put") {
      std::vector<std::pair<std::string, std::string>> entries;
      for (const std::string& line : read_lines(arg(2))) {
        const auto tab = line.find('\t');
        entries.emplace_back(line.substr(0, tab), tab == std::string::npos ? std::string() : line.substr(tab + 1));
      }
      std::vector<v1::Result> results;
      if (auto s = client.batch_put(entries, absl::GetFlag(FLAGS_if_absent), &results); !s.ok()) return failed(s);
      bool all_ok = true;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        std::printf("%s\t%s\n", entries[i].first.c_str(), result_name(results[i]));
        all_ok &= results[i] == v1::RESULT_OK;
      }
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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpukv: %s\n", e.what());
    return 2;
  }
  return usage();
}
