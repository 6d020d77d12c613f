"""End-to-end: the limits on what the real gpukv-server binary takes at once, whoever asks.

Promised (README, "Access"): past --max_concurrent_calls unary calls in flight, or --max_streams open streams, a
new call is refused RESOURCE_EXHAUSTED at once, naming the flag, runs nothing, and is counted in
gpukv_limit_refusals_total{limit=...}; the calls in flight are served and the server takes new calls once they
end. A request over --max_message_bytes is refused RESOURCE_EXHAUSTED and stores nothing, and a read whose values
could not fit a response is refused naming the limit. One connection runs at most --max_calls_per_connection
calls at once (the rest wait in it), and one without calls for --max_connection_idle_s is closed. Memory
follows the table's widths: wide values do not reserve --batch_size batches of them.
"""
import queue
import re
import time

import grpc
import pytest

from test_server_e2e import Server, kv_pb2


def items(server):
    return sum(t.items for t in server.stub.Stats(kv_pb2.StatsRequest(), timeout=10).tiers)


def test_calls_past_the_limit_in_flight_are_refused_at_once_and_run_nothing():
    # Each call waits for its batch a full second (a batch of 65536 never fills), so the first three stay in
    # flight while the others come.
    s = Server("--capacity=20000", "--key_width=16", "--value_width=64", "--max_concurrent_calls=3",
               "--max_queue_delay=1000000", "--launch_when_idle=false")
    try:
        futures = [s.stub.Put.future(kv_pb2.PutRequest(key=b"c%d" % i, value=b"v"), timeout=20) for i in range(3)]
        time.sleep(0.3)  # the three reach the server and wait there for their batch (a second)
        refused = []
        for i in range(3, 6):
            with pytest.raises(grpc.RpcError) as err:
                s.stub.Put(kv_pb2.PutRequest(key=b"c%d" % i, value=b"v"), timeout=20)
            refused.append(err.value)
        assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused), refused
        assert "--max_concurrent_calls" in refused[0].details(), refused[0].details()
        assert [f.result().result for f in futures] == [kv_pb2.RESULT_OK] * 3
        assert s.counter("gpukv_limit_refusals_total", limit="calls") == 3
        assert items(s) == 3, "a refused call stored its key"
        # Once the calls in flight are answered, new ones are taken.
        assert s.stub.Put(kv_pb2.PutRequest(key=b"after", value=b"v"), timeout=20).result == kv_pb2.RESULT_OK
    finally:
        assert s.stop() == 0


def test_streams_past_the_limit_are_refused_and_a_closed_one_frees_its_place():
    s = Server("--capacity=20000", "--key_width=16", "--value_width=64", "--max_streams=2")
    try:
        def open_stream():
            requests = queue.Queue()
            replies = s.stub.Stream(iter(requests.get, None), timeout=30)
            requests.put(kv_pb2.StreamRequest(id=1, ops=bytes([kv_pb2.OP_GET]), keys=b"k", key_lengths=[1]))
            assert next(replies).id == 1  # the stream is open in the server
            return requests, replies

        streams = [open_stream(), open_stream()]
        third = s.stub.Stream(iter([kv_pb2.StreamRequest(id=9, ops=bytes([kv_pb2.OP_PUT]), keys=b"x", key_lengths=[1],
                                                         values=b"v", value_lengths=[1])]), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            list(third)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max_streams" in err.value.details()
        assert s.counter("gpukv_limit_refusals_total", limit="streams") == 1
        assert not s.stub.Get(kv_pb2.GetRequest(key=b"x"), timeout=10).found, "the refused stream's PUT ran"
        requests, replies = streams.pop()
        requests.put(None)  # half-close: the stream ends and frees its place
        assert list(replies) == []
        streams.append(open_stream())  # the freed place is taken
    finally:
        for requests, _ in streams:
            requests.put(None)
        assert s.stop() == 0


def test_a_request_over_the_message_limit_is_refused_and_stores_nothing():
    s = Server("--capacity=100000", "--key_width=16", "--value_width=64", "--max_message_bytes=1048576")
    try:
        keys = [b"m%07d" % i for i in range(20000)]
        values = b"v" * 64 * len(keys)  # 1.28 MB of values alone
        big = kv_pb2.BatchPutRequest(keys=b"".join(keys), key_lengths=[len(k) for k in keys], values=values,
                                     value_lengths=[64] * len(keys))
        with pytest.raises(grpc.RpcError) as err:
            s.stub.BatchPut(big, timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
        assert items(s) == 0
        # 20000 GETs of 64-byte values could answer 1.28 MB: refused before anything is reserved.
        with pytest.raises(grpc.RpcError) as err:
            s.stub.BatchGet(kv_pb2.BatchGetRequest(keys=b"".join(keys), key_lengths=[len(k) for k in keys]), timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "over the 1048576 bytes a response carries (--max_message_bytes)" in err.value.details()
        half = keys[:8000]  # 512 KB of values: taken
        s.stub.BatchPut(kv_pb2.BatchPutRequest(keys=b"".join(half), key_lengths=[len(k) for k in half],
                                               values=b"v" * 64 * len(half), value_lengths=[64] * len(half)), timeout=30)
        assert items(s) == len(half)
    finally:
        assert s.stop() == 0


def test_a_table_of_wide_values_reserves_what_its_batches_need_not_what_the_flag_says():
    """--value_width=65536 with 1000 slots reserved 26 GB of address space (three staged batches of --batch_size
    65536 operations of 64 KiB values); batches at that width take 2047 operations, so the server stays under
    4 GB of address space, and a value of the full width is stored and read back."""
    s = Server("--capacity=1000", "--key_width=16", "--value_width=65536")
    try:
        status = open(f"/proc/{s.proc.pid}/status").read()
        vm_kb = int(re.search(r"VmSize:\s+(\d+) kB", status).group(1))
        assert vm_kb < 4 << 20, f"the server reserves {vm_kb >> 20} GB of address space"
        value = bytes(range(256)) * 256
        assert s.stub.Put(kv_pb2.PutRequest(key=b"wide", value=value), timeout=10).result == kv_pb2.RESULT_OK
        got = s.stub.Get(kv_pb2.GetRequest(key=b"wide"), timeout=10)
        assert got.found and got.value == value
    finally:
        assert s.stop() == 0


def test_one_connection_runs_at_most_its_share_of_calls_and_the_rest_wait_in_it():
    """--max_calls_per_connection=2 (HTTP/2 concurrent streams): four calls sent at once on one connection reach
    the server two at a time, so a server that takes three calls in flight refuses none of them; the calls
    beyond the connection's share wait in the client instead of failing."""
    s = Server("--capacity=20000", "--key_width=16", "--value_width=64", "--max_calls_per_connection=2",
               "--max_concurrent_calls=3", "--max_queue_delay=300000", "--launch_when_idle=false")
    try:
        futures = [s.stub.Put.future(kv_pb2.PutRequest(key=b"p%d" % i, value=b"v"), timeout=30) for i in range(4)]
        assert [f.result().result for f in futures] == [kv_pb2.RESULT_OK] * 4
        assert s.counter("gpukv_limit_refusals_total", limit="calls") == 0
    finally:
        assert s.stop() == 0


def test_a_connection_without_calls_is_closed_after_the_idle_time_and_the_client_comes_back():
    s = Server("--capacity=20000", "--max_connection_idle_s=1")
    try:
        assert s.stub.Put(kv_pb2.PutRequest(key=b"i", value=b"v"), timeout=10).result == kv_pb2.RESULT_OK
        states = []
        s.channel.subscribe(states.append, try_to_connect=False)
        deadline = time.monotonic() + 20
        while grpc.ChannelConnectivity.IDLE not in states[1:] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert grpc.ChannelConnectivity.IDLE in states[1:], f"the connection was kept: {states}"
        assert s.stub.Get(kv_pb2.GetRequest(key=b"i"), timeout=10).found  # reconnects on its next call
    finally:
        assert s.stop() == 0
