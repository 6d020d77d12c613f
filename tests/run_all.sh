#!/usr/bin/env bash
# The one test command (README.md; .ci/run runs exactly this): installs what is missing, builds, and runs
# every test. Two builds:
#   build/       Release, with the CUDA backend when nvcc is present; all tests. GPU tests run when a GPU is
#                present and are reported as skipped, with the reason, when not. Then the end-to-end tests:
#                the server binary driven by a Python grpcio client (tests/e2e, packages from PyPI). Then the
#                deployment tests (tests/deploy): Kubernetes manifests against the API schemas, promtool on the
#                Prometheus configuration, alert rules and their unit tests, the Grafana dashboard's queries, and
#                the server scraped by a real Prometheus.
#   build-tsan/  the CPU backend and the batcher under ThreadSanitizer: the concurrency stress, the batcher's
#                tests, shortened model tests, the write-ahead log's files and snapshots, and the many-client model test over gRPC (Debian's gRPC is not
#                instrumented: see tests/tsan-suppressions.txt and the end of CMakeLists.txt).
#   build-asan/  the server under AddressSanitizer (CPU backend): the fuzzing, unread-stream and shutdown tests
#                of tests/e2e run against it again.
# GPUKV_IMAGE_TEST=1 adds the slow image test (tests/deploy/image_test.sh: builds docker/Dockerfile with buildah
# and runs the image; needs root). GPUKV_LONG=1 runs the long suite: 25 kill -9 rounds of the durability test
# instead of 5, and 100000 fuzzed calls per RPC instead of 1000.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${GPUKV_JOBS:-2}

"$root/deploy/install-deps.sh" build test

echo "== build: Release"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$jobs"
echo "== tests: Release"
GPUKV_KILL_ROUNDS=$([ "${GPUKV_LONG:-0}" = 1 ] && echo 25 || echo 5) \
  ctest --test-dir "$root/build" --output-on-failure -j"$jobs"

echo "== tests: the installed table library (cmake --install, find_package(gpukv) from a program outside)"
"$root/tests/install/install_test.sh" "$root/build"

echo "== tests: end to end (the server binary on 127.0.0.1, a Python grpcio client)"
venv="$root/build/e2e-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -r "$root/tests/e2e/requirements.txt"
GPUKV_SERVER="$root/build/server/gpukv-server" GPUKV_CLI="$root/build/client/gpukv" GPUKV_LOAD="$root/build/client/gpukv-load" \
  GPUKV_CEILING="$root/build/bench/transport_ceiling_server" "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/e2e"

echo "== tests: deployment (Kubernetes manifests, Prometheus rules and dashboard, the server scraped by Prometheus)"
venv="$root/build/deploy-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -r "$root/tests/deploy/requirements.txt"
# Plugin autoload off: a test dependency (cloudcoil) registers a pytest plugin that these tests do not use.
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 GPUKV_SERVER="$root/build/server/gpukv-server" GPUKV_CLI="$root/build/client/gpukv" \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/deploy"

if [ "${GPUKV_IMAGE_TEST:-0}" = 1 ]; then
  echo "== tests: the container image (buildah)"
  "$root/tests/deploy/image_test.sh"
fi

echo "== build: ThreadSanitizer (CPU backend)"
cmake -S "$root" -B "$root/build-tsan" -DGPUKV_ENABLE_CUDA=OFF -DGPUKV_SANITIZE=thread \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUKV_BUILD_BENCH=OFF -DGPUKV_BUILD_SERVICE=ON >/dev/null
cmake --build "$root/build-tsan" -j"$jobs" --target table_test server_test service_model_test persistence_test
echo "== tests: ThreadSanitizer"
GPUKV_TEST_SCALE=0.2 TSAN_OPTIONS="halt_on_error=1 abort_on_error=0" \
  ctest --test-dir "$root/build-tsan" --output-on-failure -j"$jobs" -R 'cpu|Stress|Batcher|DecideBatch|LogDir|BatchRecord|SnapshotDir'
# The gRPC test alone gets the suppressions for gRPC's own reports. The uninstrumented libraries it links
# are ignored as a whole; called_from_lib needs each one's exact name, so the list is made from the binary.
supp="$root/build-tsan/tsan-suppressions.txt"
{
  cat "$root/tests/tsan-suppressions.txt"
  ldd "$root/build-tsan/tests/service_model_test" | awk '{print $1}' |
    grep -E '^lib(grpc|gpr|absl|upb|protobuf|re2|cares|address_sorting|ssl|crypto|z)[._]' | sed 's/^/called_from_lib:/'
} >"$supp"
GPUKV_TEST_SCALE=0.2 TSAN_OPTIONS="halt_on_error=1 abort_on_error=0 suppressions=$supp" \
  ctest --test-dir "$root/build-tsan" --output-on-failure -R 'ServiceModel'

echo "== build: AddressSanitizer (the server, CPU backend)"
cmake -S "$root" -B "$root/build-asan" -DGPUKV_ENABLE_CUDA=OFF -DGPUKV_SANITIZE=address -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGPUKV_BUILD_BENCH=OFF -DGPUKV_BUILD_TESTS=OFF >/dev/null
cmake --build "$root/build-asan" -j"$jobs" --target gpukv-server
echo "== tests: AddressSanitizer (fuzzed requests, an unread stream's memory, shutdown, against that server)"
ASAN_OPTIONS="abort_on_error=1" GPUKV_SERVER="$root/build-asan/server/gpukv-server" "$root/build/e2e-venv/bin/python" -m pytest -q \
  -p no:cacheprovider "$root/tests/e2e/test_fuzz_e2e.py" "$root/tests/e2e/test_stream_flow_e2e.py" "$root/tests/e2e/test_drain_e2e.py"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "NOTE: no GPU on this machine: the GPU tests above were SKIPPED (bench/RESULTS.md records the last GPU run)."
fi
echo "all tests passed"
