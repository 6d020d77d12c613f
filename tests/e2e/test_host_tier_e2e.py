"""End to end: a gpukv-server with a tiny device tier serves a data set many times larger from its host tier.

Starts the real server binary (CPU backend: the same two-tier code the GPU runs, with ordinary memory as the
host tier) on 127.0.0.1 and drives it over gRPC from Python: fills far past the device tier, reads every key
back, overwrites and deletes keys in both tiers, fills both tiers until writes are refused, and checks Stats
and the Prometheus metrics for the host tier.
"""
import re
import urllib.request

from test_server_e2e import Server, kv_pb2, packed

KEYS = 30000


def key(i):
    return f"user:{i:08d}".encode()


def value(i, version=0):
    return f"v{version}-{i}-".encode() * 3


def batch_put(stub, ids, version=0):
    blob, lengths = packed([key(i) for i in ids])
    values = [value(i, version) for i in ids]
    reply = stub.BatchPut(kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=b"".join(values),
                                                 value_lengths=[len(v) for v in values]), timeout=60)
    return reply.results


def batch_get(stub, ids):
    blob, lengths = packed([key(i) for i in ids])
    reply = stub.BatchGet(kv_pb2.BatchGetRequest(keys=blob, key_lengths=lengths), timeout=60)
    out, offset = {}, 0
    for i, result, length in zip(ids, reply.results, reply.value_lengths):
        out[i] = reply.values[offset:offset + length] if result == kv_pb2.RESULT_OK else None
        offset += length
    return out


def tiers(stub):
    stats = stub.Stats(kv_pb2.StatsRequest(), timeout=10)
    return {t.name: t for t in stats.tiers}, stats


def metric(body, name, labels):
    match = re.search(re.escape(name + "{" + labels + "}") + r" ([0-9.e+]+)", body)
    assert match, f"{name}{{{labels}}} not exported"
    return float(match.group(1))


def test_tiny_device_tier_serves_a_much_larger_data_set():
    server = Server("--capacity=1000", f"--host_capacity={2 * KEYS}", "--key_width=16", "--value_width=64")
    try:
        stub = server.stub
        for begin in range(0, KEYS, 5000):
            assert batch_put(stub, range(begin, begin + 5000)) == bytes([kv_pb2.RESULT_OK]) * 5000
        by_tier, stats = tiers(stub)
        device, host = by_tier["device"], by_tier["host"]
        assert device.items == device.max_items, "the device tier fills first"
        assert device.items + host.items == KEYS
        assert host.items > 20 * device.items, "most of the data set lives in the host tier"
        assert stats.host_writes == host.items, "each key placed in the host tier was written there once"

        got = batch_get(stub, range(KEYS))
        assert all(got[i] == value(i) for i in range(KEYS)), "a key was lost or corrupted"
        misses = batch_get(stub, range(10 * KEYS, 10 * KEYS + 5000))
        assert all(v is None for v in misses.values())
        _, after = tiers(stub)
        assert after.host_reads_avoided > 0, "the host tier's tickets rejected nothing"

        # Overwrites and deletes reach keys in both tiers; a deleted key is gone, an overwritten one is new.
        assert batch_put(stub, range(0, KEYS, 7), version=1) == bytes([kv_pb2.RESULT_OK]) * len(range(0, KEYS, 7))
        blob, lengths = packed([key(i) for i in range(3, KEYS, 11)])
        deleted = stub.BatchDelete(kv_pb2.BatchDeleteRequest(keys=blob, key_lengths=lengths), timeout=60)
        assert deleted.results == bytes([kv_pb2.RESULT_OK]) * len(range(3, KEYS, 11))
        got = batch_get(stub, range(KEYS))
        for i in range(KEYS):
            want = None if i % 11 == 3 else value(i, 1) if i % 7 == 0 else value(i)
            assert got[i] == want, i

        # The metrics carry both tiers and the host traffic.
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        by_tier, stats = tiers(stub)
        assert metric(body, "gpukv_items", 'tier="host"') == by_tier["host"].items
        assert metric(body, "gpukv_capacity_slots", 'tier="host"') == by_tier["host"].capacity
        assert metric(body, "gpukv_host_tier_accesses_total", 'kind="read"') == stats.host_reads
        assert metric(body, "gpukv_host_tier_accesses_total", 'kind="write"') == stats.host_writes
        assert metric(body, "gpukv_host_tier_accesses_total", 'kind="avoided"') == stats.host_reads_avoided
    finally:
        assert server.stop() == 0


def test_both_tiers_full_refuse_writes_and_keep_every_key():
    server = Server("--capacity=500", "--host_capacity=3000", "--key_width=16", "--value_width=64")
    try:
        stub = server.stub
        results = batch_put(stub, range(5000))
        stored = [i for i, r in enumerate(results) if r == kv_pb2.RESULT_OK]
        refused = [i for i, r in enumerate(results) if r != kv_pb2.RESULT_OK]
        assert refused and all(results[i] == kv_pb2.RESULT_FULL for i in refused)
        by_tier, _ = tiers(stub)
        assert len(stored) == by_tier["device"].max_items + by_tier["host"].max_items
        # A refused write changed nothing; every stored key is still there.
        got = batch_get(stub, range(5000))
        assert all(got[i] == value(i) for i in stored)
        assert all(got[i] is None for i in refused)
        # The unary form reports the full table as RESOURCE_EXHAUSTED.
        import grpc
        try:
            stub.Put(kv_pb2.PutRequest(key=b"one more", value=b"v"), timeout=10)
            raise AssertionError("a write into two full tiers was accepted")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        assert server.stop() == 0
