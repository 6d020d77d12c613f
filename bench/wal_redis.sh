#!/usr/bin/env bash
# The write-ahead log's three settings beside Redis' append-only file at the matching fsync policies, one run,
# one machine: 1000-key PUT batches (gpukv-load --mode=batch --batch=1000 --put=1) against gpukv-server with
# --wal=off, everysec and batch, and 1000-key MSETs (redis-benchmark) against redis-server with appendonly no,
# appendfsync everysec and always. Each server starts on a fresh data directory under DATA_ROOT (default
# /tmp/gpukv-wal-redis: put it on the disk to measure); ROUNDS rounds alternate the settings. Prints one line
# per measurement: keys/s and p99 (gpukv-load's RESULT line; redis-benchmark's CSV: requests/s, then latencies
# in ms, avg, min, p50, p95, p99, max). Binaries: GPUKV_SERVER, GPUKV_LOAD (default build/), REDIS_SERVER,
# REDIS_BENCHMARK (default on PATH). SERVER_FLAGS adds gpukv-server flags; LOAD_FLAGS gpukv-load's.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=${GPUKV_SERVER:-$root/build/server/gpukv-server}
load_bin=${GPUKV_LOAD:-$root/build/client/gpukv-load}
redis_server=${REDIS_SERVER:-redis-server}
redis_benchmark=${REDIS_BENCHMARK:-redis-benchmark}
data=${DATA_ROOT:-/tmp/gpukv-wal-redis}
secs=${SECONDS_PER_RUN:-6}
rm -rf "$data" && mkdir -p "$data"
pkill -f "redis-server.*:6399" 2>/dev/null
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo bundle), data on $(df -h "$data" | tail -1 | awk '{print $1}')"

gpukv_line() {  # $1: --wal setting
  local wal=$1 dir="$data/gpukv-$1" flags=() port
  [[ $wal != off ]] && flags=(--data_dir="$dir" --wal="$wal")
  "$server_bin" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --capacity=${CAPACITY:-16777216} --key_width=16 \
    --value_width=8 --log_level=warn --snapshot_interval=0 "${flags[@]}" ${SERVER_FLAGS:-} >"$data/server.out" 2>&1 &
  local pid=$!
  for _ in $(seq 300); do
    port=$(grep -o 'listening on port [0-9]*' "$data/server.out" | grep -o '[0-9]*$') && break
    sleep 0.1
  done
  [[ -n ${port:-} ]] || { echo "gpukv-server did not start: $(cat "$data/server.out")"; kill "$pid"; return; }
  echo "gpukv wal=$wal $("$load_bin" --target=127.0.0.1:"$port" --mode=batch --batch=1000 --callers=${CALLERS:-32} \
    --get=0 --put=1 --keys=1000000 --seconds="$secs" ${LOAD_FLAGS:-} 2>/dev/null)"
  kill "$pid"
  wait "$pid" 2>/dev/null
  rm -rf "$dir"
}

redis_line() {  # $1: appendfsync policy, or "no" for appendonly no
  local policy=$1 dir="$data/redis-$1"
  mkdir -p "$dir"
  local aof=(--appendonly yes --appendfsync "$policy")
  [[ $policy == no ]] && aof=(--appendonly no)
  "$redis_server" --port 6399 --bind 127.0.0.1 --save "" --dir "$dir" "${aof[@]}" --daemonize yes --logfile "$data/redis.log" >/dev/null
  sleep 1
  local kvs
  kvs=$(for _ in $(seq 1000); do printf 'key:__rand_int__ v '; done)
  echo "redis appendfsync=$policy MSET1000 $("$redis_benchmark" -p 6399 -r 1000000 -n ${REDIS_REQUESTS:-20000} -c ${REDIS_CLIENTS:-50} \
    --csv MSET $kvs 2>/dev/null | tail -1 | tr -d '"' |
    awk -F, '{printf "requests_per_s=%s keys_per_s=%.0f avg_ms=%s p50_ms=%s p99_ms=%s", $(NF-6), $(NF-6) * 1000, $(NF-5), $(NF-3), $(NF-1)}')"
  "$redis_benchmark" -p 6399 -n 1 -c 1 SHUTDOWN NOSAVE >/dev/null 2>&1
  sleep 0.5
  rm -rf "$dir"
}

for round in $(seq "${ROUNDS:-2}"); do
  echo "# round $round"
  for wal in off everysec batch; do gpukv_line "$wal"; done
  for policy in no everysec always; do redis_line "$policy"; done
done
rm -rf "$data"
