#!/usr/bin/env bash
# The service beside Redis on this machine, same workload shapes, one run: unpipelined single keys, batches
# of 100 and 1000 keys (Redis MGET/MSET of 100), pipelined / streamed groups of 64. Both servers and their
# load tools share the machine's cores. Then the same gpukv-load lines against transport_ceiling_server (the
# API with no table: what gRPC itself allows here), and the unary and batch lines against it once more with
# calls answered from another thread as gpukv-server answers them (--answer_delay_us). Writes the raw output to
# bench/results/<date>-service-<host>.log and prints the RESULT lines (LABEL=x adds -x to the log's name).
# SERVER_FLAGS adds gpukv-server flags. Needs: build/ (server, gpukv-load, transport_ceiling_server),
# redis-server and redis-benchmark.
set -euo pipefail
# This machine is a VM whose host lends its cores to others too: each gpukv line is followed by the share of
# its time that the hypervisor took away (steal), so that a slow line can be told from a slow server.
steal() { awk '/^cpu / {print $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/bench/results/$(date -u +%Y-%m-%d)-service-$(hostname -s)${LABEL:+-$LABEL}.log
secs=${SECONDS_PER_RUN:-8}
: > "$out"
{ echo "# $(date -u +%FT%TZ) $(nproc) cores, $(git -C "$root" rev-parse --short HEAD)"; } >> "$out"

redis-server --port 6399 --save "" --appendonly no --daemonize yes >/dev/null
sleep 1
rb() { redis-benchmark -p 6399 -r 1000000 --csv "$@" 2>/dev/null | tail -1; }
keys=$(for _ in $(seq 1 100); do printf 'key:__rand_int__ '; done)
kvs=$(for _ in $(seq 1 100); do printf 'key:__rand_int__ v '; done)
redis_steal=$(steal)
{
  echo "redis SET c50 $(rb -t set -n 300000 -c 50)"
  echo "redis GET c50 $(rb -t get -n 300000 -c 50)"
  echo "redis GET c50 P64 $(rb -t get -n 3000000 -c 50 -P 64)"
  echo "redis MGET100 c50 $(rb -n 40000 -c 50 MGET $keys)"
  echo "redis MSET100 c50 $(rb -n 20000 -c 50 MSET $kvs)"
  echo "$redis_steal $(steal)" | awk '{printf "STEAL %.1f%% (the Redis lines)\n", 100 * ($3 - $1) / ($4 - $2)}'
} >> "$out"
redis-cli -p 6399 shutdown nosave >/dev/null 2>&1 || true

"$root/build/server/gpukv-server" --listen=127.0.0.1:50088 --metrics_listen=127.0.0.1:0 --capacity=4000000 \
  --key_width=16 --value_width=8 --log_level=warn ${SERVER_FLAGS:-} >/dev/null 2>&1 &
server=$!
sleep 2
load() {
  local before after
  before=$(steal)
  "$root/build/client/gpukv-load" --target=127.0.0.1:50088 --seconds="${SECONDS_PER_RUN:-$secs}" --keys=1000000 "$@" 2>/dev/null
  after=$(steal)
  echo "$before $after" | awk '{printf "STEAL %.1f%%\n", 100 * ($3 - $1) / ($4 - $2)}'
}
workloads() {
  # Two seconds of unary calls first, not reported: the first line after a server starts (or after the
  # prefill) ran 15-30% below the same line repeated.
  SECONDS_PER_RUN=2 load --mode=unary --callers=64 --get=1 --put=0 | sed 's/^RESULT/WARMUP/'
  load --mode=unary --callers=64 --get=1 --put=0
  load --mode=unary --callers=64 --get=0 --put=1
  load --mode=batch --batch=100 --callers=64 --get=1 --put=0
  load --mode=batch --batch=100 --callers=64 --get=0 --put=1
  load --mode=batch --batch=1000 --callers=16 --get=1 --put=0
  load --mode=batch --batch=1000 --callers=64 --get=1 --put=0
  load --mode=stream --batch=64 --callers=8 --depth=8 --get=1 --put=0
}
{
  echo "# gpukv-server (CPU backend)"
  # Every key of the key space first, so that GETs find their keys (the ceiling server answers every GET
  # with a value, too).
  SECONDS_PER_RUN=4 load --mode=batch --batch=1000 --callers=16 --get=0 --put=1 | sed 's/^RESULT/PREFILL/'
  workloads
} >> "$out"
kill -TERM $server
wait $server || true

"$root/build/bench/transport_ceiling_server" --listen=127.0.0.1:50088 >/dev/null 2>&1 &
server=$!
sleep 1
{
  echo "# transport_ceiling_server (no table)"
  workloads | sed 's/^RESULT load/RESULT ceiling/'
} >> "$out"
kill -TERM $server
wait $server || true

# The ceiling again with calls answered as gpukv-server answers them (queued by the handler, finished by one
# other thread in batches timed like gpukv's default 200 us queue delay): what the hop off gRPC's thread costs.
"$root/build/bench/transport_ceiling_server" --listen=127.0.0.1:50088 --answer_delay_us=200 >/dev/null 2>&1 &
server=$!
sleep 1
{
  echo "# transport_ceiling_server --answer_delay_us=200 (no table, answered from another thread)"
  SECONDS_PER_RUN=2 load --mode=unary --callers=64 --get=1 --put=0 | sed 's/^RESULT/WARMUP/'
  load --mode=unary --callers=64 --get=1 --put=0 | sed 's/^RESULT load/RESULT hop/'
  load --mode=batch --batch=100 --callers=64 --get=1 --put=0 | sed 's/^RESULT load/RESULT hop/'
  load --mode=batch --batch=1000 --callers=16 --get=1 --put=0 | sed 's/^RESULT load/RESULT hop/'
} >> "$out"
kill -TERM $server
wait $server || true
grep -E "^redis|^#|RESULT|STEAL" "$out"
