"""End-to-end fuzzing of every RPC of the real server binary: random bytes and mutations of valid encodings of
each request message (bit flips, cut-offs, inserted and overwritten bytes, repeated stretches), sent raw through
gRPC. Promised: the server never crashes or hangs, whatever it is sent; a call it rejects (any status but OK)
changes no stored data; data no fuzzed call names (canary keys) is untouched at the end; and bytes that do not
parse as the request are answered INVALID_ARGUMENT naming the message expected (a Stream answers the requests
before such a message and then ends INVALID_ARGUMENT, running nothing of it or after it).

FUZZ_CALLS sets the calls per RPC (1000; GPUKV_LONG=1: 100000). GPUKV_SERVER may name an AddressSanitizer build
(tests/run_all.sh runs this file against one too).
"""
import os
import random

import grpc
import pytest

from test_server_e2e import Server, kv_pb2, packed

CALLS = int(os.environ.get("FUZZ_CALLS", 100000 if os.environ.get("GPUKV_LONG") == "1" else 1000))
SERVICE = "/gpukv.v1.KeyValue/"
# What a fuzzed call may end with: served, refused as bad input, or refused as too large to take.
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
# Bytes no request message parses from: field 31 of wire type 7 (no such type), and a length-delimited
# field 1 whose length runs past the end.
UNPARSABLE = [b"\xff", b"\x0a\x05ab", b"\x08"]


def seeds():
    """A valid request of each method, serialized: what the mutations start from."""
    keys = [b"fz:a", b"fz:bb", b"fz:" + b"c" * 12]
    blob, lengths = packed(keys)
    values = [b"1", b"22", b"x" * 30]
    return {
        "Get": kv_pb2.GetRequest(key=b"fz:a"),
        "Put": kv_pb2.PutRequest(key=b"fz:a", value=b"v", if_absent=False),
        "Delete": kv_pb2.DeleteRequest(key=b"fz:bb"),
        "BatchGet": kv_pb2.BatchGetRequest(keys=blob, key_lengths=lengths),
        "BatchPut": kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=b"".join(values),
                                           value_lengths=[len(v) for v in values]),
        "BatchDelete": kv_pb2.BatchDeleteRequest(keys=blob, key_lengths=lengths),
        "Stream": kv_pb2.StreamRequest(id=7, ops=bytes([kv_pb2.OP_PUT, kv_pb2.OP_GET, kv_pb2.OP_DELETE]), keys=blob,
                                       key_lengths=lengths, values=b"1", value_lengths=[1]),
        "Stats": kv_pb2.StatsRequest(),
    }


def mutate(rng, data):
    b = bytearray(data)
    kind = rng.randrange(7)
    if kind == 0 or not b:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 80)))
    for _ in range(1 + rng.randrange(3)):
        if not b:
            break
        at = rng.randrange(len(b))
        if kind == 1:
            b[at] ^= 1 << rng.randrange(8)
        elif kind == 2:
            del b[at:]
        elif kind == 3:
            b[at:at] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 9)))
        elif kind == 4:
            b[at] = rng.getrandbits(8)
        elif kind == 5:
            end = min(len(b), at + rng.randrange(1, 16))
            b[at:at] = b[at:end] * rng.randrange(1, 4)
        else:  # a length or a varint pushed to its extreme
            b[at] = rng.choice([0x00, 0x7F, 0x80, 0xFF])
    return bytes(b)


@pytest.fixture(scope="module")
def server():
    s = Server("--capacity=20000", "--key_width=16", "--value_width=64")
    yield s
    assert s.proc.poll() is None, "the server died during the fuzzing"
    assert s.stop() == 0


def parses(message, data):
    try:
        message.FromString(data)
        return True
    except Exception:  # the protobuf runtime's DecodeError, whichever runtime is installed
        return False


def canaries(server):
    keys = [f"canary:{i}".encode() for i in range(50)]
    blob, lengths = packed(keys)
    return keys, blob, lengths


def items(server):
    return sum(t.items for t in server.stub.Stats(kv_pb2.StatsRequest(), timeout=10).tiers)


@pytest.mark.parametrize("method", ["Get", "Put", "Delete", "BatchGet", "BatchPut", "BatchDelete", "Stream", "Stats"])
def test_fuzzed_requests_never_crash_the_server_and_rejected_ones_change_nothing(server, method):
    keys, blob, lengths = canaries(server)
    values = [b"canary-value-" + k for k in keys]
    server.stub.BatchPut(kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=b"".join(values),
                                                value_lengths=[len(v) for v in values]), timeout=10)
    seed = seeds()[method].SerializeToString()
    rng = random.Random(hash(method) & 0xFFFF)
    writes = method in ("Put", "Delete", "BatchPut", "BatchDelete", "Stream")
    codes = {}
    if method == "Stream":
        call = server.channel.stream_stream(SERVICE + method, request_serializer=None, response_deserializer=None)
        # Streams of a few requests each, so that a stream the server ends early does not end the fuzzing.
        # Half the streams carry only messages that parse, since one that does not ends its stream there.
        for n in range(max(1, CALLS // 10)):
            requests = [mutate(rng, seed) for _ in range(10)]
            if n % 2 == 0:
                requests = [r if parses(kv_pb2.StreamRequest, r) else seed for r in requests]
            try:
                for _ in call(iter(requests), timeout=10):
                    pass
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
            codes[code] = codes.get(code, 0) + 1
            assert code != grpc.StatusCode.DEADLINE_EXCEEDED, "a fuzzed stream hung"
            assert code in ALLOWED, f"a fuzzed stream ended {code}: {requests!r}"
    else:
        call = server.channel.unary_unary(SERVICE + method, request_serializer=None, response_deserializer=None)
        for i in range(CALLS):
            request = mutate(rng, seed)
            # Whether a rejected call changed anything: the live-key count around it (exact, since nothing else
            # runs), on every call of the normal run and every 50th of the long one.
            check = writes and (CALLS <= 1000 or i % 50 == 0)
            before = items(server) if check else None
            try:
                call(request, timeout=10)
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
            codes[code] = codes.get(code, 0) + 1
            assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"a fuzzed {method} hung: {request!r}"
            assert code in ALLOWED, f"a fuzzed {method} ended {code}: {request!r}"
            if check and code != grpc.StatusCode.OK:
                assert items(server) == before, f"a rejected {method} ({code}) changed the table: {request!r}"
    assert server.proc.poll() is None, f"the server died fuzzing {method}; status counts {codes}"
    got = server.stub.BatchGet(kv_pb2.BatchGetRequest(keys=blob, key_lengths=lengths), timeout=10)
    assert got.results == bytes([kv_pb2.RESULT_OK]) * len(keys)
    assert got.values == b"".join(values), "a fuzzed call changed keys it did not name"
    print(f"{method}: {sum(codes.values())} calls, {dict((c.name, n) for c, n in codes.items())}")


@pytest.mark.parametrize("method,message", [
    ("Get", "GetRequest"), ("Put", "PutRequest"), ("Delete", "DeleteRequest"), ("BatchGet", "BatchGetRequest"),
    ("BatchPut", "BatchPutRequest"), ("BatchDelete", "BatchDeleteRequest"), ("Stats", "StatsRequest"),
    ("Snapshot", "SnapshotRequest")])
def test_bytes_that_are_not_the_request_are_invalid_argument_naming_the_message(server, method, message):
    call = server.channel.unary_unary(SERVICE + method, request_serializer=None, response_deserializer=None)
    before_items = items(server)
    before = server.counter("gpukv_requests_total", method=method, code="INVALID_ARGUMENT")
    for data in UNPARSABLE:
        with pytest.raises(grpc.RpcError) as err:
            call(data, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (data, err.value)
        assert err.value.details() == f"the request does not parse as gpukv.v1.{message}"
    assert server.counter("gpukv_requests_total", method=method, code="INVALID_ARGUMENT") == before + len(UNPARSABLE)
    assert items(server) == before_items


def test_a_stream_message_that_does_not_parse_ends_the_stream_after_answering_the_ones_before():
    s = Server("--capacity=20000", "--key_width=16", "--value_width=64")
    try:
        call = s.channel.stream_stream(SERVICE + "Stream", request_serializer=None, response_deserializer=None)
        put = lambda i, key: kv_pb2.StreamRequest(id=i, ops=bytes([kv_pb2.OP_PUT]), keys=key, key_lengths=[len(key)],
                                                  values=b"v", value_lengths=[1]).SerializeToString()
        for data in UNPARSABLE:
            replies = []
            with pytest.raises(grpc.RpcError) as err:
                for reply in call(iter([put(1, b"before"), data, put(3, b"after")]), timeout=10):
                    replies.append(kv_pb2.StreamResponse.FromString(reply))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (data, err.value)
            assert err.value.details() == "a message does not parse as gpukv.v1.StreamRequest"
            assert [r.id for r in replies] == [1] and replies[0].results == bytes([kv_pb2.RESULT_OK])
            got = s.stub.BatchGet(kv_pb2.BatchGetRequest(keys=b"beforeafter", key_lengths=[6, 5]), timeout=10)
            assert got.results == bytes([kv_pb2.RESULT_OK, kv_pb2.RESULT_NOT_FOUND]), "the request after it ran"
        assert s.counter("gpukv_requests_total", method="Stream", code="INVALID_ARGUMENT") == len(UNPARSABLE)
    finally:
        assert s.stop() == 0
