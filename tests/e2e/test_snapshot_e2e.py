"""End-to-end: snapshots of the real gpukv-server binary (CPU backend) on 127.0.0.1, against what README promises:
- `gpukv snapshot` (the Snapshot call) answers once the snapshot is durable: the server killed with SIGKILL right
  after it comes back with every item the snapshot holds, even with no write-ahead log.
- SIGTERM takes a last snapshot after the last call: a clean stop keeps every acknowledged write without a log.
- --snapshot_interval takes snapshots on its own, each superseding the log before it, and the metrics count them.
- A server without --data_dir refuses the call with FAILED_PRECONDITION.
"""
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.request

import grpc
import pytest

from test_server_e2e import CLI, Server, kv_pb2, packed


def put_keys(server, n, prefix="k"):
    for start in range(0, n, 500):
        keys = [f"{prefix}{i}".encode() for i in range(start, min(n, start + 500))]
        blob, lengths = packed(keys)
        values = [b"value-" + k for k in keys]
        reply = server.stub.BatchPut(kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=b"".join(values),
                                                            value_lengths=[len(v) for v in values]), timeout=30)
        assert reply.results == bytes([kv_pb2.RESULT_OK]) * len(keys)


def count_present(server, n, prefix="k"):
    keys = [f"{prefix}{i}".encode() for i in range(n)]
    blob, lengths = packed(keys)
    reply = server.stub.BatchGet(kv_pb2.BatchGetRequest(keys=blob, key_lengths=lengths), timeout=30)
    values, at, present = reply.values, 0, 0
    for key, result, length in zip(keys, reply.results, reply.value_lengths):
        if result == kv_pb2.RESULT_OK:
            assert values[at:at + length] == b"value-" + key
            present += 1
        at += length
    return present


def metrics(server):
    return urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()


def metric(body, name):
    match = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
    return float(match.group(1)) if match else None


FLAGS = ("--capacity=20000", "--key_width=16", "--value_width=32")


def test_a_snapshot_taken_on_request_survives_kill9_without_a_log():
    with tempfile.TemporaryDirectory() as data:
        s = Server(*FLAGS, f"--data_dir={data}", "--wal=off", "--snapshot_interval=0")
        put_keys(s, 3000)
        run = subprocess.run([CLI, f"--target=127.0.0.1:{s.port}", "snapshot"], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        path, items, size, seconds = run.stdout.strip().split("\t")
        assert os.path.dirname(path) == data and int(items) == 3000 and os.path.getsize(path) == int(size)
        body = metrics(s)
        assert metric(body, 'gpukv_snapshots_total{result="ok"}') == 1
        assert metric(body, "gpukv_snapshot_items") == 3000
        put_keys(s, 100, prefix="after")  # not in the snapshot, and no log: lost by the kill
        assert s.stop(signal.SIGKILL) == -signal.SIGKILL
        again = Server(*FLAGS, f"--data_dir={data}", "--wal=off", "--snapshot_interval=0")
        try:
            assert count_present(again, 3000) == 3000
            assert count_present(again, 100, prefix="after") == 0
            assert metric(metrics(again), "gpukv_recovery_writes") == 3000
        finally:
            again.stop()


def test_sigterm_takes_a_last_snapshot_that_the_restart_loads():
    with tempfile.TemporaryDirectory() as data:
        s = Server(*FLAGS, f"--data_dir={data}", "--wal=off", "--snapshot_interval=0")
        put_keys(s, 2000)
        assert s.stop(signal.SIGTERM) == 0
        assert [f for f in os.listdir(data) if f.endswith(".snap")], os.listdir(data)
        again = Server(*FLAGS, f"--data_dir={data}", "--wal=off")
        try:
            assert count_present(again, 2000) == 2000
        finally:
            again.stop()


def test_scheduled_snapshots_supersede_the_log_before_them():
    with tempfile.TemporaryDirectory() as data:
        s = Server(*FLAGS, f"--data_dir={data}", "--wal=batch", "--snapshot_interval=1")
        try:
            assert metric(metrics(s), "gpukv_snapshot_interval_seconds") == 1
            for round in range(3):
                put_keys(s, 500, prefix=f"r{round}-")
                time.sleep(1.2)
            deadline = time.monotonic() + 10
            while metric(metrics(s), 'gpukv_snapshots_total{result="ok"}') < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert metric(metrics(s), 'gpukv_snapshots_total{result="ok"}') >= 2
            files = os.listdir(data)
            assert len([f for f in files if f.endswith(".snap")]) == 1, files
            assert len([f for f in files if f.endswith(".log")]) == 1, files
        finally:
            assert s.stop(signal.SIGKILL) == -signal.SIGKILL
        again = Server(*FLAGS, f"--data_dir={data}", "--wal=batch")
        try:
            for round in range(3):
                assert count_present(again, 500, prefix=f"r{round}-") == 500
        finally:
            again.stop()


def test_a_server_without_data_dir_refuses_a_snapshot():
    s = Server(*FLAGS)
    try:
        with pytest.raises(grpc.RpcError) as e:
            s.stub.Snapshot(kv_pb2.SnapshotRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--data_dir" in e.value.details()
    finally:
        s.stop()
