"""Paths and tools shared by the deployment tests (tests/deploy). tests/run_all.sh runs them with the binaries
of its Release build: GPUKV_SERVER, GPUKV_CLI."""
import os
import re
import shutil
import subprocess

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.environ.get("GPUKV_SERVER", os.path.join(ROOT, "build", "server", "gpukv-server"))
CLI = os.environ.get("GPUKV_CLI", os.path.join(ROOT, "build", "client", "gpukv"))
K8S = os.path.join(ROOT, "deploy", "k8s")
PROMETHEUS_DIR = os.path.join(ROOT, "deploy", "prometheus")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "gpukv-dashboard.json")


def path(*parts):
    return os.path.join(ROOT, *parts)


def read(*parts):
    with open(path(*parts)) as f:
        return f.read()


def load_yaml_docs(file):
    with open(file) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def require_tool(name):
    """The tool's path. deploy/install-deps.sh test installs every tool these tests run, so a missing one is a
    failure of the setup, reported as a skip that names it rather than as a test failure."""
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (deploy/install-deps.sh test installs it)")
    return found


def require_binary(binary):
    if not os.access(binary, os.X_OK):
        pytest.skip(f"{binary} is not built (tests/run_all.sh builds it)")
    return binary


def server_flags():
    """The names of gpukv-server's own flags (those defined in server/main.cpp), from its --helpfull."""
    out = subprocess.run([require_binary(SERVER), "--helpfull"], capture_output=True, text=True, timeout=30)
    text = out.stdout + out.stderr
    section = re.search(r"Flags from \S*server/main\.cpp:\n(.*?)(?:\n\n|\Z)", text, re.S)
    assert section, f"no server/main.cpp section in --helpfull: {text[:500]}"
    flags = set(re.findall(r"^\s+--([a-z_]+) \(", section.group(1), re.M))
    assert "capacity" in flags, f"cannot read the server's flags: {section.group(1)[:500]}"
    return flags
