#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: what the write-ahead log costs a GPU server, and
# how fast a restart replays it. One server (16-byte keys, 8-byte values, 64 M slots) per log setting, off,
# batch and everysec, each with a fresh data directory on the machine's local disk, under the same write-heavy
# lines; each line's figures, then the log's bytes and its fdatasync count and mean time from /metrics.
# Then the batch server is killed with SIGKILL and started again on its directory: the replay's time. First,
# bench/wal_bench's figures for the log alone.
# Logs to $OUT/durability_gpu.log.
set -uo pipefail
log_name=durability_gpu
source "$(dirname "$0")/service_lib.sh"
table="--capacity=67108864 --key_width=16 --value_width=8"
keys=--keys=16000000
data=${DATA_ROOT:-/tmp/gpukv-wal}
rm -rf "$data"
df -h "$(dirname "$data")" | tail -1 | tee -a "$log"
# The log's own costs, apart from gRPC: encode, write, fdatasync, and replay into a GPU table.
"$bundle/bin/wal_bench" --dir="$data/bench" --backend=gpu --batches=200 2>&1 | tee -a "$log"

wal_metrics() {  # the log's figures so far, from the latest shard's metrics port
  local port=${shard_metrics[0]}
  local name line=
  for name in gpukv_wal_bytes_total gpukv_wal_fsync_seconds_sum gpukv_wal_fsync_seconds_count gpukv_wal_failures_total; do
    line+="${line:+ }$name=$(metric "$port" "$name")"
  done
  echo "$line" | tee -a "$log"
}

for wal in off batch everysec; do
  echo "# --wal=$wal" | tee -a "$log"
  flags=()
  [[ $wal != off ]] && flags=(--data_dir="$data/$wal" --wal="$wal")
  start_shard 50301 0 $table "${flags[@]}" || continue
  for shape in "--mode=batch --batch=10000 --callers=16 --processes=4 --get=0 --put=1" \
               "--mode=batch --batch=1000 --callers=32 --processes=4 --get=0 --put=1" \
               "--mode=batch --batch=1000 --callers=32 --processes=4 --get=0.5 --put=0.45" \
               "--mode=unary --callers=128 --processes=4 --get=0 --put=1"; do
    measure "wal=$wal" --target=127.0.0.1:50301 $keys $shape
    [[ $wal != off ]] && wal_metrics
  done
  if [[ $wal == batch ]]; then
    kill -KILL "${shards[0]}"
    wait "${shards[0]}" 2>/dev/null
    shards=()
    shard_metrics=()
    du -sh "$data/batch" | tee -a "$log"
    t0=$(date +%s%N)
    start_shard 50301 0 $table "${flags[@]}" --log_level=info
    echo "REPLAY restart to serving: $((($(date +%s%N) - t0) / 1000000)) ms" | tee -a "$log"
    grep -h "recovered" "$out/server.log" | tail -1 | tee -a "$log"
  fi
  stop_shards
  [[ $wal != off ]] && du -sh "$data/$wal" | tee -a "$log" && rm -rf "${data:?}/$wal"
done
rm -rf "$data"
