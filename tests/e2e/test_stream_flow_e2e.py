"""End-to-end: a Stream whose client does not read its answers, against what the server promises (README,
"The service"): the requests and answers such a stream holds in the server are bounded (64 MiB), so the
server's memory does not grow with what the client sends, and other clients are served meanwhile.
"""
import re
import threading
import time

from test_server_e2e import Server, kv_pb2, packed

KEYS = 200
VALUE = 1000


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1)) / 1024


def test_a_stream_that_is_not_read_holds_bounded_memory_and_slows_only_itself():
    s = Server("--capacity=200000", "--value_width=1024")
    keys = [f"k{i}".encode() for i in range(KEYS)]
    blob, lengths = packed(keys)
    reply = s.stub.BatchPut(kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=b"x" * KEYS * VALUE,
                                                   value_lengths=[VALUE] * KEYS), timeout=30)
    assert reply.results == bytes([kv_pb2.RESULT_OK]) * KEYS
    get = kv_pb2.StreamRequest(ops=bytes([kv_pb2.OP_GET]) * KEYS, keys=blob, key_lengths=lengths)
    sent = [0]
    stop = threading.Event()

    def requests():  # 200 KB of answers each: 4000 of them would be 800 MB
        while not stop.is_set() and sent[0] < 4000:
            get.id = sent[0]
            sent[0] += 1
            yield get
        stop.wait(60)

    before = rss_mib(s.proc.pid)
    call = s.stub.Stream(requests(), timeout=60)  # its answers are never read
    time.sleep(3.0)
    # Meanwhile another client is served as usual.
    other = s.stub.BatchGet(kv_pb2.BatchGetRequest(keys=blob, key_lengths=lengths), timeout=10)
    assert other.results == bytes([kv_pb2.RESULT_OK]) * KEYS
    grown = rss_mib(s.proc.pid) - before
    stop.set()
    call.cancel()
    s.stop()
    # The bound, plus what gRPC's transport buffers for the stream in each direction.
    assert grown < 160, f"the server grew {grown:.0f} MiB for an unread stream ({sent[0]} requests sent)"
    print(f"grew {grown:.0f} MiB with {sent[0]} requests sent")
