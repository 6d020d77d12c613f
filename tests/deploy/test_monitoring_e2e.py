"""End to end: the real gpukv-server (CPU backend, with a host tier and a write-ahead log) and the real Prometheus
server on 127.0.0.1, Prometheus configured from deploy/prometheus (its gpukv job pointed at the test server, its
alert rules as shipped). Known calls through the gpukv CLI must arrive in Prometheus with exactly their counts;
after a load run that fills both tiers, Prometheus' figures must equal the server's own; every dashboard query must
run and return data; every alert rule must evaluate, the table and error alerts must start on the full table, and
the server-down alert when the server stops.
"""
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

from conftest import CLI, PROMETHEUS_DIR, SERVER, require_binary, require_tool
from test_prometheus_files import ALERTS, alert_rules, as_prometheus_expr, dashboard_queries

LOAD = os.environ.get("GPUKV_LOAD", os.path.join(os.path.dirname(CLI), "gpukv-load"))
# Slots per tier: few, so that even a slow load run spills to the host tier and fills it, and the host-tier,
# ticket-board and FULL paths all report.
CAPACITY = 1000
HOST_CAPACITY = 1000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, observe, done, timeout=60.0):
    """Polls observe() until done(value) holds and returns that value; fails showing the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = observe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; last seen: {value!r}")
        time.sleep(0.5)


class Stack:
    """gpukv-server and a Prometheus that scrapes it every second and evaluates deploy/prometheus/alerts.yml."""

    def __init__(self, workdir):
        self.server = subprocess.Popen(
            [require_binary(SERVER), "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--backend=cpu",
             "--log_level=warn", f"--capacity={CAPACITY}", f"--host_capacity={HOST_CAPACITY}", "--key_width=16", "--value_width=16", "--cpu_threads=2",
             f"--data_dir={workdir}/gpukv-data", "--wal=batch"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.server.stdout.readline()
        match = re.search(r"listening on port (\d+), metrics on port (\d+)", line)
        assert match, f"server did not start: {line!r}"
        self.port, self.metrics_port = int(match.group(1)), int(match.group(2))

        config = yaml.safe_load(open(os.path.join(PROMETHEUS_DIR, "prometheus.yml")))
        (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gpukv"]
        # The shipped job finds shards through Kubernetes DNS; here the one shard is on a known address.
        job.pop("dns_sd_configs")
        job.pop("relabel_configs")
        job["static_configs"] = [{"targets": [f"127.0.0.1:{self.metrics_port}"]}]
        config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [ALERTS]
        config_file = os.path.join(workdir, "prometheus.yml")
        with open(config_file, "w") as f:
            yaml.safe_dump(config, f)
        self.web = f"http://127.0.0.1:{free_port()}"
        self.log = open(os.path.join(workdir, "prometheus.log"), "w")
        self.prometheus = subprocess.Popen(
            [require_tool("prometheus"), f"--config.file={config_file}", f"--storage.tsdb.path={workdir}/data",
             f"--web.listen-address={self.web[len('http://'):]}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for("Prometheus to be ready", self.ready, bool)

    def ready(self):
        assert self.prometheus.poll() is None, f"prometheus exited: {open(self.log.name).read()[-2000:]}"
        try:
            return urllib.request.urlopen(self.web + "/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def api(self, endpoint, **params):
        url = f"{self.web}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
        try:
            body = json.load(urllib.request.urlopen(url, timeout=10))
        except urllib.error.HTTPError as e:  # a bad query answers 400 with the parser's message
            body = json.load(e)
        return body

    def query(self, expr):
        """{frozenset of labels: value} for an instant query; fails on a query error."""
        body = self.api("query", query=expr)
        assert body["status"] == "success", f"{expr}: {body}"
        return {frozenset(r["metric"].items()): float(r["value"][1]) for r in body["data"]["result"]}

    def cli(self, *args, stdin=None):
        return subprocess.run([require_binary(CLI), f"--target=127.0.0.1:{self.port}", *args], input=stdin,
                              capture_output=True, text=True, timeout=30)

    def server_metrics(self):
        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()

    def stop_server(self):
        if self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            self.server.wait(timeout=30)

    def close(self):
        self.stop_server()
        if self.prometheus.poll() is None:
            self.prometheus.terminate()
            self.prometheus.wait(timeout=30)
        self.log.close()


@pytest.fixture
def stack(tmp_path):
    s = Stack(str(tmp_path))
    yield s
    s.close()


def operations(values):
    """{(kind, result): count} from a query's result over gpukv_operations_total."""
    return {(dict(k)["kind"], dict(k)["result"]): v for k, v in values.items()}


def scraped_operations(text):
    return {(kind, result): float(v) for kind, result, v in
            re.findall(r'^gpukv_operations_total\{kind="(\w+)",result="(\w+)"\} (\S+)$', text, re.M)}


def test_metrics_reach_prometheus_with_the_values_driven(stack):
    # Known calls: 300 keys stored in one batch, read back with 50 absent ones, one refused insert, one delete,
    # one call with a key over the 16-byte width.
    keys = [f"k{i}" for i in range(300)]
    assert stack.cli("batch-put", "-", stdin="".join(f"{k}\tv\n" for k in keys)).returncode == 0
    got = stack.cli("batch-get", "-", stdin="".join(f"{k}\n" for k in keys + [f"absent{i}" for i in range(50)]))
    assert got.returncode == 1 and got.stdout.count("\tOK\t") == 300  # exit code 1: some keys were absent
    assert stack.cli("put", "--if_absent", "k0", "x").stdout == "EXISTS\n"
    assert stack.cli("delete", "k0").stdout == "OK\n"
    assert stack.cli("put", "k" * 40, "v").returncode != 0

    expected = {("PUT", "OK"): 300, ("GET", "OK"): 300, ("GET", "NOT_FOUND"): 50, ("PUT_IF_ABSENT", "EXISTS"): 1,
                ("DELETE", "OK"): 1}
    wait_for("the driven operation counts in Prometheus",
             lambda: operations(stack.query('gpukv_operations_total{job="gpukv"}')), lambda v: v == expected)
    requests = {(dict(k)["method"], dict(k)["code"]): v for k, v in stack.query("gpukv_requests_total").items()}
    assert requests[("BatchPut", "OK")] == 1 and requests[("BatchGet", "OK")] == 1
    assert requests[("Put", "INVALID_ARGUMENT")] == 1 and requests[("Delete", "OK")] == 1
    items = {dict(k)["tier"]: v for k, v in stack.query("gpukv_items").items()}
    assert items == {"device": 299, "host": 0}  # new keys go to the device tier until it is full
    assert stack.query("gpukv_capacity_slots")  # the slot count, prime-rounded by the table, is exported
    assert sum(stack.query("gpukv_batch_size_ops_count").values()) >= 3
    assert stack.query('gpukv_queue_delay_seconds_bucket{le="+Inf"}')
    assert stack.query("gpukv_batch_execution_seconds_sum")
    assert list(stack.query('up{job="gpukv"}').values()) == [1.0]

    # A load run over more keys than the table holds: fills the device tier, spills to the host tier, fills
    # that, then FULL results and RESOURCE_EXHAUSTED calls.
    load = subprocess.run([require_binary(LOAD), f"--target=127.0.0.1:{stack.port}", "--mode=unary", "--callers=4",
                           "--seconds=2", f"--keys={3 * (CAPACITY + HOST_CAPACITY)}", "--get=0.2", "--put=0.8", "--value_size=8"],
                          capture_output=True, text=True, timeout=60)
    assert "RESULT load" in load.stdout, load.stdout + load.stderr
    truth = scraped_operations(stack.server_metrics())  # the server is idle now: its counters stay put
    assert truth.get(("PUT", "FULL"), 0) > 0, f"the load run did not fill the table: {truth}"
    wait_for("Prometheus to match the server's counters after the load",
             lambda: operations(stack.query("gpukv_operations_total")), lambda v: v == truth)
    server_errors = stack.query('sum(gpukv_requests_total{code="RESOURCE_EXHAUSTED"})')
    assert list(server_errors.values())[0] > 0
    host = {dict(k)["kind"]: v for k, v in stack.query("gpukv_host_tier_accesses_total").items()}
    assert host["write"] > 0 and host["read"] + host["avoided"] > 0, host
    items = {dict(k)["tier"]: v for k, v in stack.query("gpukv_items").items()}
    assert items["host"] > 0, items

    # Every dashboard query runs and shows data.
    empty = [title for title, expr in dashboard_queries() if not stack.query(as_prometheus_expr(expr))]
    assert empty == [], f"dashboard panels without data: {empty}"

    # The shipped alert rules all evaluate; the full table starts the table alerts and the refused calls the
    # error ratio alert (pending: their `for` has not passed yet).
    def rule_health():
        return {r["name"]: r.get("health") for g in stack.api("rules")["data"]["groups"] for r in g["rules"]}
    wait_for("every alert rule to evaluate", rule_health,
             lambda v: v == {r["alert"]: "ok" for r in alert_rules()})

    def active_alerts():
        return {a["labels"]["alertname"] for a in stack.api("alerts")["data"]["alerts"]}
    wait_for("the table and error alerts", active_alerts,
             lambda v: {"GpukvTableNearFull", "GpukvTableFull", "GpukvErrorRatioHigh"} <= v)

    stack.stop_server()
    wait_for("GpukvServerDown", active_alerts, lambda v: "GpukvServerDown" in v)
    assert list(stack.query('up{job="gpukv"}').values()) == [0.0]
