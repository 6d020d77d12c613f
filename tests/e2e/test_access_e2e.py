"""End-to-end: access control of the real gpukv-server binary over TLS on 127.0.0.1, with certificates made
for the test by the openssl command.

Promised (README, "Access"):
- --tls_client_ca: the TLS handshake fails for a client without a certificate signed by that CA (no call of it
  reaches the service); a client with one is served.
- --auth_token_file: every KeyValue call without "authorization: Bearer <token>" (or with another token) is
  answered UNAUTHENTICATED and nothing of it runs, unary and Stream alike, and is counted under that code in
  gpukv_requests_total; health checks stay open; the gpukv CLI and gpukv-load reach the server with --token_file.
- A token file the server cannot use stops it before any port opens (exit 2).
"""
import os
import subprocess
import tempfile

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from test_server_e2e import CLI, ROOT, SERVER, Server, kv_pb2, kv_pb2_grpc

LOAD = os.environ.get("GPUKV_LOAD", os.path.join(ROOT, "build", "client", "gpukv-load"))
TOKEN = "s3cret-token-0123456789abcdef"


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def issue(d, ca, name, san=None):
    """A key and a certificate for `name` signed by the CA `ca` (files under d)."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{d}/{name}.key",
            "-out", f"{d}/{name}.csr", "-subj", f"/CN={name}")
    ext = f"{d}/{name}.ext"
    with open(ext, "w") as f:
        f.write(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/{ca}.pem", "-CAkey", f"{d}/{ca}.key",
            "-CAcreateserial", "-out", f"{d}/{name}.pem", "-days", "2", "-extfile", ext)


@pytest.fixture(scope="module")
def pki():
    d = tempfile.mkdtemp(prefix="gpukv-pki-")
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                f"{d}/{ca}.key", "-out", f"{d}/{ca}.pem", "-days", "2", "-subj", f"/CN=gpukv test {ca}")
    issue(d, "ca", "server", san="IP:127.0.0.1,DNS:localhost")
    issue(d, "ca", "client")
    issue(d, "other-ca", "stranger")
    with open(f"{d}/token", "w") as f:
        f.write(TOKEN + "\n")  # as an editor or a Kubernetes Secret leaves it
    return d


def read(path):
    with open(path, "rb") as f:
        return f.read()


class TlsServer(Server):
    """The server with TLS from the test CA's server certificate (its plaintext channel goes unused)."""

    def __init__(self, pki, *flags):
        super().__init__("--capacity=20000", "--key_width=16", "--value_width=64", f"--tls_cert={pki}/server.pem",
                         f"--tls_key={pki}/server.key", *flags)
        self.pki = pki
        self.target = f"127.0.0.1:{self.port}"

    def tls_channel(self, identity=None):
        """A TLS channel trusting the test CA, presenting `identity`'s certificate (none: no certificate)."""
        key, cert = (read(f"{self.pki}/{identity}.key"), read(f"{self.pki}/{identity}.pem")) if identity else (None, None)
        creds = grpc.ssl_channel_credentials(read(f"{self.pki}/ca.pem"), key, cert)
        return grpc.secure_channel(self.target, creds)


def test_mutual_tls_serves_clients_of_the_ca_and_refuses_others_at_the_handshake(pki):
    server = TlsServer(pki, f"--tls_client_ca={pki}/ca.pem")
    try:
        with server.tls_channel("client") as ch:
            stub = kv_pb2_grpc.KeyValueStub(ch)
            assert stub.Put(kv_pb2.PutRequest(key=b"m", value=b"v"), timeout=10).result == kv_pb2.RESULT_OK
        for identity in (None, "stranger"):  # no certificate; one of another CA
            with server.tls_channel(identity) as ch:
                with pytest.raises(grpc.RpcError) as err:
                    kv_pb2_grpc.KeyValueStub(ch).Put(kv_pb2.PutRequest(key=b"m", value=b"w"), timeout=10)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, (identity, err.value)
        with server.tls_channel("client") as ch:
            got = kv_pb2_grpc.KeyValueStub(ch).Get(kv_pb2.GetRequest(key=b"m"), timeout=10)
            assert got.found and got.value == b"v", "a refused client's Put ran"
        # The CLI with its certificate.
        cli = [CLI, f"--target={server.target}", f"--tls_ca={pki}/ca.pem"]
        assert subprocess.run(cli + [f"--tls_cert={pki}/client.pem", f"--tls_key={pki}/client.key", "get", "m"],
                              capture_output=True, text=True, timeout=30).stdout == "v\n"
        assert subprocess.run(cli + ["get", "m"], capture_output=True, text=True, timeout=30).returncode != 0
        # deploy/k8s-secure's probe: the shard's own certificate as the client's, health without a token.
        probe = subprocess.run(cli + [f"--tls_cert={pki}/server.pem", f"--tls_key={pki}/server.key", "--timeout_ms=3000",
                                      "health"], capture_output=True, text=True, timeout=30)
        assert probe.returncode == 0 and probe.stdout == "SERVING\n", probe.stderr
    finally:
        assert server.stop() == 0


def test_a_bearer_token_is_required_of_every_call_and_health_stays_open(pki):
    server = TlsServer(pki, f"--auth_token_file={pki}/token")
    try:
        with server.tls_channel() as ch:
            stub = kv_pb2_grpc.KeyValueStub(ch)
            for metadata in ((), (("authorization", "Bearer wrong-token-0123456789"),), (("authorization", TOKEN),)):
                with pytest.raises(grpc.RpcError) as err:
                    stub.Put(kv_pb2.PutRequest(key=b"t", value=b"v"), timeout=10, metadata=metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, (metadata, err.value)
                with pytest.raises(grpc.RpcError) as err:
                    stub.BatchPut(kv_pb2.BatchPutRequest(keys=b"t", key_lengths=[1], values=b"v", value_lengths=[1]),
                                  timeout=10, metadata=metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.RpcError) as err:
                    list(stub.Stream(iter([kv_pb2.StreamRequest(id=1, ops=bytes([kv_pb2.OP_PUT]), keys=b"t",
                                                                key_lengths=[1], values=b"v", value_lengths=[1])]),
                                     timeout=10, metadata=metadata))
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert server.counter("gpukv_requests_total", method="Put", code="UNAUTHENTICATED") == 3
            assert server.counter("gpukv_requests_total", method="Stream", code="UNAUTHENTICATED") == 3
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="gpukv.v1.KeyValue"), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            good = (("authorization", "Bearer " + TOKEN),)
            stats = stub.Stats(kv_pb2.StatsRequest(), timeout=10, metadata=good)
            assert sum(t.items for t in stats.tiers) == 0, "a refused call stored something"
            assert stub.Put(kv_pb2.PutRequest(key=b"t", value=b"v"), timeout=10, metadata=good).result == kv_pb2.RESULT_OK
        # The CLI and the load generator with --token_file; the CLI without it is refused.
        cli = [CLI, f"--target={server.target}", f"--tls_ca={pki}/ca.pem"]
        assert subprocess.run(cli + [f"--token_file={pki}/token", "get", "t"], capture_output=True, text=True,
                              timeout=30).stdout == "v\n"
        refused = subprocess.run(cli + ["get", "t"], capture_output=True, text=True, timeout=30)
        assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr, refused.stderr
        load = subprocess.run([LOAD, f"--target={server.target}", f"--tls_ca={pki}/ca.pem", f"--token_file={pki}/token",
                               "--seconds=1", "--callers=2", "--mode=batch", "--batch=10", "--keys=1000"],
                              capture_output=True, text=True, timeout=60)
        assert load.returncode == 0 and " errors=0 " in load.stdout, load.stdout + load.stderr
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("content,message", [
    ("short\n", "the token must be 16 to 4096 characters, got 5"),
    ("has a space in it somewhere", "the token must be visible ASCII characters; offset 3 is not"),
])
def test_a_token_file_the_server_cannot_use_stops_it_before_it_listens(pki, content, message):
    path = os.path.join(pki, "bad-token")
    with open(path, "w") as f:
        f.write(content)
    run = subprocess.run([SERVER, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--backend=cpu",
                          f"--auth_token_file={path}"], capture_output=True, text=True, timeout=60)
    output = run.stdout + run.stderr
    assert run.returncode == 2 and message in output and path in output, output
    assert "listening on port" not in output, output
