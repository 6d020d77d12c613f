#include "gpukv/cluster.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "part_call.hpp"
#include "shard_split.hpp"

namespace gpukv::client {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// Appends `item` with its {a..b} range, if any, expanded.
void expand(std::string_view item, std::vector<std::string>* targets) {
  const std::size_t open = item.find('{');
  if (open == std::string_view::npos) {
    if (item.find('}') != std::string_view::npos) throw std::invalid_argument("unmatched '}' in target '" + std::string(item) + "'");
    targets->emplace_back(item);
    return;
  }
  const std::size_t close = item.find('}', open);
  const std::size_t dots = item.find("..", open);
  const auto bad = [&] { return std::invalid_argument("target '" + std::string(item) + "': a range is {first..last}, as in gpukv-{0..2}"); };
  if (close == std::string_view::npos || dots == std::string_view::npos || dots > close ||
      item.find('{', open + 1) != std::string_view::npos) {
    throw bad();
  }
  unsigned first = 0, last = 0;
  const auto number = [&](std::string_view s, unsigned* v) {
    const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), *v);
    return !s.empty() && error == std::errc() && end == s.data() + s.size();
  };
  if (!number(item.substr(open + 1, dots - open - 1), &first) || !number(item.substr(dots + 2, close - dots - 2), &last) ||
      last < first || last - first >= kSlotCount) {
    throw bad();
  }
  for (unsigned i = first; i <= last; ++i) {
    targets->push_back(std::string(item.substr(0, open)) + std::to_string(i) + std::string(item.substr(close + 1)));
  }
}

template <class Request, class Response>
using Launch = typename detail::PartCall<Request, Response>::Launch;

// One batch call over the cluster: its split, the parts in flight, and the merge once the last part is
// answered. Deletes itself after running the caller's callback.
template <class Request, class Response>
class ShardedCall {
 public:
  ShardedCall(ClusterClient& cluster, const Request* request, Response* response, Launch<Request, Response> launch, BatchDone done)
      : cluster_(cluster), request_(request), response_(response), launch_(std::move(launch)), done_(std::move(done)) {}

  void start() {
    if (std::string error = detail::plan_split(cluster_.shard_map(), *request_, &plan_); !error.empty()) {
      finish(BatchOutcome{grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed request: " + error), {}});
      return;
    }
    const std::size_t parts = plan_.shards.size();
    if (parts == 0) {  // no keys: the answer of any server, without asking one
      response_->Clear();
      finish(BatchOutcome{});
      return;
    }
    status_.assign(parts, grpc::Status::OK);
    remaining_.store(parts + 1);  // one more, held until every part has started
    // A call whose keys all belong to one shard goes as it is, its answer straight into the caller's response.
    if (parts > 1) {
      detail::split_request(*request_, plan_, &requests_);
      responses_.resize(parts);
    }
    for (std::size_t p = 0; p < parts; ++p) {
      calls_.push_back(std::make_unique<detail::PartCall<Request, Response>>(
          cluster_.shard(plan_.shards[p]), launch_, parts > 1 ? &requests_[p] : request_,
          parts > 1 ? &responses_[p] : response_, [this, p](grpc::Status status) { part_done(p, std::move(status)); }));
    }
    for (auto& call : calls_) call->start();
    arrive();  // the last to arrive merges and deletes this object: nothing after it
  }

 private:
  void part_done(std::size_t p, grpc::Status status) {
    const Response& answer = plan_.shards.size() > 1 ? responses_[p] : *response_;
    if (status.ok()) {
      if (std::string error = detail::check_part(answer, plan_.part_ops[p]); !error.empty()) {
        status = grpc::Status(grpc::StatusCode::INTERNAL, "malformed response: " + error);
      }
    }
    status_[p] = std::move(status);  // each part writes its own entry; the last to arrive reads them all
    arrive();
  }

  void arrive() {
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    BatchOutcome outcome;
    for (std::size_t q = 0; q < status_.size(); ++q) {
      if (status_[q].ok()) continue;
      const std::uint32_t shard = plan_.shards[q];
      outcome.failures.push_back(ShardFailure{
          shard, grpc::Status(status_[q].error_code(), "shard " + std::to_string(shard) + " (" + cluster_.target(shard) +
                                                           "): " + status_[q].error_message())});
    }
    if (plan_.shards.size() > 1) {
      detail::merge_responses(plan_, responses_, status_, response_);
    } else if (!outcome.failures.empty()) {  // the single part failed: its keys are marked, nothing of it is read
      detail::merge_responses(plan_, std::vector<Response>(1), status_, response_);
    }
    finish(std::move(outcome));
  }

  void finish(BatchOutcome&& outcome) {
    const BatchDone done = std::move(done_);
    delete this;
    done(std::move(outcome));
  }

  ClusterClient& cluster_;
  const Request* request_;
  Response* response_;
  const Launch<Request, Response> launch_;
  BatchDone done_;
  detail::SplitPlan plan_;
  std::vector<Request> requests_;    // per part, when there are several
  std::vector<Response> responses_;
  std::vector<grpc::Status> status_;
  std::atomic<std::size_t> remaining_{0};
  std::vector<std::unique_ptr<detail::PartCall<Request, Response>>> calls_;
};

template <class Request, class Response>
void start_sharded(ClusterClient& cluster, const Request* request, Response* response, Launch<Request, Response> launch,
                   BatchDone done) {
  (new ShardedCall<Request, Response>(cluster, request, response, std::move(launch), std::move(done)))->start();
}

// Runs an asynchronous form and waits for it.
template <class Start>
grpc::Status wait_for(Start start, std::vector<ShardFailure>* failures) {
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  BatchOutcome result;
  start([&](BatchOutcome&& outcome) {
    std::lock_guard lock(m);
    result = std::move(outcome);
    finished = true;
    cv.notify_one();  // under the lock: m and cv are the waiter's
  });
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return finished; });
  if (failures != nullptr) *failures = std::move(result.failures);
  return result.status;
}

}  // namespace

std::vector<std::string> parse_targets(std::string_view spec) {
  std::vector<std::string> targets;
  while (true) {
    const std::size_t comma = spec.find(',');
    const std::string_view item = trim(spec.substr(0, comma));
    if (item.empty()) throw std::invalid_argument("empty target in the list '" + std::string(spec) + "'");
    expand(item, &targets);
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return targets;
}

ClusterClient::ClusterClient(ClusterOptions options)
    : options_(std::move(options)), map_(static_cast<std::uint32_t>(options_.targets.size())) {
  for (const std::string& target : options_.targets) {
    ClientOptions o = options_.client;
    o.target = target;
    shards_.push_back(std::make_unique<Client>(o));
  }
}

grpc::Status ClusterClient::shard_status(std::uint32_t shard, const grpc::Status& status) const {
  if (status.ok()) return status;
  return grpc::Status(status.error_code(), "shard " + std::to_string(shard) + " (" + target(shard) + "): " + status.error_message());
}

grpc::Status ClusterClient::unary_status(std::uint32_t shard, const grpc::Status& status) const {
  if (status.error_code() != grpc::StatusCode::FAILED_PRECONDITION) return shard_status(shard, status);
  return grpc::Status(status.error_code(), status.error_message() + " (this client sends it to shard " + std::to_string(shard) +
                                               " of " + std::to_string(shard_count()) + ", " + target(shard) +
                                               "): the client's target list and the servers' --shard_count disagree");
}

grpc::Status ClusterClient::get(std::string_view key, std::optional<std::string>* value) {
  const std::uint32_t s = shard_of(key);
  return unary_status(s, shards_[s]->get(key, value));
}

grpc::Status ClusterClient::put(std::string_view key, std::string_view value, bool if_absent, v1::Result* result) {
  const std::uint32_t s = shard_of(key);
  return unary_status(s, shards_[s]->put(key, value, if_absent, result));
}

grpc::Status ClusterClient::del(std::string_view key, bool* deleted) {
  const std::uint32_t s = shard_of(key);
  return unary_status(s, shards_[s]->del(key, deleted));
}

void ClusterClient::batch_get_async(const v1::BatchGetRequest* request, v1::BatchGetResponse* response, BatchDone done) {
  start_sharded<v1::BatchGetRequest, v1::BatchGetResponse>(
      *this, request, response, [](auto* stub, auto* c, auto* q, auto* r, auto d) { stub->BatchGet(c, q, r, std::move(d)); },
      std::move(done));
}

void ClusterClient::batch_put_async(const v1::BatchPutRequest* request, v1::BatchPutResponse* response, BatchDone done) {
  start_sharded<v1::BatchPutRequest, v1::BatchPutResponse>(
      *this, request, response, [](auto* stub, auto* c, auto* q, auto* r, auto d) { stub->BatchPut(c, q, r, std::move(d)); },
      std::move(done));
}

void ClusterClient::batch_delete_async(const v1::BatchDeleteRequest* request, v1::BatchDeleteResponse* response, BatchDone done) {
  start_sharded<v1::BatchDeleteRequest, v1::BatchDeleteResponse>(
      *this, request, response, [](auto* stub, auto* c, auto* q, auto* r, auto d) { stub->BatchDelete(c, q, r, std::move(d)); },
      std::move(done));
}

grpc::Status ClusterClient::batch_get(const v1::BatchGetRequest& request, v1::BatchGetResponse* response,
                                      std::vector<ShardFailure>* failures) {
  return wait_for([&](BatchDone done) { batch_get_async(&request, response, std::move(done)); }, failures);
}

grpc::Status ClusterClient::batch_put(const v1::BatchPutRequest& request, v1::BatchPutResponse* response,
                                      std::vector<ShardFailure>* failures) {
  return wait_for([&](BatchDone done) { batch_put_async(&request, response, std::move(done)); }, failures);
}

grpc::Status ClusterClient::batch_delete(const v1::BatchDeleteRequest& request, v1::BatchDeleteResponse* response,
                                         std::vector<ShardFailure>* failures) {
  return wait_for([&](BatchDone done) { batch_delete_async(&request, response, std::move(done)); }, failures);
}

grpc::Status ClusterClient::batch_get(const std::vector<std::string>& keys, std::vector<KeyResult>* results,
                                      std::vector<ShardFailure>* failures) {
  v1::BatchGetRequest req;
  pack_keys(keys, req.mutable_keys(), req.mutable_key_lengths());
  v1::BatchGetResponse resp;
  grpc::Status s = batch_get(req, &resp, failures);
  if (!s.ok()) return s;
  unpack_get_results(resp, keys.size(), results);
  return s;
}

grpc::Status ClusterClient::batch_put(const std::vector<std::pair<std::string, std::string>>& entries, bool if_absent,
                                      std::vector<v1::Result>* results, std::vector<ShardFailure>* failures) {
  const v1::BatchPutRequest req = pack_entries(entries, if_absent);
  v1::BatchPutResponse resp;
  grpc::Status s = batch_put(req, &resp, failures);
  if (!s.ok()) return s;
  results->clear();
  for (const char r : resp.results()) results->push_back(static_cast<v1::Result>(r));
  return s;
}

grpc::Status ClusterClient::batch_delete(const std::vector<std::string>& keys, std::vector<v1::Result>* results,
                                         std::vector<ShardFailure>* failures) {
  v1::BatchDeleteRequest req;
  pack_keys(keys, req.mutable_keys(), req.mutable_key_lengths());
  v1::BatchDeleteResponse resp;
  grpc::Status s = batch_delete(req, &resp, failures);
  if (!s.ok()) return s;
  results->clear();
  for (const char r : resp.results()) results->push_back(static_cast<v1::Result>(r));
  return s;
}

std::unique_ptr<ClusterStream> ClusterClient::stream(const StreamOptions& options) {
  return std::make_unique<ClusterStream>(*this, options);
}

std::vector<ClusterClient::ShardStats> ClusterClient::shard_stats() {
  std::vector<ShardStats> all(shard_count());
  std::vector<std::thread> askers;  // one Stats call per shard at once: a dead shard costs its timeout once
  for (std::uint32_t s = 0; s < shard_count(); ++s) {
    askers.emplace_back([this, s, &all] { all[s].status = shard_status(s, shards_[s]->stats(&all[s].stats)); });
  }
  for (auto& t : askers) t.join();
  return all;
}

grpc::Status ClusterClient::stats(v1::StatsResponse* total) {
  total->Clear();
  const std::vector<ShardStats> all = shard_stats();
  for (const ShardStats& s : all) {
    if (!s.status.ok()) return s.status;
  }
  *total = all[0].stats;
  total->clear_shard_index();
  total->set_shard_count(shard_count());
  for (std::size_t i = 1; i < all.size(); ++i) {
    const v1::StatsResponse& s = all[i].stats;
    for (int t = 0; t < s.tiers_size(); ++t) {
      v1::TierStats* into = nullptr;
      for (v1::TierStats& have : *total->mutable_tiers()) {
        if (have.name() == s.tiers(t).name()) into = &have;
      }
      if (into == nullptr) {
        *total->add_tiers() = s.tiers(t);
        continue;
      }
      into->set_items(into->items() + s.tiers(t).items());
      into->set_capacity(into->capacity() + s.tiers(t).capacity());
      into->set_max_items(into->max_items() + s.tiers(t).max_items());
      into->set_bytes(into->bytes() + s.tiers(t).bytes());
      into->set_tombstones(into->tombstones() + s.tiers(t).tombstones());
    }
    total->set_batches(total->batches() + s.batches());
    total->set_operations(total->operations() + s.operations());
    total->set_tombstones(total->tombstones() + s.tombstones());
    total->set_cleanups(total->cleanups() + s.cleanups());
    total->set_host_reads(total->host_reads() + s.host_reads());
    total->set_host_writes(total->host_writes() + s.host_writes());
    total->set_host_reads_avoided(total->host_reads_avoided() + s.host_reads_avoided());
    total->set_wrong_shard_keys(total->wrong_shard_keys() + s.wrong_shard_keys());
  }
  return grpc::Status::OK;
}

grpc::Status ClusterClient::check() {
  const std::vector<ShardStats> all = shard_stats();
  for (std::uint32_t s = 0; s < all.size(); ++s) {
    if (!all[s].status.ok()) return all[s].status;
    const v1::StatsResponse& st = all[s].stats;
    const std::uint32_t count = std::max<std::uint32_t>(1, st.shard_count());  // a server before cluster mode says 0
    if (st.shard_index() != s || count != shard_count()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "shard " + std::to_string(s) + " (" + target(s) + ") says it is shard " + std::to_string(st.shard_index()) +
                              " of " + std::to_string(count) + ", but this client lists " + std::to_string(shard_count()) +
                              " targets with it at position " + std::to_string(s));
    }
  }
  return grpc::Status::OK;
}

grpc::Status ClusterClient::health(bool* serving) {
  *serving = true;
  for (std::uint32_t s = 0; s < shard_count(); ++s) {
    bool shard_serving = false;
    if (grpc::Status status = shards_[s]->health(&shard_serving); !status.ok()) return shard_status(s, status);
    *serving &= shard_serving;
  }
  return grpc::Status::OK;
}

}  // namespace gpukv::client
