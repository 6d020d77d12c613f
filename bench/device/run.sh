#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: the GPU tests, then the benchmarks, with logs
# under $OUT. Usage: bench/device/run.sh [tests|bench|host|staging|all] [benchmark flags...]
#   bench: table_bench_gpu; host: host_tier_bench_gpu; staging: staging_bench_gpu (the flags go to the one
#   that runs)
set -uo pipefail
what=${1:-all}
shift || true
source "$(dirname "$0")/bundle_env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$out/device.txt"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$out/device.txt"
status=0
if [[ $what == tests || $what == all ]]; then
  "$bundle/bin/table_test" --gtest_filter="${TEST_FILTER:-*gpu*:*Gpu*}" >"$out/table_test.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED TEST|tests? from .* ran" "$out/table_test.log" | tail -30
fi
if [[ $what == bench || $what == all ]]; then
  "$bundle/bin/table_bench_gpu" "$@" 2>&1 | tee "$out/table_bench_gpu.log" || status=1
fi
if [[ $what == staging ]]; then
  "$bundle/bin/staging_bench_gpu" "$@" 2>&1 | tee "$out/staging_bench_gpu.log" || status=1
fi
if [[ $what == host ]]; then
  "$bundle/bin/host_tier_bench_gpu" "$@" 2>&1 | tee "$out/host_tier_bench_gpu.log" || status=1
fi
exit $status
