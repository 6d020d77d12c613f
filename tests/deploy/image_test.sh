#!/usr/bin/env bash
# The image test: builds docker/Dockerfile for real and runs the image.
#
# No Docker engine is needed: buildah builds the Dockerfile and runs commands in the image with chroot isolation.
# The official CUDA images cannot be pulled here, so the build arguments point the two stages at local stand-ins
# (tests/deploy/make_test_bases.sh: Debian 12 from debootstrap, the devel one with the CCCL headers) and turn the
# CUDA backend off. Then:
#   - the image's configuration: non-root numeric user, both ports exposed, the server as entrypoint, a health check
#   - the runtime stage holds no build tools and no headers
#   - the image's entrypoint, configured through GPUKV_* variables as a Kubernetes ConfigMap would, serves on the
#     CPU backend as user 10001: the image's own health check command passes, the image's CLI stores and reads a
#     key, the metrics endpoint counts it, and SIGTERM drains the server to exit code 0.
#
# Slow (the build stage compiles the server with $GPUKV_JOBS jobs, 2 by default), so it is not part of every run:
# run it directly, or set GPUKV_IMAGE_TEST=1 for tests/run_all.sh. Needs root. Base images and buildah's layer
# cache are kept in $GPUKV_IMAGE_TEST_DIR (default build-image/), so a rerun rebuilds only what changed;
# GPUKV_IMAGE_TEST_NO_CACHE=1 rebuilds every step.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${GPUKV_IMAGE_TEST_DIR:-$root/build-image}
jobs=${GPUKV_JOBS:-2}
image=localhost/gpukv:image-test
started=$(date +%s)
[ "$(id -u)" -eq 0 ] || { echo "image test: needs root (buildah's chroot isolation and debootstrap)"; exit 1; }

"$root/deploy/install-deps.sh" image
mkdir -p "$dir"
export GPUKV_IMAGE_TEST_DIR=$dir
"$root/tests/deploy/make_test_bases.sh" >/dev/null
bah() { buildah --root "$dir/storage" --runroot "$dir/run" --storage-driver vfs "$@"; }
fail() { echo "image test FAILED: $*"; exit 1; }

echo "== image test: buildah bud docker/Dockerfile (CPU backend, $jobs jobs; log: $dir/build.log)"
cache=--layers
[ "${GPUKV_IMAGE_TEST_NO_CACHE:-0}" = 1 ] && cache=--no-cache
if ! bah bud --isolation chroot --pull=never --format docker "$cache" -f "$root/docker/Dockerfile" \
    --build-arg BUILD_IMAGE=localhost/gpukv-test/devel:bookworm \
    --build-arg RUNTIME_IMAGE=localhost/gpukv-test/base:bookworm \
    --build-arg GPUKV_ENABLE_CUDA=OFF --build-arg JOBS="$jobs" -t "$image" "$root" >"$dir/build.log" 2>&1; then
  tail -40 "$dir/build.log"
  fail "the image did not build"
fi
grep -E 'STEP [0-9]+/[0-9]+: (FROM|RUN)|^runtime packages:|Using cache' "$dir/build.log" | cut -c1-160 || true
echo "built in $(( $(date +%s) - started )) s; $(bah images --format '{{.Size}}' "$image") runtime image"

echo "== image test: configuration"
bah inspect --type image "$image" | python3 -c 'import json, sys; json.dump(json.load(sys.stdin)["Docker"]["config"], sys.stdout)' \
  >"$dir/config.json"
python3 - "$dir/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
assert not c.get("Cmd"), f"arguments after the entrypoint: {c['Cmd']}"
assert c["User"] == "10001:10001", f"user {c['User']!r}"
assert {"50051/tcp", "9464/tcp"} <= set(c.get("ExposedPorts") or {}), f"ports {c.get('ExposedPorts')}"
assert c["Entrypoint"] == ["/usr/local/bin/gpukv-server"], f"entrypoint {c['Entrypoint']}"
assert (c.get("Healthcheck") or {}).get("Test", [""])[0] == "CMD-SHELL", f"health check {c.get('Healthcheck')}"
print("user", c["User"], "| ports", " ".join(sorted(c["ExposedPorts"])), "| entrypoint", c["Entrypoint"][0])
EOF
healthcheck=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['Healthcheck']['Test'][1])" "$dir/config.json")

ctr=$(bah from --pull=never "$image")
server=""
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then kill "$server"; wait "$server" || true; fi
  bah rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
in_image() { bah run --isolation chroot "$ctr" -- "$@"; }

echo "== image test: runtime stage contents"
in_image sh -c 'id -u' | grep -qx 10001 || fail "commands in the image do not run as user 10001"
in_image sh -c 'for t in cc c++ gcc cmake protoc nvcc; do command -v $t && exit 1; done; [ ! -e /usr/include/grpcpp ]' ||
  fail "build tools or headers in the runtime image"
echo "runs as 10001; no compiler, cmake, protoc, nvcc or headers"

echo "== image test: the entrypoint on the CPU backend"
read -r grpc_port metrics_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
# Configured through the environment only, as deploy/k8s/configmap.yaml does.
bah config --env GPUKV_LISTEN="127.0.0.1:$grpc_port" --env GPUKV_METRICS_LISTEN="127.0.0.1:$metrics_port" \
  --env GPUKV_BACKEND=cpu --env GPUKV_CAPACITY=100000 --env GPUKV_CPU_THREADS=2 --env GPUKV_SHUTDOWN_GRACE_MS=3000 "$ctr"
# Exactly what a container runtime starts: the entrypoint (the configuration check above found no Cmd).
mapfile -t entrypoint < <(python3 -c "import json,sys; print('\n'.join(json.load(open(sys.argv[1]))['Entrypoint']))" "$dir/config.json")
in_image "${entrypoint[@]}" >"$dir/server.log" 2>&1 &
server=$!
for _ in $(seq 120); do
  in_image sh -c "$healthcheck" 2>/dev/null && break
  kill -0 "$server" 2>/dev/null || { cat "$dir/server.log"; fail "the server exited"; }
  sleep 0.5
done
in_image sh -c "$healthcheck" || { cat "$dir/server.log"; fail "the image's health check never passed"; }
echo "health check: $healthcheck -> passed"

cli() { in_image gpukv --target="127.0.0.1:$grpc_port" "$@"; }
[ "$(cli put image-test hello)" = OK ] || fail "put"
[ "$(cli get image-test)" = hello ] || fail "get"
cli stats | tee "$dir/stats.txt" | grep -q 'backend: "cpu"' || fail "stats do not name the CPU backend"
echo "put image-test hello -> OK; get image-test -> hello"
python3 - "$metrics_port" <<'EOF'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
for line in ('gpukv_operations_total{kind="PUT",result="OK"} 1', 'gpukv_operations_total{kind="GET",result="OK"} 1'):
    assert line in body, f"metrics lack {line!r}"
print("metrics: PUT OK 1, GET OK 1")
EOF

# The server process is ours (started above through buildah); find it by its listening port to check its user
# and to send it the signal a container runtime sends on stop.
pid=$(ss -Hltnp "sport = :$grpc_port" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
[ -n "$pid" ] || fail "no process listens on $grpc_port"
ancestor=$pid
while [ "$ancestor" -gt 1 ] && [ "$ancestor" != "$server" ]; do ancestor=$(awk '{print $4}' "/proc/$ancestor/stat"); done
[ "$ancestor" = "$server" ] || fail "the process on port $grpc_port is not the one this test started"
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
[ "$uid" = 10001 ] || fail "the server runs as uid $uid"
kill -TERM "$pid"
code=0
wait "$server" || code=$?
server=""
[ "$code" -eq 0 ] || { cat "$dir/server.log"; fail "the server exited with $code after SIGTERM"; }
grep -q draining "$dir/server.log" || { cat "$dir/server.log"; fail "no drain in the server's log"; }
echo "server ran as uid $uid; SIGTERM -> drained, exit code 0"
echo "image test passed in $(( $(date +%s) - started )) s"
