"""deploy/k8s, offline: every manifest against the Kubernetes API schemas (kubernetes-validate from PyPI ships
them; strict, so an unknown or misspelt field fails), the ServiceMonitor against the Prometheus Operator's CRD
schema, and the links between the resources that no schema sees: selectors that match, ports that exist,
ConfigMap keys that are real server flags, a grace period longer than the drain."""
import copy
import glob
import os
import re
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1 as prometheus_operator

from conftest import CLI, K8S, load_yaml_docs, read, require_binary, server_flags

# The oldest Kubernetes with native gRPC probes in GA, and the newest the validator knows.
KUBERNETES_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]


def manifests():
    """{file name: [documents]} for every resource file the kustomization lists."""
    kustomization = yaml.safe_load(open(os.path.join(K8S, "kustomization.yaml")))
    return {name: load_yaml_docs(os.path.join(K8S, name)) for name in kustomization["resources"]}


def resources():
    return [doc for docs in manifests().values() for doc in docs]


def one(kind, name=None):
    found = [r for r in resources() if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec():
    return one("StatefulSet")["spec"]["template"]["spec"]


def container():
    (c,) = pod_spec()["containers"]
    return c


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


# -- schemas ------------------------------------------------------------------------------------------------------

def test_kustomization_lists_every_manifest_and_only_existing_files():
    listed = set(manifests())
    on_disk = {os.path.basename(f) for f in glob.glob(os.path.join(K8S, "*.yaml"))} - {"kustomization.yaml"}
    assert listed == on_disk, f"listed but missing: {listed - on_disk}; present but not listed: {on_disk - listed}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_builtin_resources_match_the_kubernetes_schemas(version):
    kinds = set()
    for doc in resources():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError with the path
        kinds.add(doc["kind"])
    assert kinds == {"Namespace", "ConfigMap", "StatefulSet", "Service", "PodDisruptionBudget"}


def test_the_schema_validator_rejects_broken_manifests():
    """The validation above can fail: a misspelt field and a wrong type are both caught."""
    sts = one("StatefulSet")
    misspelt = copy.deepcopy(sts)
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["prot"] = 50051
    wrong_type = copy.deepcopy(sts)
    wrong_type["spec"]["replicas"] = "two"
    for bad in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, KUBERNETES_VERSIONS[0], strict=True)


def service_monitor_schema():
    """JSON schema of monitoring.coreos.com/v1 ServiceMonitor, from the models that cloudcoil generates from the
    Prometheus Operator's CRDs (v0.80.1). Made strict the way kubernetes-validate's strict schemas are: an object
    with declared properties accepts no others, as `kubectl apply --validate=strict` would refuse them."""
    schema = prometheus_operator.ServiceMonitor.model_json_schema(by_alias=True, mode="validation")

    def strict(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    return schema


def test_service_monitor_matches_the_operator_crd_schema():
    schema = service_monitor_schema()
    monitor = one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    jsonschema.validate(monitor, schema)
    for mutate in (lambda m: m["spec"]["endpoints"][0].update(intervall="15s"),   # misspelt field
                   lambda m: m["spec"]["endpoints"][0].update(interval="fifteen"),  # not a duration
                   lambda m: m["spec"].pop("selector")):                            # required field
        bad = copy.deepcopy(monitor)
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_kustomize_renders_the_set_into_one_namespace():
    """`kubectl kustomize` (kustomize built into kubectl), where kubectl is installed: the rendered set is the
    same resources, every namespaced one in the gpukv namespace, with the image the kustomization names."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomization was checked file by file only")
    out = subprocess.run([kubectl, "kustomize", K8S], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == \
        sorted((d["kind"], d["metadata"]["name"]) for d in resources())
    kustomization = yaml.safe_load(open(os.path.join(K8S, "kustomization.yaml")))
    for d in rendered:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == kustomization["namespace"], d["metadata"]
        if not d["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(d, KUBERNETES_VERSIONS[-1], strict=True)
    (sts,) = [d for d in rendered if d["kind"] == "StatefulSet"]
    image = kustomization["images"][0]
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == f"{image['newName']}:{image['newTag']}"


# -- the links between resources ----------------------------------------------------------------------------------

def test_statefulset_runs_one_gpu_per_pod_with_grpc_probes_on_the_grpc_port():
    c = container()
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    grpc_port = {p["name"]: p["containerPort"] for p in c["ports"]}["grpc"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == grpc_port, probe
        # The empty service name is the server's overall health, which turns NOT_SERVING while draining.
        assert c[probe]["grpc"].get("service", "") == ""


def test_termination_grace_outlasts_the_drain():
    config = one("ConfigMap", "gpukv-config")["data"]
    drain_s = int(config["GPUKV_SHUTDOWN_GRACE_MS"]) / 1000
    grace_s = pod_spec()["terminationGracePeriodSeconds"]
    # Margin for the readiness probe to see NOT_SERVING and for the last batches to finish after the drain.
    assert grace_s >= drain_s + 10, f"terminationGracePeriodSeconds {grace_s} s vs drain {drain_s} s"


def test_configmap_sets_real_server_flags_on_the_ports_the_pod_declares():
    config = one("ConfigMap", "gpukv-config")
    assert container()["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]
    flags = server_flags()
    for key in config["data"]:
        assert key.startswith("GPUKV_") and key[len("GPUKV_"):].lower() in flags, f"{key} is not a server flag"
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert config["data"]["GPUKV_LISTEN"].rsplit(":", 1)[1] == str(ports["grpc"])
    assert config["data"]["GPUKV_METRICS_LISTEN"].rsplit(":", 1)[1] == str(ports["metrics"])


def test_each_shard_keeps_its_log_on_a_volume_of_its_own():
    # The data directory the servers are told is where each pod mounts its own claim, writable by the server's
    # group, and the log makes every write durable before it is acknowledged.
    config = one("ConfigMap", "gpukv-config")["data"]
    sts = one("StatefulSet")
    claims = {t["metadata"]["name"]: t for t in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in container()["volumeMounts"]}
    assert mounts.get(config["GPUKV_DATA_DIR"]) in claims, (config["GPUKV_DATA_DIR"], mounts)
    claim = claims[mounts[config["GPUKV_DATA_DIR"]]]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pod_spec()["securityContext"]["fsGroup"] == pod_spec()["securityContext"]["runAsGroup"]
    assert config["GPUKV_WAL"] == "batch"


def test_pod_and_image_agree_on_user_and_ports():
    dockerfile = read("docker", "Dockerfile")
    uid, gid = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M).groups()
    security = pod_spec()["securityContext"]
    assert security["runAsNonRoot"] is True
    assert (str(security["runAsUser"]), str(security["runAsGroup"])) == (uid, gid)
    exposed = set(re.search(r"^EXPOSE (.*)$", dockerfile, re.M).group(1).split())
    assert {str(p["containerPort"]) for p in container()["ports"]} == exposed


def test_services_select_the_shards_and_reach_named_container_ports():
    sts = one("StatefulSet")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert selects(sts["spec"]["selector"]["matchLabels"], pod_labels)
    port_names = {p["name"] for p in container()["ports"]}
    headless = one("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    for service in (headless, one("Service", "gpukv")):
        assert selects(service["spec"]["selector"], pod_labels), service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, (service["metadata"]["name"], port)
    # Only the headless Service offers gRPC: a virtual address in front of several shards would send each key
    # to whichever shard it picked.
    assert "grpc" in {p["name"] for p in headless["spec"]["ports"]}
    assert "grpc" not in {p["name"] for p in one("Service", "gpukv")["spec"]["ports"]}
    pdb = one("PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"]["maxUnavailable"] == 1


def test_service_monitor_scrapes_each_shard_once_on_the_metrics_port():
    monitor = one("ServiceMonitor")
    services = [r for r in resources() if r["kind"] == "Service"]
    matched = [s for s in services if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    # Two matching Services would scrape every shard twice and double every sum in alerts and dashboard.
    assert [s["metadata"]["name"] for s in matched] == ["gpukv"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in matched[0]["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def expand_targets(spec):
    """GPUKV_TARGETS as README defines it: a comma-separated list, an item's {a..b} giving one item per number."""
    targets = []
    for item in spec.split(","):
        m = re.fullmatch(r"(.*)\{(\d+)\.\.(\d+)\}(.*)", item.strip())
        if m:
            targets += [f"{m.group(1)}{i}{m.group(4)}" for i in range(int(m.group(2)), int(m.group(3)) + 1)]
        else:
            targets.append(item.strip())
    return targets


def test_the_shard_count_is_the_same_for_the_statefulset_the_servers_and_the_clients():
    sts = one("StatefulSet")
    replicas = sts["spec"]["replicas"]
    server = one("ConfigMap", "gpukv-config")["data"]
    assert int(server["GPUKV_SHARD_COUNT"]) == replicas
    assert server["GPUKV_SHARD_INDEX"] == "auto"  # pod gpukv-N is shard N
    client = one("ConfigMap", "gpukv-client")["data"]
    targets = expand_targets(client["GPUKV_TARGETS"])
    namespace = yaml.safe_load(open(os.path.join(K8S, "kustomization.yaml")))["namespace"]
    grpc_port = {p["name"]: p["port"] for p in one("Service", sts["spec"]["serviceName"])["spec"]["ports"]}["grpc"]
    # Shard i is pod <statefulset>-i under the headless Service, in the namespace the kustomization deploys to.
    assert targets == [f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}.{namespace}.svc:{grpc_port}"
                       for i in range(replicas)]
    # The C++ client reads the same list: gpukv shard-of spreads keys over exactly that many shards.
    keys = "".join(f"key{i}\n" for i in range(2000))
    run = subprocess.run([require_binary(CLI), f"--targets={client['GPUKV_TARGETS']}", "shard-of", "-"], input=keys,
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert {int(line.split("\t")[1]) for line in run.stdout.splitlines()} == set(range(replicas))


# -- the overlay with access control (deploy/k8s-secure) ----------------------------------------------------------

def test_the_access_overlay_mounts_what_its_flags_name_and_probes_over_tls():
    """deploy/k8s-secure, rendered by `kubectl kustomize`: every resource valid and strict, the StatefulSet's
    added variables real server flags naming files on read-only mounts of the Secrets the kustomization says to
    create, and probes that run the CLI over TLS with those files (native gRPC probes speak plaintext)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the overlay cannot be rendered")
    overlay = os.path.join(os.path.dirname(K8S), "k8s-secure")
    out = subprocess.run([kubectl, "kustomize", overlay], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == \
        sorted((d["kind"], d["metadata"]["name"]) for d in resources())
    for d in rendered:
        if not d["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(d, KUBERNETES_VERSIONS[-1], strict=True)
    (sts,) = [d for d in rendered if d["kind"] == "StatefulSet"]
    spec = sts["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    flags = server_flags()
    assert set(env) == {"GPUKV_TLS_CERT", "GPUKV_TLS_KEY", "GPUKV_TLS_CLIENT_CA", "GPUKV_AUTH_TOKEN_FILE"}
    assert all(k[len("GPUKV_"):].lower() in flags for k in env)
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    instructions = read(os.path.join(overlay, "kustomization.yaml"))
    for file in env.values():
        mount = mounts[os.path.dirname(file)]
        assert mount.get("readOnly") is True, mount
        secret = secrets[mount["name"]]
        # The kustomization's comment creates that Secret with that key.
        assert f"create secret generic {secret}" in instructions and f"--from-file={os.path.basename(file)}=" in instructions
    grpc_port = {p["name"]: p["containerPort"] for p in c["ports"]}["grpc"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "grpc" not in c[probe], probe
        command = c[probe]["exec"]["command"]
        assert command[0] == "gpukv" and command[-1] == "health" and f"--target=127.0.0.1:{grpc_port}" in command
        for flag, var in (("tls_ca", "GPUKV_TLS_CLIENT_CA"), ("tls_cert", "GPUKV_TLS_CERT"), ("tls_key", "GPUKV_TLS_KEY")):
            assert f"--{flag}={env[var]}" in command, (probe, flag)
