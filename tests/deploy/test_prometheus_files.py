"""deploy/prometheus and deploy/grafana, offline: promtool checks the scrape configuration and the alert rules
and runs the alerts' unit tests; every alert has a unit test; the dashboard parses, and each of its queries is
valid PromQL (promtool parses it) that names only metrics and label values the server exports."""
import json
import os
import re
import subprocess

import pytest
import yaml

from conftest import DASHBOARD, PROMETHEUS_DIR, path, require_tool
from promql_names import check_expression, exported

ALERTS = os.path.join(PROMETHEUS_DIR, "alerts.yml")
ALERTS_TEST = path("tests", "deploy", "prometheus", "alerts_test.yml")


def promtool(*args):
    out = subprocess.run([require_tool("promtool"), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}{out.stderr}"
    return out.stdout + out.stderr


def alert_rules():
    return [r for g in yaml.safe_load(open(ALERTS))["groups"] for r in g["rules"] if "alert" in r]


def dashboard_queries():
    """(panel title, expression) for every query of the dashboard."""
    board = json.load(open(DASHBOARD))
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def as_prometheus_expr(expr):
    """A Grafana query with its variables replaced the way Grafana would for one shard's view."""
    return expr.replace("$__rate_interval", "1m").replace("$instance", ".*")


def test_scrape_configuration_is_valid():
    assert "SUCCESS" in promtool("check", "config", os.path.join(PROMETHEUS_DIR, "prometheus.yml"))


def test_alert_rules_are_valid():
    out = promtool("check", "rules", ALERTS)
    assert f"SUCCESS: {len(alert_rules())} rules found" in out


def test_alert_unit_tests_pass():
    assert "SUCCESS" in promtool("test", "rules", ALERTS_TEST)


def test_every_alert_has_a_unit_test_that_sees_it_fire():
    tests = yaml.safe_load(open(ALERTS_TEST))["tests"]
    firing = {case["alertname"] for t in tests for case in t["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for t in tests for case in t["alert_rule_test"] if not case["exp_alerts"]}
    names = {r["alert"] for r in alert_rules()}
    assert names == {"GpukvServerDown", "GpukvQueueSaturated", "GpukvTableNearFull", "GpukvTableFull",
                     "GpukvHostTierSpilling", "GpukvErrorRatioHigh", "GpukvWalFsyncSlow", "GpukvWalFailing",
                     "GpukvSnapshotMissing", "GpukvLimitRefusals"}
    assert names <= firing, f"alerts never seen firing in a test: {names - firing}"
    assert names <= quiet, f"alerts never seen quiet in a test: {names - quiet}"


def test_alerts_use_only_exported_metrics_and_label_values():
    series = exported()
    problems = [f"{r['alert']}: {p}" for r in alert_rules() for p in check_expression(r["expr"], series)]
    assert problems == []


def test_dashboard_is_a_grafana_dashboard_covering_what_operators_watch():
    board = json.load(open(DASHBOARD))
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in board["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p.get("targets"), p["title"]
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "instance"}
    used = " ".join(expr for _, expr in dashboard_queries())
    for metric in ("gpukv_operations_total", "gpukv_queue_delay_seconds_bucket", "gpukv_batch_execution_seconds_bucket",
                   "gpukv_batch_size_ops_bucket", "gpukv_items", "gpukv_capacity_slots",
                   "gpukv_host_tier_accesses_total", "gpukv_wal_bytes_total", "gpukv_wal_fsync_seconds_bucket"):
        assert metric in used, f"the dashboard does not show {metric}"
    assert re.search(r'kind="avoided".*kind="read"', used, re.S), "no ticket-board effectiveness panel"


def test_dashboard_queries_are_valid_promql(tmp_path):
    """promtool has no command that parses a bare expression; it parses recording rules, so each query
    becomes one."""
    queries = dashboard_queries()
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": as_prometheus_expr(expr)} for i, (_, expr) in enumerate(queries)]}]}
    file = tmp_path / "dashboard_rules.yml"
    file.write_text(yaml.safe_dump(rules))
    assert f"SUCCESS: {len(queries)} rules found" in promtool("check", "rules", str(file))


def test_dashboard_uses_only_exported_metrics_and_label_values():
    series = exported()
    problems = [f"{title}: {p}" for title, expr in dashboard_queries() for p in check_expression(expr, series)]
    assert problems == []


@pytest.mark.parametrize("bad, complaint", [
    ('sum(rate(gpukv_operation_total[1m]))', "no such metric"),
    ('gpukv_operations_total{kind="put"}', "not among"),
    ('gpukv_requests_total{code!~"OK|INVALID_ARGUMENTS"}', "not among"),
    ('gpukv_items{shard="0"}', "no label shard"),
    ('histogram_quantile(0.5, rate(gpukv_queue_delay_seconds_buckets[1m]))', "no such metric"),
])
def test_the_name_check_catches_mistakes(bad, complaint):
    problems = check_expression(bad, exported())
    assert problems and complaint in problems[0], problems
