#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root (after bench/device/run.sh has unpacked the bundle):
# gpukv-server on the GPU backend, driven by gpukv-load from the same machine over 127.0.0.1, in the shapes
# of bench/service_bench.sh; the main lines again with the calls answered on the execution thread
# (--completion_threads=0); the same lines against transport_ceiling_server (the API with no table: what
# gRPC allows on this machine); and a host-tier server that must spill. Logs to $OUT/service_gpu.log.
set -uo pipefail
bundle=.device/bundle
export LD_LIBRARY_PATH=$bundle/lib
out=${OUT:-/tmp/out}
mkdir -p "$out"
log=$out/service_gpu.log
secs=${SECONDS_PER_RUN:-6}
: > "$log"
echo "# $(date -u +%FT%TZ) $(nproc) cores $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee -a "$log"

serve() {  # serve <port> <flags...>: starts a server and waits until it answers health checks
  local port=$1
  shift
  "$bundle/bin/gpukv-server" --listen=127.0.0.1:"$port" --metrics_listen=127.0.0.1:0 --backend=gpu --log_level=warn "$@" \
    >>"$out/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 60); do
    "$bundle/bin/gpukv" --target=127.0.0.1:"$port" health >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "server on $port did not come up" | tee -a "$log"
  return 1
}
load() { "$bundle/bin/gpukv-load" --seconds="$secs" "$@" 2>&1 | grep -E 'RESULT|error|Error' | tee -a "$log"; }
# load_split <n> <flags...>: n gpukv-load processes at once, each with the flags (--callers is per process);
# prints each one's RESULT line and their sum. One process's callbacks run on one gRPC client's threads, so
# several show whether the server or the client is the limit.
load_split() {
  local n=$1 i pids=()
  shift
  for i in $(seq 1 "$n"); do
    "$bundle/bin/gpukv-load" --seconds="$secs" "$@" >"$out/split.$i" 2>/dev/null &
    pids+=($!)
  done
  wait "${pids[@]}"  # not a bare wait: the server runs in the background too
  cat "$out"/split.* | grep RESULT | tee -a "$log" |
    awk -v n="$n" '{for (i = 1; i <= NF; i++) if ($i ~ /^keys_per_s=/) {split($i, kv, "="); s += kv[2]}}
                   END {printf "RESULT split processes=%d keys_per_s=%.0f\n", n, s}' | tee -a "$log"
  rm -f "$out"/split.*
}
# Per-thread CPU time of the latest server, as "tid name nanoseconds" (schedstat's first field).
thread_ns() {
  local t
  for t in /proc/"$server"/task/*; do
    [[ -r $t/schedstat ]] && echo "${t##*/} $(cat "$t/comm" | tr -d ' ') $(cut -d' ' -f1 "$t/schedstat")"
  done
}
# cpu_of <label> <command...>: runs the command, then prints how many cores each kind of server thread used
# meanwhile (threads grouped by name: gRPC's pollers and executors, the server's own threads).
cpu_of() {
  local label=$1 before after t0 t1
  shift
  before=$(thread_ns)
  t0=$(date +%s%N)
  "$@"
  t1=$(date +%s%N)
  after=$(thread_ns)
  join <(sort <<<"$before") <(sort <<<"$after") |
    awk -v ns="$((t1 - t0))" -v l="$label" \
      '{d[$2] += $5 - $3; n[$2]++} END {for (k in d) printf "CPU %s %s threads=%d cores=%.2f\n", l, k, n[k], d[k] / ns}' |
    sort -t= -k3 -rn | tee -a "$log"
}
# The latest server's batch counters from its metrics port (no curl there: bash's /dev/tcp): how many
# batches, how large, how long each waited in the queue, was staged (columns copied in), executed (copies
# and kernels) and answered (results written into the calls).
batch_metrics() {
  local port
  port=$(grep -o 'metrics on port [0-9]*' "$out/server.log" | tail -1 | awk '{print $4}')
  exec 3<>"/dev/tcp/127.0.0.1/$port" || return 0
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  grep -E '^gpukv_(batch_size_ops|batch_(execution|staging|answer)_seconds|queue_delay_seconds)_(sum|count)|^gpukv_batches_total' <&3 | tee -a "$log"
  exec 3>&-
}
# The counters are cumulative: the difference between successive snapshots belongs to the run between them.
load_then_metrics() {
  load "$@"
  batch_metrics
}

# The device tier only: 16-byte keys, 8-byte values, 64 M slots.
if serve 50091 --capacity=67108864 --key_width=16 --value_width=8; then
  t=--target=127.0.0.1:50091
  load_then_metrics $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=0 --put=1   # fills part of the table
  load_then_metrics $t --keys=16000000 --mode=unary --callers=128 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=100 --callers=128 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=10000 --callers=16 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=0.5 --put=0.45
  load_then_metrics $t --keys=16000000 --mode=stream --batch=64 --callers=16 --depth=8 --get=1 --put=0
  kill -TERM $server
  wait $server
fi

# The same server with every call answered by the execution thread (the server's choice below 8 cores).
if serve 50093 --capacity=67108864 --key_width=16 --value_width=8 --completion_threads=0; then
  t=--target=127.0.0.1:50093
  echo "# --completion_threads=0" | tee -a "$log"
  load_then_metrics $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=0 --put=1
  load_then_metrics $t --keys=16000000 --mode=unary --callers=128 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=1 --put=0
  load_then_metrics $t --keys=16000000 --mode=batch --batch=10000 --callers=16 --get=1 --put=0
  kill -TERM $server
  wait $server
fi

# The same server driven by four load generators at once, with as many callers in all as the lines above.
if serve 50095 --capacity=67108864 --key_width=16 --value_width=8; then
  t=--target=127.0.0.1:50095
  echo "# four gpukv-load processes" | tee -a "$log"
  load $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=0 --put=1
  cpu_of gpukv-batch1000 load_split 4 $t --keys=16000000 --mode=batch --batch=1000 --callers=8 --get=1 --put=0
  cpu_of gpukv-batch10000 load_split 4 $t --keys=16000000 --mode=batch --batch=10000 --callers=4 --get=1 --put=0
  kill -TERM $server
  wait $server
fi

# The transport's ceiling: the same load against the API with no table behind it.
"$bundle/bin/transport_ceiling_server" --listen=127.0.0.1:50094 >>"$out/server.log" 2>&1 &
server=$!
sleep 1
echo "# transport_ceiling_server" | tee -a "$log"
t=--target=127.0.0.1:50094
load $t --keys=16000000 --mode=unary --callers=128 --get=1 --put=0
load $t --keys=16000000 --mode=batch --batch=100 --callers=128 --get=1 --put=0
load $t --keys=16000000 --mode=batch --batch=1000 --callers=32 --get=1 --put=0
load $t --keys=16000000 --mode=batch --batch=10000 --callers=16 --get=1 --put=0
load $t --keys=16000000 --mode=stream --batch=64 --callers=16 --depth=8 --get=1 --put=0
echo "# transport_ceiling_server, four gpukv-load processes" | tee -a "$log"
cpu_of ceiling-batch1000 load_split 4 $t --keys=16000000 --mode=batch --batch=1000 --callers=8 --get=1 --put=0
cpu_of ceiling-batch10000 load_split 4 $t --keys=16000000 --mode=batch --batch=10000 --callers=4 --get=1 --put=0
kill -TERM $server
wait $server

# A tiny device tier (1 M slots) under a 16 M-slot host tier: the data set lives mostly in host memory.
if serve 50092 --capacity=1048576 --host_capacity=16777216 --key_width=16 --value_width=8; then
  t=--target=127.0.0.1:50092
  load $t --keys=12000000 --mode=batch --batch=1000 --callers=32 --get=0 --put=1
  load $t --keys=12000000 --mode=batch --batch=1000 --callers=32 --get=1 --put=0
  load $t --keys=12000000 --mode=batch --batch=1000 --callers=32 --get=0.5 --put=0.45
  "$bundle/bin/gpukv" --target=127.0.0.1:50092 stats 2>&1 | tee -a "$log"
  kill -TERM $server
  wait $server
fi
