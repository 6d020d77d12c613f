"""End-to-end: shutdown on time, against what README promises: on SIGTERM or SIGINT the server stops taking
calls, finishes the queued ones, cancels whatever is still open --shutdown_grace_ms later, and exits within that
time (plus a small margin for the process itself), whatever its clients do: an idle connection, a Stream the
client never closes, a Stream whose client never reads its answers, calls arriving all along.
"""
import signal
import threading
import time

import grpc
import pytest

from test_server_e2e import Server, kv_pb2, packed

GRACE_MS = 2000
MARGIN_S = 2.0  # the process's own exit: threads joined, the metrics endpoint closed


def stop_within(server, sig):
    start = time.monotonic()
    code = server.stop(sig, timeout=30)
    return code, time.monotonic() - start


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_idle_server_with_a_connection_stops_at_once(sig):
    s = Server("--capacity=20000", f"--shutdown_grace_ms={GRACE_MS}")
    s.stub.Put(kv_pb2.PutRequest(key=b"k", value=b"v"), timeout=10)  # the connection stays open
    code, took = stop_within(s, sig)
    assert code == 0 and took < MARGIN_S, took


def test_a_stream_the_client_keeps_open_is_cancelled_at_the_grace_time():
    s = Server("--capacity=20000", f"--shutdown_grace_ms={GRACE_MS}")
    release = threading.Event()

    def requests():
        yield kv_pb2.StreamRequest(id=1, ops=bytes([kv_pb2.OP_PUT]), keys=b"k", key_lengths=[1], values=b"v",
                                   value_lengths=[1])
        release.wait(60)  # never half-closes while the server stops

    call = s.stub.Stream(requests(), timeout=60)
    assert next(call).results == bytes([kv_pb2.RESULT_OK])
    code, took = stop_within(s, signal.SIGTERM)
    release.set()
    assert code == 0 and took < GRACE_MS / 1000 + MARGIN_S, took
    with pytest.raises(grpc.RpcError):  # the call ended with the server, not silently
        for _ in call:
            pass


def test_a_stream_whose_client_never_reads_does_not_hold_the_server():
    s = Server("--capacity=200000", "--value_width=1024", f"--shutdown_grace_ms={GRACE_MS}")
    keys = [f"k{i}".encode() for i in range(200)]
    blob, lengths = packed(keys)
    put = kv_pb2.StreamRequest(ops=bytes([kv_pb2.OP_PUT]) * 200, keys=blob, key_lengths=lengths, values=b"x" * 200 * 1000,
                               value_lengths=[1000] * 200)
    s.stub.Stream(iter([put]), timeout=30).next()
    get = kv_pb2.StreamRequest(ops=bytes([kv_pb2.OP_GET]) * 200, keys=blob, key_lengths=lengths)
    stop = threading.Event()

    def requests():  # about 200 KB of answers each, never read
        i = 0
        while not stop.is_set() and i < 2000:
            get.id = i
            yield get
            i += 1
        stop.wait(60)

    call = s.stub.Stream(requests(), timeout=60)  # the response iterator is never read
    time.sleep(1.0)
    code, took = stop_within(s, signal.SIGTERM)
    stop.set()
    call.cancel()
    assert code == 0 and took < GRACE_MS / 1000 + MARGIN_S, took


def test_under_load_the_server_stops_within_the_grace_time():
    s = Server("--capacity=4000000", f"--shutdown_grace_ms={GRACE_MS}")
    stop = threading.Event()

    def writer(w):
        i = 0
        while not stop.is_set():
            keys = [f"{w}:{i + j}".encode() for j in range(500)]
            blob, lengths = packed(keys)
            try:
                s.stub.BatchPut(kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=b"v" * 500,
                                                       value_lengths=[1] * 500), timeout=30)
            except grpc.RpcError:
                time.sleep(0.01)
            except ValueError:  # the test closed the channel once the server was gone
                return
            i += 500

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    code, took = stop_within(s, signal.SIGTERM)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert code == 0 and took < GRACE_MS / 1000 + MARGIN_S, took
