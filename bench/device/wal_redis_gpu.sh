#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: bench/wal_redis.sh (the write-ahead log's settings
# beside Redis' append-only file, 1000-key PUT batches and MSETs) with the GPU server, the data on the
# machine's disk. The bundle carries redis-server and redis-benchmark (make_bundle.sh with EXTRA_BINS). Logs to
# $OUT/wal_redis_gpu.log.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/wal_redis_gpu.log"
GPUKV_SERVER=$bundle/bin/gpukv-server GPUKV_LOAD=$bundle/bin/gpukv-load REDIS_SERVER=$bundle/bin/redis-server \
  REDIS_BENCHMARK=$bundle/bin/redis-benchmark DATA_ROOT=${DATA_ROOT:-/tmp/gpukv-wal-redis} \
  CAPACITY=${CAPACITY:-67108864} LOAD_FLAGS="--processes=${PROCESSES:-4}" \
  bash bench/wal_redis.sh 2>&1 | tee -a "$out/wal_redis_gpu.log"
