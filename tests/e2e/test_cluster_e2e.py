"""End-to-end, cluster mode: the key-to-shard function implemented here in Python from README's definition
("Cluster mode") agrees with the C++ one on 100,000 keys; three gpukv-server processes with --shard_count=3
serve the keys a Python client routes with it and refuse the others (WRONG_SHARD with the owner, or
FAILED_PRECONDITION for a unary call); the gpukv CLI and gpukv-load reach all three through --targets.

Run by tests/run_all.sh: GPUKV_SERVER=... GPUKV_CLI=... GPUKV_LOAD=... pytest tests/e2e
"""
import os
import random
import re
import socket
import subprocess

import grpc
import pytest

from test_server_e2e import ROOT, SERVER, Server, kv_pb2

CLI = os.environ.get("GPUKV_CLI", os.path.join(ROOT, "build", "client", "gpukv"))
LOAD = os.environ.get("GPUKV_LOAD", os.path.join(ROOT, "build", "client", "gpukv-load"))

# -- README's definition, written again here ----------------------------------------------------------------

SLOTS = 16384


def crc16_xmodem_bitwise(data: bytes) -> int:
    """CRC-16/XMODEM: polynomial 0x1021, initial value 0, most significant bit first, no final xor."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


# The same a byte at a time, through the CRC of each byte value (what the bitwise loop does to it).
CRC_TABLE = [crc16_xmodem_bitwise(bytes([b])) for b in range(256)]


def crc16_xmodem(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ CRC_TABLE[(crc >> 8) ^ byte]
    return crc


def key_slot(key: bytes) -> int:
    return crc16_xmodem(key) % SLOTS


def jump_consistent_hash(key: int, buckets: int) -> int:
    """Lamping and Veach (2014), in 64-bit unsigned arithmetic and IEEE doubles."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) % 2**64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def shard_of(key: bytes, shards: int) -> int:
    return jump_consistent_hash(key_slot(key), shards)


def test_the_readme_definition_is_redis_cluster_key_slot():
    # Values Redis documents for CLUSTER KEYSLOT, and CRC-16/XMODEM's check value; Python's binascii has
    # the same CRC.
    import binascii
    assert key_slot(b"foo") == 12182 and key_slot(b"somekey") == 11058
    assert crc16_xmodem(b"123456789") == crc16_xmodem_bitwise(b"123456789") == 0x31C3
    rng = random.Random(1)
    for key in [b"", b"a", b"\x00\xff" * 9] + [rng.randbytes(rng.randint(1, 32)) for _ in range(1000)]:
        assert crc16_xmodem(key) == crc16_xmodem_bitwise(key) == binascii.crc_hqx(key, 0)


def test_python_and_cpp_agree_on_100000_keys():
    # Random keys of 1 to 32 bytes of any value but newline (the CLI reads one key per line).
    rng = random.Random(20261124)
    keys = [rng.randbytes(rng.randint(1, 32)).replace(b"\n", b"\x00") for _ in range(100_000)]
    slots = [key_slot(k) for k in keys]
    for shards in (1, 2, 3, 5, 16, 1000):
        run = subprocess.run([CLI, f"--shard_count={shards}", "shard-of", "-"], input=b"\n".join(keys) + b"\n",
                             capture_output=True, timeout=120)
        assert run.returncode == 0, run.stderr
        lines = run.stdout.decode().splitlines()
        assert len(lines) == len(keys)
        shard_of_slot = {}
        for key, slot, line in zip(keys, slots, lines):
            if slot not in shard_of_slot:
                shard_of_slot[slot] = jump_consistent_hash(slot, shards)
            assert line == f"{slot}\t{shard_of_slot[slot]}", (shards, key)


# -- three shards ------------------------------------------------------------------------------------------

@pytest.fixture
def cluster():
    servers = [Server("--capacity=20000", "--key_width=16", "--value_width=32", "--shard_count=3", f"--shard_index={i}")
               for i in range(3)]
    yield servers
    for s in servers:
        s.stop()


def packed(keys):
    return b"".join(keys), [len(k) for k in keys]


def test_each_shard_serves_its_keys_and_refuses_the_others(cluster):
    keys = [f"user:{i}".encode() for i in range(600)]
    # Routed by the Python function: every key lands on its owner, none is refused.
    for shard, server in enumerate(cluster):
        mine = [k for k in keys if shard_of(k, 3) == shard]
        blob, lengths = packed(mine)
        reply = server.stub.BatchPut(kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=blob,
                                                            value_lengths=lengths), timeout=30)
        assert reply.results == bytes([kv_pb2.RESULT_OK]) * len(mine)
        assert list(reply.owners) == []
    counts = [s.stub.Stats(kv_pb2.StatsRequest(), timeout=10) for s in cluster]
    assert [c.tiers[0].items for c in counts] == [sum(shard_of(k, 3) == i for k in keys) for i in range(3)]
    assert [(c.shard_index, c.shard_count) for c in counts] == [(0, 3), (1, 3), (2, 3)]

    # Sent naively to shard 0: its own keys answer, the others are WRONG_SHARD with their owners, and
    # nothing of them is stored there.
    blob, lengths = packed(keys)
    reply = cluster[0].stub.BatchGet(kv_pb2.BatchGetRequest(keys=blob, key_lengths=lengths), timeout=30)
    owners = []
    offset = 0
    for i, key in enumerate(keys):
        owner = shard_of(key, 3)
        if owner == 0:
            assert reply.results[i] == kv_pb2.RESULT_OK
            assert reply.values[offset:offset + reply.value_lengths[i]] == key
        else:
            assert reply.results[i] == kv_pb2.RESULT_WRONG_SHARD
            assert reply.value_lengths[i] == 0
            owners.append(owner)
        offset += reply.value_lengths[i]
    assert list(reply.owners) == owners
    put = cluster[0].stub.BatchPut(kv_pb2.BatchPutRequest(keys=blob, key_lengths=lengths, values=blob, value_lengths=lengths),
                                   timeout=30)
    assert put.results.count(bytes([kv_pb2.RESULT_WRONG_SHARD])) == len(owners)
    assert cluster[0].stub.Stats(kv_pb2.StatsRequest(), timeout=10).tiers[0].items == counts[0].tiers[0].items

    # A unary call of another shard's key: FAILED_PRECONDITION, the owner in the message and the trailers.
    foreign = next(k for k in keys if shard_of(k, 3) == 2)
    with pytest.raises(grpc.RpcError) as err:
        cluster[0].stub.Get(kv_pb2.GetRequest(key=foreign), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "belongs to shard 2" in err.value.details()
    assert ("gpukv-owner-shard", "2") in tuple(err.value.trailing_metadata())


def cli(cluster, *args, stdin=None):
    targets = ",".join(f"127.0.0.1:{s.port}" for s in cluster)
    return subprocess.run([CLI, f"--targets={targets}", *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_the_cli_reaches_every_shard_through_targets(cluster):
    lines = "".join(f"k{i}\tv{i}\n" for i in range(100))
    assert cli(cluster, "batch-put", "-", stdin=lines).stdout == "".join(f"k{i}\tOK\n" for i in range(100))
    got = cli(cluster, "batch-get", "-", stdin="".join(f"k{i}\n" for i in range(100)) + "absent\n")
    assert got.returncode == 1  # one key absent
    assert got.stdout == "".join(f"k{i}\tOK\tv{i}\n" for i in range(100)) + "absent\tNOT_FOUND\t\n"
    assert cli(cluster, "get", "k7").stdout == "v7\n"
    assert cli(cluster, "put", "single", "s").stdout == "OK\n"
    stream = cli(cluster, "stream", "-", stdin="put\tz\t1\nget\tz\ndelete\tk1\nget\tk1\n")
    assert stream.stdout == "put\tz\tOK\t\nget\tz\tOK\t1\ndelete\tk1\tOK\t\nget\tk1\tNOT_FOUND\t\n"
    stats = cli(cluster, "cluster-stats")
    assert stats.returncode == 0, stats.stdout + stats.stderr
    rows = [line.split() for line in stats.stdout.splitlines()[1:]]
    assert [r[2] for r in rows[:3]] == ["0/3", "1/3", "2/3"]
    per_shard = [sum(shard_of(k.encode(), 3) == i for k in [f"k{j}" for j in range(100) if j != 1] + ["single", "z"])
                 for i in range(3)]
    assert [int(r[4]) for r in rows[:3]] == per_shard
    assert rows[3][0] == "total" and int(rows[3][1]) == 101


def test_the_cli_reports_a_shard_list_that_disagrees_with_the_servers(cluster):
    two = subprocess.run([CLI, f"--targets=127.0.0.1:{cluster[0].port},127.0.0.1:{cluster[1].port}", "cluster-stats"],
                         capture_output=True, text=True, timeout=60)
    assert two.returncode == 1
    assert "MISMATCH" in two.stdout
    naive = subprocess.run([CLI, f"--target=127.0.0.1:{cluster[1].port}", "batch-get", "-"],
                           input="".join(f"k{i}\n" for i in range(30)), capture_output=True, text=True, timeout=60)
    assert "WRONG_SHARD" in naive.stdout


def test_gpukv_load_spreads_over_the_shards(cluster):
    targets = ",".join(f"127.0.0.1:{s.port}" for s in cluster)
    for mode in ("unary", "batch", "stream"):
        run = subprocess.run([LOAD, f"--targets={targets}", f"--mode={mode}", "--batch=50", "--callers=3", "--seconds=1",
                              "--keys=5000"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        fields = dict(item.split("=", 1) for item in run.stdout.split("RESULT load ")[1].split())
        assert fields["shards"] == "3" and int(fields["errors"]) == 0 and float(fields["keys_per_s"]) > 0
    stats = [s.stub.Stats(kv_pb2.StatsRequest(), timeout=10) for s in cluster]
    assert all(st.operations > 0 for st in stats), "every shard took load"
    assert all(st.wrong_shard_keys == 0 for st in stats)


def test_shard_index_auto_takes_the_ordinal_of_the_host_name():
    host = socket.gethostname()
    ordinal = re.search(r"-(\d+)$", host)
    if ordinal:  # this host is named like a StatefulSet pod: auto must take its number
        s = Server("--capacity=1000", f"--shard_count={int(ordinal.group(1)) + 1}", "--shard_index=auto")
        try:
            assert s.stub.Stats(kv_pb2.StatsRequest(), timeout=10).shard_index == int(ordinal.group(1))
        finally:
            s.stop()
        return
    run = subprocess.run([SERVER, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--backend=cpu",
                          "--shard_count=3", "--shard_index=auto"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert f"this host is named '{host}'" in run.stdout + run.stderr
