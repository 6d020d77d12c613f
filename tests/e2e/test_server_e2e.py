"""End-to-end: the real gpukv-server binary on 127.0.0.1, driven by Python grpcio through stubs generated from
proto/gpukv/v1/kv.proto, the same file the C++ server is built from (wire compatibility). Covers health
checking, reflection, unary / batch / stream calls, errors, the metrics endpoint, and SIGTERM under load.

Run by tests/run_all.sh: GPUKV_SERVER=<path to gpukv-server> pytest tests/e2e
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.environ.get("GPUKV_SERVER", os.path.join(ROOT, "build", "server", "gpukv-server"))
CLI = os.environ.get("GPUKV_CLI", os.path.join(ROOT, "build", "client", "gpukv"))


def _generate_stubs():
    out = tempfile.mkdtemp(prefix="gpukv-stubs-")
    proto_dir = os.path.join(ROOT, "proto")
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}",
                      os.path.join(proto_dir, "gpukv", "v1", "kv.proto")])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, out)
    from gpukv.v1 import kv_pb2, kv_pb2_grpc  # noqa: E402
    return kv_pb2, kv_pb2_grpc


kv_pb2, kv_pb2_grpc = _generate_stubs()


class Server:
    """gpukv-server on free ports of 127.0.0.1 (it prints the ports it bound)."""

    def __init__(self, *flags):
        self.proc = subprocess.Popen(
            [SERVER, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--backend=cpu", "--log_level=warn", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # Warnings logged while it starts come first.
        lines = []
        while not lines or (not lines[-1].startswith("gpukv-server listening") and lines[-1]):
            lines.append(self.proc.stdout.readline())
        match = re.search(r"listening on port (\d+), metrics on port (\d+)", lines[-1])
        assert match, f"server did not start: {''.join(lines)!r}"
        self.port, self.metrics_port = int(match.group(1)), int(match.group(2))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = kv_pb2_grpc.KeyValueStub(self.channel)

    def counter(self, name, **labels):
        """The value of a counter with these labels (among others) on the metrics port, 0 if not exported yet."""
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        for line in body.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return int(float(line.split()[-1]))
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self.channel.close()
        return code


@pytest.fixture
def server():
    s = Server("--capacity=20000", "--key_width=16", "--value_width=64")
    yield s
    s.stop()


def packed(keys):
    return b"".join(keys), [len(k) for k in keys]


def test_health_and_reflection(server):
    health = health_pb2_grpc.HealthStub(server.channel)
    for name in ("", "gpukv.v1.KeyValue"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    replies = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
    names = [s.name for r in replies for s in r.list_services_response.service]
    assert "gpukv.v1.KeyValue" in names


def test_reflection_v1_describes_the_service():
    """grpc.reflection.v1, which newer tools ask for first: the same messages as v1alpha under another package,
    so the v1alpha Python messages encode and decode it (the server's own .proto for v1 is checked by this
    independent encoding). Lists the services, sends the file of a symbol with what it imports, and answers a
    symbol it does not know NOT_FOUND in the response, keeping the stream."""
    s = Server("--capacity=1000")
    try:
        call = s.channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                       request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                       response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
        requests = [reflection_pb2.ServerReflectionRequest(host="h", list_services=""),
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol="gpukv.v1.KeyValue"),
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.such.Thing"),
                    reflection_pb2.ServerReflectionRequest(file_by_filename="gpukv/v1/kv.proto")]
        listed, by_symbol, missing, by_name = list(call(iter(requests), timeout=10))
        assert listed.valid_host == "h" and listed.original_request == requests[0]
        assert {"gpukv.v1.KeyValue", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection"} == {x.name for x in listed.list_services_response.service}
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in by_symbol.file_descriptor_response.file_descriptor_proto]
        assert files[0].name == "gpukv/v1/kv.proto" and files[0].package == "gpukv.v1"
        (service,) = files[0].service
        assert [m.name for m in service.method] == ["Get", "Put", "Delete", "BatchGet", "BatchPut", "BatchDelete",
                                                    "Stream", "Stats", "Snapshot"]
        assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
        assert list(by_name.file_descriptor_response.file_descriptor_proto) == [], "a file sent twice on one stream"
    finally:
        assert s.stop() == 0


def test_unary_calls_and_errors(server):
    stub = server.stub
    assert not stub.Get(kv_pb2.GetRequest(key=b"absent"), timeout=10).found
    assert stub.Put(kv_pb2.PutRequest(key=b"k", value=b"v\x00\xff"), timeout=10).result == kv_pb2.RESULT_OK
    reply = stub.Get(kv_pb2.GetRequest(key=b"k"), timeout=10)
    assert reply.found and reply.value == b"v\x00\xff"
    assert stub.Put(kv_pb2.PutRequest(key=b"k", value=b"x", if_absent=True), timeout=10).result == kv_pb2.RESULT_EXISTS
    assert stub.Delete(kv_pb2.DeleteRequest(key=b"k"), timeout=10).deleted
    for bad in (kv_pb2.PutRequest(key=b"", value=b"v"), kv_pb2.PutRequest(key=b"x" * 17, value=b"v"),
                kv_pb2.PutRequest(key=b"k", value=b"v" * 65)):
        with pytest.raises(grpc.RpcError) as err:
            stub.Put(bad, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_batch_calls_on_packed_columns(server):
    keys = [f"key{i}".encode() for i in range(1000)]
    values = [f"value{i}".encode() for i in range(1000)]
    blob, lengths = packed(keys)
    put = server.stub.BatchPut(kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=b"".join(values),
                                                      value_lengths=[len(v) for v in values]), timeout=30)
    assert put.results == bytes([kv_pb2.RESULT_OK]) * 1000
    got = server.stub.BatchGet(kv_pb2.BatchGetRequest(keys=blob + b"nope", key_lengths=lengths + [4]), timeout=30)
    assert got.results == bytes([kv_pb2.RESULT_OK]) * 1000 + bytes([kv_pb2.RESULT_NOT_FOUND])
    offset = 0
    for i, length in enumerate(got.value_lengths[:1000]):
        assert got.values[offset:offset + length] == values[i]
        offset += length
    with pytest.raises(grpc.RpcError) as err:  # lengths that do not add up
        server.stub.BatchGet(kv_pb2.BatchGetRequest(keys=b"abc", key_lengths=[7]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_stream_pipelines_requests_and_keeps_their_order(server):
    def requests():
        yield kv_pb2.StreamRequest(id=1, ops=bytes([kv_pb2.OP_PUT]), keys=b"s", key_lengths=[1], values=b"one",
                                   value_lengths=[3])
        yield kv_pb2.StreamRequest(id=2, ops=bytes([kv_pb2.OP_GET, kv_pb2.OP_PUT, kv_pb2.OP_GET]), keys=b"sss",
                                   key_lengths=[1, 1, 1], values=b"two", value_lengths=[3])
        yield kv_pb2.StreamRequest(id=3, ops=bytes([kv_pb2.OP_DELETE, kv_pb2.OP_GET]), keys=b"ss", key_lengths=[1, 1])

    replies = list(server.stub.Stream(requests(), timeout=30))
    assert [r.id for r in replies] == [1, 2, 3]
    assert replies[1].values == b"onetwo" and list(replies[1].value_lengths) == [3, 0, 3]
    assert replies[2].results == bytes([kv_pb2.RESULT_OK, kv_pb2.RESULT_NOT_FOUND])


def test_metrics_endpoint(server):
    server.stub.Put(kv_pb2.PutRequest(key=b"m", value=b"v"), timeout=10)
    # The batch's figures are recorded after its calls are answered: wait for them (at most 5 s).
    deadline = time.monotonic() + 5
    while True:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        if 'gpukv_operations_total{kind="PUT",result="OK"} 1' in body or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert 'gpukv_operations_total{kind="PUT",result="OK"} 1' in body
    assert "gpukv_queue_delay_seconds_bucket" in body
    stats = server.stub.Stats(kv_pb2.StatsRequest(), timeout=10)
    assert stats.backend == "cpu" and stats.key_width == 16 and stats.tiers[0].items == 1


def test_sigterm_under_load_answers_every_call_and_exits_cleanly():
    # Room for everything the writers can send in the run (about 1.5 M keys/s on 2 cores), so every
    # acknowledged write must be OK.
    s = Server("--capacity=8000000", "--key_width=16", "--value_width=16", "--shutdown_grace_ms=5000")
    outcomes = {"ok": 0, "refused": 0, "other": []}
    lock = threading.Lock()
    stop = threading.Event()

    def writer(worker):
        i = 0
        while not stop.is_set():
            keys = [f"{worker}:{i + j}".encode() for j in range(50)]
            blob, lengths = packed(keys)
            try:
                reply = s.stub.BatchPut(kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=b"v" * 50,
                                                               value_lengths=[1] * 50), timeout=20)
                with lock:
                    outcomes["ok"] += 1
                    if reply.results != bytes([kv_pb2.RESULT_OK]) * 50:  # checked in the main thread below
                        outcomes["other"].append("acknowledged batch with a failed key")
            except grpc.RpcError as e:
                # Refused while draining: UNAVAILABLE from the service, or CANCELLED from gRPC itself for a call
                # that arrived once its shutdown had begun. Either way nothing of the call was applied.
                refused = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
                with lock:
                    if refused:
                        outcomes["refused"] += 1
                    else:
                        outcomes["other"].append(e.code())
                return
            i += 50

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    code = s.stop(signal.SIGTERM)
    stop.set()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a call hung across the shutdown"
    assert code == 0
    assert outcomes["ok"] > 0
    assert outcomes["other"] == [], f"calls failed with {outcomes['other']}"


@pytest.mark.parametrize("flag,message", [
    ("--key_width=12", "key_width must be 8, 16 or 32 bytes, got 12"),
    ("--cleanup_headroom=2", "cleanup_headroom must be in (0, 1]"),
    ("--backend=quantum", "--backend must be auto, gpu or cpu, got 'quantum'"),
    # Threads past four per core: a hundred thousand of them exhausted the host's process limit.
    ("--cpu_threads=100000", "--cpu_threads must be 0 (one per core) to"),
    # A queue shorter than a batch refuses the calls a batch is made for (0 refused every call).
    ("--max_queued_ops=0", "--max_queued_ops must be at least --batch_size (65536), got 0"),
    ("--max_queue_delay=5000000", "--max_queue_delay must be at most 1000000 microseconds"),
    ("--tls_cert=/etc/hostname", "--tls_cert and --tls_key go together"),
    ("--tls_client_ca=/etc/hostname", "--tls_client_ca asks clients for certificates during the TLS handshake: it needs --tls_cert"),
    ("--max_message_bytes=1000", "--max_message_bytes must be 1048576 (1 MiB) to 1073741824 (1 GiB), got 1000"),
    ("--max_concurrent_calls=0", "--max_concurrent_calls must be 1 to 1000000, got 0"),
    ("--max_streams=0", "--max_streams must be 1 to 100000, got 0"),
    ("--slot_layout=tiles", "--slot_layout must be board, line or auto, got 'tiles'"),
    ("--optimistic_inserts=maybe", "--optimistic_inserts must be auto, off or always, got 'maybe'"),
    # The default widths (16-byte keys, 128-byte values) make a slot of 144 bytes: not 3 to a line.
    ("--slot_layout=line", "key_width 16 and value_width 128 make a slot of 144 bytes: use slot_layout board"),
])
def test_the_server_refuses_a_bad_setting_with_a_clear_error_before_it_listens(flag, message):
    """A bad flag stops the server with a message naming it and its bounds, before any port opens: nothing
    listens on the gRPC or metrics port meanwhile (the server logs "listening on port" when its ports open)."""
    run = subprocess.run([SERVER, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--backend=cpu", flag],
                         capture_output=True, text=True, timeout=60)
    output = run.stdout + run.stderr  # the server's log goes to stdout
    assert run.returncode != 0, output
    assert message in output, output
    assert "listening on port" not in output, output


def test_a_server_with_the_line_layout_stores_and_serves_keys():
    """--slot_layout=line (tickets and slots of a probe unit in one 128-byte line) serves every call as the
    board layout does: 1000 keys written in a batch, read back, overwritten, deleted one by one."""
    s = Server("--slot_layout=line", "--key_width=8", "--value_width=8", "--capacity=5000")
    try:
        keys = [f"k{i}".encode() for i in range(1000)]
        blob, lengths = packed(keys)
        values = [f"v{i}".encode() for i in range(1000)]
        put = s.stub.BatchPut(kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=b"".join(values),
                                                     value_lengths=[len(v) for v in values]), timeout=30)
        assert put.results == bytes([kv_pb2.RESULT_OK]) * 1000
        got = s.stub.BatchGet(kv_pb2.BatchGetRequest(keys=blob, key_lengths=lengths), timeout=30)
        assert got.results == bytes([kv_pb2.RESULT_OK]) * 1000 and got.values == b"".join(values)
        assert s.stub.Put(kv_pb2.PutRequest(key=b"k7", value=b"new"), timeout=10).result == kv_pb2.RESULT_OK
        assert s.stub.Get(kv_pb2.GetRequest(key=b"k7"), timeout=10).value == b"new"
        for key in keys:
            assert s.stub.Delete(kv_pb2.DeleteRequest(key=key), timeout=10).deleted
        assert not s.stub.Get(kv_pb2.GetRequest(key=b"k1"), timeout=10).found
    finally:
        s.stop()


@pytest.mark.parametrize("mode", ["auto", "always", "off"])
def test_optimistic_inserts_setting_keeps_results_and_is_counted(mode):
    """--optimistic_inserts only changes how the GPU runs passes of PUTs: batches of new keys, a batch that
    repeats a key and one of keys already present answer as the batch order says, in every mode. The scrape
    counts optimistic passes kept and redone; the CPU backend (these tests' server) never runs one, so both
    stay 0 there."""
    s = Server("--slot_layout=line", "--key_width=8", "--value_width=8", "--capacity=20000", f"--optimistic_inserts={mode}")
    try:
        def put(keys, values):
            blob, lengths = packed(keys)
            return s.stub.BatchPut(kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=b"".join(values),
                                                          value_lengths=[len(v) for v in values]), timeout=30)
        keys = [f"n{i}".encode() for i in range(3000)]
        for first in range(0, 3000, 1000):  # new keys, a batch at a time
            assert put(keys[first:first + 1000], [b"a"] * 1000).results == bytes([kv_pb2.RESULT_OK]) * 1000
        assert put([b"r", b"r", b"n5"], [b"1", b"2", b"3"]).results == bytes([kv_pb2.RESULT_OK]) * 3
        blob, lengths = packed([b"r", b"n5", b"n2999"])
        got = s.stub.BatchGet(kv_pb2.BatchGetRequest(keys=blob, key_lengths=lengths), timeout=30)
        assert got.results == bytes([kv_pb2.RESULT_OK]) * 3 and got.values == b"23a"
        stats = s.stub.Stats(kv_pb2.StatsRequest(), timeout=10)
        assert stats.backend == "cpu" and stats.tiers[0].items == 3001
        assert s.counter("gpukv_optimistic_passes_total", outcome="kept") == 0
        assert s.counter("gpukv_optimistic_passes_total", outcome="redone") == 0
        body = urllib.request.urlopen(f"http://127.0.0.1:{s.metrics_port}/metrics", timeout=10).read().decode()
        assert 'gpukv_optimistic_passes_total{outcome="redone"} 0' in body
    finally:
        s.stop()


def test_cli_against_the_server(server):
    def cli(*args, stdin=None):
        return subprocess.run([CLI, f"--target=127.0.0.1:{server.port}", *args], input=stdin, capture_output=True,
                              text=True, timeout=30)

    assert cli("health").stdout == "SERVING\n"
    assert cli("put", "k", "v").stdout == "OK\n"
    assert cli("put", "--if_absent", "k", "w").stdout == "EXISTS\n"
    got = cli("get", "k")
    assert got.returncode == 0 and got.stdout == "v\n"
    assert cli("get", "absent").returncode == 1
    assert cli("batch-put", "-", stdin="a\t1\nb\t2\n").stdout == "a\tOK\nb\tOK\n"
    batch = cli("batch-get", "-", stdin="a\nb\nzz\n")
    assert batch.returncode == 1  # one key was not found
    assert batch.stdout == "a\tOK\t1\nb\tOK\t2\nzz\tNOT_FOUND\t\n"
    assert cli("batch-delete", "-", stdin="a\nzz\n").stdout == "a\tOK\nzz\tNOT_FOUND\n"
    assert cli("delete", "k").stdout == "OK\n"
    bad = cli("put", "", "v")
    assert bad.returncode == 3 and "INVALID_ARGUMENT" in bad.stderr
    assert 'backend: "cpu"' in cli("stats").stdout


def test_help_lists_every_flag_with_its_default_and_variable():
    """--help names each of the server's own flags (those --helpfull lists under server/main.cpp), with its default
    and the GPUKV_ variable that sets it, and exits 0 without starting anything."""
    full = subprocess.run([SERVER, "--helpfull"], capture_output=True, text=True, timeout=30)
    section = re.search(r"Flags from \S*server/main\.cpp:\n(.*?)(?:\n\n|\Z)", full.stdout + full.stderr, re.S)
    defined = set(re.findall(r"^\s+--([a-z_]+) \(", section.group(1), re.M))
    run = subprocess.run([SERVER, "--help"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    listed = {name: (default, var) for name, default, var in
              re.findall(r"^  --([a-z_]+)=(\S*)\s+\[(GPUKV_[A-Z_]+)\]$", run.stdout, re.M)}
    assert set(listed) == defined, run.stdout
    for name, (default, var) in listed.items():
        assert var == "GPUKV_" + name.upper()
    assert listed["capacity"][0] == "16777216" and listed["wal"][0] == "off" and listed["data_dir"][0] == ""
