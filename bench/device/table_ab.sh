#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: two builds of table_bench_gpu alternating in one
# lease (the bundle's bin/table_bench_gpu and bin/table_bench_gpu.base, which make_bundle.sh's EXTRA_BINS
# adds), ROUNDS rounds (default 2) of the same command, so that a change to gpu/ is measured against its
# baseline on the same device. Flags go to the benchmark. Logs to $OUT/table_ab.log.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh"
log=$out/table_ab.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$log"
for round in $(seq "${ROUNDS:-2}"); do
  for build in base new; do
    bin=$bundle/bin/table_bench_gpu
    [[ $build == base ]] && bin=$bundle/bin/table_bench_gpu.base
    echo "# round $round $build: $*" | tee -a "$log"
    "$bin" "$@" 2>&1 | grep RESULT | sed "s/^RESULT/RESULT build=$build/" | tee -a "$log"
  done
done
