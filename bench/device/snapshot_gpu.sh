#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: the GPU tests after the snapshot work (table_test's
# GPU cases, which read the table out in ranges; the kill -9 test on a GPU server with each log setting and
# with snapshots back to back), then the snapshot and load of 100 M items (16 B keys, 128 B values) beside
# the disk's own sequential write and read rates, measured with dd on the same directory in the same run.
# Logs to $OUT. SKIP_TESTS=1 runs the disk and the benchmark alone; REPEATS=N runs the benchmark N times.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh"
log=$out/snapshot_gpu.log
data=${DATA_ROOT:-/tmp/gpukv-snapshot}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$log"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$log"
nproc | tee -a "$log"
status=0

if [[ ${SKIP_TESTS:-0} != 1 ]]; then
echo "== table_test (GPU cases)" | tee -a "$log"
"$bundle/bin/table_test" --gtest_filter='*gpu*:*Gpu*' >"$out/table_test.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED) |FAILED TEST|tests? from .* ran" "$out/table_test.log" | tail -12 | tee -a "$log"
echo "== durability_test on the GPU backend" | tee -a "$log"
GPUKV_TEST_BACKEND=gpu GPUKV_SERVER=$bundle/bin/gpukv-server GPUKV_KILL_ROUNDS=${KILL_ROUNDS:-5} \
  "$bundle/bin/durability_test" --gtest_filter='Wal/*' >"$out/durability_test.log" 2>&1 || status=1
grep -E "kill rounds|^\[  (PASSED|FAILED|  OK) |FAILED TEST" "$out/durability_test.log" | tee -a "$log"
fi

echo "== the disk, then snapshot_bench, each repeat" | tee -a "$log"
rm -rf "$data" && mkdir -p "$data"
df -h "$data" | tee -a "$log"
for _ in $(seq "${REPEATS:-1}"); do
  # Sequential rates of the disk itself, past the page cache, right before each run: 15 GB, about the
  # snapshot's size (this machine's virtual disk varies from run to run).
  dd if=/dev/zero of="$data/dd.bin" bs=16M count=900 oflag=direct conv=fsync 2>&1 | tail -1 | sed 's/^/DD write: /' | tee -a "$log"
  dd if="$data/dd.bin" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1 | sed 's/^/DD read: /' | tee -a "$log"
  # Through the page cache, as the snapshot's loader reads (emptied first: it is root here).
  sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null
  dd if="$data/dd.bin" of=/dev/null bs=16M 2>&1 | tail -1 | sed 's/^/DD read, page cache: /' | tee -a "$log"
  rm -f "$data/dd.bin"
  "$bundle/bin/snapshot_bench" --dir="$data/bench" --items="${ITEMS:-100000000}" --value_width=128 --backend=gpu 2>&1 | tee -a "$log" || status=1
done
rm -rf "$data"
exit $status
